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

from speculax.models.attention import prefix_block_mask
from speculax.models.config import LlamaConfig
from speculax.models.kernels.tree_attention import runtime_kernel

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
    rt = config.runtime
    if rt.attention_impl != "xla":  # the kernel walks whole blocks of slots
      block = runtime_kernel(rt)[1].block_kv
      max_len = -(-max_len // block) * block
    shape = (batch, config.n_kv_heads, max_len, config.head_dim)
    dtype = jnp.dtype(dtype or rt.cache_dtype or rt.dtype)
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
    """[b, t, s] bool: each new token sees the valid prefix plus the block slots new_mask allows.

    new_mask [b, t, u], u >= t, covers the last u slots up to the new tokens' own: [b, t, t] is
    causal for a chain or the ancestor mask for a tree; u > t adds the tree nodes already in the
    cache (a drafter feeding its tree level by level), which only their descendants may see.
    """
    t, u = new_mask.shape[-2:]
    return prefix_block_mask(self.lengths - (u - t), new_mask, self.max_len)

  def gather_path(self, start: jax.Array, path: jax.Array) -> KVCache:
    """Moves the kept tree path into contiguous slots: slot start + i <- slot start + path[:, i].

    start [b] is the root's slot and a node's slot is start + its index; path [b, m] node
    indices. Lengths are unchanged (set them with `with_lengths`).
    """
    rows = jnp.arange(path.shape[0])[:, None]
    src = start[:, None] + path  # [b, m]

    def move(buf):  # [b, k, s, q]
      return write(buf, buf[rows, :, src], start)  # buf[rows, :, src]: [b, m, k, q]

    if self.per_layer:
      return self.replace(k=tuple(map(move, self.k)), v=tuple(map(move, self.v)))
    return self.replace(k=jax.vmap(move)(self.k), v=jax.vmap(move)(self.v))

  def with_lengths(self, lengths: jax.Array) -> KVCache:
    """Rolls back (or sets) each sequence's filled length; stale slots become invisible."""
    return self.replace(lengths=lengths.astype(jnp.int32))


def write(buf: jax.Array, new: jax.Array, lengths: jax.Array) -> jax.Array:
  """Writes new [b, t, k, q] into one layer's buf [b, k, s, q] at slots lengths[b] + [0, t).

  One scatter with explicit (batch, slot) indices; a vmapped dynamic_update_slice lowers to a
  scatter XLA CPU runs ~1000x slower at batch 8. Callers guarantee lengths + t <= s (checked at
  the public entry points); out-of-range slots are dropped, never wrapped onto valid ones.

  A one-token write gets a second row aimed past the buffer (dropped): XLA:CPU turns a
  one-index scatter into a dynamic-update-slice, duplicates it into the attention's fusion, and
  then copies every layer's K and V buffers around the two (four copies per buffer per step:
  ~4 ms of a 41 ms SmolLM2 decode step at batch 1, measured in a profile, 2026-11-25). A
  two-index scatter stays one in-place scatter.
  """
  b, t = new.shape[:2]
  rows = jnp.arange(b)[:, None]  # [b, 1]
  slots = lengths[:, None] + jnp.arange(t)[None, :]  # [b, t]
  if t == 1:  # a second, dropped row keeps it a scatter (see above)
    new = jnp.concatenate([new, new], axis=1)
    slots = jnp.concatenate([slots, jnp.full_like(slots, buf.shape[2])], axis=1)
  # Advanced indices split by a slice put their broadcast dims [b, t] first (NumPy rule).
  return buf.at[rows, :, slots].set(new.astype(buf.dtype), mode="drop")
