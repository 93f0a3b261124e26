"""What every decode loop shares: prompts checked and packed, params, cache and batch placed on
the mesh, the prefill, a warm-up compile timed apart, the timed run, and the new tokens read back.

A decode loop is a `Program`: how many cache slots it needs past the new tokens, which target
hidden states its prefill must return, `start` (prefill outputs -> the loop state) and `loop`
(a jitted `lax.while_loop` over that state, donated). Autoregressive decoding
(decode/generate.py) and speculative decoding (decode/speculative.py) are two programs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import numbers
import time
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from speculax.decode.config import GenerateConfig
from speculax.decode.inputs import check_room, pack_prompts
from speculax.decode.metrics import DecodeOutput
from speculax.models import distributed, llama, sharding
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache
from speculax.models.sharding import MeshConfig


def running(done: jax.Array, watch: jax.Array) -> jax.Array:
  """[] bool: a loop goes on while a row [b] is unfinished and no watched row is done."""
  return ~jnp.all(done) & ~jnp.any(done & watch)


def one_state(state) -> list:
  """A loop with one path (one step program) warms up from its state as it is."""
  return [state]


@dataclasses.dataclass(frozen=True)
class Program:
  extra_slots: int  # cache slots past prompt + new tokens (a speculative verify block)
  hidden_layers: tuple[int, ...]  # prefill features the start reads (() for none)
  # start(params, tokens [b, T], lengths [b], logits [b, v], hidden, cache, key, max_len,
  # budget: [] int32) -> loop state whose rows stop at `budget` new tokens (<= the config's
  # max_new_tokens, which sizes the buffers: a shorter run reuses the compiled loop).
  start: Callable[..., Any]
  # (params, state, watch [b] bool) -> state, run until every row is done or a watched one is
  # (continuous batching refills it: decode/continuous.py). The state has done [b] bool.
  loop: Callable[[Any, Any, jax.Array], Any]
  # state -> (buffer [b, W], first [b], n [b]): row i's new tokens are buffer[i, first:first + n].
  new_tokens: Callable[[Any], tuple[jax.Array, jax.Array, jax.Array]]
  # state -> the states the warm-up runs one loop step from, each with buffers of its own (the
  # loop donates its state): a loop with several step programs (goodput's, one per draft length)
  # gives one state per program, since a compiled program's first execution is slow on XLA:CPU
  # and would land in the timed run.
  warm_states: Callable[[Any], Iterable] = one_state


@functools.partial(jax.jit, static_argnames=("config", "hidden_layers"), donate_argnames=("cache",))
def prefill(params, config: LlamaConfig, tokens, lengths, cache: KVCache,
            hidden_layers: tuple[int, ...] = ()):
  """Runs the padded prompts [b, T]; returns last-position logits [b, v], the hidden states at
  `hidden_layers` for every prompt slot [l, b, T, d] (None when none are asked: drafters that
  read target features start from them) and the cache.

  Pad slots are written but the cache length is set to each prompt's true length, so they
  are invisible and get overwritten by the first generated tokens.
  """
  positions = llama.row_positions(*tokens.shape)
  logits, hidden, cache = llama.forward(params, config, tokens, positions, cache,
                                        hidden_layers=hidden_layers or (-1,),
                                        logits_at=(lengths - 1)[:, None])
  return logits[:, 0], (hidden if hidden_layers else None), cache.with_lengths(lengths)


def start(params, config: LlamaConfig, program: Program, tokens, lengths, cache: KVCache, key,
          max_len: int, budget: int):
  """The prefill of tokens [b, T] into cache, then program.start: the loop state of b rows
  (budget as a fresh array: the loop donates the state, budget and all)."""
  logits, hidden, cache = prefill(params, config, tokens, lengths, cache, program.hidden_layers)
  return program.start(params, tokens, lengths, logits, hidden, cache, key, max_len,
                       jnp.asarray(budget, jnp.int32))


def place(params, config: LlamaConfig, cache: KVCache, tokens, lengths, mesh: MeshConfig | None):
  """Puts params, cache and the batch on the mesh (if any) and unstacks the layers. In a
  multi-process run every process passes the same params and prompts and keeps its own shards.

  Decoding runs the layers as an unrolled loop over per-layer buffers (see
  `llama.unstack_layers`); params already unstacked are used as they are.
  """
  tokens, lengths = jnp.asarray(tokens), jnp.asarray(lengths)
  stacked = not isinstance(params["layers"], tuple)
  if mesh is not None:
    mesh.check_batch(tokens.shape[0], "batch size (prompts)")
    m = sharding.make_mesh(mesh)
    if stacked:
      params = sharding.shard_params(params, config, m, mesh.rules)
    cache = sharding.shard_cache(cache, m, mesh.rules)
    tokens = distributed.put_global(tokens, sharding.batch_sharding(m, mesh.rules, 2))
    lengths = distributed.put_global(lengths, sharding.batch_sharding(m, mesh.rules, 1))
  return decoding_params(params), cache, tokens, lengths


def decoding_params(params):
  """The layers unstacked for decoding (`llama.unstack_layers`); unstacked params as they are."""
  return params if isinstance(params["layers"], tuple) else llama.unstack_layers(params)


def _placed(params, config: LlamaConfig, prompts, gen: GenerateConfig, program: Program,
            key: jax.Array | None, mesh: MeshConfig | None, new_tokens: int | None):
  """run's set-up: the prompts checked and packed, params, cache and batch placed. Returns
  (params, cache, begin: (cache, budget) -> the loop state after the prefill, budget, the
  context the loop runs in)."""
  gen.check_vocab(config.vocab_size)
  budget = gen.max_new_tokens if new_tokens is None else new_tokens
  integral = isinstance(budget, numbers.Integral) and not isinstance(budget, bool)
  if not (integral and 1 <= budget <= gen.max_new_tokens):  # numpy ints are fine
    raise ValueError(f"new_tokens must be an int in [1, max_new_tokens={gen.max_new_tokens}], "
                     f"got {new_tokens!r}")
  tokens, lengths = pack_prompts(prompts, config.vocab_size, gen.prompt_bucket)
  check_room(int(lengths.max()), gen.max_new_tokens, config.max_seq_len, extra=program.extra_slots)
  max_len = tokens.shape[1] + gen.max_new_tokens + program.extra_slots
  key = jax.random.key(0) if key is None else key
  params, cache, tokens, lengths = place(
      params, config, KVCache.init(config, len(lengths), max_len, per_layer=True), tokens,
      lengths, mesh)
  begin = lambda cache, budget: start(params, config, program, tokens, lengths, cache, key,
                                     max_len, budget)
  # The attention kernel reads the mesh in context to run per shard (shard_map); XLA's own
  # attention is partitioned from the arrays' shardings alone.
  kernel_mesh = mesh is not None and config.runtime.attention_impl != "xla"
  context = jax.set_mesh(sharding.make_mesh(mesh)) if kernel_mesh else contextlib.nullcontext()
  return params, cache, begin, int(budget), context


def _warm_up(params, program: Program, begin, cache, budget: int, watch) -> None:
  """Compiles the prefill and the loop and runs one loop step (the prefill's token and one
  more) from each of program.warm_states, on a copy of the cache."""
  warm = begin(jax.tree.map(jnp.copy, cache), min(2, budget))
  for state in program.warm_states(warm):
    jax.block_until_ready(program.loop(params, state, watch))


def run(params, config: LlamaConfig, prompts, gen: GenerateConfig, program: Program,
        key: jax.Array | None, mesh: MeshConfig | None, warmup: bool,
        new_tokens: int | None = None) -> tuple[Any, DecodeOutput]:
  """Decodes `prompts` (token-id lists) with `program`; returns its final state and the
  DecodeOutput of what every decode reports (tokens, timings, target forwards).

  warmup: compile the prefill and the loop first and run one loop step (on a copy of the
  cache; one per step program of a loop with several: Program.warm_states), timed as
  compile_s, so prefill_s and decode_s measure only the run itself: the first execution of a
  compiled step is slow on XLA:CPU (an AR loop 1.28 s cold, 1.21 s warm), and a loop that ran
  no step would pay it in the timed run.
  new_tokens: this run's most new tokens per prompt (None: gen.max_new_tokens, which sizes the
  compiled loop; fewer reuse it).
  """
  params, cache, begin, budget, context = _placed(params, config, prompts, gen, program, key,
                                                  mesh, new_tokens)
  b = len(prompts)
  watch = np.zeros((b,), bool)  # a fixed batch: every row runs to its end
  with context:
    compile_s = None  # no warm-up: the timings include compiling (DecodeOutput says so)
    if warmup:
      t = time.perf_counter()
      _warm_up(params, program, begin, cache, budget, watch)
      compile_s = time.perf_counter() - t
    t0 = time.perf_counter()
    state = jax.block_until_ready(begin(cache, budget))
    t1 = time.perf_counter()
    state = jax.block_until_ready(program.loop(params, state, watch))
    t2 = time.perf_counter()
  # Rows sharded over several processes are gathered: every process returns every row.
  buffer, first, n = (distributed.to_host(x) for x in program.new_tokens(state))
  out = [buffer[i, first[i]:first[i] + n[i]].tolist() for i in range(b)]
  return state, DecodeOutput(tokens=out, prefill_s=t1 - t0, decode_s=t2 - t1,
                             forwards=int(state.forwards), compile_s=compile_s)


def step_seconds(params, config: LlamaConfig, prompts, gen: GenerateConfig, program: Program,
                 key: jax.Array | None, mesh: MeshConfig | None, new_tokens: int,
                 repeats: int) -> tuple[np.ndarray, Any]:
  """[repeats, n] seconds of one loop step over `new_tokens` new tokens from each of the n
  states program.warm_states gives (goodput's: one per draft length, that length forced),
  rounds of them in turn, after a warm-up, and the loop state the last run ended with (goodput's:
  the longest length's). Every run starts from a copy of one timed-apart prefill: timing a step
  needs no prefill of its own (a goodput calibration at batch 8 on a 2-core CPU took 108 s with
  a prefill per run, 49-51 s from one)."""
  params, cache, begin, budget, context = _placed(params, config, prompts, gen, program, key,
                                                  mesh, new_tokens)
  watch = np.zeros((len(prompts),), bool)
  times = []
  with context:
    _warm_up(params, program, begin, cache, budget, watch)
    state = jax.block_until_ready(begin(cache, budget))
    for _ in range(repeats):
      times.append([])
      # warm_states copies each state it gives (the loop donates it) where a loop has several;
      # the outer copy keeps `state` for the next round whatever the program.
      for run in program.warm_states(jax.tree.map(jnp.copy, state)):
        t = time.perf_counter()
        run = jax.block_until_ready(program.loop(params, run, watch))
        times[-1].append((time.perf_counter() - t) / max(int(run.forwards) - 1, 1))
  return np.array(times), run
