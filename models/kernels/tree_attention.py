"""Tree-verify attention: t new tokens (tree nodes) attend to a ragged KV-cache prefix and their
ancestors, as a Pallas kernel with online softmax over KV blocks, one backend per platform.

Dims: b batch, t query time (tree nodes), s key time (cache slots), h heads, k kv heads, g heads per
kv head, q head dim, r query rows of one kv head (t * g, padded), c slots of one KV block, u tree
columns (t, padded).

Semantics (equal to `tree_attention_reference`): query i of row b sees slots < lengths[b] and slot
lengths[b] + j iff tree_mask[b, i, j]; the new block's own K/V are already written at slots
lengths[b] + [0, t). Slots >= lengths[b] + t are stale and invisible.

Backends (one function, `backend=`; all share this wrapper's validation and layout, and the TPU
and Triton ones `tree_attention_common.attend_block`, the online-softmax step with the in-kernel
prefix+tree mask):
  - "mosaic-tpu" (tree_attention_tpu.py): grid (b, k, KV blocks), K/V streamed through VMEM one
    [c, q] block per step, lengths as scalar prefetch;
  - "mosaic-gpu" (tree_attention_mosaic_gpu.py, Hopper; JAX's default Pallas lowering on CUDA):
    grid (b, k, 64-row tiles, KV splits), one warpgroup walks its range of KV blocks, TMA-copied
    into SMEM, both matmuls `plgpu.wgmma` (16-bit: a float32 cache is cast to bf16), the tree
    mask precomputed for the few slots it can cover, since Mosaic GPU has no dot_general on
    register arrays; the ranges' partial softmaxes are merged after (split-K);
  - "triton" (tree_attention_triton.py): grid (b, k), a loop over KV blocks in each program;
    deprecated by JAX from 0.11, kept while JAX ships it (and the default on ROCm).
`backend=None` picks by platform (`default_backend`). `interpret=True` runs the chosen backend's
kernel in an interpreter on CPU (Mosaic GPU's own for "mosaic-gpu"). One program takes the g
query heads of one kv head as an [r, q] tile (64 rows of it on Mosaic GPU), so each K/V block
is read once per group (per tile), and blocks past lengths[b] + t cost no compute, so cost
follows the ragged length, not s.

Padding (done here, sliced off after): rows to r = max(16, next_pow2(t * g)) (on Mosaic GPU to
a multiple of 64, wgmma's M, instead), tree columns to u = max(16, next_pow2(t)), both cheap (q
and the mask are small). A head dim that is not a power of two >= 16 on Triton, or not a
multiple of 64 on Mosaic GPU, is padded too, which copies the cache: fine for tests, avoid it in
production (Llama head dims are 64 or 128).

Under a mesh (an abstract or concrete mesh in context: `jax.set_mesh`, `use_abstract_mesh`) the
kernel runs through `jax.shard_map`, each device on its local shard: batch over the mesh's
`BATCH_AXES`, kv heads (with their query heads) over `HEAD_AXIS`. A pallas_call is opaque to
XLA's partitioner, which would otherwise gather the whole cache onto every device. A dim that an
axis does not divide stays replicated on it (correct, just not split). With no mesh in context
the call is not split; decoding with `mesh=` (decode/engine.py) enters its mesh for the kernel
(tests/test_sharded_kernel.py).

Guarantees beyond the reference: stale slots (>= lengths[b] + t) may hold anything, NaN and inf
included, without changing the output (their scores are replaced and their values zeroed). A row
that sees no slot at all (impossible for a valid tree mask, whose diagonal is true) outputs 0,
where the reference outputs the mean of all values.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from speculax.core.fields import Checked, field
from speculax.models.attention import attention, prefix_block_mask
from speculax.models.kernels import tree_attention_mosaic_gpu as mosaic_gpu
from speculax.models.kernels.tree_attention_tpu import tree_attention_tpu
from speculax.models.kernels.tree_attention_triton import tree_attention_triton

Backend = Literal["mosaic-tpu", "mosaic-gpu", "triton"]
# Each backend's kernel: (lengths [b] int32, q [b, k, r, q], k, v [b, k, s, q], tree [b, r, u],
# *, block_kv, num_new, scale, interpret) -> [b, k, r, q]; Mosaic GPU's also takes splits.
BACKENDS = {"mosaic-tpu": tree_attention_tpu, "mosaic-gpu": mosaic_gpu.tree_attention_mosaic_gpu,
            "triton": tree_attention_triton}
# The backend `backend=None` picks on each platform (jax platform names; "cuda" as an abstract
# device names it, "gpu" as a concrete one does; Mosaic GPU is NVIDIA-only, so ROCm keeps Triton).
PLATFORM_BACKENDS = {"tpu": "mosaic-tpu", "gpu": "mosaic-gpu", "cuda": "mosaic-gpu",
                     "rocm": "triton"}
# Documented default KV block (cache slots per online-softmax step) per backend:
#   mosaic-tpu 512: each grid step costs ~0.35 us of fixed overhead on TPU, so blocks are big;
#     K/V in VMEM are 2 arrays x 2 buffers x 512 x q slots (1 MiB at q = 128 float32), far
#     below the 16 MiB scoped VMEM of a v5e.
#   mosaic-gpu 128: one warpgroup holds the [64, c] scores and the [64, q] accumulator in
#     registers (64 + 64 float32 per thread at q = 128); SMEM holds 16-bit q, two K and V
#     buffers, P and the mask slab: 176 KiB at q = 128 of the H100's 227 KiB.
#   triton 64: the [r, c] scores and [c, q] K/V tiles live in registers; 64 keeps r <= 64 rows
#     with q = 128 from spilling.
DEFAULT_BLOCK_KV = {"mosaic-tpu": 512, "mosaic-gpu": 128, "triton": 64}
_MIN_TILE = 16  # smallest tile dim the Triton dot accepts
# Mesh axes the kernel splits over (models/sharding.py's rules map batch and kv_heads to these).
BATCH_AXES = ("data", "fsdp")
HEAD_AXIS = "tensor"


def platform() -> str:
  """The platform kernels are lowered for: the abstract device's when one is named
  (`jax.sharding.use_abstract_mesh`, deviceless AOT), else JAX's default backend."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  return device.platform if device is not None else jax.default_backend()


