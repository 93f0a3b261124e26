"""Lossless draft-then-verify decoding: one jitted `lax.while_loop`, batched, with any drafter.

Each step: the drafter proposes k tokens per sequence (or a tree of n nodes); one target forward
of k + 1 positions (the pending last token, then the drafts; a tree with its ancestor mask)
scores them; `verify_chain` keeps the longest acceptable prefix plus one target token
(`verify_tree` the best root-to-node path, whose K/V then move into contiguous slots); each
sequence advances by its own count (ragged), and the target cache is rolled back by length
arithmetic. Greedy output equals the target's own greedy output; sampled output follows the
target's distribution exactly.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculax.models.sharding import MeshConfig
from speculax.models.config import LlamaConfig
from speculax.core.fields import field
from speculax.core import trees
from speculax.decode.generate import GenerateConfig, place, prefill
from speculax.decode.inputs import check_room, pack_prompts
from speculax.decode.metrics import DecodeOutput
from speculax.core.sampling import SamplingConfig, sample
from speculax.verifiers.chain import emitted_tokens, verify_chain
from speculax.verifiers.tree import verify_tree
from speculax.core.types import TargetView, Verified
from speculax.drafters.base import Drafter
from speculax.models import llama
from speculax.models.kvcache import KVCache


@dataclasses.dataclass(frozen=True)
class SpecConfig(GenerateConfig):
  """GenerateConfig plus the number of draft tokens per verify step."""
  k: int = field(5, ge=1)


@flax.struct.dataclass
class SpecState:
  cache: KVCache  # target cache: every history token but the pending last one
  history: jax.Array  # [b, S] int32 prompt, then generated tokens
  lengths: jax.Array  # [b] int32 valid tokens in history
  n_out: jax.Array  # [b] int32 generated tokens
  done: jax.Array  # [b] bool
  drafter: Any  # the drafter's state pytree
  key: jax.Array
  forwards: jax.Array  # [] int32 target forwards, prefill included
  row_steps: jax.Array  # [] int32 verify steps summed over active sequences
  step_tokens: jax.Array  # [] int32 tokens those steps emitted
  accepted_at: jax.Array  # [k] int32 active sequences whose draft i was accepted
  drafted: jax.Array  # [] int32 draft tokens the target checked, summed over active sequences


def block_shape(drafter: Drafter, spec: SpecConfig) -> tuple[int, int]:
  """(draft tokens fed per verify step, most drafts one step can keep): k and k for a chain."""
  tree = drafter.tree
  return (spec.k, spec.k) if tree is None else (tree.n_nodes, tree.depth)


def _stop(tokens, n_emit, n_out, max_new, eos_ids):
  """Cuts each row's emitted tokens [b, k+1] at its budget and first EOS; returns (n, hit_eos)."""
  n_emit = jnp.minimum(n_emit, max_new - n_out)
  if not eos_ids:
    return n_emit, jnp.zeros_like(n_emit, bool)
  pos = jnp.arange(tokens.shape[1])[None]
  is_eos = jnp.isin(tokens, jnp.asarray(eos_ids, jnp.int32)) & (pos < n_emit[:, None])
  first = jnp.argmax(is_eos, 1)
  hit = is_eos.any(1)
  return jnp.where(hit, first + 1, n_emit), hit


