"""`--set a.b=value` overrides of any field of a frozen config dataclass, nested or not.

    exp = overrides.apply(exp, ["distill.optim.learning_rate=1e-3", "data.rows=64"])

A value is read as a Python literal (3e-4, 64, True, None, (1, 2), "text") and, failing that, as
the bare string; a list becomes a tuple and an int becomes a float where the field holds one
(configs are hashable static arguments). The config's own checks (core/fields.Checked) then run
as `dataclasses.replace` rebuilds every level, so a bad value fails naming the field.
"""
from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence
from typing import Any


def apply(config: Any, assignments: Sequence[str]) -> Any:
  """`config` with each "dotted.path=value" of `assignments` set, in order."""
  for text in assignments:
    path, sep, value = text.partition("=")
    if not sep or not path.strip():
      raise ValueError(f"--set takes FIELD.PATH=VALUE, got {text!r}")
    config = set_field(config, path.strip().split("."), value.strip(), text)
  return config


def set_field(config: Any, path: list[str], value: str, text: str) -> Any:
  """`config` with the field at `path` (names, outermost first) set to `value` parsed."""
  if not dataclasses.is_dataclass(config):
    raise ValueError(f"--set {text}: {type(config).__name__} has no fields to set "
                     f"({'.'.join(path)!r} goes too deep)")
  name, rest = path[0], path[1:]
  names = [f.name for f in dataclasses.fields(config)]
  if name not in names:
    raise ValueError(f"--set {text}: {type(config).__name__} has no field {name!r} (it has: "
                     f"{', '.join(names)})")
  current = getattr(config, name)
  new = set_field(current, rest, value, text) if rest else _parse(value, current)
  return dataclasses.replace(config, **{name: new})


def _parse(text: str, current: Any) -> Any:
  """A literal, shaped like the value it replaces (tuple for a list, float for an int in a float
  field); the bare text when it is not a literal."""
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text
  if isinstance(value, list) or (isinstance(current, tuple) and not isinstance(value, tuple)):
    value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
  if isinstance(value, tuple) and isinstance(current, tuple) and current:
    return tuple(_widened(v, current[0]) for v in value)
  return _widened(value, current)


def _widened(value: Any, like: Any) -> Any:
  """An int as a float where the field holds a float (`peak_lr=1` means 1.0)."""
  if isinstance(like, float) and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  return value
