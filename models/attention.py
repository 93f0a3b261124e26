"""Grouped-query attention over a KV cache, and the mask of a new block (chain or tree) in it.

Dims: b batch, t query time, s key time (cache slots), h heads, k kv heads, g heads per kv head,
q head dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """q [b, t, h, q]; k, v [b, k, s, q]; mask [b, t, s] bool -> [b, t, h, q].

  Grouped-query: each of the k kv heads serves g = h / k query heads. Softmax in float32.
  """
  b, t, h, dq = q.shape
  kh = k.shape[1]
  qg = q.reshape(b, t, kh, h // kh, dq).astype(jnp.float32) * dq ** -0.5
  scores = jnp.einsum("btkgq,bksq->bkgts", qg, k.astype(jnp.float32))
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bkgts,bksq->bkgtq", probs, v.astype(jnp.float32))  # cache-friendly order
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, dq).astype(q.dtype)


def prefix_block_mask(lengths: jax.Array, new_mask: jax.Array, s: int) -> jax.Array:
  """[b, t, s] bool: new token i sees slots < lengths[b], and lengths[b] + j iff new_mask[b, i, j].

  lengths [b] int32 (the prefix; the block sits at slots lengths + [0, t)); new_mask [b, t, t] is
  causal for a chain and the ancestor-or-self mask for a tree.
  """
  t = new_mask.shape[-1]
  rel = jnp.arange(s)[None, :] - lengths[:, None]  # [b, s] slot - length
  in_block = (rel >= 0) & (rel < t)
  block = jnp.take_along_axis(new_mask, jnp.clip(rel, 0, t - 1)[:, None, :], axis=2)
  return (rel < 0)[:, None, :] | (in_block[:, None, :] & block)
