"""Autoregressive decoding: one jitted prefill, then one jitted `lax.while_loop` over tokens.

The loop state is a `DecodeState` donated to the jitted loop, so the cache is updated in place
and nothing returns to the host until every sequence is done.
"""
from __future__ import annotations

import dataclasses
import functools
import time

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculax.models.sharding import MeshConfig, make_mesh
from speculax.models.config import LlamaConfig
from speculax.core.fields import Checked, field
from speculax.decode.inputs import check_room, pack_prompts
from speculax.decode.metrics import DecodeOutput
from speculax.core.sampling import SamplingConfig, sample
from speculax.models import llama
from speculax.models import sharding
from speculax.models.kvcache import KVCache


@dataclasses.dataclass(frozen=True)
class GenerateConfig(Checked):
  max_new_tokens: int = field(128, ge=1)
  sampling: SamplingConfig = SamplingConfig()
  eos_ids: tuple[int, ...] = field((), ge=0)
  # Prompts are right-padded to a multiple of this: one compile per bucket.
  prompt_bucket: int = field(64, ge=1)

  def check_vocab(self, vocab_size: int) -> None:
    """Host-side, once the model is known: top_k and the EOS ids must fit its vocabulary."""
    self.sampling.check_vocab(vocab_size)
    bad = [i for i in self.eos_ids if i >= vocab_size]
    if bad:
      raise ValueError(f"eos_ids {self.eos_ids} name id {bad[0]}, outside the vocabulary "
                       f"[0, {vocab_size})")


@flax.struct.dataclass
class DecodeState:
  cache: KVCache
  out: jax.Array  # [b, n] generated ids, -1 past each sequence's end
  n_out: jax.Array  # [b] int32 tokens emitted so far
  last: jax.Array  # [b] int32 most recent token (next step's input)
  done: jax.Array  # [b] bool
  key: jax.Array
  forwards: jax.Array  # [] int32 target forwards, prefill included


@functools.partial(jax.jit, static_argnames=("config", "hidden_layers"), donate_argnames=("cache",))
def prefill(params, config: LlamaConfig, tokens, lengths, cache: KVCache,
            hidden_layers: tuple[int, ...] = ()):
  """Runs the padded prompts [b, T]; returns last-position logits [b, v], the hidden states at
  `hidden_layers` for every prompt slot [l, b, T, d] (None when none are asked: drafters that
  read target features start from them) and the cache.

  Pad slots are written but the cache length is set to each prompt's true length, so they
  are invisible and get overwritten by the first generated tokens.
  """
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
  logits, hidden, cache = llama.forward(params, config, tokens, positions, cache,
                                        hidden_layers=hidden_layers or (-1,),
                                        logits_at=(lengths - 1)[:, None])
  return logits[:, 0], (hidden if hidden_layers else None), cache.with_lengths(lengths)


def emit(state: DecodeState, tok: jax.Array, eos_ids: tuple[int, ...]) -> DecodeState:
  """Appends tok [b] to every unfinished sequence and updates the stop flags."""
  b, n = state.out.shape
  active = ~state.done
  slot = jnp.where(active, state.n_out, n)  # finished rows write out of bounds: dropped
  out = state.out.at[jnp.arange(b), slot].set(tok, mode="drop")
  n_out = state.n_out + active
  hit_eos = jnp.isin(tok, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros_like(active)
  done = state.done | (active & hit_eos) | (n_out >= n)
  return state.replace(out=out, n_out=n_out, last=jnp.where(active, tok, state.last), done=done)


@functools.partial(jax.jit, static_argnames=("config", "gen"), donate_argnames=("state",))
def decode_loop(params, config: LlamaConfig, gen: GenerateConfig, state: DecodeState):
  def step(s: DecodeState) -> DecodeState:
    key, sub = jax.random.split(s.key)
    logits, _, cache = llama.forward(params, config, s.last[:, None], s.cache.lengths[:, None],
                                     s.cache)
    s = s.replace(cache=cache, key=key, forwards=s.forwards + 1)
    return emit(s, sample(sub, logits[:, 0], gen.sampling), gen.eos_ids)

  return jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state)


