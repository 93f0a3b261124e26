"""Continuous batching: a stream of prompts decoded `rows` at a time, each row that finishes
refilled with the next prompt while the others go on.

A fixed batch runs until its last row is done, so a row that finished early rides along in every
later step (7-25% of a speculative batch-8 run's row-steps here, README "Batch 8: finished rows
ride along"). Here the jitted loop also stops as soon as a row it was told to watch is done
(`Program.loop`'s watch mask); the host reads that row's tokens, prefills the next prompt as a
one-row batch and writes the one-row loop state into the finished row (`put_row`), and the loop
goes on. Which axis of each state leaf is the batch is found, not declared: the leaves whose
shape changes between a one-row and a two-row start (`batch_axes`). Leaves without one (the
PRNG key, counters, a goodput estimate, a Token Recycling matrix) stay the live state's, so what
the loop learns carries from request to request.
"""
from __future__ import annotations

import collections
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculax.core import fields
from speculax.decode import engine
from speculax.decode.config import GenerateConfig
from speculax.decode.inputs import check_room, pack_prompts, round_up
from speculax.decode.metrics import DecodeOutput
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache


def batch_axes(start, tokens, lengths) -> tuple[int | None, ...]:
  """Per leaf of the loop state (flattened), the axis that holds the rows, or None for a leaf
  shared by every row: where the shapes of a one-row and a two-row start differ. start(tokens
  [r, T], lengths [r]) -> state; tokens and lengths hold at least one prompt."""
  one, two = (jax.tree.leaves(jax.eval_shape(start, jnp.repeat(tokens[:1], r, 0),
                                             jnp.repeat(lengths[:1], r, 0))) for r in (1, 2))
  axes = []
  for a, b in zip(one, two):
    differ = [i for i, (m, n) in enumerate(zip(a.shape, b.shape)) if m != n]
    if len(differ) > 1:  # a leaf [b, b]: no one row of it to replace
      raise ValueError(f"a loop-state leaf of shape {a.shape} at one row has several row axes "
                       f"{differ}; continuous batching replaces one row at a time")
    axes.append(differ[0] if differ else None)
  return tuple(axes)


@functools.partial(jax.jit, static_argnames=("axes",), donate_argnums=(0,))
def put_row(state, row_state, i, axes: tuple[int | None, ...]):
  """The loop state with row i [] replaced by a one-row state's (its leaves with a row axis)."""
  leaves, tree = jax.tree.flatten(state)
  new = jax.tree.leaves(row_state)
  return jax.tree.unflatten(tree, [
      x if a is None else jax.lax.dynamic_update_slice_in_dim(x, y.astype(x.dtype), i, a)
      for x, y, a in zip(leaves, new, axes)])


def run(params, config: LlamaConfig, prompts, gen: GenerateConfig, program: engine.Program,
        rows: int, key: jax.Array | None, warmup: bool, mesh=None,
        new_tokens: int | None = None) -> tuple[object, DecodeOutput]:
  """Decodes `prompts` (token-id lists) `rows` at a time with `program`, a finished row refilled
  with the next prompt; returns the final loop state and the DecodeOutput (tokens in prompt
  order; forwards counts the first prefill and every loop step, the refills' one-row prefills
  are timed in prefill_s, as is the host's reading of finished rows).

  warmup: compile and run once, timed as compile_s, every piece the timed run uses: the first
  batch's start, a one-row start per prompt width, the row write and the loop (each branch).
  mesh, new_tokens: not with continuous batching (a ValueError when given).
  """
  fields.check("rows", rows, int, ge=1)
  if mesh is not None or new_tokens is not None:
    raise ValueError(f"continuous batching (rows={rows}) runs on one device with the config's "
                     f"max_new_tokens; got mesh={mesh}, new_tokens={new_tokens}")
  gen.check_vocab(config.vocab_size)
  tokens, lengths = pack_prompts(prompts, config.vocab_size, gen.prompt_bucket)
  check_room(int(lengths.max()), gen.max_new_tokens, config.max_seq_len, extra=program.extra_slots)
  n, b = len(lengths), min(rows, len(lengths))
  max_len = tokens.shape[1] + gen.max_new_tokens + program.extra_slots
  key = jax.random.key(0) if key is None else key
  key, refills = jax.random.split(key)  # the first batch's, and prompt j's fold_in(refills, j)
  widths = [round_up(int(m), gen.prompt_bucket) for m in lengths]
  first_width = max(widths[:b])
  params = engine.decoding_params(params)

  def start(tokens, lengths, key=key, budget=gen.max_new_tokens):  # [r, T] -> a state of r rows
    cache = KVCache.init(config, tokens.shape[0], max_len, per_layer=True)
    return engine.start(params, config, program, tokens, lengths, cache, key, max_len, budget)

  def prompt(j):  # prompt j alone, at its own width -> (tokens [1, w], lengths [1])
    return jnp.asarray(tokens[j:j + 1, :widths[j]]), jnp.asarray(lengths[j:j + 1])

  def first_batch(budget):
    return start(jnp.asarray(tokens[:b, :first_width]), jnp.asarray(lengths[:b]), budget=budget)

  axes = batch_axes(start, jnp.asarray(tokens[:1, :widths[0]]), jnp.asarray(lengths[:1]))
  watch_none, watch_all = jnp.zeros((b,), bool), jnp.ones((b,), bool)
  compile_s = None
  if warmup:
    t = time.perf_counter()
    for state in program.warm_states(first_batch(min(2, gen.max_new_tokens))):
      jax.block_until_ready(program.loop(params, state, watch_all))
    state = first_batch(gen.max_new_tokens)
    for w in sorted({widths[j] for j in range(b, n)}):
      j = widths.index(w, b)
      state = put_row(state, start(*prompt(j)), 0, axes)
    jax.block_until_ready(state)
    compile_s = time.perf_counter() - t

  t0 = time.perf_counter()
  decode_s = 0.0
  state = first_batch(gen.max_new_tokens)
  holder = list(range(b))  # the prompt each row decodes (None: done, nothing left to refill)
  queue = collections.deque(range(b, n))
  out: list[list[int] | None] = [None] * n
  while any(h is not None for h in holder):
    t = time.perf_counter()
    state = jax.block_until_ready(program.loop(params, state, watch_all if queue else watch_none))
    decode_s += time.perf_counter() - t
    done = np.asarray(state.done)
    buffer, start_at, count = (np.asarray(x) for x in program.new_tokens(state))
    for r in np.flatnonzero(done):
      if holder[r] is None:
        continue
      out[holder[r]] = buffer[r, start_at[r]:start_at[r] + count[r]].tolist()
      holder[r] = None
      if queue:
        holder[r] = queue.popleft()
        row = start(*prompt(holder[r]), key=jax.random.fold_in(refills, holder[r]))
        state = put_row(state, row, int(r), axes)
  wall = time.perf_counter() - t0
  return state, DecodeOutput(tokens=out, prefill_s=wall - decode_s, decode_s=decode_s,
                             forwards=int(state.forwards), compile_s=compile_s, batch=b)
