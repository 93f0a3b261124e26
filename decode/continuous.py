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
import dataclasses
import functools
import time
from typing import Any, Iterator

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


@dataclasses.dataclass
class Finished:
  """A row done: prompt `index`'s new tokens. `state` is the loop state as the row finished
  (row `row` holds it), valid until the stream goes on; `seconds` the stream's own time so far
  (loop steps, refills, reads; not the time its consumer spent between rows)."""
  index: int
  tokens: list[int]
  state: Any
  row: int
  seconds: float


class Stream:
  """`prompts` (token-id lists) decoded `rows` at a time with `program`, a finished row refilled
  with the next prompt; iterating yields a `Finished` per prompt, in finishing order.

  program: may be replaced between rows (same shapes: an online learner's new drafter params),
  later loop steps and refills run the new one.
  warmup: compile and run once, timed as compile_s, every piece the timed run uses: the first
  batch's start, a one-row start per prompt width, the row write and the loop (each step program).
  After the iteration: `state` the final loop state, `seconds` and `decode_s` (its loop steps)
  the stream's own time.
  """

  def __init__(self, params, config: LlamaConfig, prompts, gen: GenerateConfig,
               program: engine.Program, rows: int, key: jax.Array | None, warmup: bool):
    fields.check("rows", rows, int, ge=1)
    gen.check_vocab(config.vocab_size)
    self.tokens, self.lengths = pack_prompts(prompts, config.vocab_size, gen.prompt_bucket)
    check_room(int(self.lengths.max()), gen.max_new_tokens, config.max_seq_len,
               extra=program.extra_slots)
    self.params, self.config, self.gen, self.program = (engine.decoding_params(params), config,
                                                        gen, program)
    self.n, self.batch = len(self.lengths), min(rows, len(self.lengths))
    self.max_len = self.tokens.shape[1] + gen.max_new_tokens + program.extra_slots
    key = jax.random.key(0) if key is None else key
    # The first batch's key, and prompt j's fold_in(refills, j).
    self.key, self.refills = jax.random.split(key)
    self.widths = [round_up(int(m), gen.prompt_bucket) for m in self.lengths]
    self.axes = batch_axes(self._start, *self._prompt(0))
    self.seconds = self.decode_s = 0.0
    self.compile_s = self.state = None
    if warmup:
      t = time.perf_counter()
      for state in program.warm_states(self._first_batch(min(2, gen.max_new_tokens))):
        jax.block_until_ready(program.loop(self.params, state, jnp.ones((self.batch,), bool)))
      state = self._first_batch(gen.max_new_tokens)
      for w in sorted({self.widths[j] for j in range(self.batch, self.n)}):
        state = put_row(state, self._start(*self._prompt(self.widths.index(w, self.batch))), 0,
                        self.axes)
      jax.block_until_ready(state)
      self.compile_s = time.perf_counter() - t

  def _start(self, tokens, lengths, key=None, budget=None):  # [r, T] -> a state of r rows
    cache = KVCache.init(self.config, tokens.shape[0], self.max_len, per_layer=True)
    return engine.start(self.params, self.config, self.program, tokens, lengths, cache,
                        self.key if key is None else key, self.max_len,
                        self.gen.max_new_tokens if budget is None else budget)

  def _prompt(self, j):  # prompt j alone, at its own width -> (tokens [1, w], lengths [1])
    return (jnp.asarray(self.tokens[j:j + 1, :self.widths[j]]),
            jnp.asarray(self.lengths[j:j + 1]))

  def _first_batch(self, budget):
    b = self.batch
    width = max(self.widths[:b])
    return self._start(jnp.asarray(self.tokens[:b, :width]), jnp.asarray(self.lengths[:b]),
                       budget=budget)

  def __iter__(self) -> Iterator[Finished]:
    t = time.perf_counter()
    watch_all, watch_none = jnp.ones((self.batch,), bool), jnp.zeros((self.batch,), bool)
    # Blocked here, so the prefills count in prefill_s, not in the next loop call's decode_s.
    state = jax.block_until_ready(self._first_batch(self.gen.max_new_tokens))
    holder = list(range(self.batch))  # the prompt each row decodes (None: done, none to refill)
    queue = collections.deque(range(self.batch, self.n))
    while any(h is not None for h in holder):
      step = time.perf_counter()
      state = jax.block_until_ready(
          self.program.loop(self.params, state, watch_all if queue else watch_none))
      self.decode_s += time.perf_counter() - step
      done = np.asarray(state.done)
      buffer, start_at, count = (np.asarray(x) for x in self.program.new_tokens(state))
      for r in np.flatnonzero(done):
        if holder[r] is None:
          continue
        self.seconds += time.perf_counter() - t
        yield Finished(holder[r], buffer[r, start_at[r]:start_at[r] + count[r]].tolist(), state,
                       int(r), self.seconds)
        t = time.perf_counter()
        holder[r] = queue.popleft() if queue else None
        if holder[r] is not None:
          row = self._start(*self._prompt(holder[r]),
                            key=jax.random.fold_in(self.refills, holder[r]))
          state = jax.block_until_ready(put_row(state, row, int(r), self.axes))
    self.state, self.seconds = state, self.seconds + time.perf_counter() - t


def run(params, config: LlamaConfig, prompts, gen: GenerateConfig, program: engine.Program,
        rows: int, key: jax.Array | None, warmup: bool, mesh=None,
        new_tokens: int | None = None) -> tuple[object, DecodeOutput]:
  """Decodes `prompts` (token-id lists) `rows` at a time with `program` (a `Stream`); returns
  the final loop state and the DecodeOutput (tokens in prompt order; forwards counts the first
  prefill and every loop step, the refills' one-row prefills are timed in prefill_s, as is the
  host's reading of finished rows).

  mesh, new_tokens: not with continuous batching (a ValueError when given).
  """
  if mesh is not None or new_tokens is not None:
    raise ValueError(f"continuous batching (rows={rows}) runs on one device with the config's "
                     f"max_new_tokens; got mesh={mesh}, new_tokens={new_tokens}")
  stream = Stream(params, config, prompts, gen, program, rows, key, warmup)
  out: list[list[int] | None] = [None] * stream.n
  for f in stream:
    out[f.index] = f.tokens
  return stream.state, DecodeOutput(
      tokens=out, prefill_s=stream.seconds - stream.decode_s, decode_s=stream.decode_s,
      forwards=int(stream.state.forwards), compile_s=stream.compile_s, batch=stream.batch)
