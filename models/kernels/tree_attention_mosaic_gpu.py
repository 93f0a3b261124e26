"""Tree-verify attention on the Pallas Mosaic GPU backend (Hopper: TMA copies, wgmma).

Grid (b, k, row tiles, KV splits), one warpgroup per program: it takes a 64-row tile (wgmma's M)
of the [r, q] query rows of one kv head (its g query heads x t nodes) and walks one contiguous
range of the cache's KV blocks of c slots, in two loops like the Triton kernel (blocks below the
prefix length unmasked, then those reaching the new tokens masked); blocks past length + t are
never copied. The ranges split [0, cdiv(length + t, c)) evenly per sequence, so a short
sequence's blocks spread over the programs as a long one's do. Each program writes its rows'
partial output (normalised over its range) and log-sum-exp, and `merge_splits` combines them
(flash-decoding's split-K). Why split: at (b, k) alone, one Llama-3-8B sequence is 8 programs on
an H100's 132 SMs, each walking the whole cache, and a 64-node tree's 256 rows ran as 4 wgmma
tiles in turn in one program; the 2026-11-27 H100 run measured that grid 1.35-4.3x slower than
XLA (README "Second GPU run"). `kv_splits` picks how many ranges: enough for about
`TARGET_PROGRAMS` programs, at most one per KV block of the cache.

Each block's K and V are TMA-copied into swizzled SMEM (the operand form wgmma reads),
double-buffered (block n + 1 is copied while block n computes), both matmuls are `plgpu.wgmma`
into float32 accumulators, and the online softmax runs on the [64, c] scores in registers
(Warpgroup lowering semantics, JAX's default from 0.11, infers the register layouts).

What differs from the other backends, and why:
  - wgmma multiplies 16-bit operands here: float32 ones run as tf32, which Mosaic GPU refuses
    for any transposed operand ("Only f16 WGMMA supports transposes"), and Q.K^T reads K
    transposed. So a float32 q/k/v is cast to bfloat16: a copy of the cache per call and bf16
    matmul precision. Use a bf16/f16 cache on GPU. The partial outputs are 16-bit too (the
    merge weighs them in float32).
  - No dot_general on register arrays, so `common.attend_block`'s tree lookup (a one-hot
    matmul) cannot run in-kernel: `visibility` precomputes, outside the kernel, the [r, w] 0/1
    mask of the w = c * (1 + cdiv(t - 1, c)) slots that masked blocks can cover (from block
    lengths // c on; cheap, independent of s; 16-bit, 0/1 is exact), and each masked step
    TMA-copies its [64, c] slab.
  - `lengths` stays in global memory and is read as a scalar (a TMA copy moves >= 16 bytes).
  - P goes through SMEM to the second wgmma (not registers): slower by one [64, c] SMEM store
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

ROWS = 64  # wgmma's M: one program's query rows (r is padded to a multiple)
MIN_BLOCK, MAX_BLOCK = 64, 256  # c: K of P.V in 128-byte swizzle groups; N of Q.K^T <= 256
HEAD_DIM, MAX_HEAD_DIM = 64, 256  # q: K of Q.K^T in 128-byte swizzle groups; N of P.V <= 256
SMEM_BYTES = 227 * 1024  # an H100 block's shared memory
TARGET_PROGRAMS = 2 * 132  # two waves of an H100's 132 SMs


def _smem(shape, dtype):
  """SMEM scratch tiled and swizzled as TMA writes it and wgmma reads it."""
  bits = jnp.dtype(dtype).itemsize * 8
  swizzle = plgpu.find_swizzle(shape[-1] * bits)
  return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, swizzle * 8 // bits)),
                                              plgpu.SwizzleTransform(swizzle)))


def _kernel(lengths_gmem, q_gmem, k_gmem, v_gmem, vis_gmem, o_gmem, lse_gmem, q_smem, k_bufs,
            v_bufs, vis_smem, p_smem, lse_smem, barriers, k_barriers, v_barriers, *,
            block_kv: int, num_new: int, splits: int, scale: float, k_transposed: bool):
  """One (b, kv head, row tile, KV range). GMEM: lengths_gmem [b]; q_gmem [b, k, r, q];
  k_gmem, v_gmem [b, k, s, q] (k_gmem [b, k, q, s] if k_transposed); vis_gmem [b, r, w];
  o_gmem [splits, b, k, r, q]; lse_gmem [splits, b, k, r] float32. SMEM: q_smem [64, q] (reused
  for the output), k_bufs [2, c, q] ([2, q, c]), v_bufs [2, c, q] (block n in buffer n % 2,
  block n + 1 copied while n computes), vis_smem, p_smem [64, c], lse_smem [64]; barriers: 2
  (q, vis), k_barriers, v_barriers: 2 (one per buffer)."""
  bi, head, split = lax.axis_index("b"), lax.axis_index("h"), lax.axis_index("s")
  tile = pl.ds(lax.axis_index("t") * ROWS, ROWS)  # this program's query rows
  length = lengths_gmem[bi]
  dq = q_smem.shape[1]
  full = length // block_kv  # blocks entirely below length
  last = pl.cdiv(length + num_new, block_kv)  # end of the blocks reaching the new tokens (>= 1)
  per = pl.cdiv(last, splits)
  first = jnp.minimum(split * per, last)  # this program's blocks: [first, stop), maybe none
  stop = jnp.minimum(first + per, last)
  mid = jnp.clip(full, first, stop)  # [first, mid) unmasked, [mid, stop) masked

  def fetch(n):  # start copying block n's K and V into buffer n % 2
    buf, slots = lax.rem(n, 2), pl.ds(n * block_kv, block_kv)
    k_block = k_gmem.at[bi, head, :, slots] if k_transposed else k_gmem.at[bi, head, slots]
    plgpu.copy_gmem_to_smem(k_block, k_bufs.at[buf], k_barriers.at[buf])
    plgpu.copy_gmem_to_smem(v_gmem.at[bi, head, slots], v_bufs.at[buf], v_barriers.at[buf])

  plgpu.copy_gmem_to_smem(q_gmem.at[bi, head, tile], q_smem, barriers.at[0])
  pl.when(first < stop)(lambda: fetch(first))
  plgpu.barrier_wait(barriers.at[0])

  def step(n, carry, masked: bool):
    m, l, acc = carry  # [64], [64], [64, q]
    start, buf = n * block_kv, lax.rem(n, 2)
    k_smem, v_smem = k_bufs.at[buf], v_bufs.at[buf]  # [c, q] ([q, c]), [c, q]
    # The other buffer's last readers (step n - 1's wgmmas) have completed.
    pl.when(n + 1 < stop)(lambda: fetch(n + 1))
    if masked:
      window = pl.ds((n - full) * block_kv, block_kv)
      plgpu.copy_gmem_to_smem(vis_gmem.at[bi, tile, window], vis_smem, barriers.at[1])
    plgpu.barrier_wait(k_barriers.at[buf])

    def qk(acc_ref):
      plgpu.wgmma(acc_ref, q_smem, k_smem if k_transposed else k_smem.transpose((1, 0)))
      return acc_ref[...]  # waits for the wgmma

    scores = pl.run_scoped(qk, plgpu.ACC((ROWS, block_kv), jnp.float32)) * scale  # [64, c]
    if masked:
      plgpu.barrier_wait(barriers.at[1])
      visible = vis_smem[...] > 0.5  # [64, c]
      scores = jnp.where(visible, scores, common.NEG)
    m_new = jnp.maximum(m, scores.max(axis=1))  # [64]
    p = jnp.exp(scores - lax.broadcast_in_dim(m_new, scores.shape, [0]))  # [64, c]
    if masked:
      p = jnp.where(visible, p, 0.0)  # a row with nothing visible yet must add nothing
    corr = jnp.exp(m - m_new)  # [64]
    p_smem[...] = p.astype(p_smem.dtype)
    plgpu.barrier_wait(v_barriers.at[buf])
    if masked:  # zero stale values: p is 0 there, but 0 * NaN is NaN
      slot = start + lax.broadcasted_iota(jnp.int32, (block_kv, dq), 0)  # [c, q]
      v_smem[...] = jnp.where(slot < length + num_new, v_smem[...], 0).astype(v_smem.dtype)
    plgpu.commit_smem()  # make the register writes to SMEM visible to wgmma (async proxy)

    def pv(acc_ref):  # a fresh accumulator: the interpreter has no run_state (ACC.init)
      plgpu.wgmma(acc_ref, p_smem, v_smem)
      return acc_ref[...]  # waits for the wgmma: this K/V buffer and P are free again

    pv = pl.run_scoped(pv, plgpu.ACC((ROWS, dq), jnp.float32))  # [64, q]
    return m_new, corr * l + p.sum(axis=1), lax.broadcast_in_dim(corr, acc.shape, [0]) * acc + pv

  carry = (jnp.full((ROWS,), common.NEG, jnp.float32), jnp.zeros((ROWS,), jnp.float32),
           jnp.zeros((ROWS, dq), jnp.float32))
  carry = lax.fori_loop(first, mid, functools.partial(step, masked=False), carry)
  m, l, acc = lax.fori_loop(mid, stop, functools.partial(step, masked=True), carry)
  seen = l > 0  # a range with nothing visible (or no blocks) outputs 0 and weighs nothing
  out = acc / lax.broadcast_in_dim(jnp.where(seen, l, 1.0), acc.shape, [0])
  q_smem[...] = out.astype(q_smem.dtype)
  lse_smem[...] = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), common.NEG)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(q_smem, o_gmem.at[split, bi, head, tile])
  plgpu.copy_smem_to_gmem(lse_smem, lse_gmem.at[split, bi, head, tile])
  plgpu.wait_smem_to_gmem(0)


def smem_bytes(dq: int, block_kv: int) -> int:
  """One program's SMEM scratch in bytes (2-byte elements): q, 2 x (K, V), the mask and P, and
  the float32 log-sum-exp of its 64 rows."""
  return 2 * (ROWS * dq + 4 * block_kv * dq + 2 * ROWS * block_kv) + 4 * ROWS


def fitting_block(dq: int, block_kv: int) -> int:
  """The largest multiple of MIN_BLOCK dividing block_kv whose scratch fits in SMEM. A smaller
  block changes the tiling only, not the result, and still divides the cache, which is sized in
  whole block_kv blocks: so block_kv is an upper bound on this backend. Every head dim up to
  MAX_HEAD_DIM fits at MIN_BLOCK (176 KiB at 256)."""
  return next(c for c in range(block_kv, MIN_BLOCK - 1, -MIN_BLOCK)
              if block_kv % c == 0 and smem_bytes(dq, c) <= SMEM_BYTES)


def kv_splits(programs: int, blocks: int) -> int:
  """KV ranges per (b, kv head, row tile) for about TARGET_PROGRAMS programs in all, at most one
  per block of the cache (`blocks`) and at least one."""
  return max(1, min(blocks, -(-TARGET_PROGRAMS // programs)))


def merge_splits(out: jax.Array, lse: jax.Array) -> jax.Array:
  """out [n, ...rows, q] partial outputs, each normalised over its KV range, lse [n, ...rows]
  their log-sum-exps -> [...rows, q] float32: the softmax over all ranges. A row no range saw
  (all NEG) merges to 0 (every weight 1, every output 0)."""
  weight = jnp.exp(lse - lse.max(axis=0))  # [n, ...rows]
  total = (weight[..., None] * out.astype(jnp.float32)).sum(axis=0)
  return total / weight.sum(axis=0)[..., None]


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
                              scale: float, interpret: bool, splits: int = 0) -> jax.Array:
  """lengths [b] int32, q [b, k, r, q], k, v [b, k, s, q], tree [b, r, u] -> [b, k, r, q];
  r a multiple of ROWS, q of HEAD_DIM, c in [MIN_BLOCK, MAX_BLOCK] a multiple of MIN_BLOCK
  (tree_attention.py pads and checks); splits: KV ranges per row tile, 0 for `kv_splits`."""
  b, kh, rows, dq = q.shape
  if dq > MAX_HEAD_DIM:
    raise ValueError(f"head dim {dq} > {MAX_HEAD_DIM} on mosaic-gpu (wgmma's N)")
  block_kv = fitting_block(dq, block_kv)
  tiles = rows // ROWS
  splits = splits or kv_splits(b * kh * tiles, k.shape[2] // block_kv)
  out_dtype = q.dtype
  if jnp.dtype(k.dtype).itemsize != 2:  # float32: see the module docstring
    k, v = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
  q, tree = q.astype(k.dtype), tree.astype(k.dtype)
  vis = visibility(lengths, tree, block_kv=block_kv, num_new=num_new)  # [b, r, w]
  if interpret:
    k = k.swapaxes(2, 3)  # [b, k, q, s]: see the module docstring
  kernel = functools.partial(_kernel, block_kv=block_kv, num_new=num_new, splits=splits,
                             scale=scale, k_transposed=interpret)
  k_block = (2, dq, block_kv) if interpret else (2, block_kv, dq)
  out, lse = plgpu.kernel(
      kernel,
      out_type=(jax.ShapeDtypeStruct((splits, *q.shape), q.dtype),
                jax.ShapeDtypeStruct((splits, b, kh, rows), jnp.float32)),
      scratch_types=[_smem((ROWS, dq), q.dtype), _smem(k_block, k.dtype),
                     _smem((2, block_kv, dq), k.dtype), _smem((ROWS, block_kv), k.dtype),
                     _smem((ROWS, block_kv), k.dtype), plgpu.SMEM((ROWS,), jnp.float32),
                     plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=2),
                     plgpu.Barrier(num_barriers=2)],
      grid=(b, kh, tiles, splits),
      grid_names=("b", "h", "t", "s"),
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=_interpret_params() if interpret else None,
      kernel_name="tree_attention_mosaic_gpu",
  )(lengths, q, k, v, vis)  # [splits, b, k, r, q], [splits, b, k, r]
  return (out[0] if splits == 1 else merge_splits(out, lse)).astype(out_dtype)