def default_backend(interpret: bool = False) -> str:
  """The backend for this platform; in interpret mode (which runs anywhere) the TPU-style
  blocked kernel, the one furthest from the jnp reference."""
  if interpret:
    return "mosaic-tpu"
  name = platform()
  if name not in PLATFORM_BACKENDS:
    raise ValueError(f"no Pallas tree-attention backend for platform {name!r} (known: "
                     f"{sorted(PLATFORM_BACKENDS)}); run it with interpret=True "
                     f"(attention_impl='pallas-interpret') or use attention_impl='xla'")
  return PLATFORM_BACKENDS[name]


def check_backend(backend: str) -> None:
  if backend not in BACKENDS:
    raise ValueError(f"unknown tree-attention backend {backend!r}; known: {sorted(BACKENDS)}")


@dataclasses.dataclass(frozen=True)
class BlockSizes(Checked):
  # Cache slots per online-softmax step; must divide s. On mosaic-gpu an upper bound: the kernel
  # tiles by the largest divisor whose SMEM fits (tree_attention_mosaic_gpu.fitting_block).
  block_kv: int = field(128, ge=1)
  # KV ranges each (b, kv head, row tile) splits the cache into, merged after (flash-decoding's
  # split-K); mosaic-gpu only (the others walk the whole cache per program); 0: enough ranges
  # for about two waves of programs (tree_attention_mosaic_gpu.kv_splits).
  kv_splits: int = field(0, ge=0)

  @classmethod
  def get_default(cls, backend: Backend | None = None, interpret: bool = False) -> BlockSizes:
    """The documented default for `backend` (None: this platform's, see `default_backend`);
    values and reasons in `DEFAULT_BLOCK_KV`."""
    backend = backend or default_backend(interpret)
    check_backend(backend)
    return cls(DEFAULT_BLOCK_KV[backend])


def runtime_kernel(runtime) -> tuple[str, BlockSizes, bool]:
  """(backend, block sizes, interpret) that a model Runtime's attention_impl and
  attention_block_kv mean: one resolution for the cache (sized in whole blocks) and the call."""
  backend, interpret = runtime.attention_kernel()
  backend = backend or default_backend(interpret)
  block_kv = runtime.attention_block_kv
  return backend, BlockSizes(block_kv) if block_kv else BlockSizes.get_default(backend), interpret


