"""models/kernels/rows_cpu: the CPU rows kernel against float64 numpy, a row's result
independent of the rows beside it, bad input, the build's fallback, and where table_dot uses it."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from speculax.models import llama, tables
from speculax.models.config import get_preset
from speculax.models.kernels import rows_cpu
from speculax.models.kvcache import KVCache
from test_tables import dot_lhs_shapes, lowered_for_cpu


def _random(shape, seed):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _table(shape, seed, dtype):
  """A random table in dtype: unit normals rounded, or for int8 integers over its whole range."""
  if dtype == jnp.int8:
    return jnp.asarray(np.random.default_rng(seed).integers(-128, 128, shape), jnp.int8)
  return jnp.asarray(_random(shape, seed), dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8], ids=["f32", "bf16", "i8"])
@pytest.mark.parametrize("m, v, d", [(1, 7, 16), (2, 100, 40), (4, 1000, 576), (8, 301, 33),
                                     (9, 130, 64), (16, 4096, 64), (5, 1, 17), (3, 4096, 576),
                                     (20, 512, 96), (37, 160, 64), (0, 50, 40)])
def test_equals_numpy(m, v, d, dtype):
  """d not a multiple of 16 (a tail), v not a multiple of a tile or a chunk, more rows than one
  pass takes (9, 16), no rows (0), tables large enough to be shared among threads (4096 x 64,
  1000 x 576); a bfloat16 or int8 table is read exactly (the reference takes the same values).
  With AMX (rows_cpu.amx()) bfloat16 tables of d a multiple of 32 and v of 16 go to the tile
  units: one, two and three groups of 16 rows (3, 20, 37), features to 16 bits (the same
  tolerance)."""
  x, table = _random((m, d), 0), _table((v, d), 1, dtype)
  out = np.asarray(jax.jit(rows_cpu.rows_dot)(x, table))
  assert out.shape == (m, v) and out.dtype == np.float32
  ref = x.astype(np.float64) @ np.asarray(table.astype(jnp.float32), np.float64).T
  # float32 sums of d products of unit normals (an int8 table's values are up to 128)
  atol = 1e-5 * np.sqrt(d) * (128 if dtype == jnp.int8 else 1)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=atol)
  np.testing.assert_allclose(out, rows_cpu.rows_dot_reference(x, table), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int8], ids=["f32", "bf16", "i8"])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(dtype):
  """Bit for bit: each row alone, and the rows in another order and count, as in the full call
  (what makes a one-token step and a verify forward agree exactly on dense outputs)."""
  for (m, v, d), order in (((11, 3001, 200), [10, 3, 7]),  # the vector path
                           ((35, 1024, 96), [34, 3, 20, 17, 0])):  # AMX's, where it has AMX
    x, table = _random((m, d), 2), _table((v, d), 3, dtype)
    dot = jax.jit(rows_cpu.rows_dot)
    full = np.asarray(dot(x, table))
    for j in range(m):
      np.testing.assert_array_equal(np.asarray(dot(x[j:j + 1], table))[0], full[j])
    np.testing.assert_array_equal(np.asarray(dot(x[order], table)), full[order])


@pytest.mark.parametrize("x_shape, t_shape, dtype, match", [
    ((4,), (8, 4), jnp.float32, r"x \[m, d\] and table \[v, d\]; got \(4,\)"),
    ((2, 4), (8, 5), jnp.float32, r"got \(2, 4\) and \(8, 5\)"),
    ((2, 4), (8, 4), (jnp.bfloat16, jnp.float32), "float32 x .*; got bfloat16 and float32"),
    ((2, 4), (8, 4), (jnp.float32, jnp.float16), "int8 table; got float32 and float16"),
])
def test_bad_input(x_shape, t_shape, dtype, match):
  x_dtype, t_dtype = dtype if isinstance(dtype, tuple) else (dtype, dtype)
  with pytest.raises(ValueError, match=match):
    rows_cpu.rows_dot(jnp.zeros(x_shape, x_dtype), jnp.zeros(t_shape, t_dtype))


def test_without_a_compiler_a_warning_and_xla(monkeypatch, tmp_path):
  monkeypatch.setenv("CXX", "false")
  monkeypatch.setenv(rows_cpu.CACHE, str(tmp_path))
  rows_cpu._library.cache_clear()
  try:
    with pytest.warns(UserWarning, match="rows kernel is not available.*failed"):
      assert not rows_cpu.enabled()
    x, table = _random((2, 64), 4), _random((4096, 64), 5)
    assert _form(x, table) == "sliced"
  finally:
    rows_cpu._library.cache_clear()
  assert not list(tmp_path.rglob("*.so"))


def _form(features, table) -> str:
  """What table_dot runs on the CPU: "kernel", "sliced" (a 3-d table operand) or "one dot"."""
  text = lowered_for_cpu(lambda f, t: tables.table_dot(f, t), features, table)
  if rows_cpu.TARGET in text:
    return "kernel"
  return "sliced" if len(dot_lhs_shapes(text)[0]) == 3 else "one dot"  # sliced: [n, v/n, d] left


@pytest.mark.parametrize("rows, dtype, switch, form", [
    (1, jnp.float32, "1", "kernel"), ("limit", jnp.float32, "1", "kernel"),
    ("limit+1", jnp.float32, "1", "sliced"), (65, jnp.float32, "1", "one dot"),
    (2, jnp.bfloat16, "1", "kernel"), (2, jnp.float16, "1", "sliced"),
    (2, jnp.float32, "0", "sliced")])
def test_table_dot_takes_the_kernel_for_few_float32_rows(monkeypatch, rows, dtype, switch, form):
  monkeypatch.setenv(rows_cpu.SWITCH, switch)
  if isinstance(rows, str):  # the limit on this CPU (rows_cpu.max_rows()), or one row past it
    rows = rows_cpu.max_rows() + (rows == "limit+1")
  features, table = jnp.zeros((rows, 64), dtype), jnp.zeros((4096, 64), dtype)
  assert _form(features, table) == form
  got = jax.jit(lambda f, t: tables.table_dot(f, t))(_random((rows, 64), 6).astype(dtype),
                                                     _random((4096, 64), 7).astype(dtype))
  assert got.shape == (rows, 4096) and got.dtype == dtype


def test_the_kernel_is_built_for_the_cpus_vector_width():
  """16 lanes where /proc/cpuinfo lists AVX-512 (-march=native lets the compiler use it), else
  8; the row limit follows (56 rows, 8 rows)."""
  flags = rows_cpu._cpu_flags().split()
  want = 16 if "avx512f" in flags else 8
  assert rows_cpu.lanes() == want
  assert rows_cpu.max_rows() == {16: rows_cpu.MAX_ROWS, 8: rows_cpu.NARROW_MAX_ROWS}[want]


@pytest.mark.parametrize("lanes, rows, form", [
    (16, 8, "kernel"), (16, 9, "kernel"), (16, 56, "kernel"), (16, 57, "sliced"),
    (8, 8, "kernel"), (8, 9, "sliced"), (8, 56, "sliced"), (0, 1, "sliced")])
def test_the_row_limit_follows_the_lanes(monkeypatch, lanes, rows, form):
  """Each width's branch, whatever this CPU has: table_dot asks the kernel up to 56 rows with 16
  lanes, 8 with 8, never where it is not available (0)."""
  monkeypatch.setattr(rows_cpu, "lanes", lambda: lanes)
  assert _form(jnp.zeros((rows, 64)), jnp.zeros((4096, 64))) == form


def test_the_limit_can_be_set(monkeypatch):
  """SPECULAX_ROWS_LIMIT in place of the CPU's limit (read at trace time); not a number: an
  error naming it."""
  monkeypatch.setattr(rows_cpu, "lanes", lambda: 8)
  monkeypatch.setenv(rows_cpu.LIMIT, "12")
  assert [_form(jnp.zeros((rows, 64)), jnp.zeros((4096, 64))) for rows in (12, 13)] == [
      "kernel", "sliced"]
  monkeypatch.setenv(rows_cpu.LIMIT, "twelve")
  with pytest.raises(ValueError, match="SPECULAX_ROWS_LIMIT must be a number .*got 'twelve'"):
    rows_cpu.max_rows()


@pytest.mark.parametrize("platform, device", [
    ("cuda", AbstractDevice("NVIDIA H100 80GB HBM3", 132, "cuda")),
    ("tpu", AbstractDevice("TPU v5 lite", 1, "tpu")), ("cpu", None)])
def test_an_accelerator_lowering_holds_no_rows_kernel(platform, device):
  """The choice is made when lowering, so a CPU machine still lowers decoding's forward (weights
  as tables) for a GPU or TPU, deviceless, with XLA's dots there; for the CPU, every dense and
  the head go to the kernel."""
  cfg = get_preset("tiny")
  params = jax.eval_shape(lambda key: llama.unstack_layers(llama.init_params(cfg, key)),
                          jax.random.key(0))
  cache = jax.eval_shape(lambda: KVCache.init(cfg, 1, 64, per_layer=True))
  tokens = jax.ShapeDtypeStruct((1, 2), jnp.int32)
  forward = jax.jit(lambda p, tok, c: llama.forward(p, cfg, tok, tok, c)[0])
  if device is None:
    text = forward.trace(params, tokens, cache).lower().as_text()
    assert text.count(f"@{rows_cpu.TARGET}(") == 7 * cfg.n_layers + 1  # q k v o gate up down
  else:
    with use_abstract_mesh(AbstractMesh((1,), ("data",), abstract_device=device)):
      text = forward.trace(params, tokens, cache).lower(lowering_platforms=(platform,)).as_text()
    assert rows_cpu.TARGET not in text and "dot_general" in text


def test_the_switch_holds_for_shapes_traced_before(monkeypatch):
  """SPECULAX_ROWS_KERNEL is read at every trace, not once per process (JAX caches a branch's
  trace by function: the choice is made before the branch)."""
  features, table = jnp.zeros((3, 48)), jnp.zeros((2048, 48))
  for switch, form in [("1", "kernel"), ("0", "sliced"), ("1", "kernel")]:
    monkeypatch.setenv(rows_cpu.SWITCH, switch)
    assert _form(features, table) == form


def test_the_amx_switch_chooses_the_path_of_bf16_tables(monkeypatch):
  """SPECULAX_ROWS_AMX=0 keeps bfloat16 tables on the vector path, read at every trace of
  table_dot (as SPECULAX_ROWS_KERNEL is); with AMX here (rows_cpu.amx()) the two paths round
  differently, both within the float32 tolerance."""
  x, table = _random((5, 64), 6), jnp.asarray(_random((256, 64), 7), jnp.bfloat16)
  ref = x.astype(np.float64) @ np.asarray(table.astype(jnp.float32), np.float64).T
  outs = []
  for switch in ("1", "0", "1"):
    monkeypatch.setenv(rows_cpu.AMX_SWITCH, switch)
    outs.append(np.asarray(jax.jit(lambda f, t: tables.table_dot(f, t))(x, table)))
    np.testing.assert_allclose(outs[-1], ref, rtol=1e-5, atol=1e-5 * 8)
  np.testing.assert_array_equal(outs[0], outs[2])
  assert np.array_equal(outs[0], outs[1]) != rows_cpu.amx()


def test_the_research_script_times_both_paths(tmp_path, tiny_chat_folder):
  from speculax.research import rows_kernel
  rows_kernel.main(["--model", str(tiny_chat_folder), "--tokens", "1", "2", "--rounds", "1",
                    "--repeats", "1", "--out", str(tmp_path)])
  rows = json.loads((tmp_path / "rows_kernel.json").read_text())["rows"]
  assert [(r["batch"], r["t"]) for r in rows] == [(1, 1), (1, 2), (8, 1), (8, 2)]
  for r in rows:
    assert r["kernel_ms"] > 0 and r["xla_ms"] > 0 and len(r["rounds"]["kernel"]) == 1
    assert r["kernel_over_one_token"] == r["kernel_ms"] / rows[0 if r["batch"] == 1 else 2][
        "kernel_ms"]
  assert (tmp_path / "rows_kernel.png").stat().st_size > 0
  # the script leaves the switches as it found them
  assert rows_cpu.SWITCH not in os.environ and rows_cpu.LIMIT not in os.environ
  with pytest.raises(SystemExit):
    rows_kernel.main(["--tokens", "2", "4", "--out", str(tmp_path)])


def test_the_research_script_with_bf16_weights_times_the_vector_path_where_amx(
    tmp_path, tiny_chat_folder):
  from speculax.research import rows_kernel
  rows_kernel.main(["--model", str(tiny_chat_folder), "--tokens", "1", "2", "--batch8", "1", "4",
                    "--dtype", "bfloat16", "--rounds", "1", "--repeats", "1",
                    "--out", str(tmp_path)])
  result = json.loads((tmp_path / "rows_kernel_bfloat16.json").read_text())
  assert result["dtype"] == "bfloat16" and result["amx"] == rows_cpu.amx()
  rows = result["rows"]
  assert [(r["batch"], r["t"]) for r in rows] == [(1, 1), (1, 2), (8, 1), (8, 4)]
  assert all(("vector_ms" in r) == rows_cpu.amx() for r in rows)
  assert rows_cpu.AMX_SWITCH not in os.environ


def test_gradients_through_the_kernel_equal_the_references():
  """Online adaptation trains a drafter in decoding's param form (tables, few rows): the kernel
  has a VJP, XLA's products of the reference."""
  x, table = _random((5, 48), 8), _random((300, 48), 9)
  w = _random((5, 300), 10)
  loss = lambda dot: lambda x, t: jnp.sum(jnp.sin(dot(x, t)) * w)
  got = jax.jit(jax.grad(loss(rows_cpu.rows_dot), argnums=(0, 1)))(x, table)
  want = jax.grad(loss(rows_cpu.rows_dot_reference), argnums=(0, 1))(x, table)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
