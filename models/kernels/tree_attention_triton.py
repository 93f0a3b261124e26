"""Tree-verify attention on the Pallas Triton GPU backend (deprecated by JAX from 0.11; kept while
JAX ships it).

Grid (b, k). One program takes the g query heads of one kv head as an [r, q] tile and walks the
cache in KV blocks of c slots with `lax.fori_loop`, in two loops (blocks entirely below the
prefix length, unmasked; then the blocks reaching the new tokens, masked). Blocks past
length + t are never visited, so cost follows the ragged length, not s. The whole [s, q] K/V
slab is the block: on GPU a block is only a pointer into global memory, loads happen per step.
Triton wants power-of-two tiles of at least 16 (rows, tree columns, head dim, block_kv).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from speculax.models.kernels import tree_attention_common as common


def _kernel(lengths_ref, q_ref, k_ref, v_ref, tree_ref, o_ref, *, block_kv: int, num_new: int,
            scale: float):
  """One (b, kv head): lengths_ref [] ; q_ref [r, q]; k_ref, v_ref [s, q]; tree_ref [r, u]."""
  length = lengths_ref[()]
  q = q_ref[...].astype(jnp.float32) * scale  # [r, q]
  tree = tree_ref[...]  # [r, u]
  num_blocks = k_ref.shape[0] // block_kv

  def step(i, carry, masked: bool):
    start = pl.multiple_of(i * block_kv, block_kv)
    k = k_ref[pl.ds(start, block_kv), :]  # [c, q]
    v = v_ref[pl.ds(start, block_kv), :]  # [c, q]
    return common.attend_block(carry, q, k, v, tree, start, length, num_new, masked)

  full = jnp.clip(length // block_kv, 0, num_blocks)  # blocks entirely below length
  last = jnp.clip(pl.cdiv(length + num_new, block_kv), full, num_blocks)  # reaching the new ones
  carry = common.init_carry(*q.shape)
  carry = lax.fori_loop(0, full, functools.partial(step, masked=False), carry)
  carry = lax.fori_loop(full, last, functools.partial(step, masked=True), carry)
  o_ref[...] = common.finish(carry, o_ref.dtype)


def tree_attention_triton(lengths, q, k, v, tree, *, block_kv: int, num_new: int, scale: float,
                          interpret: bool) -> jax.Array:
  """lengths [b] int32, q [b, k, r, q], k, v [b, k, s, q], tree [b, r, u] -> [b, k, r, q]."""
  b, kh, rows, dq = q.shape
  s, u = k.shape[2], tree.shape[2]
  kernel = functools.partial(_kernel, block_kv=block_kv, num_new=num_new, scale=scale)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      grid=(b, kh),
      in_specs=[
          pl.BlockSpec((None,), lambda i, j: (i,)),  # lengths -> []
          pl.BlockSpec((None, None, rows, dq), lambda i, j: (i, j, 0, 0)),  # q -> [r, q]
          pl.BlockSpec((None, None, s, dq), lambda i, j: (i, j, 0, 0)),  # k -> [s, q]
          pl.BlockSpec((None, None, s, dq), lambda i, j: (i, j, 0, 0)),  # v -> [s, q]
          pl.BlockSpec((None, rows, u), lambda i, j: (i, 0, 0)),  # tree -> [r, u]
      ],
      out_specs=pl.BlockSpec((None, None, rows, dq), lambda i, j: (i, j, 0, 0)),
      compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name="tree_attention_triton",
  )(lengths, q, k, v, tree)
