"""A few feature rows times a weight stored as a table of output rows, on the CPU, in one pass
over the table: x [m, d] . table [v, d] over d -> [m, v], float32, the table float32, bfloat16 or
int8 (rows_cpu.cc; an int8 table's scales are applied outside, models/tables.Q8).

Why not XLA: decoding and verifying multiply 1-56 rows with every weight of the model once per step,
a bandwidth-bound product, and XLA:CPU runs it well below the machine's bandwidth (its matrix-vector
dot for one row, YNNPACK's GEMM for more: models/tables.py). Measured (x86_64, 2 cores, 2026-12-04,
SmolLM2-135M's 211 dense tables, 538 MB, in one jitted function, ms at 1 / 2 / 4 / 8 / 16 / 32
rows): this kernel 20 / 20 / 22 / 25 / 36 / 56, XLA's sliced dot 26 / 33 / 35 / 39 / 50 / 68. On an
AMD EPYC (Zen 4, 2 cores, 2026-12-05) the whole forward ran 5-23% faster than with XLA's dots at 1-8
rows, an 8-token one 1.21 one-token ones (rows_cpu.cc says why it streams each tile in address
order, prefetched into L2 several KB ahead, there). Pallas does not compile for the CPU, so the
kernel is C++ behind JAX's foreign function interface (`jax.ffi`), the tool JAX provides for a CPU
kernel of one's own.

Built on first use with the machine's C++ compiler (`$CXX`, else g++; ~5 s) for its own CPU
(-march=native) into `$SPECULAX_CACHE/native` (default ~/.cache/speculax/native), keyed by the
source, the compiler, jaxlib and the CPU's flags. `SPECULAX_ROWS_KERNEL=0` turns it off
(models/tables.py then asks XLA, as before it); where it cannot be built (no compiler) a warning
says so once and XLA is asked.

A bfloat16 table on a CPU with AMX (Intel's tile units, Sapphire Rapids on) goes to them
(`amx()` says whether it does here; `SPECULAX_ROWS_AMX=0`, read at trace time, keeps the vector
path): each feature split into two bfloat16 parts (16 of its 24 mantissa bits), exact products,
float32 sums, relative error ~3e-6 (the vector path's ~3e-7). From ~8 rows the vector path's
multiply-adds bound it on 2 cores; AMX's do not (rows_cpu.cc has the numbers).

A row's result does not depend on the other rows in the call (each output is the same sequence
of operations whatever m is, on either path), so a one-token step and a verify forward of up to
`max_rows()` rows give bit-identical dense outputs for the same features. `max_rows()` follows
the vector width the kernel was built for: on a CPU without AVX-512 its 8-lane tiles fall behind
XLA's dot from ~16 rows. `rows_dot_reference` is the product in jnp.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

SOURCE = Path(__file__).with_name("rows_cpu.cc")
TARGET = "speculax_rows_dot"
SWITCH = "SPECULAX_ROWS_KERNEL"  # "0": off
AMX_SWITCH = "SPECULAX_ROWS_AMX"  # "0": bfloat16 tables take the vector path even with AMX
LIMIT = "SPECULAX_ROWS_LIMIT"  # rows up to which the kernel is asked, in place of max_rows()'s
# choice for this CPU (to measure it past that: research/rows_kernel.py)
CACHE = "SPECULAX_CACHE"
MAX_ROWS = 56  # feature rows up to which models/tables.py asks the kernel where it has 16 lanes
# (AVX-512): from 64 XLA's sliced dot ran faster (SmolLM2's 211 dense tables, ms at 16 / 32 / 40 /
# 48 / 56 / 64 rows, AMD EPYC Zen 4, 2 cores, 2026-12-05: kernel 32 / 55 / 69 / 81 / 95 / 121, XLA
# 36 / 56 / 76 / 94 / 121 / 102; on an Intel CPU, 2026-12-04, at 16 / 32 / 64: kernel 36 / 56 /
# 93, XLA 49 / 67 / 78)
NARROW_MAX_ROWS = 8  # the same with 8 lanes (AVX2): the whole SmolLM2 forward, kernel over XLA's
# time at 1 / 2 / 4 / 8 / 16 / 32 rows, float32 1.09 / 0.95 / 0.88 / 1.01 / 1.31 / 1.44, bfloat16
# 0.39 / 0.49 / 0.52 / 0.70 / 1.25 / 1.62 (AMD EPYC without AVX-512, 2 cores, 2026-12-06:
# results/rows_kernel_avx2*.md)
TABLE_DTYPES = (jnp.float32, jnp.bfloat16, jnp.int8)
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC")


def rows_dot_reference(x: jax.Array, table: jax.Array) -> jax.Array:
  """x [m, d] . table [v, d] over d -> [m, v] in float32."""
  return jnp.einsum("md,vd->mv", x, table.astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


def _cpu_flags() -> str:
  try:
    text = Path("/proc/cpuinfo").read_text()
  except OSError:
    return platform.processor()
  return next((line for line in text.splitlines() if line.startswith("flags")), "")


def _compiler() -> str:
  return os.environ.get("CXX", "g++")


def _library_path() -> Path:
  key = hashlib.sha256("\n".join([SOURCE.read_text(), _compiler(), " ".join(FLAGS),
                                  jaxlib.__version__, platform.machine(), _cpu_flags()])
                       .encode()).hexdigest()[:16]
  root = Path(os.environ.get(CACHE, Path.home() / ".cache" / "speculax"))
  return root / "native" / f"rows_cpu-{key}.so"


def _build(path: Path) -> None:
  """Compiles the kernel to path (through a temporary file, so parallel builders do not race)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
    out = Path(tmp) / path.name
    cmd = [_compiler(), *FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    os.replace(out, path)


@functools.cache
def _library() -> ctypes.CDLL | None:
  """The kernel's library, built once per machine and registered; None, with a warning, where
  it cannot be built."""
  path = _library_path()
  try:
    if not path.exists():
      _build(path)
    library = ctypes.CDLL(str(path))
  except (OSError, RuntimeError) as e:
    warnings.warn(f"the CPU rows kernel is not available, XLA's dot is used instead: {e}",
                  stacklevel=4)
    return None
  jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.SpeculaxRowsDot), platform="cpu")
  return library


