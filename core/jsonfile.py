"""JSON files that name themselves when they are missing or corrupt, and atomic JSON writes."""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any


def read_json_object(path: str | os.PathLike, missing: dict | None = None) -> dict[str, Any]:
  """The JSON object in `path`. A missing file gives `missing` when one is given and raises
  FileNotFoundError naming the file otherwise; a corrupt one raises ValueError naming it."""
  path = pathlib.Path(path)
  if not path.is_file():
    if missing is not None:
      return missing
    raise FileNotFoundError(f"missing file: {path}")
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not valid JSON: {e}") from e
  if not isinstance(value, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(value).__name__}")
  return value


def write_json_atomic(path: str | os.PathLike, value: Any) -> None:
  """Writes a temporary file in the same folder, fsyncs it, then renames it over `path`: a
  reader sees the old file or the whole new one, never a torn write."""
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(value, f, indent=1)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise
