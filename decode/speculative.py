"""Lossless draft-then-verify decoding: one jitted `lax.while_loop`, batched, with any drafter.

Each step: the drafter proposes its draft (k chain tokens or a tree of nodes); its verifier
(verifiers/) runs one target forward over the pending token and the draft, keeps the longest
acceptable path plus one target token and leaves that path's K/V in contiguous cache slots;
each sequence advances by its own count (ragged), and the target cache is rolled back by length
arithmetic. Greedy output equals the target's own greedy output; sampled output follows the
target's distribution exactly. The scaffold around the loop (inputs, placement, prefill,
warm-up, timing, output) is decode/engine.py's.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterator

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.sampling import sample
from speculax.core.types import Draft, TargetView
from speculax.decode import continuous, engine, goodput
from speculax.decode.config import SpecConfig
from speculax.decode.metrics import DecodeOutput
from speculax.drafters.base import Drafter
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache
from speculax.models.sharding import MeshConfig
from speculax.verifiers.chain import ChainVerifier, emitted_tokens
from speculax.verifiers.judge import Judge


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
  goodput: goodput.GoodputState | None  # spec.goodput's acceptance estimate, k counts, costs
  budget: jax.Array  # [] int32 the most new tokens a row makes in this run (decode/engine.py)


def block_shape(drafter: Drafter, spec: SpecConfig) -> tuple[int, int]:
  """(draft tokens fed per verify step, most drafts one step can keep): k and k for a chain."""
  return drafter.verifier().block_shape(spec.k)


def emit(out, n_emit, s, eos_ids):
  """Writes each active row's emitted tokens out [b, w] (the first n_emit [b] of them, cut at
  the row's budget and first EOS) after its history. Returns (history, lengths, tokens emitted
  [b], whether an EOS was emitted [b]); done rows emit nothing. s: the loop state."""
  n_emit = jnp.where(s.done, 0, jnp.minimum(n_emit, s.budget - s.n_out))
  hit = jnp.zeros_like(n_emit, bool)
  if eos_ids:
    pos = jnp.arange(out.shape[1])[None]
    is_eos = jnp.isin(out, jnp.asarray(eos_ids, jnp.int32)) & (pos < n_emit[:, None])
    hit = is_eos.any(1)
    n_emit = jnp.where(hit, jnp.argmax(is_eos, 1) + 1, n_emit)
  slots = s.lengths[:, None] + jnp.arange(out.shape[1])[None]
  slots = jnp.where(jnp.arange(out.shape[1])[None] < n_emit[:, None], slots, s.history.shape[1])
  rows = jnp.arange(out.shape[0])[:, None]
  history = s.history.at[rows, slots].set(out, mode="drop")
  return history, s.lengths + n_emit, n_emit, hit


def _step(params, dparams, config: LlamaConfig, spec: SpecConfig, drafter: Drafter,
          alike: jax.Array, k: int, s: SpecState) -> SpecState:
  b = s.history.shape[0]
  key, k_draft, k_verify = jax.random.split(s.key, 3)
  view = TargetView(params, s.cache, s.history, s.lengths)
  if k:
    draft, dstate, view = drafter.propose(dparams, s.drafter, view, k_draft, config, k,
                                          spec.sampling)
  else:  # a plain decoding step: the verifier checks no drafts and draws the target's token
    draft, dstate = Draft(jnp.zeros((b, 0), jnp.int32), None), s.drafter
  layers = drafter.hidden_layers or (-1,)  # Verified.hidden: the features the drafter reads
  forward = lambda tokens, positions, mask: llama.forward(
      params, config, tokens, positions, view.cache, mask, hidden_layers=layers)
  verifier = drafter.verifier() if k else ChainVerifier()
  if spec.lossy is not None:
    verifier = dataclasses.replace(verifier, lossy=spec.lossy)
  verified, cache = verifier.verify(k_verify, draft, view.pending, view.lengths - 1, forward,
                                    spec.sampling, config.vocab_size)
  n_acc = verified.n_accepted
  out = emitted_tokens(verified.kept, n_acc, verified.next_token)  # [b, depth + 1]
  width = out.shape[1]
  checked = draft.tokens.shape[1] if draft.length is None else draft.length  # [] or [b]
  active = ~s.done
  # The budget or an EOS may cut the accepted block: only the emitted tokens count in tau and
  # acceptance.
  history, lengths, n_emit, hit_eos = emit(out, n_acc + 1, s, spec.eos_ids)
  cache = cache.with_lengths(lengths - 1)
  # A drafter that proposed nothing still sees the step (Verified of the pending token alone).
  after = TargetView(params, cache, history, lengths)
  dstate = drafter.update(dparams, dstate, after, verified)
  n_out = s.n_out + n_emit
  done = s.done | (active & hit_eos) | (n_out >= s.budget)
  accepted = jnp.arange(width - 1)[None] < jnp.minimum(n_acc, n_emit)[:, None]  # [b, depth]
  accepted_at = s.accepted_at.at[:width - 1].add(accepted.sum(0))  # goodput: k <= spec.k
  gstate = s.goodput if spec.goodput is None else goodput.observe(
      spec.goodput, s.goodput, k, jnp.broadcast_to(checked, (b,)), n_acc,
      row_bins(spec, drafter, dparams, dstate, after, config, n_out, done),
      spec.goodput.weights(n_out, done, s.budget, alike))
  return s.replace(
      cache=cache, history=history, lengths=lengths, n_out=n_out, drafter=dstate, key=key,
      done=done, forwards=s.forwards + 1, row_steps=s.row_steps + active.sum(),
      step_tokens=s.step_tokens + n_emit.sum(), accepted_at=accepted_at,
      drafted=s.drafted + jnp.where(active, checked, 0).sum(), goodput=gstate)


def every_row(spec: SpecConfig, watch: jax.Array) -> jax.Array:
  """[] bool: goodput weighs every running row alike (Goodput.weights), as any may end last: a
  finished row is refilled (a watched one [b]: continuous batching), or an EOS may end a row
  before its budget, so the row furthest behind need not be the last (serving prompt lookup at
  batch 8 over 128 tokens with EOS, 12 of 32 answers ended by one: 1.10 of AR weighing the rows
  furthest behind, 1.14 weighing every row)."""
  return jnp.any(watch) | bool(spec.eos_ids)


def row_bins(spec: SpecConfig, drafter: Drafter, dparams, dstate, view: TargetView,
             config: LlamaConfig, n_out: jax.Array, done: jax.Array) -> jax.Array:
  """[b] int32 each row's goodput estimate for the next choice (Goodput.bins; -1: done)."""
  pooled = spec.goodput.signal_values(drafter.signal_bins) == 1
  signal = (jnp.zeros_like(n_out) if pooled
            else drafter.signal(dparams, dstate, view, config))  # [b]
  return spec.goodput.bins(signal, n_out, done)