def _tile(n: int) -> int:
  """Smallest power of two >= max(n, 16)."""
  return max(_MIN_TILE, pl.next_power_of_2(n))


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _check_block_sizes(backend: str, sizes: BlockSizes, s: int, dtype) -> None:
  """Each backend's tile rule for the KV block, divisibility of the cache length, then
  kv_splits (Mosaic GPU's alone)."""
  block_kv = sizes.block_kv
  if backend == "triton" and (block_kv < _MIN_TILE or block_kv & (block_kv - 1)):
    raise ValueError(f"block_kv={block_kv} must be a power of two >= {_MIN_TILE} on triton")
  low, high = mosaic_gpu.MIN_BLOCK, mosaic_gpu.MAX_BLOCK
  if backend == "mosaic-gpu" and (block_kv % low or block_kv > high):
    raise ValueError(f"block_kv={block_kv} must be a multiple of {low} and <= {high} on "
                     f"mosaic-gpu (wgmma tiles)")
  sublanes = 8 * 4 // min(4, jnp.dtype(dtype).itemsize)  # Mosaic's second-minor tile
  if backend == "mosaic-tpu" and block_kv % sublanes and block_kv != s:
    raise ValueError(f"block_kv={block_kv} must be a multiple of {sublanes} for a "
                     f"{jnp.dtype(dtype).name} cache on mosaic-tpu")
  if s % block_kv != 0:
    raise ValueError(f"block_kv={block_kv} does not divide the cache length s={s}")
  if sizes.kv_splits and backend != "mosaic-gpu":
    raise ValueError(f"kv_splits={sizes.kv_splits} is a mosaic-gpu setting; {backend} walks "
                     f"the whole cache per program (leave it 0)")


def _validate(q, k, v, lengths, tree_mask) -> None:
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"expected q [b, t, h, q] and k, v [b, k, s, q], got q {q.shape}, "
                     f"k {k.shape}, v {v.shape}")
  b, t, h, dq = q.shape
  kh, s = k.shape[1], k.shape[2]
  if k.shape != v.shape:
    raise ValueError(f"k {k.shape} and v {v.shape} must have the same shape")
  if k.shape[0] != b or k.shape[3] != dq:
    raise ValueError(f"k, v {k.shape} do not match q {q.shape}: expected [{b}, k, s, {dq}]")
  if kh < 1 or h % kh != 0:
    raise ValueError(f"query heads h={h} are not a multiple of kv heads k={kh}")
  if lengths.shape != (b,):
    raise ValueError(f"lengths must have shape ({b},), got {lengths.shape}")
  if tree_mask.shape != (b, t, t):
    raise ValueError(f"tree_mask must have shape ({b}, {t}, {t}), got {tree_mask.shape}")
  for name, x in (("q", q), ("k", k), ("v", v)):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"{name} must be floating point, got {x.dtype}")
  if k.dtype != v.dtype:
    raise ValueError(f"k and v must share a dtype, got {k.dtype} and {v.dtype}")
  if not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise ValueError(f"lengths must be integer, got {lengths.dtype}")
  if tree_mask.dtype != jnp.bool_:
    raise ValueError(f"tree_mask must be bool, got {tree_mask.dtype}")
  if t < 1 or s < 1:
    raise ValueError(f"need t >= 1 new tokens and s >= 1 cache slots, got t={t} s={s}")
  if not isinstance(lengths, jax.core.Tracer):  # concrete: check the values too (host side)
    bad = [int(n) for n in jax.device_get(lengths) if not 0 <= n <= s - t]
    if bad:
      raise ValueError(f"lengths {bad} leave no room for t={t} new slots in s={s} "
                       f"(need 0 <= length <= {s - t})")


@functools.partial(jax.jit, static_argnames=("backend", "block_sizes", "interpret"))
def _tree_attention(q, k, v, lengths, tree_mask, backend: str, block_sizes: BlockSizes,
                    interpret: bool):
  b, t, h, dq = q.shape
  kh = k.shape[1]
  g = h // kh
  rows, u, dp = _tile(t * g), _tile(t), dq
  if backend == "triton":
    dp = _tile(dq)
  elif backend == "mosaic-gpu":  # whole 64-row tiles, one program each: no power of two
    rows, dp = _round_up(t * g, mosaic_gpu.ROWS), _round_up(dq, mosaic_gpu.HEAD_DIM)
  # Rows of one kv head ordered (t, g): query head kh * g + gi of token ti is row ti * g + gi.
  qr = q.reshape(b, t, kh, g, dq).transpose(0, 2, 1, 3, 4).reshape(b, kh, t * g, dq)
  qr = jnp.pad(qr, ((0, 0), (0, 0), (0, rows - t * g), (0, dp - dq)))  # [b, k, r, q]
  if dp != dq:  # copies the cache: only for head dims the backend's tiles do not fit
    k = jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, dp - dq)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, dp - dq)))
  tree = jnp.repeat(tree_mask, g, axis=1).astype(jnp.float32)  # [b, t * g, t]
  tree = jnp.pad(tree, ((0, 0), (0, rows - t * g), (0, u - t)))  # [b, r, u]; padding hidden
  splits = {"splits": block_sizes.kv_splits} if backend == "mosaic-gpu" else {}
  out = BACKENDS[backend](lengths.astype(jnp.int32), qr, k, v, tree,
                          block_kv=block_sizes.block_kv, num_new=t, scale=dq ** -0.5,
                          interpret=interpret, **splits)  # [b, k, r, q]
  out = out[:, :, :t * g, :dq].reshape(b, kh, t, g, dq)
  return out.transpose(0, 2, 1, 3, 4).reshape(b, t, h, dq)