def _verify(params, config, spec, drafter, draft, view, last, key):
  """One target forward over the pending token and the drafts, and what it keeps.

  Returns (Verified, emitted tokens [b, depth + 1] (-1 past each row's), cache with the kept
  path's K/V in contiguous slots after the root's).

  A draft id outside the vocabulary (a faulty drafter) is never kept and never reaches the
  model: the forward reads token 0 in its place (an out-of-range embedding lookup gives NaN,
  whose K/V would poison every later step through the masked attention), and verification
  stops before it: a chain checks only the drafts before the first bad one, a tree tries no
  sibling from a bad one on. Both are lossless stopping rules, so the output is the target's
  whatever the drafter proposes.
  """
  b = last.shape[0]
  valid = (draft.tokens >= 0) & (draft.tokens < config.vocab_size)  # [b, n]
  drafts = jnp.where(valid, draft.tokens, 0)  # [b, n]
  block = jnp.concatenate([last[:, None], drafts], 1)  # [b, n + 1]
  root = view.lengths - 1  # [b] the pending token's slot and position
  q = draft.probs
  layers = getattr(drafter, "hidden_layers", (-1,))  # target features the drafter reads
  if draft.parents is None:  # a chain: position i after the root, causal mask
    k = drafts.shape[1]
    if q is None and not spec.sampling.greedy:  # deterministic drafter: q is one-hot
      q = jax.nn.one_hot(drafts, config.vocab_size, dtype=jnp.float32)
    length = jnp.cumprod(valid.astype(jnp.int32), 1).sum(1)  # [b] drafts before a bad id
    if draft.length is not None:
      length = jnp.minimum(length, draft.length)

    def chain(m):  # verifies the first m drafts with one forward of m + 1 tokens
      logits, hidden, cache = llama.forward(params, config, block[:, :m + 1],
                                            root[:, None] + jnp.arange(m + 1), view.cache,
                                            hidden_layers=layers)
      n_acc, nxt = verify_chain(key, logits, drafts[:, :m], None if q is None else q[:, :m],
                                spec.sampling, jnp.minimum(length, m))
      pad = lambda x, axis: jnp.pad(x, [(0, k - m if a == axis else 0) for a in range(x.ndim)])
      return pad(logits, 1), pad(hidden, 2), cache, n_acc, nxt

    if draft.length is None:
      logits, hidden, cache, n_acc, nxt = chain(k)
    else:  # adaptive length: the forward covers the longest draft of the batch, no more
      m = jnp.clip(jnp.max(draft.length), 1, k)
      logits, hidden, cache, n_acc, nxt = jax.lax.switch(
          m - 1, [functools.partial(chain, i) for i in range(1, k + 1)])
    path = jnp.broadcast_to(jnp.arange(k + 1, dtype=jnp.int32), (b, k + 1))
    kept = drafts
  else:
    tree = drafter.tree
    positions = root[:, None] + trees.depths(draft.parents, tree.depth)
    mask = trees.ancestor_mask(draft.parents, tree.depth)  # [b, n + 1, n + 1]
    logits, hidden, cache = llama.forward(params, config, block, positions, view.cache, mask,
                                          hidden_layers=layers)
    valid_nodes = jnp.concatenate([jnp.ones((b, 1), bool), valid], 1)  # [b, n + 1]
    path, n_acc, nxt = verify_tree(key, logits, block, draft.parents, q, spec.sampling,
                                   tree.depth, tree.max_children, valid=valid_nodes)
    cache = cache.gather_path(root, path)
    kept = jnp.take_along_axis(block, path[:, 1:], 1)  # [b, depth]
  verified = Verified(block=block, logits=logits, hidden=hidden, path=path, n_accepted=n_acc)
  return verified, emitted_tokens(kept, n_acc, nxt), cache


def spec_step(params, dparams, config: LlamaConfig, spec: SpecConfig, drafter: Drafter,
              s: SpecState) -> SpecState:
  b = s.history.shape[0]
  rows = jnp.arange(b)
  key, k_draft, k_verify = jax.random.split(s.key, 3)
  view = TargetView(params, s.cache, s.history, s.lengths)
  draft, dstate, view = drafter.propose(dparams, s.drafter, view, k_draft, config, spec.k,
                                        spec.sampling)
  last = s.history[rows, s.lengths - 1]
  verified, out, cache = _verify(params, config, spec, drafter, draft, view, last, k_verify)
  n_acc, width = verified.n_accepted, out.shape[1]  # width: depth + 1
  checked = draft.tokens.shape[1] if draft.length is None else draft.length  # [] or [b]
  active = ~s.done
  n_emit, hit_eos = _stop(out, n_acc + 1, s.n_out, spec.max_new_tokens, spec.eos_ids)
  n_emit = jnp.where(active, n_emit, 0)  # [b] tokens this step emits (the budget or an EOS may
  # cut the accepted block: only the emitted ones count in tau and acceptance)
  slots = s.lengths[:, None] + jnp.arange(width)[None]
  slots = jnp.where(jnp.arange(width)[None] < n_emit[:, None], slots, s.history.shape[1])
  history = s.history.at[rows[:, None], slots].set(out, mode="drop")
  lengths = s.lengths + n_emit
  cache = cache.with_lengths(lengths - 1)
  dstate = drafter.update(dparams, dstate, TargetView(params, cache, history, lengths), verified)
  n_out = s.n_out + n_emit
  accepted = jnp.arange(width - 1)[None] < jnp.minimum(n_acc, n_emit)[:, None]  # [b, depth]
  return s.replace(
      cache=cache, history=history, lengths=lengths, n_out=n_out, drafter=dstate, key=key,
      done=s.done | (active & hit_eos) | (n_out >= spec.max_new_tokens),
      forwards=s.forwards + 1, row_steps=s.row_steps + active.sum(),
      step_tokens=s.step_tokens + n_emit.sum(),
      accepted_at=s.accepted_at + accepted.sum(0),
      drafted=s.drafted + jnp.where(active, checked, 0).sum())


