"""Preallocated per-layer K/V buffers with a filled length per sequence.

The forward pass never writes the cache inside the layer scan: it attends to the cached prefix
plus the new block, returns the new block's K/V, and `append` writes them in one scatter at each
sequence's own length. Rejecting draft tokens is then length arithmetic (`with_lengths`).
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from configs.models import LlamaConfig

CACHE_AXES = ("layers", "batch", "cache_seq", "kv_heads", "head_dim")


@flax.struct.dataclass
class KVCache:
  k: jax.Array  # [l, b, s, k, q]
  v: jax.Array  # [l, b, s, k, q]
  lengths: jax.Array  # [b] int32: slots [0, lengths) hold valid keys

  @classmethod
  def init(cls, config: LlamaConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    if batch < 1 or max_len < 1:
      raise ValueError(f"KVCache needs batch >= 1 and max_len >= 1, got {batch=} {max_len=}")
    shape = (config.n_layers, batch, max_len, config.n_kv_heads, config.head_dim)
    dtype = jnp.dtype(dtype or config.dtype)
    return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch,), jnp.int32))

  @property
  def max_len(self) -> int:
    return self.k.shape[2]

  def visible(self) -> jax.Array:  # [b, s] bool
    return jnp.arange(self.max_len)[None, :] < self.lengths[:, None]

  def append(self, k_new: jax.Array, v_new: jax.Array) -> KVCache:
    """Writes k_new/v_new [l, b, t, k, q] at slots lengths[b] + [0, t); lengths += t.

    Callers guarantee lengths + t <= max_len (validated at the public entry points):
    dynamic_update_slice would otherwise clamp the start and overwrite valid slots.
    """
    write = jax.vmap(lambda buf, new, start: jax.lax.dynamic_update_slice_in_dim(buf, new, start, 1),
                     in_axes=(1, 1, 0), out_axes=1)
    t = k_new.shape[2]
    return self.replace(k=write(self.k, k_new.astype(self.k.dtype), self.lengths),
                        v=write(self.v, v_new.astype(self.v.dtype), self.lengths),
                        lengths=self.lengths + t)

  def with_lengths(self, lengths: jax.Array) -> KVCache:
    """Rolls back (or sets) each sequence's filled length; stale slots become invisible."""
    return self.replace(lengths=lengths.astype(jnp.int32))