def tree_attention(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                   tree_mask: jax.Array, *, backend: Backend | None = None,
                   block_sizes: BlockSizes | None = None, interpret: bool = False) -> jax.Array:
  """Attention of t new tokens over a ragged cache prefix plus their tree ancestors.

  Args:
    q: [b, t, h, q] queries of the new tokens (tree nodes; node 0 is the root).
    k, v: [b, k, s, q] one layer's cache, the new block already written at lengths + [0, t).
    lengths: [b] int prefix length per sequence, 0 <= lengths <= s - t (checked when concrete).
    tree_mask: [b, t, t] bool, tree_mask[b, i, j]: node j is an ancestor-or-self of node i
      (causal for a chain).
    backend: one of `BACKENDS`; None picks by platform (`default_backend`).
    block_sizes: kernel tiling, None for `BlockSizes.get_default(backend)`; block_kv must divide
      s and fit the backend's tile rule; kv_splits only on mosaic-gpu.
    interpret: run the backend's kernel in the Pallas interpreter (CPU, tests).

  Returns:
    [b, t, h, q] in q.dtype; equals `tree_attention_reference` (see the module docstring for the
    extra guarantees on stale slots).
  """
  backend = backend or default_backend(interpret)
  check_backend(backend)
  block_sizes = block_sizes or BlockSizes.get_default(backend)
  _validate(q, k, v, lengths, tree_mask)
  _check_block_sizes(backend, block_sizes, k.shape[2], k.dtype)
  run = functools.partial(_tree_attention, backend=backend, block_sizes=block_sizes,
                          interpret=interpret)
  mesh = jax.sharding.get_abstract_mesh()
  batch, heads = _split_axes(mesh, q.shape[0], k.shape[1])
  if not batch and heads is None:
    return run(q, k, v, lengths, tree_mask)
  bs = batch or None
  q_spec = P(bs, None, heads, None)  # [b, t, h, q]
  kv_spec = P(bs, heads, None, None)  # [b, k, s, q]
  specs = (q_spec, kv_spec, kv_spec, P(bs), P(bs))
  args = (q, k, v, lengths, tree_mask)
  if jax.sharding.AxisType.Explicit in mesh.axis_types:  # jax >= 0.11 meshes default to it
    # On Explicit axes shard_map takes inputs already sharded as in_specs says.
    args = tuple(jax.sharding.reshard(x, spec) for x, spec in zip(args, specs))
  # Manual over the split axes only (others stay as they are, e.g. already manual in a caller's
  # shard_map); check_vma=False: pallas_call does not declare how its outputs vary over axes.
  return jax.shard_map(run, mesh=mesh, in_specs=specs, out_specs=q_spec,
                       axis_names=set(batch) | ({heads} - {None}), check_vma=False)(*args)


def _split_axes(mesh, b: int, kh: int) -> tuple[tuple[str, ...], str | None]:
  """(BATCH_AXES that split b, HEAD_AXIS if it splits kh) among the mesh's non-manual axes of
  size > 1. Query head i belongs to kv head i // g, so splitting h like k keeps each group on
  its kv head's device."""
  sizes = {n: size for n, size in mesh.shape.items()
           if size > 1 and n not in mesh.manual_axes} if not mesh.empty else {}
  batch, ways = [], 1
  for axis in BATCH_AXES:
    if axis in sizes and b % (ways * sizes[axis]) == 0:
      batch.append(axis)
      ways *= sizes[axis]
  heads = HEAD_AXIS if HEAD_AXIS in sizes and kh % sizes[HEAD_AXIS] == 0 else None
  return tuple(batch), heads


def tree_attention_reference(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                             tree_mask: jax.Array) -> jax.Array:
  """The same attention in plain jnp: the model's dense path with the prefix+tree mask."""
  return attention(q, k, v, prefix_block_mask(lengths, tree_mask, k.shape[2]))
