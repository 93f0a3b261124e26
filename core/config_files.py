"""Configs as Python files: an experiment or a benchmark is a file defining one named object
(EXPERIMENT = DistillExperiment(...), BENCH = BenchConfig(...)), run, checked and returned."""
from __future__ import annotations

import pathlib
import runpy


def load(path: str, variable: str, cls: type, folder: pathlib.Path, what: str):
  """The `cls` instance that file `path` (or `folder/<path>.py`, a shipped one named by its stem)
  defines as `variable`. A missing file raises FileNotFoundError listing the shipped names; a file
  that does not parse, fails while it runs (a value out of range, a field that does not exist, a
  missing import) or defines something else raises ValueError naming the file and the problem."""
  file = pathlib.Path(path)
  if not file.is_file() and path in shipped(folder, variable):
    file = folder / f"{path}.py"
  if not file.is_file():
    raise FileNotFoundError(f"{what} {path!r} does not exist (shipped ones: "
                            f"{', '.join(shipped(folder, variable))})")
  try:
    names = runpy.run_path(str(file))
  except SyntaxError as e:
    raise ValueError(f"{path}:{e.lineno}: not valid Python: {e.msg}") from None
  except Exception as e:  # the file's own code failed: report it as the file's problem
    raise ValueError(f"{path}: {type(e).__name__}: {e}") from None
  value = names.get(variable)
  if not isinstance(value, cls):
    got = "nothing" if value is None else f"a {type(value).__name__} ({value!r:.60})"
    raise ValueError(f"{path} must define {variable} = {cls.__name__}(...); it defines {got}")
  return value


def shipped(folder: pathlib.Path, variable: str) -> list[str]:
  """Stems of the files in `folder` that define `variable`."""
  return sorted(f.stem for f in folder.glob("*.py")
                if f"{variable} =" in f.read_text(encoding="utf-8"))