def place(params, config: LlamaConfig, cache: KVCache, tokens, lengths, mesh: MeshConfig | None):
  """Puts params, cache and the batch on the mesh (if any) and unstacks the layers.

  Decoding runs the layers as an unrolled loop over per-layer buffers (see
  `llama.unstack_layers`); params already unstacked are used as they are.
  """
  tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)
  stacked = not isinstance(params["layers"], tuple)
  if mesh is not None:
    mesh.check_batch(tokens.shape[0], "batch size (prompts)")
    m = make_mesh(mesh)
    if stacked:
      params = sharding.shard_params(params, config, m, mesh.rules)
    cache = sharding.shard_cache(cache, m, mesh.rules)
    tokens = jax.device_put(tokens, sharding.batch_sharding(m, mesh.rules, 2))
    lengths = jax.device_put(lengths, sharding.batch_sharding(m, mesh.rules, 1))
  return (llama.unstack_layers(params) if stacked else params), cache, tokens, lengths


def _initial_state(cache, logits, key, gen: GenerateConfig, done) -> DecodeState:
  b, n = logits.shape[0], gen.max_new_tokens
  key, sub = jax.random.split(key)
  state = DecodeState(cache=cache, out=jnp.full((b, n), -1, jnp.int32),
                      n_out=jnp.zeros((b,), jnp.int32), last=jnp.zeros((b,), jnp.int32),
                      done=done, key=key, forwards=jnp.ones((), jnp.int32))
  return emit(state, sample(sub, logits, gen.sampling), gen.eos_ids)


def generate(params, config: LlamaConfig, prompts, gen: GenerateConfig = GenerateConfig(),
             key: jax.Array | None = None, mesh: MeshConfig | None = None,
             warmup: bool = False) -> DecodeOutput:
  """Generates up to gen.max_new_tokens for each prompt (lists of token ids), batched.

  Greedy output of each prompt is the same whatever else is in the batch. With `mesh`, params,
  cache and batch are placed by the logical-axis rules and the same jitted code runs sharded.
  warmup: compile prefill and the loop first (the loop runs zero steps), timed as compile_s,
  so prefill_s, decode_s and tokens_per_s measure only the run itself.
  """
  gen.check_vocab(config.vocab_size)
  tokens, lengths = pack_prompts(prompts, config.vocab_size, gen.prompt_bucket)
  check_room(int(lengths.max()), gen.max_new_tokens, config.max_seq_len)
  b, n = len(lengths), gen.max_new_tokens
  key = jax.random.key(0) if key is None else key
  params, cache, tokens, lengths = place(params, config, KVCache.init(
      config, b, tokens.shape[1] + n, per_layer=True), tokens, lengths, mesh)

  compile_s = 0.0
  if warmup:
    t = time.perf_counter()
    logits, _, spare = prefill(params, config, tokens, lengths, jax.tree.map(jnp.copy, cache))
    idle = _initial_state(spare, logits, key, gen, done=jnp.ones((b,), bool))
    jax.block_until_ready(decode_loop(params, config, gen, idle))
    compile_s = time.perf_counter() - t
  t0 = time.perf_counter()
  logits, _, cache = prefill(params, config, tokens, lengths, cache)
  state = jax.block_until_ready(_initial_state(cache, logits, key, gen, jnp.zeros((b,), bool)))
  t1 = time.perf_counter()
  state = jax.block_until_ready(decode_loop(params, config, gen, state))
  t2 = time.perf_counter()
  out, n_out = np.asarray(state.out), np.asarray(state.n_out)
  return DecodeOutput(tokens=[out[i, :n_out[i]].tolist() for i in range(b)], prefill_s=t1 - t0,
                        decode_s=t2 - t1, forwards=int(state.forwards), compile_s=compile_s)
