"""The arrays that pass between the decode loop, drafters and verifiers.

TargetView: what a drafter sees of the target (its params, cache and the token history).
Draft: what a drafter proposes (a chain of k tokens or a tree of n nodes, and their law q).
Verified: what one verify step scored and kept, for drafters that learn from it.

Invariant shared with the loop: `view.history[b, :lengths[b]]` holds the prompt and every token
emitted so far; the target cache holds all of them but the last (the pending token the next
verify step feeds first). A drafter may write the target cache only at slots >= lengths - 1:
the verify forward overwrites those.

Dims: b batch, S history slots, k chain drafts, n tree nodes, v vocab, l feature layers, d model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import jax.numpy as jnp

if TYPE_CHECKING:  # a type only: core stays below the model layer
  from speculax.models.kvcache import KVCache


@flax.struct.dataclass
class TargetView:
  params: Any  # target params (layers unstacked)
  cache: KVCache
  history: jax.Array  # [b, S] int32
  lengths: jax.Array  # [b] int32 valid tokens in history
  # In `init` only, for drafters with `hidden_layers`: the prefill's hidden states there at every
  # prompt slot [l, b, T, d] (slots past a row's prompt hold padding); None elsewhere.
  prompt_hidden: jax.Array | None = None

  @property
  def pending(self) -> jax.Array:
    """[b] int32 each row's last token: the one the next verify step feeds first."""
    return self.history[jnp.arange(self.history.shape[0]), self.lengths - 1]


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
  next_token: jax.Array  # [b] int32 the target's token after them (correction or bonus)

  @property
  def plain(self) -> bool:
    """Static: the step checked no drafts (goodput-driven length chose k = 0), so the block is
    the pending token alone and the drafter proposed nothing for it."""
    return self.block.shape[1] == 1

  @property
  def kept(self) -> jax.Array:
    """[b, depth] int32 the kept path's tokens (valid up to n_accepted)."""
    return jnp.take_along_axis(self.block, self.path[:, 1:], 1)
