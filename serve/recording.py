"""What verification already computed, kept for learning: the target's top-k law of emitted tokens.

Online adaptation (train/online.py) distils the drafter on target distributions that the verify
steps computed anyway. `Recording(drafter)` wraps any drafter: it drafts exactly as the wrapped
one (so the decode loop, and every output token, is unchanged) and, in `update`, writes the
target's top-k log-probs for tokens the step emitted into buffers indexed by history slot: slot
j holds the target's law of the token at slot j (given slots < j), at temperature 1. By default
only where a draft was rejected (the token that replaced it); `all_positions` records every
emitted token. The first token after the prompt comes from the prefill and is never recorded.

Dims: b batch, s history slots, n block nodes, K top-k.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculax.core.fields import field
from speculax.core.types import TargetView, Verified
from speculax.drafters.wrapped import Wrapped


@flax.struct.dataclass
class RecordState:
  inner: Any  # the wrapped drafter's state
  start: jax.Array  # [b] int32 history length when the step began
  ids: jax.Array  # [b, s, K] int32 top-k ids of the target's law of the token at each slot
  logprobs: jax.Array  # [b, s, K] float32 their log-probs
  recorded: jax.Array  # [b, s] bool


@dataclasses.dataclass(frozen=True)
class Recording(Wrapped):
  """Drafts, verifies and updates exactly as `drafter`; records on the side."""
  top_k: int = field(32, ge=1)
  all_positions: bool = False  # False: only where a draft was rejected

  def inner(self, state: RecordState):
    return state.inner

  def with_inner(self, state: RecordState, inner) -> RecordState:
    return state.replace(inner=inner)

  def check(self, target, params, k: int) -> None:
    if not 1 <= self.top_k <= target.vocab_size:
      raise ValueError(f"recording top_k must be in [1, vocab size {target.vocab_size}], "
                       f"got {self.top_k}")
    self.drafter.check(target, params, k)

  def init(self, params, view: TargetView, config, max_len: int) -> RecordState:
    b, s = view.history.shape
    return RecordState(inner=self.drafter.init(params, view, config, max_len), start=view.lengths,
                       ids=jnp.zeros((b, s, self.top_k), jnp.int32),
                       logprobs=jnp.zeros((b, s, self.top_k), jnp.float32),
                       recorded=jnp.zeros((b, s), bool))

  def propose(self, params, state: RecordState, view: TargetView, key, config, k: int, sampling):
    draft, inner, view = self.drafter.propose(params, state.inner, view, key, config, k,
                                              sampling)
    return draft, state.replace(inner=inner, start=view.lengths), view

  def update(self, params, state: RecordState, view: TargetView,
             verified: Verified) -> RecordState:
    inner = self.drafter.update(params, state.inner, view, verified)
    b, width = verified.path.shape  # width: most tokens one step emits (depth + 1)
    n_acc = verified.n_accepted
    n_emit = view.lengths - state.start  # [b] after the budget / EOS cut; 0 for finished rows
    if self.all_positions:
      at = jnp.broadcast_to(jnp.arange(width), (b, width))  # [b, m] emitted token index
      keep = at < n_emit[:, None]
    else:  # the token after the accepted prefix, when a draft stood there
      at = n_acc[:, None]
      keep = (at < n_emit[:, None]) & (at < width - 1)
    nodes = jnp.take_along_axis(verified.path, at, 1)  # [b, m] block nodes scored there
    logits = jnp.take_along_axis(verified.logits, nodes[:, :, None], 1)  # [b, m, v]
    logprobs, ids = jax.lax.top_k(jax.nn.log_softmax(logits.astype(jnp.float32)), self.top_k)
    slots = jnp.where(keep, state.start[:, None] + at, state.recorded.shape[1])  # past: dropped
    rows = jnp.arange(b)[:, None]
    return state.replace(
        inner=inner, ids=state.ids.at[rows, slots].set(ids.astype(jnp.int32), mode="drop"),
        logprobs=state.logprobs.at[rows, slots].set(logprobs, mode="drop"),
        recorded=state.recorded.at[rows, slots].set(True, mode="drop"))
