"""The drafter protocol the decode loop calls without knowing the drafter's kind.

A drafter is a small frozen dataclass (static, hashable: it is a jit static argument) plus a
pytree state that rides in the loop state. Arrays a drafter reads but never changes (a draft
model's weights) are its `params`, passed apart from the donated loop state.

Invariant shared with the loop: `view.history[b, :lengths[b]]` holds the prompt and every token
emitted so far; the target cache holds all of them but the last (the pending token the next
verify step feeds first). A drafter may write the target cache only at slots >= lengths - 1:
the verify forward overwrites those.
"""
from __future__ import annotations

from typing import Any, Protocol

import flax.struct
import jax

from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache


class Drafter(Protocol):
  tree: Any  # decode.trees.StaticTree | DynamicTree, or None for a chain of k drafts
  # Optional: hidden_layers, the target features `Verified.hidden` carries (default (-1,):
  # the final-normed features) and `TargetView.prompt_hidden` holds in `init` (head drafters
  # read them; drafters without the attribute get no prompt features).

  def check(self, target: LlamaConfig, params, k: int) -> None:
    """Host-side validation before anything is compiled; raises ValueError naming the value."""

  def prepare(self, params):
    """Host-side, once per call: the drafter's params in the form `propose` reads."""

  def init(self, params, view: TargetView, config: LlamaConfig, max_len: int) -> Any:
    """State after the target's prefill (history holds the prompt and the first new token)."""

  def propose(self, params, state, view: TargetView, key: jax.Array, config: LlamaConfig,
              k: int, sampling) -> tuple[Draft, Any, TargetView]:
    """k draft tokens continuing each row of view.history."""

  def update(self, params, state, view: TargetView, verified: Verified) -> Any:
    """After verification: view has the new history and lengths."""


class Stateless:
  """Defaults for chain drafters without params or state of their own (subclass, add propose)."""
  tree = None

  def check(self, target: LlamaConfig, params, k: int) -> None:
    pass

  def prepare(self, params):
    return params

  def init(self, params, view: TargetView, config: LlamaConfig, max_len: int):
    return ()

  def update(self, params, state, view: TargetView, verified: Verified):
    return state