# XLA copies a buffer a conditional's branch updates in place, in every branch (the goodput
# switch's plain step 76-81 ms against AR's 61-68 at batch 8 on a 2-core CPU); copy insertion's
# region analysis, off by default on CPU and GPU, keeps the plain step's branch in place and
# copies once in a drafting one (XLA:CPU, the switch at batch 8 with prompt lookup, the same
# steps: 72.2 ms a step without, 55.7 with, the chain 55.6; no compile time added to
# tests/test_goodput.py).
REGION_ANALYSIS = {"xla_cpu_copy_insertion_use_region_analysis": True,
                   "xla_gpu_copy_insertion_use_region_analysis": True}


@functools.partial(jax.jit, static_argnames=("config", "drafter"),
                   donate_argnames=("state",), compiler_options=REGION_ANALYSIS)
def spec_loop(params, dparams, config: LlamaConfig, spec: SpecConfig, drafter: Drafter,
              state: SpecState, watch: jax.Array) -> SpecState:
  """Steps of spec.k drafts until every row is done or a watched one [b] bool is; with
  spec.goodput each step drafts the k' in 0..k it picks, each k' its own program (a shorter
  draft pays only its own drafting and forward), and a drafter with max_lag catches up on the
  plain steps' tokens in one block before it drafts again, or once max_lag of them wait."""
  alike = every_row(spec, watch)
  step = functools.partial(_step, params, dparams, config, spec, drafter, alike)
  running = lambda s: engine.running(s.done, watch)
  if spec.goodput is None:
    return jax.lax.while_loop(running, functools.partial(step, spec.k), state)
  # The first step's choice weighs the rows as this call does (refilled or not; rows put in
  # since the last step); each step makes the next one's.
  weights = spec.goodput.weights(state.n_out, state.done, state.budget, alike)  # [b]
  state = state.replace(goodput=state.goodput.replace(
      choice=goodput.choose(spec.goodput, state.goodput, weights)))
  choice = lambda s: s.goodput.choice  # made by the step before (goodput.observe)
  view = lambda s: TargetView(params, s.cache, s.history, s.lengths)
  lag = lambda s: jnp.where(s.done, 0, drafter.lag(s.drafter, view(s)))  # [b]
  catch_up = lambda s: s.replace(drafter=drafter.catch_up(dparams, s.drafter, view(s)))
  behind = lambda s: jnp.any(lag(s) > 0)  # [] plain steps' tokens wait for the drafter
  full = lambda s: jnp.any(lag(s) >= drafter.max_lag)  # [] a row's backlog has no more room

  if spec.goodput.loop == "switch":
    steps = [functools.partial(step, k) for k in range(spec.k + 1)]
    steps += [catch_up] if drafter.max_lag else []

    def branch(s):  # the choice's step, or (branch K + 1) catching up, as the chain does it:
      # before a draft, or once max_lag plain steps wait
      if not drafter.max_lag:
        return choice(s)
      return jnp.where(behind(s) & ((choice(s) > 0) | full(s)), spec.k + 1, choice(s))
    return jax.lax.while_loop(running, lambda s: jax.lax.switch(branch(s), steps, s), state)

  def segments(s):  # for k = 0..K in turn, steps of k drafts while k is the choice
    for k in range(spec.k + 1):
      same = lambda s, k=k: running(s) & (choice(s) == k)
      if k == 0 and drafter.max_lag:  # plain steps while the drafter's backlog has room
        same = lambda s, plain=same: plain(s) & ~full(s)
      s = jax.lax.while_loop(same, functools.partial(step, k), s)
      if k == 0 and drafter.max_lag:  # a loop run once or never: a cond would copy the
        # drafter's cache (see below); an empty backlog costs no block forward
        s = jax.lax.while_loop(behind, catch_up, s)
    return s

  # The chain (Goodput.loop) has no conditional, so its loops update the KV cache in place (the
  # switch's copies: REGION_ANALYSIS above; a switch per segment copied the cache at every change
  # of length and every continuous-batching refill). A loop whose k is not the choice runs no
  # step; each pass of the outer loop runs at least one (the choice's own loop), so it ends. Both
  # forms run the same steps in the same order (the chain also catches up after plain steps that
  # end a call, which changes no token).
  return jax.lax.while_loop(running, segments, state)


