"""The math the Mosaic TPU and Triton backends share: one online-softmax step over a block of
cache slots, with the prefix+tree mask built in-kernel, and the final normalisation. (Mosaic GPU
shares only NEG: its matmuls are wgmma on SMEM refs, see tree_attention_mosaic_gpu.py.)

Dims as in tree_attention.py: r query rows of one kv head (t * g, padded), q head dim, c slots of
one KV block, u tree columns (t, padded). Running state is kept 2-D ([r, 1], not [r]) because
Mosaic TPU lays out rank-1 vectors poorly and both backends accept the 2-D form.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

NEG = -0.7 * float(jnp.finfo(jnp.float32).max)  # hidden score: finite, exp(NEG - m) == 0

Carry = tuple[jax.Array, jax.Array, jax.Array]  # running max [r, 1], sum [r, 1], acc [r, q]


def dot_nt(a: jax.Array, b: jax.Array) -> jax.Array:
  """a [m, n] . b [p, n]^T -> [m, p] float32."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def dot_nn(a: jax.Array, b: jax.Array) -> jax.Array:
  """a [m, n] . b [n, p] -> [m, p] float32."""
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def init_carry(rows: int, head_dim: int) -> Carry:
  return (jnp.full((rows, 1), NEG, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
          jnp.zeros((rows, head_dim), jnp.float32))


def attend_block(carry: Carry, q: jax.Array, k: jax.Array, v: jax.Array, tree: jax.Array,
                 start, length, num_new: int, masked: bool) -> Carry:
  """One online-softmax step of the rows q [r, q] (scaled, float32) over slots [start, start + c).

  k, v: [c, q] that block of the cache; tree: [r, u] float32 0/1 tree rows. Unmasked blocks lie
  entirely below `length` (every slot visible). Masked ones overlap the new block: slot
  length + j is visible iff tree[i, j], and stale slots (>= length + num_new) are hidden with
  their values zeroed, since a stale value may be NaN and 0 * NaN is NaN.
  """
  m, l, acc = carry
  block_kv, u = k.shape[0], tree.shape[1]
  k, v = k.astype(jnp.float32), v.astype(jnp.float32)
  scores = dot_nt(q, k)  # [r, c]
  if masked:
    slot = start + lax.broadcasted_iota(jnp.int32, (1, block_kv), 1)  # [1, c]
    rel = slot - length  # [1, c]
    # Gather-free tree lookup: a one-hot [u, c] of (slot - length) times the tree rows gives
    # tree[i, slot - length] per row and slot (an exact 0/1 matmul).
    onehot = (rel == lax.broadcasted_iota(jnp.int32, (u, block_kv), 0)).astype(jnp.float32)
    visible = (rel < 0) | (dot_nn(tree, onehot) > 0.5)  # [r, c]
    scores = jnp.where(visible, scores, NEG)
    fresh = lax.broadcasted_iota(jnp.int32, (block_kv, 1), 0) + start < length + num_new
    v = jnp.where(fresh, v, 0.0)  # [c, q]
  m_new = jnp.maximum(m, scores.max(axis=1, keepdims=True))  # [r, 1]
  p = jnp.exp(scores - m_new)  # [r, c]
  if masked:
    p = jnp.where(visible, p, 0.0)  # a row with nothing visible yet must add nothing
  corr = jnp.exp(m - m_new)  # [r, 1]
  return m_new, corr * l + p.sum(axis=1, keepdims=True), corr * acc + dot_nn(p, v)


def finish(carry: Carry, dtype) -> jax.Array:
  """acc / l as dtype [r, q]; a row that saw nothing (l == 0) gives 0."""
  _, l, acc = carry
  return (acc / jnp.where(l > 0, l, 1.0)).astype(dtype)
