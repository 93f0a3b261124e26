"""Tree-verify attention on the Pallas Mosaic GPU backend (Hopper: TMA copies, wgmma).

Grid (b, k), one warpgroup per program: it takes the g query heads of one kv head as an [r, q]
tile (r a multiple of 64, wgmma's M) and walks the cache in KV blocks of c slots in two loops,
like the Triton kernel (blocks below the prefix length unmasked, then those reaching the new
tokens masked); blocks past length + t are never copied. Each block's K and V are TMA-copied
into swizzled SMEM (the operand form wgmma reads), double-buffered (block n + 1 is copied while
block n computes), both matmuls are `plgpu.wgmma` into float32 accumulators, and the online
softmax runs on the [r, c] scores in registers (Warpgroup lowering semantics, JAX's default from
0.11, infers the register layouts).

What differs from the other backends, and why:
  - wgmma multiplies 16-bit operands here: float32 ones run as tf32, which Mosaic GPU refuses
    for any transposed operand ("Only f16 WGMMA supports transposes"), and Q.K^T reads K
    transposed. So a float32 q/k/v is cast to bfloat16: a copy of the cache per call and bf16
    matmul precision. Use a bf16/f16 cache on GPU.
  - No dot_general on register arrays, so `common.attend_block`'s tree lookup (a one-hot
    matmul) cannot run in-kernel: `visibility` precomputes, outside the kernel, the [r, w] 0/1
    mask of the w = c * (1 + cdiv(t - 1, c)) slots that masked blocks can cover (from block
    lengths // c on; cheap, independent of s; 16-bit, 0/1 is exact), and each masked step
    TMA-copies its [r, c] slab.
  - `lengths` stays in global memory and is read as a scalar (a TMA copy moves >= 16 bytes).
  - P goes through SMEM to the second wgmma (not registers): slower by one [r, c] SMEM store
    per block, but the only form Mosaic GPU's interpreter runs (next point).
  - `interpret=True` runs this kernel in Mosaic GPU's own interpreter (simulated SMEM, TMA,
    barriers, wgmma) with one change: that interpreter (jax 0.10 and 0.11) cannot apply a
    transposed view (it only slices refs: `to_range` reads NDIndexer transforms, and wgmma's A
    must be an SMEM ref, which is also why P goes through SMEM),
    so K is transposed in global memory ([b, k, q, s], a cache copy) and its [q, c] blocks are
    wgmma's B directly, where the compiled kernel reads [c, q] blocks through `ref.transpose`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from speculax.models.kernels import tree_attention_common as common

ROWS = 64  # wgmma's M: query rows come in multiples of one warpgroup's tile
MIN_BLOCK, MAX_BLOCK = 64, 256  # c: K of P.V in 128-byte swizzle groups; N of Q.K^T <= 256
HEAD_DIM, MAX_HEAD_DIM = 64, 256  # q: K of Q.K^T in 128-byte swizzle groups; N of P.V <= 256
SMEM_BYTES = 227 * 1024  # an H100 block's shared memory


def _smem(shape, dtype):
  """SMEM scratch tiled and swizzled as TMA writes it and wgmma reads it."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(shape[-1] * bits)
  return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, swizzle * 8 // bits)),
                                              plgpu.SwizzleTransform(swizzle)))