def begin(key, tokens, lengths, logits, spec, max_len: int, budget):
  """The first new token from the prefill logits [b, v] and the history buffer [b, max_len]
  holding prompt and token -> (key, history, lengths, n_out, done)."""
  b = tokens.shape[0]
  key, sub = jax.random.split(key)
  first = sample(sub, logits, spec.sampling)
  history = jnp.zeros((b, max_len), jnp.int32).at[:, :tokens.shape[1]].set(tokens)
  history = history.at[jnp.arange(b), lengths].set(first)
  n_out = jnp.ones((b,), jnp.int32)
  stop = n_out >= budget
  if spec.eos_ids:
    stop |= jnp.isin(first, jnp.asarray(spec.eos_ids, jnp.int32))
  return key, history, lengths + 1, n_out, stop


@functools.partial(jax.jit, static_argnames=("config", "drafter", "max_len"))
def _start(params, dparams, config, spec, drafter, tokens, lengths, logits, hidden, cache, key,
           max_len, budget, step_costs, estimate):
  """The loop state after the prefill, with the drafter's state (which may read the prefill's
  hidden states); step_costs [k + 1] and estimate (kept, reached [bins, k]) of a goodput run
  (None otherwise)."""
  key, history, lengths, n_out, done = begin(key, tokens, lengths, logits, spec, max_len, budget)
  view = TargetView(params, cache, history, lengths, prompt_hidden=hidden)
  dstate = drafter.init(dparams, view, config, max_len)
  gstate = None if spec.goodput is None else goodput.GoodputState.init(
      spec.goodput, step_costs,
      row_bins(spec, drafter, dparams, dstate, view, config, n_out, done), estimate)
  return SpecState(
      cache=cache, history=history, lengths=lengths, n_out=n_out, done=done,
      drafter=dstate, key=key,
      forwards=jnp.ones((), jnp.int32), row_steps=jnp.zeros((), jnp.int32),
      step_tokens=jnp.zeros((), jnp.int32),
      accepted_at=jnp.zeros((block_shape(drafter, spec)[1],), jnp.int32),
      drafted=jnp.zeros((), jnp.int32),
      goodput=gstate, budget=budget)


