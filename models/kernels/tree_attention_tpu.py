"""Tree-verify attention on the Pallas Mosaic TPU backend: K/V streamed through VMEM in blocks.

Grid (b, k, n) with n over the s / c KV blocks (innermost, sequential). Each step's K/V block
[c, q] is DMA'd into VMEM by the Pallas pipeline (double-buffered), so VMEM holds
2 x 2 x c x q elements of K/V whatever the cache length. The online-softmax state lives in VMEM
scratch across the n steps: set at n == 0, written out at the last n. `lengths` is scalar
prefetch (SMEM), read by the index maps as well as the body: the K/V index map clamps n to the
last block that reaches the new tokens, so blocks past lengths[b] + t repeat the previous block
index and Pallas skips their copy; their steps do no compute.

Mosaic tile rules: the last two block dims must be multiples of (8, 128) or equal the array's;
here q, tree and output blocks are whole in those dims, and a K/V block is [c, q] with c a
multiple of 8 (16 for 16-bit caches) and q the full head dim.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from speculax.models.kernels import tree_attention_common as common


def _last_block(length, num_new: int, block_kv: int):
  """Index of the last KV block holding a slot < length + num_new (the last one the rows see)."""
  return (length + num_new - 1) // block_kv


def _kernel(lengths_ref, q_ref, k_ref, v_ref, tree_ref, o_ref, m_ref, l_ref, acc_ref, *,
            block_kv: int, num_new: int, scale: float):
  """One (b, kv head, kv block): lengths_ref [b] (SMEM); q_ref [r, q]; k_ref, v_ref [c, q];
  tree_ref [r, u]; scratch m_ref, l_ref [r, 1], acc_ref [r, q]."""
  n = pl.program_id(2)
  length = lengths_ref[pl.program_id(0)]
  start = n * block_kv

  @pl.when(n == 0)
  def _init():
    m_ref[...], l_ref[...], acc_ref[...] = common.init_carry(*acc_ref.shape)

  def attend(masked: bool):
    q = q_ref[...].astype(jnp.float32) * scale  # [r, q]
    carry = (m_ref[...], l_ref[...], acc_ref[...])
    carry = common.attend_block(carry, q, k_ref[...], v_ref[...], tree_ref[...], start, length,
                                num_new, masked)
    m_ref[...], l_ref[...], acc_ref[...] = carry

  below = start + block_kv <= length  # every slot of the block is prefix
  pl.when(below)(functools.partial(attend, False))
  pl.when(~below & (n <= _last_block(length, num_new, block_kv)))(
      functools.partial(attend, True))

  @pl.when(n == pl.num_programs(2) - 1)
  def _write():
    o_ref[...] = common.finish((m_ref[...], l_ref[...], acc_ref[...]), o_ref.dtype)


def tree_attention_tpu(lengths, q, k, v, tree, *, block_kv: int, num_new: int, scale: float,
                       interpret: bool) -> jax.Array:
  """lengths [b] int32, q [b, k, r, q], k, v [b, k, s, q], tree [b, r, u] -> [b, k, r, q]."""
  b, kh, rows, dq = q.shape
  s, u = k.shape[2], tree.shape[2]

  def kv_map(i, j, n, lengths_ref):  # no copy past the last needed block: repeat its index
    return i, j, jnp.minimum(n, _last_block(lengths_ref[i], num_new, block_kv)), 0

  kernel = functools.partial(_kernel, block_kv=block_kv, num_new=num_new, scale=scale)
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1,
      grid=(b, kh, s // block_kv),
      in_specs=[
          pl.BlockSpec((None, None, rows, dq), lambda i, j, n, _: (i, j, 0, 0)),  # q -> [r, q]
          pl.BlockSpec((None, None, block_kv, dq), kv_map),  # k -> [c, q]
          pl.BlockSpec((None, None, block_kv, dq), kv_map),  # v -> [c, q]
          pl.BlockSpec((None, rows, u), lambda i, j, n, _: (i, 0, 0)),  # tree -> [r, u]
      ],
      out_specs=pl.BlockSpec((None, None, rows, dq), lambda i, j, n, _: (i, j, 0, 0)),
      scratch_shapes=[pltpu.VMEM((rows, 1), jnp.float32), pltpu.VMEM((rows, 1), jnp.float32),
                      pltpu.VMEM((rows, dq), jnp.float32)],
  )
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      grid_spec=grid_spec,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      interpret=interpret,
      name="tree_attention_tpu",
  )(lengths, q, k, v, tree)
