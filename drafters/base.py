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

from configs.models import LlamaConfig
from models.kvcache import KVCache


@flax.struct.dataclass
class TargetView:
  params: Any  # target params (layers unstacked)
  cache: KVCache
  history: jax.Array  # [b, S] int32
  lengths: jax.Array  # [b] int32 valid tokens in history
  # In `init` only, for drafters with `hidden_layers`: the prefill's hidden states there at every
  # prompt slot [l, b, T, d] (slots past a row's prompt hold padding); None elsewhere.
  prompt_hidden: jax.Array | None = None


@flax.struct.dataclass
class Draft:
  """k chain drafts, or the n draft nodes of a tree (node i + 1 is tokens[:, i]; 0 is the root)."""
  tokens: jax.Array  # [b, k or n] int32
  # [b, k or n, v] the law each draft was drawn from: the drafter's q after the sampling
  # transform (a tree node's: its parent's q before siblings are removed); None = one-hot.
  probs: jax.Array | None
  parents: jax.Array | None = None  # [b, n + 1] int32 tree parents (root -1); None = a chain
  # [b] int32 in [1, k]: a chain's drafts to verify, the rest count as rejected (adaptive
  # draft length); None = all k.
  length: jax.Array | None = None


@flax.struct.dataclass
class Verified:
  """What one verify step saw and kept, for drafters that learn from it or keep their own cache."""
  block: jax.Array  # [b, n + 1] int32 tokens the target scored: the pending token, then drafts
  logits: jax.Array  # [b, n + 1, v] the target's logits at each of them
  hidden: jax.Array  # [len(drafter.hidden_layers), b, n + 1, d] the target's features there
  path: jax.Array  # [b, depth + 1] int32 kept block nodes from the root (a chain: 0, 1, ...)
  n_accepted: jax.Array  # [b] int32 drafts kept


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