def warm_states(state: SpecState) -> Iterator[SpecState]:
  """The warm-up's states: one per draft length of a goodput loop (its costs forcing that
  length), so every segment's step has run once before the timed run; a fixed-k loop's state
  as it is. Each is a copy made when the warm-up reaches it (the loop donates it), so one copy
  of the cache is alive at a time."""
  if state.goodput is None:
    yield state
    return
  costs = state.goodput.step_costs  # [K + 1]
  for k in range(costs.shape[0]):
    # An op on the costs themselves: the same placement (and committedness), so the warm-up
    # runs the very executable the timed run will (jit caches on both).
    forced = jnp.ones_like(costs) * goodput.forcing(k, costs.shape[0])
    choice = jnp.zeros_like(state.goodput.choice) + k  # what choose gives under forced costs
    yield jax.tree.map(jnp.copy, state.replace(goodput=state.goodput.replace(
        step_costs=forced, choice=choice)))


def check_lossy(spec: SpecConfig, drafter: Drafter, config: LlamaConfig) -> None:
  """A judge reads the target's final features at the drafts' slots, which the verify forward
  returns last of the drafter's hidden layers: a drafter reading others last (EAGLE-3's low,
  mid and high layers) is refused, as is a head of another width."""
  if not isinstance(spec.lossy, Judge):
    return
  spec.lossy.check(config.d_model)
  last = (drafter.hidden_layers or (-1,))[-1]
  if last % (config.n_layers + 1) != config.n_layers:
    raise ValueError(f"a judge head reads the target's final features; the {drafter.name} "
                     f"drafter's verify forward returns layers {drafter.hidden_layers}")