def _kernel(lengths_gmem, q_gmem, k_gmem, v_gmem, vis_gmem, o_gmem, q_smem, k_bufs, v_bufs,
            vis_smem, p_smem, barriers, k_barriers, v_barriers, *, block_kv: int, num_new: int,
            scale: float, k_transposed: bool):
  """One (b, kv head). GMEM: lengths_gmem [b]; q_gmem, o_gmem [b, k, r, q]; k_gmem, v_gmem
  [b, k, s, q] (k_gmem [b, k, q, s] if k_transposed); vis_gmem [b, r, w]. SMEM: q_smem [r, q]
  (reused for the output), k_bufs [2, c, q] ([2, q, c]), v_bufs [2, c, q] (block n in buffer
  n % 2, block n + 1 copied while n computes), vis_smem, p_smem [r, c]; barriers: 2 (q, vis),
  k_barriers, v_barriers: 2 (one per buffer)."""
  bi, hi = lax.axis_index("b"), lax.axis_index("h")
  length = lengths_gmem[bi]
  rows, dq = q_smem.shape
  full = length // block_kv  # blocks entirely below length
  last = pl.cdiv(length + num_new, block_kv)  # end of the blocks reaching the new tokens (>= 1)

  def fetch(n):  # start copying block n's K and V into buffer n % 2
    buf, slots = lax.rem(n, 2), pl.ds(n * block_kv, block_kv)
    k_block = k_gmem.at[bi, hi, :, slots] if k_transposed else k_gmem.at[bi, hi, slots]
    plgpu.copy_gmem_to_smem(k_block, k_bufs.at[buf], k_barriers.at[buf])
    plgpu.copy_gmem_to_smem(v_gmem.at[bi, hi, slots], v_bufs.at[buf], v_barriers.at[buf])

  plgpu.copy_gmem_to_smem(q_gmem.at[bi, hi], q_smem, barriers.at[0])
  fetch(0)
  plgpu.barrier_wait(barriers.at[0])

  def step(n, carry, masked: bool):
    m, l, acc = carry  # [r], [r], [r, q]
    start, buf = n * block_kv, lax.rem(n, 2)
    k_smem, v_smem = k_bufs.at[buf], v_bufs.at[buf]  # [c, q] ([q, c]), [c, q]
    # The other buffer's last readers (step n - 1's wgmmas) have completed.
    pl.when(n + 1 < last)(lambda: fetch(n + 1))
    if masked:
      window = pl.ds((n - full) * block_kv, block_kv)
      plgpu.copy_gmem_to_smem(vis_gmem.at[bi, :, window], vis_smem, barriers.at[1])
    plgpu.barrier_wait(k_barriers.at[buf])

    def qk(acc_ref):
      plgpu.wgmma(acc_ref, q_smem, k_smem if k_transposed else k_smem.transpose((1, 0)))
      return acc_ref[...]  # waits for the wgmma

    scores = pl.run_scoped(qk, plgpu.ACC((rows, block_kv), jnp.float32)) * scale  # [r, c]
    if masked:
      plgpu.barrier_wait(barriers.at[1])
      visible = vis_smem[...] > 0.5  # [r, c]
      scores = jnp.where(visible, scores, common.NEG)
    m_new = jnp.maximum(m, scores.max(axis=1))  # [r]
    p = jnp.exp(scores - lax.broadcast_in_dim(m_new, scores.shape, [0]))  # [r, c]
    if masked:
      p = jnp.where(visible, p, 0.0)  # a row with nothing visible yet must add nothing
    corr = jnp.exp(m - m_new)  # [r]
    p_smem[...] = p.astype(p_smem.dtype)
    plgpu.barrier_wait(v_barriers.at[buf])
    if masked:  # zero stale values: p is 0 there, but 0 * NaN is NaN
      slot = start + lax.broadcasted_iota(jnp.int32, (block_kv, dq), 0)  # [c, q]
      v_smem[...] = jnp.where(slot < length + num_new, v_smem[...], 0).astype(v_smem.dtype)
    plgpu.commit_smem()  # make the register writes to SMEM visible to wgmma (async proxy)

    def pv(acc_ref):  # a fresh accumulator: the interpreter has no run_state (ACC.init)
      plgpu.wgmma(acc_ref, p_smem, v_smem)
      return acc_ref[...]  # waits for the wgmma: this K/V buffer and P are free again

    pv = pl.run_scoped(pv, plgpu.ACC((rows, dq), jnp.float32))  # [r, q]
    return m_new, corr * l + p.sum(axis=1), lax.broadcast_in_dim(corr, acc.shape, [0]) * acc + pv

  carry = (jnp.full((rows,), common.NEG, jnp.float32), jnp.zeros((rows,), jnp.float32),
           jnp.zeros((rows, dq), jnp.float32))
  carry = lax.fori_loop(0, full, functools.partial(step, masked=False), carry)
  _, l, acc = lax.fori_loop(full, last, functools.partial(step, masked=True), carry)
  out = acc / lax.broadcast_in_dim(jnp.where(l > 0, l, 1.0), acc.shape, [0])  # l == 0: 0
  q_smem[...] = out.astype(q_smem.dtype)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(q_smem, o_gmem.at[bi, hi])
  plgpu.wait_smem_to_gmem(0)


def smem_bytes(rows: int, dq: int, block_kv: int) -> int:
  """The kernel's SMEM scratch in bytes (2-byte elements): q, 2 x (K, V), the mask and P."""
  return 2 * (rows * dq + 4 * block_kv * dq + 2 * rows * block_kv)