@functools.partial(jax.jit, static_argnames=("config", "spec", "drafter"), donate_argnames=("state",))
def spec_loop(params, dparams, config: LlamaConfig, spec: SpecConfig, drafter: Drafter,
              state: SpecState) -> SpecState:
  step = functools.partial(spec_step, params, dparams, config, spec, drafter)
  return jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)


@functools.partial(jax.jit, static_argnames=("config", "spec", "drafter", "max_len"))
def _start(params, dparams, config, spec, drafter, max_len, tokens, lengths, logits, hidden,
           cache, key):
  """First token from the prefill logits, the history buffer and the drafter's state (which
  may read the prefill's hidden states)."""
  b = tokens.shape[0]
  key, sub = jax.random.split(key)
  first = sample(sub, logits, spec.sampling)
  history = jnp.zeros((b, max_len), jnp.int32).at[:, :tokens.shape[1]].set(tokens)
  history = history.at[jnp.arange(b), lengths].set(first)
  n_out = jnp.ones((b,), jnp.int32)
  done = n_out >= spec.max_new_tokens
  if spec.eos_ids:
    done |= jnp.isin(first, jnp.asarray(spec.eos_ids, jnp.int32))
  view = TargetView(params, cache, history, lengths + 1, prompt_hidden=hidden)
  return SpecState(
      cache=cache, history=history, lengths=lengths + 1, n_out=n_out, done=done,
      drafter=drafter.init(dparams, view, config, max_len), key=key,
      forwards=jnp.ones((), jnp.int32), row_steps=jnp.zeros((), jnp.int32),
      step_tokens=jnp.zeros((), jnp.int32),
      accepted_at=jnp.zeros((block_shape(drafter, spec)[1],), jnp.int32),
      drafted=jnp.zeros((), jnp.int32))


def speculative_generate(params, config: LlamaConfig, prompts, drafter: Drafter,
                         spec: SpecConfig = SpecConfig(), drafter_params=None,
                         key: jax.Array | None = None, mesh: MeshConfig | None = None,
                         warmup: bool = False) -> DecodeOutput:
  """Speculative decoding of a batch of prompts (lists of token ids) with `drafter`.

  drafter_params: arrays the drafter reads (a draft model's weights), or None.
  warmup: compile everything first (the loop runs zero steps), timed apart as compile_s.
  """
  spec.check_vocab(config.vocab_size)
  drafter.check(config, drafter_params, spec.k)
  drafter_params = drafter.prepare(drafter_params)
  tokens, lengths = pack_prompts(prompts, config.vocab_size, spec.prompt_bucket)
  # Room: the prompt, the new tokens, and one verify block (k or tree nodes, + 1) past the last.
  nodes = block_shape(drafter, spec)[0]
  check_room(int(lengths.max()), spec.max_new_tokens, config.max_seq_len, extra=nodes + 1)
  b = len(lengths)
  max_len = tokens.shape[1] + spec.max_new_tokens + nodes + 1
  key = jax.random.key(0) if key is None else key
  params, cache, tokens, lengths = place(
      params, config, KVCache.init(config, b, max_len, per_layer=True), tokens, lengths, mesh)

  def start(cache, done_now: bool):
    logits, hidden, cache = prefill(params, config, tokens, lengths, cache,
                                    getattr(drafter, "hidden_layers", ()))
    state = _start(params, drafter_params, config, spec, drafter, max_len, tokens, lengths,
                   logits, hidden, cache, key)
    return state.replace(done=state.done | done_now)

  compile_s = 0.0
  if warmup:
    t = time.perf_counter()
    idle = start(jax.tree.map(jnp.copy, cache), True)
    jax.block_until_ready(spec_loop(params, drafter_params, config, spec, drafter, idle))
    compile_s = time.perf_counter() - t
  t0 = time.perf_counter()
  state = jax.block_until_ready(start(cache, False))
  t1 = time.perf_counter()
  state = jax.block_until_ready(spec_loop(params, drafter_params, config, spec, drafter, state))
  t2 = time.perf_counter()
  history, lengths_out, n_out = (np.asarray(x) for x in (state.history, state.lengths, state.n_out))
  out = [history[i, lengths_out[i] - n_out[i]:lengths_out[i]].tolist() for i in range(b)]
  return DecodeOutput(tokens=out, prefill_s=t1 - t0, decode_s=t2 - t1, compile_s=compile_s,
                      forwards=int(state.forwards), row_steps=int(state.row_steps),
                      step_tokens=int(state.step_tokens),
                      accepted_at=np.asarray(state.accepted_at), drafted=int(state.drafted),
                      drafter_state=state.drafter)