def _registered() -> bool:
  return _library() is not None


def amx() -> bool:
  """Whether bfloat16 tables (d a multiple of 32, v of 16) go to the CPU's AMX tile units here:
  the kernel was compiled for a CPU that has them and Linux granted this process their state."""
  library = _library()
  return library is not None and bool(library.SpeculaxRowsAmx())


def enabled() -> bool:
  """Whether models/tables.py routes few-row products (float32 features, float32 or bfloat16
  tables) here: on the CPU backend, unless SPECULAX_ROWS_KERNEL=0, and once the kernel is built."""
  return (os.environ.get(SWITCH, "1") != "0" and jax.default_backend() == "cpu"
          and _registered())


def lanes() -> int:
  """The vector lanes the kernel was built for here (16 with AVX-512, else 8); 0 where it is
  not available."""
  library = _library()
  return 0 if library is None else library.SpeculaxRowsLanes()


def max_rows() -> int:
  """Feature rows up to which models/tables.py asks the kernel here (read at trace time): MAX_ROWS
  with 16 lanes, NARROW_MAX_ROWS with fewer (where more rows ran slower than XLA's dot), or
  SPECULAX_ROWS_LIMIT where set; 0 where the kernel is not available."""
  width = lanes()
  limit = os.environ.get(LIMIT)
  if limit is not None and not limit.isdigit():
    raise ValueError(f"{LIMIT} must be a number of rows (a whole number >= 0), got {limit!r}")
  if width == 0:
    return 0
  return int(limit) if limit is not None else MAX_ROWS if width == 16 else NARROW_MAX_ROWS


def amx_wanted() -> bool:
  """SPECULAX_ROWS_AMX, read when called (at trace time): False for "0"."""
  return os.environ.get(AMX_SWITCH, "1") != "0"


def rows_dot(x: jax.Array, table: jax.Array, amx: bool | None = None) -> jax.Array:
  """x [m, d] float32 . table [v, d] float32, bfloat16 or int8 over d -> [m, v] float32, by the
  kernel (CPU only; a bfloat16 or int8 table is widened exactly as it is read, sums are float32;
  with AMX, a bfloat16 table's features to 16 bits). amx: whether a bfloat16 table may go to AMX
  where the machine has it (None: amx_wanted())."""
  if x.ndim != 2 or table.ndim != 2 or x.shape[1] != table.shape[1]:
    raise ValueError(f"rows_dot takes x [m, d] and table [v, d]; got {x.shape} and {table.shape}")
  if x.dtype != jnp.float32 or table.dtype not in TABLE_DTYPES:
    raise ValueError(f"rows_dot takes float32 x and a float32, bfloat16 or int8 table; got "
                     f"{x.dtype} and {table.dtype}")
  if not _registered():
    raise RuntimeError("the CPU rows kernel could not be built (see the warning above)")
  return _rows_dot(x, table, amx_wanted() if amx is None else amx)


def _rows_dot_call(x: jax.Array, table: jax.Array, amx: bool) -> jax.Array:
  out = jax.ShapeDtypeStruct((x.shape[0], table.shape[0]), jnp.float32)
  return jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")(x, table, amx=amx)


_rows_dot = jax.custom_vjp(_rows_dot_call, nondiff_argnums=(2,))


def _rows_dot_forward(x, table, amx):
  return _rows_dot(x, table, amx), (x, table)


def _rows_dot_backward(amx, saved, g):  # g [m, v]; XLA's products (training is not few-row)
  x, table = saved
  return (jnp.einsum("mv,vd->md", g, table.astype(jnp.float32)),
          jnp.einsum("mv,md->vd", g, x).astype(table.dtype))


_rows_dot.defvjp(_rows_dot_forward, _rows_dot_backward)