def fitting_block(rows: int, dq: int, block_kv: int) -> int:
  """The largest multiple of MIN_BLOCK dividing block_kv whose scratch fits in SMEM (MIN_BLOCK if
  none does). A smaller block changes the tiling only, not the result, and still divides the
  cache, which is sized in whole block_kv blocks: so block_kv is an upper bound on this backend.
  Measured on an H100: a 64-token tree with 4 query heads per kv head and head dim 128 (r = 256)
  needs 320 KiB at block_kv=128 and fits at 64."""
  fits = [c for c in range(block_kv, MIN_BLOCK - 1, -MIN_BLOCK)
          if block_kv % c == 0 and smem_bytes(rows, dq, c) <= SMEM_BYTES]
  return fits[0] if fits else MIN_BLOCK


def visibility(lengths, tree, *, block_kv: int, num_new: int) -> jax.Array:
  """[b, r, w] 0/1 (tree's dtype): row i sees slot (lengths // c) * c + x, for the w slots masked
  blocks can cover (prefix slots: yes; slot length + j: tree[i, j]; stale slots: no)."""
  u = tree.shape[2]
  w = block_kv * (1 + pl.cdiv(num_new - 1, block_kv))
  rel = (lengths // block_kv * block_kv - lengths)[:, None] + jnp.arange(w)  # [b, w]
  cols = jnp.broadcast_to(jnp.clip(rel, 0, u - 1)[:, None, :], tree.shape[:2] + (w,))
  seen = jnp.take_along_axis(tree, cols, axis=2)  # [b, r, w]: tree[i, slot - length]
  vis = jnp.where(rel[:, None] < 0, 1, jnp.where(rel[:, None] < num_new, seen, 0))
  return vis.astype(tree.dtype)


def _interpret_params():
  # Not re-exported by jax.experimental.pallas.mosaic_gpu in jax 0.10 / 0.11.
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
  return InterpretGPUParams()


def tree_attention_mosaic_gpu(lengths, q, k, v, tree, *, block_kv: int, num_new: int,
                              scale: float, interpret: bool) -> jax.Array:
  """lengths [b] int32, q [b, k, r, q], k, v [b, k, s, q], tree [b, r, u] -> [b, k, r, q];
  r a multiple of ROWS, q of HEAD_DIM, c in [MIN_BLOCK, MAX_BLOCK] a multiple of MIN_BLOCK
  (tree_attention.py pads and checks)."""
  b, kh, rows, dq = q.shape
  if dq > MAX_HEAD_DIM:
    raise ValueError(f"head dim {dq} > {MAX_HEAD_DIM} on mosaic-gpu (wgmma's N)")
  block_kv = fitting_block(rows, dq, block_kv)
  if (smem := smem_bytes(rows, dq, block_kv)) > SMEM_BYTES:
    raise ValueError(f"r={rows} query rows and head dim {dq} need {smem} bytes of SMEM even with "
                     f"block_kv={block_kv} (> {SMEM_BYTES} on mosaic-gpu): verify fewer tokens "
                     f"at once")
  out_dtype = q.dtype
  if jnp.dtype(k.dtype).itemsize != 2:  # float32: see the module docstring
    k, v = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
  q, tree = q.astype(k.dtype), tree.astype(k.dtype)
  vis = visibility(lengths, tree, block_kv=block_kv, num_new=num_new)  # [b, r, w]
  if interpret:
    k = k.swapaxes(2, 3)  # [b, k, q, s]: see the module docstring
  kernel = functools.partial(_kernel, block_kv=block_kv, num_new=num_new, scale=scale,
                             k_transposed=interpret)
  k_block = (2, dq, block_kv) if interpret else (2, block_kv, dq)
  out = plgpu.kernel(
      kernel,
      out_type=jax.ShapeDtypeStruct(q.shape, q.dtype),
      scratch_types=[_smem((rows, dq), q.dtype), _smem(k_block, k.dtype),
                     _smem((2, block_kv, dq), k.dtype), _smem((rows, block_kv), k.dtype),
                     _smem((rows, block_kv), k.dtype), plgpu.Barrier(num_barriers=2),
                     plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=2)],
      grid=(b, kh),
      grid_names=("b", "h"),
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=_interpret_params() if interpret else None,
      kernel_name="tree_attention_mosaic_gpu",
  )(lengths, q, k, v, vis)
  return out.astype(out_dtype)
