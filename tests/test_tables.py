"""models/tables: the sliced dot and Tables equal one dot against the weight as loaded; an int8
table (Q8) is its table rounded row by row, and its product the rounded table's."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.models.kernels import rows_cpu
from speculax.models.tables import (MAX_SLICED_ROWS, Q8, as_table, dense, dense_fused, fuse, slices,
                                    table_dot)


def lowered_for_cpu(fn, *args) -> str:
  return jax.jit(fn).lower(*args).as_text()


def dot_lhs_shapes(text: str) -> list[tuple]:
  """The left operand's shape of every dot_general in a lowered module's text."""
  lhs = re.findall(r"stablehlo\.dot_general.*: \(tensor<([^>]*)>", text)
  return [tuple(int(n) for n in shape.split("x")[:-1]) for shape in lhs]


@pytest.mark.parametrize("v, n", [(49152, 48), (16384, 16), (4096, 4), (3000, 3), (576, 3),
                                  (64, 4), (16, 1), (1031, 1)])
def test_slices_near_1024_rows_dividing_the_table(v, n):
  assert slices(v) == n and v % n == 0


@pytest.mark.parametrize("lead", [(1,), (2,), (1, 5), (8, 5), (4, 40)])
def test_equals_one_dot_against_numpy(lead, monkeypatch):
  monkeypatch.setenv(rows_cpu.SWITCH, "0")  # XLA's forms (the rows kernel: test_rows_cpu.py)
  rng = np.random.default_rng(0)
  table = rng.standard_normal((4096, 32)).astype(np.float32)
  features = rng.standard_normal((*lead, 32)).astype(np.float32)
  out = np.asarray(jax.jit(table_dot)(features, table))
  ref = features.astype(np.float64) @ table.astype(np.float64).T
  assert out.shape == (*lead, 4096)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)
  # the form taken: sliced for few rows on CPU, one dot past the cut-off
  sliced = np.prod(lead) <= MAX_SLICED_ROWS
  lhs = (4, 1024, 32) if sliced else features.shape
  assert dot_lhs_shapes(lowered_for_cpu(lambda f, t: table_dot(f, t), features, table)) == [lhs]


@pytest.mark.parametrize("w_shape, n_in", [((32, 4, 8), 1), ((4, 8, 32), 2), ((32, 96), 1)])
@pytest.mark.parametrize("lead", [(1, 1), (1, 3), (2, 5), (1, 12)])  # 10, 12 rows: padded
def test_dense_with_a_table_equals_the_weight_as_loaded(w_shape, n_in, lead):
  rng = np.random.default_rng(1)
  w = rng.standard_normal(w_shape).astype(np.float32)
  x = rng.standard_normal((*lead, *w_shape[:n_in])).astype(np.float32)
  table = as_table(jnp.asarray(w), n_in)
  assert table.rows.shape == (np.prod(w_shape[n_in:]), np.prod(w_shape[:n_in]))
  got = np.asarray(jax.jit(dense, static_argnums=2)(x, table, n_in))
  want = np.asarray(dense(x, jnp.asarray(w), n_in))
  ref = np.tensordot(x.astype(np.float64), w.astype(np.float64), n_in)
  assert got.shape == want.shape == (*lead, *w_shape[n_in:])
  np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_q8_rounds_each_row_to_127_steps_of_its_largest_magnitude():
  table = np.random.default_rng(0).standard_normal((50, 40)).astype(np.float32)
  table[3] = 0  # a zero row: scale 1, all zeros, no division by zero
  table[4] *= 1000
  q = Q8.of(jnp.asarray(table))
  rows, scale = np.asarray(q.rows), np.asarray(q.scale)
  assert rows.dtype == np.int8 and rows.shape == (50, 40) and scale.shape == (50,)
  assert np.abs(rows).max(axis=1)[np.arange(50) != 3].min() == 127
  assert scale[3] == 1 and not rows[3].any()
  assert (np.abs(rows * scale[:, None] - table) <= scale[:, None] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("rows, switch", [(1, "1"), (8, "1"), (8, "0"), (MAX_SLICED_ROWS + 1, "1")])
def test_q8_table_dot_is_the_rounded_tables_product(monkeypatch, rows, switch):
  """The rows kernel (few rows), XLA's sliced dot (the kernel off) and one dot (many rows)."""
  monkeypatch.setenv(rows_cpu.SWITCH, switch)
  rng = np.random.default_rng(1)
  x = rng.standard_normal((rows, 64)).astype(np.float32)
  q = Q8.of(jnp.asarray(rng.standard_normal((4096, 64)).astype(np.float32)))
  got = np.asarray(jax.jit(table_dot)(x, q))
  want = x.astype(np.float64) @ (np.asarray(q.rows, np.float64) * np.asarray(q.scale)[:, None]).T
  assert got.shape == (rows, 4096) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("switch", ["1", "0"])
@pytest.mark.parametrize("int8", [False, True])
def test_fused_tables_give_each_weights_own_output(monkeypatch, switch, int8):
  """One product over the joined rows, split: each weight's output as its own table gives it,
  bit for bit on the rows kernel (an output row's sums do not depend on the other rows)."""
  monkeypatch.setenv(rows_cpu.SWITCH, switch)
  rng = np.random.default_rng(2)
  shapes = [(64, 4, 8), (64, 2, 8), (64, 96)]
  tables = [as_table(jnp.asarray(rng.standard_normal(s).astype(np.float32)), 1) for s in shapes]
  if int8:
    tables = [t.replace(rows=Q8.of(t.rows)) for t in tables]
  x = rng.standard_normal((1, 3, 64)).astype(np.float32)
  fused = fuse(tables)
  got = jax.jit(dense_fused)(x, fused)
  assert fused.out_shapes == ((4, 8), (2, 8), (96,))
  for out, table in zip(got, tables, strict=True):
    want = np.asarray(jax.jit(dense, static_argnums=2)(x, table, 1))
    assert out.shape == want.shape
    if switch == "1" and rows_cpu.enabled():
      np.testing.assert_array_equal(out, want)
    else:
      np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_fuse_refuses_tables_of_mixed_kinds_or_sizes():
  rng = np.random.default_rng(3)
  a, b = (as_table(jnp.asarray(rng.standard_normal(s).astype(np.float32)), 1)
          for s in [(16, 8), (24, 8)])
  with pytest.raises(ValueError, match=r"one kind and input size, got \['float32'\] tables of "
                                       r"input sizes \[16, 24\]"):
    fuse([a, b])
  with pytest.raises(ValueError, match=r"got \['float32', 'int8 \(Q8\)'\]"):
    fuse([a, a.replace(rows=Q8.of(a.rows))])
