"""Tree-verify attention: t new tokens (tree nodes) attend to a ragged KV-cache prefix and their
ancestors, as a Pallas kernel with online softmax over KV blocks.

Dims: b batch, t query time (tree nodes), s key time (cache slots), h heads, k kv heads, g heads per
kv head, q head dim, r query rows of one kv head (t * g, padded), c slots of one KV block, u tree
columns (t, padded).

Semantics (equal to `tree_attention_reference`): query i of row b sees slots < lengths[b] and slot
lengths[b] + j iff tree_mask[b, i, j]; the new block's own K/V are already written at slots
lengths[b] + [0, t). Slots >= lengths[b] + t are stale and invisible.

Kernel: grid (b, k). One program takes the g query heads of one kv head together as an [r, q] tile,
so each K/V block is read once per group. It runs an online softmax (running max, running sum and
accumulator in float32) over KV blocks of `block_kv` slots, in two loops:
  - blocks entirely below lengths[b]: every slot visible, no mask;
  - blocks overlapping [lengths[b], lengths[b] + t): mask built in-kernel. The tree part is
    gather-free: a one-hot [u, c] of (slot - length) times the [r, u] tree rows gives, per row and
    slot, tree_mask[i, slot - length] (an exact 0/1 matmul).
Blocks past lengths[b] + t are never visited, so cost follows the ragged length, not s.

Padding (done in the wrapper, sliced off after): rows to r = max(16, next_pow2(t * g)), tree
columns to u = max(16, next_pow2(t)), both cheap (q and the mask are small), so tiles are powers of
two of at least 16 as the Triton GPU backend's loads and dots want. A head dim that is not a power
of two >= 16 is padded too, which copies the cache: fine for tests, avoid it in production (Llama
head dims are 64 or 128). On Triton, also pick block_kv a power of two >= 16.

Guarantees beyond the reference: stale slots (>= lengths[b] + t) may hold anything, NaN and inf
included, without changing the output (their scores are replaced and their values zeroed). A row
that sees no slot at all (impossible for a valid tree mask, whose diagonal is true) outputs 0,
where the reference outputs the mean of all values.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from speculax.core.fields import Checked, field
from speculax.models.attention import attention, prefix_block_mask

_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)  # hidden score: finite, exp(_NEG - m) == 0
_MIN_TILE = 16  # smallest tile dim the Triton dot accepts


@dataclasses.dataclass(frozen=True)
class BlockSizes(Checked):
  block_kv: int = field(128, ge=1)  # cache slots per online-softmax step; must divide s


def _tile(n: int) -> int:
  """Smallest power of two >= max(n, 16)."""
  return max(_MIN_TILE, pl.next_power_of_2(n))


def _dot_nt(a: jax.Array, b: jax.Array) -> jax.Array:
  """a [m, n] . b [p, n]^T -> [m, p] float32."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_nn(a: jax.Array, b: jax.Array) -> jax.Array:
  """a [m, n] . b [n, p] -> [m, p] float32."""
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _tree_attention_kernel(lengths_ref, q_ref, k_ref, v_ref, tree_ref, o_ref, *, block_kv: int,
                           num_new: int, scale: float):
  """One (b, kv head): lengths_ref [] ; q_ref [r, q]; k_ref, v_ref [s, q]; tree_ref [r, u]."""
  length = lengths_ref[()]
  q = q_ref[...].astype(jnp.float32) * scale  # [r, q]
  tree = tree_ref[...]  # [r, u] float32 0/1
  rows, u = tree.shape
  num_blocks = k_ref.shape[0] // block_kv
  end = length + num_new  # first stale slot

  def step(i, carry, masked: bool):
    m, l, acc = carry  # [r], [r], [r, q]
    start = pl.multiple_of(i * block_kv, block_kv)
    k = k_ref[pl.ds(start, block_kv), :].astype(jnp.float32)  # [c, q]
    v = v_ref[pl.ds(start, block_kv), :].astype(jnp.float32)  # [c, q]
    scores = _dot_nt(q, k)  # [r, c]
    if masked:
      slot = start + lax.broadcasted_iota(jnp.int32, (1, block_kv), 1)  # [1, c]
      rel = slot - length  # [1, c]
      onehot = (rel == lax.broadcasted_iota(jnp.int32, (u, block_kv), 0)).astype(jnp.float32)
      visible = (rel < 0) | (_dot_nn(tree, onehot) > 0.5)  # [r, c]
      scores = jnp.where(visible, scores, _NEG)
      v = jnp.where(slot.reshape(block_kv, 1) < end, v, 0.0)  # stale values may be NaN
    m_new = jnp.maximum(m, scores.max(axis=1))  # [r]
    p = jnp.exp(scores - m_new[:, None])  # [r, c]
    if masked:
      p = jnp.where(visible, p, 0.0)  # a row with nothing visible yet must add nothing
    corr = jnp.exp(m - m_new)  # [r]
    l = corr * l + p.sum(axis=1)
    acc = corr[:, None] * acc + _dot_nn(p, v)
    return m_new, l, acc

  carry = (jnp.full((rows,), _NEG, jnp.float32), jnp.zeros((rows,), jnp.float32),
           jnp.zeros(q.shape, jnp.float32))
  full = jnp.clip(length // block_kv, 0, num_blocks)  # blocks entirely below length
  last = jnp.clip(pl.cdiv(end, block_kv), full, num_blocks)  # blocks reaching the new block
  carry = lax.fori_loop(0, full, functools.partial(step, masked=False), carry)
  _, l, acc = lax.fori_loop(full, last, functools.partial(step, masked=True), carry)
  o_ref[...] = (acc / jnp.where(l > 0, l, 1.0)[:, None]).astype(o_ref.dtype)


def _validate(q, k, v, lengths, tree_mask, block_sizes: BlockSizes) -> None:
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
  block_kv = block_sizes.block_kv
  if block_kv < 1:
    raise ValueError(f"block_kv={block_kv} must be >= 1")
  if s % block_kv != 0:
    raise ValueError(f"block_kv={block_kv} does not divide the cache length s={s}")
  if not isinstance(lengths, jax.core.Tracer):  # concrete: check the values too (host side)
    bad = [int(n) for n in jax.device_get(lengths) if not 0 <= n <= s - t]
    if bad:
      raise ValueError(f"lengths {bad} leave no room for t={t} new slots in s={s} "
                       f"(need 0 <= length <= {s - t})")


@functools.partial(jax.jit, static_argnames=("block_sizes", "interpret"))
def _tree_attention(q, k, v, lengths, tree_mask, block_sizes: BlockSizes, interpret: bool):
  b, t, h, dq = q.shape
  kh, s = k.shape[1], k.shape[2]
  g = h // kh
  rows, u, dp = _tile(t * g), _tile(t), _tile(dq)
  # Rows of one kv head ordered (t, g): query head kh * g + gi of token ti is row ti * g + gi.
  qr = q.reshape(b, t, kh, g, dq).transpose(0, 2, 1, 3, 4).reshape(b, kh, t * g, dq)
  qr = jnp.pad(qr, ((0, 0), (0, 0), (0, rows - t * g), (0, dp - dq)))  # [b, k, r, q]
  if dp != dq:  # copies the cache: only for head dims that are not a power of two >= 16
    k = jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, dp - dq)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, 0), (0, dp - dq)))
  tree = jnp.repeat(tree_mask, g, axis=1).astype(jnp.float32)  # [b, t * g, t]
  tree = jnp.pad(tree, ((0, 0), (0, rows - t * g), (0, u - t)))  # [b, r, u]; padding hidden
  kernel = functools.partial(_tree_attention_kernel, block_kv=block_sizes.block_kv, num_new=t,
                             scale=dq ** -0.5)
  out = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((b, kh, rows, dp), q.dtype),
      grid=(b, kh),
      in_specs=[
          pl.BlockSpec((None,), lambda i, j: (i,)),  # lengths -> []
          pl.BlockSpec((None, None, rows, dp), lambda i, j: (i, j, 0, 0)),  # q -> [r, q]
          pl.BlockSpec((None, None, s, dp), lambda i, j: (i, j, 0, 0)),  # k -> [s, q]
          pl.BlockSpec((None, None, s, dp), lambda i, j: (i, j, 0, 0)),  # v -> [s, q]
          pl.BlockSpec((None, rows, u), lambda i, j: (i, 0, 0)),  # tree -> [r, u]
      ],
      out_specs=pl.BlockSpec((None, None, rows, dp), lambda i, j: (i, j, 0, 0)),
      interpret=interpret,
      name="tree_attention",
  )(lengths.astype(jnp.int32), qr, k, v, tree)  # [b, k, r, q]
  out = out[:, :, :t * g, :dq].reshape(b, kh, t, g, dq)
  return out.transpose(0, 2, 1, 3, 4).reshape(b, t, h, dq)


