"""Preallocated K/V buffers with a filled length per sequence.

Two layouts of the same cache: stacked `[l, b, k, s, q]` arrays for the layer scan, or a tuple of
per-layer `[b, k, s, q]` arrays for the unrolled layer loop (see `llama.unstack_layers`). KV heads
come before slots so each (b, k) pair's keys are contiguous for the attention matmuls.

Each layer writes its new keys at slots lengths[b] + [0, t) before attending (write-then-read
lets XLA update the donated buffer in place), and `forward` advances lengths by t. Rejecting
draft tokens is then length arithmetic (`with_lengths`); stale slots are masked out.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from configs.models import LlamaConfig

CACHE_AXES = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")

Buffers = jax.Array | tuple[jax.Array, ...]  # [l, b, k, s, q] or l x [b, k, s, q]


@flax.struct.dataclass
class KVCache:
  k: Buffers
  v: Buffers
  lengths: jax.Array  # [b] int32: slots [0, lengths) hold valid keys

  @classmethod
  def init(cls, config: LlamaConfig, batch: int, max_len: int, dtype=None,
           per_layer: bool = False) -> KVCache:
    if batch < 1 or max_len < 1:
      raise ValueError(f"KVCache needs batch >= 1 and max_len >= 1, got {batch=} {max_len=}")
    shape = (batch, config.n_kv_heads, max_len, config.head_dim)
    dtype = jnp.dtype(dtype or config.dtype)
    if per_layer:
      make = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(config.n_layers))
    else:
      make = lambda: jnp.zeros((config.n_layers, *shape), dtype)
    return cls(make(), make(), jnp.zeros((batch,), jnp.int32))

  @property
  def per_layer(self) -> bool:
    return isinstance(self.k, tuple)

  @property
  def max_len(self) -> int:
    return (self.k[0] if self.per_layer else self.k).shape[-2]

  def attention_mask(self, new_mask: jax.Array) -> jax.Array:
    """[b, t, s] bool: each new token sees the valid prefix plus the new slots new_mask allows.

    new_mask [b, t, t] is causal for a chain and the ancestor mask for a tree.
    """
    t = new_mask.shape[-1]
    rel = jnp.arange(self.max_len)[None, :] - self.lengths[:, None]  # [b, s] slot - length
    in_block = (rel >= 0) & (rel < t)
    block = jnp.take_along_axis(new_mask, jnp.clip(rel, 0, t - 1)[:, None, :], axis=2)
    return (rel < 0)[:, None, :] | (in_block[:, None, :] & block)

  def with_lengths(self, lengths: jax.Array) -> KVCache:
    """Rolls back (or sets) each sequence's filled length; stale slots become invisible."""
    return self.replace(lengths=lengths.astype(jnp.int32))


def write(buf: jax.Array, new: jax.Array, lengths: jax.Array) -> jax.Array:
  """Writes new [b, t, k, q] into one layer's buf [b, k, s, q] at slots lengths[b] + [0, t).

  One scatter with explicit (batch, slot) indices; a vmapped dynamic_update_slice lowers to a
  scatter XLA CPU runs ~1000x slower at batch 8. Callers guarantee lengths + t <= s (checked at
  the public entry points); out-of-range slots are dropped, never wrapped onto valid ones.
  """
  b, t = new.shape[:2]
  rows = jnp.arange(b)[:, None]  # [b, 1]
  slots = lengths[:, None] + jnp.arange(t)[None, :]  # [b, t]
  # Advanced indices split by a slice put their broadcast dims [b, t] first (NumPy rule).
  return buf.at[rows, :, slots].set(new.astype(buf.dtype), mode="drop")