def spec_program(params, config: LlamaConfig, drafter: Drafter, spec: SpecConfig,
                 drafter_params=None, step_costs=None, estimate=None) -> engine.Program:
  """The speculative decode loop of `drafter` as an engine.Program, its settings checked
  (speculative_generate's arguments of the same names); the drafter's params prepared once."""
  verifier = type(drafter.verifier())
  if spec.goodput is not None and verifier is not ChainVerifier:
    raise ValueError(f"goodput-driven draft length picks a chain's length; the {drafter.name} "
                     f"drafter here verifies with {verifier.__name__}")
  check_lossy(spec, drafter, config)
  if spec.lossy is not None and verifier is not ChainVerifier:
    raise ValueError(f"{spec.lossy} (lossy) checks a chain; the {drafter.name} drafter "
                     f"here verifies with {verifier.__name__}")
  if (spec.goodput is None) != (step_costs is None):
    raise ValueError("step_costs go with spec.goodput and only with it (decode/calibrate.py "
                     f"measures them); got goodput={spec.goodput} and step_costs={step_costs}")
  costs = None if step_costs is None else goodput.step_costs(step_costs, spec.k)
  if estimate is not None and spec.goodput is None:
    raise ValueError("a goodput estimate goes with spec.goodput; this run drafts a fixed "
                     f"k={spec.k}")
  if spec.goodput is not None:  # always arrays: one compiled start with or without one
    counts = spec.goodput.n_bins(drafter.signal_bins), spec.k
    estimate = goodput.estimate([np.zeros(counts)] * 2 if estimate is None else estimate,
                                *counts)
  drafter.check(config, drafter_params, spec.k)
  drafter_params = drafter.prepare(drafter_params, params, config)
  # Room past the new tokens: one verify block (k or tree nodes, + 1) after the last.
  return engine.Program(
      extra_slots=block_shape(drafter, spec)[0] + 1, hidden_layers=drafter.hidden_layers,
      start=lambda params, *args: _start(params, drafter_params, config, spec, drafter, *args,
                                         step_costs=costs, estimate=estimate),
      loop=lambda params, state, watch: spec_loop(params, drafter_params, config, spec, drafter,
                                                  state, watch),
      new_tokens=lambda s: (s.history, s.lengths - s.n_out, s.n_out), warm_states=warm_states)


def speculative_generate(params, config: LlamaConfig, prompts, drafter: Drafter,
                         spec: SpecConfig = SpecConfig(), drafter_params=None,
                         key: jax.Array | None = None, mesh: MeshConfig | None = None,
                         warmup: bool = False, step_costs=None,
                         new_tokens: int | None = None, estimate=None,
                         rows: int | None = None) -> DecodeOutput:
  """Speculative decoding of a batch of prompts (lists of token ids) with `drafter`.

  drafter_params: arrays the drafter reads (a draft model's weights), or None.
  warmup: compile everything first and run one loop step, timed apart as compile_s.
  step_costs: with spec.goodput (and only then), [k + 1] seconds of one loop step drafting
  0..k (decode/calibrate.py; +inf: never that length).
  new_tokens: this run's most new tokens per prompt (None: spec.max_new_tokens, which sizes
  the compiled loop; fewer reuse it).
  estimate: with spec.goodput, the acceptance counts to start from (a previous call's
  out.goodput_estimate, same drafter and k): a stream of calls keeps learning what the drafter
  earns instead of starting each call from the optimistic prior. None: start from the prior.
  rows: continuous batching, `rows` prompts at a time, each finished row refilled with the next
  (decode/continuous.py): the drafter's and goodput's shared state carries from prompt to
  prompt. None: every prompt in one batch.
  """
  program = spec_program(params, config, drafter, spec, drafter_params, step_costs, estimate)
  if rows is None:
    state, out = engine.run(params, config, prompts, spec, program, key, mesh, warmup,
                            new_tokens)
  else:
    state, out = continuous.run(params, config, prompts, spec, program, rows, key, warmup,
                                mesh=mesh, new_tokens=new_tokens)
  return dataclasses.replace(
      out, row_steps=int(state.row_steps), step_tokens=int(state.step_tokens),
      accepted_at=np.asarray(state.accepted_at), drafted=int(state.drafted),
      k_steps=None if state.goodput is None else np.asarray(state.goodput.steps),
      k_changes=None if state.goodput is None else int(state.goodput.changes),
      step_costs=None if state.goodput is None else np.asarray(state.goodput.step_costs),
      drafter_state=state.drafter,
      goodput_estimate=None if state.goodput is None else (
          np.asarray(state.goodput.kept), np.asarray(state.goodput.reached)),
      lossy=None if spec.lossy is None else str(spec.lossy))
