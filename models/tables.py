"""Weights as tables of output rows, [out, in], and the product of features with one: the
layout and the form XLA:CPU multiplies fastest for the few rows of decoding and verifying.

Measured (x86_64, 2 cores, jax 0.10.2, 2026-11-25): against SmolLM2's tied 49152 x 576 head,
one dot of 2-40 feature rows ran 2-3x slower than the same product with the table cut into
slices of ~1024 rows (ms, one dot / sliced: 1 row 5.7 / 5.7, 2 rows 38 / 15, 8 rows 28 / 16,
40 rows 47 / 37; a 16384-row VocabTrim table: 2 rows 6.3 / 3.0, 8 rows 7.6 / 3.7). The layer
weights gain the same way once stored as tables: SmolLM2's 30 layers of q, o, gate, up and
down, ms at 1 / 2 / 3 / 8 / 16 rows, as loaded [in, out] 34 / 41 / 58 / 78 / 112, as tables in
3 or 6 slices 28 / 36 / 35 / 43 / 64. In the whole SmolLM2 forward (a 512-slot cache at 256),
t-token forwards over a one-token one, as loaded / as tables: t = 2 1.36 / 1.24, 5 2.26 / 1.63,
8 2.42 / 1.67 (one-token forwards 60 / 56 ms in that run). From a few hundred rows on (prefill,
training) the one dot wins (256 rows against the head: 228 / 290 ms), so only the few-row case
is sliced, and other backends always get the one dot.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculax.models.kernels import rows_cpu

SLICE_ROWS = 1024  # table rows per slice (512-2048 measured alike against the head)
MIN_SLICES = 3  # layer tables (192-1536 rows) too: unsliced, as tables they ran slower
MIN_SLICE_ROWS = 8
MAX_SLICED_ROWS = 64  # feature rows up to which the sliced form is used
PAD_FROM, PAD_ROWS_TO = 4, 8  # above 4 feature rows pad to a multiple of 8: 5-7 rows ran slower
# than 8, and 9-12 rows twice as slow as 16 (a 10-token SmolLM2 forward 5.3 one-token ones, 2.6)


@functools.cache  # asked once per dense per layer at every trace
def slices(v: int) -> int:
  """How many slices a v-row table is cut into: the divisor of v (at least MIN_SLICES, slices
  of at least MIN_SLICE_ROWS) whose slice is nearest SLICE_ROWS rows; 1 (not sliced) if none."""
  divisors = [n for n in range(MIN_SLICES, v // MIN_SLICE_ROWS + 1) if v % n == 0] or [1]
  return min(divisors, key=lambda n: (abs(math.log(v / n / SLICE_ROWS)), n))


@flax.struct.dataclass
class Q8:
  """A table [v, d] in int8 with a float32 scale per row (symmetric, round to nearest): a
  quarter of float32's bytes, for drafts that read a copy of the target's weights."""
  rows: jax.Array  # [v, d] int8
  scale: jax.Array  # [v] float32: row i is rows[i] * scale[i]

  @classmethod
  def of(cls, table: jax.Array) -> Q8:
    """table [v, d] quantized row by row (each row's largest magnitude to 127)."""
    table = table.astype(jnp.float32)
    peak = jnp.max(jnp.abs(table), axis=1)  # [v]
    scale = jnp.where(peak > 0, peak / 127, 1.0)
    return cls(jnp.round(table / scale[:, None]).astype(jnp.int8), scale)


def table_dot(features: jax.Array, table: jax.Array | Q8) -> jax.Array:
  """features [..., d] . table [v, d] over d -> [..., v] (in both dtypes' result type; a Q8
  table's products scaled row by row, float32).

  On the CPU (chosen when lowering, `platform_dependent`, so a CPU machine can still lower this
  for an accelerator), up to `rows_cpu.max_rows()` rows (56, or 8 without AVX-512) against a
  float32, bfloat16 or int8 table go to the rows kernel (models/kernels/rows_cpu.py), and up to
  MAX_SLICED_ROWS otherwise to the sliced form; other backends, and more rows, get one einsum.
  """
  if isinstance(table, Q8):
    return table_dot(features.astype(jnp.float32), table.rows) * table.scale
  m = math.prod(features.shape[:-1])
  if m > MAX_SLICED_ROWS:
    return _one_dot(features, table)
  # Decided here, not inside the branch: JAX caches a branch's trace by function, so a switch
  # read inside it would be read once per process.
  kernel = (table.dtype in rows_cpu.TABLE_DTYPES and jnp.issubdtype(features.dtype, jnp.floating)
            and rows_cpu.enabled() and m <= rows_cpu.max_rows())
  cpu = _rows_kernel_dot(rows_cpu.amx_wanted()) if kernel else _sliced_dot
  return jax.lax.platform_dependent(features, table, cpu=cpu, default=_one_dot)


def _one_dot(features: jax.Array, table: jax.Array) -> jax.Array:
  return jnp.einsum("...d,vd->...v", features, table)


@functools.cache
def _rows_kernel_dot(amx: bool):
  """The kernel's branch, one function per AMX switch (a branch's trace is cached by function).
  The kernel sums in float32 and the result takes the dtype XLA's product would."""
  def dot(features: jax.Array, table: jax.Array) -> jax.Array:
    flat = features.reshape(-1, table.shape[1]).astype(jnp.float32)
    out = rows_cpu.rows_dot(flat, table, amx).astype(jnp.result_type(features, table))
    return out.reshape(*features.shape[:-1], table.shape[0])
  return dot


def _sliced_dot(features: jax.Array, table: jax.Array) -> jax.Array:
  """features [..., d] . table [v, d] -> [..., v] as XLA:CPU runs it fastest.

  Sliced, the table is [n, v/n, d] (a free reshape) and the product is asked for as
  [n, rows, v/n], then moved to [rows, v]: jnp.einsum then puts the table on the dot's left, and
  XLA:CPU runs that fast. Unsliced, or written as a dot_general giving [n, v/n, rows] reshaped by
  hand, it ran 2-10x slower.
  """
  v, d = table.shape
  lead = features.shape[:-1]
  m = math.prod(lead)
  flat = features.reshape(m, d)
  n = slices(v)
  if n == 1:
    out = _one_dot(flat, table)
  else:
    if m > PAD_FROM and m % PAD_ROWS_TO:
      flat = jnp.pad(flat, ((0, PAD_ROWS_TO - m % PAD_ROWS_TO), (0, 0)))
    out = jnp.einsum("md,nrd->nmr", flat, table.reshape(n, v // n, d))  # [n, m padded, v/n]
    out = jnp.moveaxis(out, 0, -2)[:m].reshape(m, v)
  return out.reshape(*lead, v)


@flax.struct.dataclass
class Table:
  """A dense weight stored as its output rows (`as_table`), for `dense`."""
  rows: jax.Array  # [out, in], each flattened
  out_shape: tuple[int, ...] = flax.struct.field(pytree_node=False)


def as_table(w: jax.Array, n_in: int) -> Table:
  """A weight as loaded, w [in..., out...] whose first n_in axes are contracted, as a Table
  (a transposed copy)."""
  return Table(w.reshape(math.prod(w.shape[:n_in]), -1).T, tuple(w.shape[n_in:]))


def dense(x: jax.Array, w: jax.Array | Table, n_in: int) -> jax.Array:
  """x [..., in...] contracted with w over its last n_in axes -> [..., out...], w as loaded
  ([in..., out...], one einsum) or a Table."""
  lead = x.shape[:x.ndim - n_in]
  if isinstance(w, Table):
    return table_dot(x.reshape(*lead, -1), w.rows).reshape(*lead, *w.out_shape)
  ins, outs = "abcdefgh"[:n_in], "abcdefgh"[n_in:w.ndim]
  return jnp.einsum(f"...{ins},{ins}{outs}->...{outs}", x, w)


@flax.struct.dataclass
class Fused:
  """Dense weights that contract the same input, their output rows in one table (`fuse`): one
  product gives every weight's output, each the sums its own table gives (the rows kernel
  computes an output row the same way whatever other rows share the table). Fewer, larger calls:
  a one-token int8 draft step of SmolLM2 pays ~10-40 us a call beyond the bytes it reads."""
  rows: jax.Array | Q8  # [sum of the weights' outputs, in]
  out_shapes: tuple[tuple[int, ...], ...] = flax.struct.field(pytree_node=False)


def fuse(tables: Sequence[Table]) -> Fused:
  """Tables of the same input size (all arrays of one dtype, or all Q8) as one Fused."""
  rows = [t.rows for t in tables]
  kinds = {"int8 (Q8)" if isinstance(r, Q8) else str(r.dtype) for r in rows}
  sizes = {(r.rows if isinstance(r, Q8) else r).shape[1] for r in rows}
  if len(kinds) != 1 or len(sizes) != 1:
    raise ValueError(f"fuse takes tables of one kind and input size, got {sorted(kinds)} tables "
                     f"of input sizes {sorted(sizes)}")
  joined = jax.tree.map(lambda *parts: jnp.concatenate(parts), *rows)  # an array or a Q8
  return Fused(joined, tuple(t.out_shape for t in tables))


def dense_fused(x: jax.Array, w: Fused) -> list[jax.Array]:
  """x [..., in] through each weight of w -> one output [..., out...] per weight."""
  lead = x.shape[:-1]
  out = table_dot(x, w.rows)  # [..., sum of outs]
  ends = np.cumsum([math.prod(s) for s in w.out_shapes])[:-1]
  return [part.reshape(*lead, *s) for part, s in zip(jnp.split(out, ends, axis=-1), w.out_shapes)]