def tree_attention(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                   tree_mask: jax.Array, *, block_sizes: BlockSizes = BlockSizes(),
                   interpret: bool = False) -> jax.Array:
  """Attention of t new tokens over a ragged cache prefix plus their tree ancestors.

  Args:
    q: [b, t, h, q] queries of the new tokens (tree nodes; node 0 is the root).
    k, v: [b, k, s, q] one layer's cache, the new block already written at lengths + [0, t).
    lengths: [b] int prefix length per sequence, 0 <= lengths <= s - t (checked when concrete).
    tree_mask: [b, t, t] bool, tree_mask[b, i, j]: node j is an ancestor-or-self of node i
      (causal for a chain).
    block_sizes: kernel tiling; block_kv must divide s.
    interpret: run the kernel in the Pallas interpreter (CPU, tests).

  Returns:
    [b, t, h, q] in q.dtype; equals `tree_attention_reference` (see the module docstring for the
    extra guarantees on stale slots).
  """
  _validate(q, k, v, lengths, tree_mask, block_sizes)
  return _tree_attention(q, k, v, lengths, tree_mask, block_sizes, interpret)


def tree_attention_reference(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array,
                             tree_mask: jax.Array) -> jax.Array:
  """The same attention in plain jnp: the model's dense path with the prefix+tree mask."""
  return attention(q, k, v, prefix_block_mask(lengths, tree_mask, k.shape[2]))
