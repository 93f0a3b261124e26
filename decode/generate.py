"""Autoregressive decoding: one jitted prefill, then one jitted `lax.while_loop` over tokens.

The loop state is a `DecodeState` donated to the jitted loop, so the cache is updated in place
and nothing returns to the host until every sequence is done. The scaffold around it (inputs,
placement, prefill, warm-up, timing, output) is decode/engine.py's.
"""
from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from speculax.core.sampling import sample
from speculax.decode import continuous, engine
from speculax.decode.config import GenerateConfig
from speculax.decode.metrics import DecodeOutput
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache
from speculax.models.sharding import MeshConfig


@flax.struct.dataclass
class DecodeState:
  cache: KVCache
  out: jax.Array  # [b, n] generated ids, -1 past each sequence's end
  n_out: jax.Array  # [b] int32 tokens emitted so far
  last: jax.Array  # [b] int32 most recent token (next step's input)
  done: jax.Array  # [b] bool
  key: jax.Array
  forwards: jax.Array  # [] int32 target forwards, prefill included
  budget: jax.Array  # [] int32 the most new tokens a row makes in this run (<= n)


def emit(state: DecodeState, tok: jax.Array, eos_ids: tuple[int, ...]) -> DecodeState:
  """Appends tok [b] to every unfinished sequence and updates the stop flags."""
  b, n = state.out.shape
  active = ~state.done
  slot = jnp.where(active, state.n_out, n)  # finished rows write out of bounds: dropped
  out = state.out.at[jnp.arange(b), slot].set(tok, mode="drop")
  n_out = state.n_out + active
  hit_eos = jnp.isin(tok, jnp.asarray(eos_ids, jnp.int32)) if eos_ids else jnp.zeros_like(active)
  done = state.done | (active & hit_eos) | (n_out >= state.budget)
  return state.replace(out=out, n_out=n_out, last=jnp.where(active, tok, state.last), done=done)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("state",))
def decode_loop(params, config: LlamaConfig, gen: GenerateConfig, state: DecodeState,
                watch: jax.Array):
  """Steps until every row is done or one of the watched rows [b] bool is."""
  def step(s: DecodeState) -> DecodeState:
    key, sub = jax.random.split(s.key)
    logits, _, cache = llama.forward(params, config, s.last[:, None], s.cache.lengths[:, None],
                                     s.cache)
    s = s.replace(cache=cache, key=key, forwards=s.forwards + 1)
    return emit(s, sample(sub, logits[:, 0], gen.sampling), gen.eos_ids)

  return jax.lax.while_loop(lambda s: engine.running(s.done, watch), step, state)


def _start(gen: GenerateConfig, params, tokens, lengths, logits, hidden, cache, key, max_len,
           budget) -> DecodeState:
  """The first token from the prefill's logits."""
  b, n = logits.shape[0], gen.max_new_tokens
  key, sub = jax.random.split(key)
  state = DecodeState(cache=cache, out=jnp.full((b, n), -1, jnp.int32),
                      n_out=jnp.zeros((b,), jnp.int32), last=jnp.zeros((b,), jnp.int32),
                      done=jnp.zeros((b,), bool), key=key, forwards=jnp.ones((), jnp.int32),
                      budget=budget)
  return emit(state, sample(sub, logits, gen.sampling), gen.eos_ids)


def generate(params, config: LlamaConfig, prompts, gen: GenerateConfig = GenerateConfig(),
             key: jax.Array | None = None, mesh: MeshConfig | None = None,
             warmup: bool = False, rows: int | None = None) -> DecodeOutput:
  """Generates up to gen.max_new_tokens for each prompt (lists of token ids), batched.

  Greedy output of each prompt is the same whatever else is in the batch. With `mesh`, params,
  cache and batch are placed by the logical-axis rules and the same jitted code runs sharded.
  warmup: compile prefill and the loop first and run one loop step, timed as compile_s, so
  prefill_s, decode_s and tokens_per_s measure only the run itself.
  rows: continuous batching, `rows` prompts at a time, each finished row refilled with the next
  (decode/continuous.py); None: every prompt in one batch.
  """
  program = engine.Program(
      extra_slots=0, hidden_layers=(), start=functools.partial(_start, gen),
      loop=lambda p, state, watch: decode_loop(p, config, gen, state, watch),
      new_tokens=lambda s: (s.out, jnp.zeros_like(s.n_out), s.n_out))
  _, out = (engine.run(params, config, prompts, gen, program, key, mesh, warmup) if rows is None
            else continuous.run(params, config, prompts, gen, program, rows, key, warmup,
                                mesh=mesh))
  return out
