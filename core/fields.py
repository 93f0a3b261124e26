"""Checked fields for the frozen config dataclasses: one way every public config validates itself.

A config declares each field's type with its annotation and its range with `field(...)`:

  @dataclasses.dataclass(frozen=True)
  class SpecConfig(Checked):
    k: int = field(5, ge=1)
    temperature: float = field(0.0, ge=0)
    policy: Literal["fifo", "reservoir"] = "fifo"

and `Checked.__post_init__` runs `validate`, so a value of the wrong type or out of range fails
where the config is built, with a ValueError naming the class, the field and the value, instead
of a shape TypeError (or a silent wrong answer) from inside jit later. Types are strict: an int
field takes no 2.5 and no True, a float field no NaN or inf, a str field no empty string, a tuple
field no list (configs are static jit arguments and must hash). Bounds on a tuple field apply to
each element. Checks that relate fields (min <= max) stay in the class's own `__post_init__`,
after `super().__post_init__()`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, Union

import numpy as np

_SYMBOL = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def field(default: Any = dataclasses.MISSING, *, ge: float | None = None, gt: float | None = None,
          le: float | None = None, lt: float | None = None, **kw) -> Any:
  """A dataclass field with a checked range (`ge`, `gt`, `le`, `lt`; for tuples, per element)."""
  bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
  return dataclasses.field(default=default, metadata={"bounds": bounds}, **kw)


class Checked:
  """Mixin for frozen config dataclasses: every field is validated when the config is built."""

  def __post_init__(self):
    validate(self)


def validate(config) -> None:
  """Raises ValueError for the first field whose value breaks its annotation or bounds."""
  cls = type(config)
  hints = _hints(cls)
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    tp = hints.get(f.name, Any)
    bounds = f.metadata.get("bounds", {})
    check(f"{cls.__name__}.{f.name}", value, tp, **bounds)


def check(name: str, value, tp, **bounds) -> None:
  """The same check for a plain function argument: raises ValueError naming it and the value."""
  if not _conforms(value, tp) or not _in_bounds(value, bounds):
    raise ValueError(f"{name} must be {describe(tp, bounds)}, got {value!r}")


def describe(tp, bounds: dict | None = None) -> str:
  """What a field takes, in words: "an int >= 1", "one of 'fifo', 'reservoir'", ..."""
  args = typing.get_args(tp)
  if typing.get_origin(tp) in (Union, types.UnionType) and type(None) in args and bounds:
    rest = [a for a in args if a is not type(None)]
    return describe(Union[tuple(rest)], bounds) + " or None"
  text = _describe(tp)
  if bounds:
    text += " " + " and ".join(f"{_SYMBOL[k]} {v}" for k, v in bounds.items())
  return text


@functools.cache
def _hints(cls) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _is_bool(v) -> bool:
  return isinstance(v, (bool, np.bool_))


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not _is_bool(v)


def _is_number(v) -> bool:
  return isinstance(v, (int, float, np.integer, np.floating)) and not _is_bool(v)


def _conforms(v, tp) -> bool:
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if tp is Any or tp is object:
    return True
  if origin in (Union, types.UnionType):
    return any(_conforms(v, a) for a in args)
  if origin is Literal:
    return any(type(v) is type(a) and v == a for a in args)
  if origin is tuple:
    if not isinstance(v, tuple):
      return False
    if len(args) == 2 and args[1] is Ellipsis:
      return all(_conforms(x, args[0]) for x in v)
    return len(v) == len(args) and all(_conforms(x, a) for x, a in zip(v, args))
  if origin is not None:  # dict[...], list[...]: the container's type only
    return isinstance(v, origin)
  if tp is type(None):
    return v is None
  if tp is bool:
    return _is_bool(v)
  if tp is int:
    return _is_int(v)
  if tp is float:
    return _is_number(v) and math.isfinite(float(v))
  if tp is str:
    return isinstance(v, str) and bool(v.strip())
  if isinstance(tp, type):
    return isinstance(v, tp)
  return True  # a typing construct we do not check (Callable, ...)


def _in_bounds(v, bounds: dict) -> bool:
  if not bounds:
    return True
  if isinstance(v, tuple):
    return all(_in_bounds(x, bounds) for x in v)
  if not _is_number(v):
    return True  # None (or a non-number the annotation allows): nothing to compare
  x = float(v)
  return (math.isfinite(x) or _is_int(v)) and all(
      {"ge": x >= b, "gt": x > b, "le": x <= b, "lt": x < b}[k] for k, b in bounds.items())


def _describe(tp) -> str:
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin in (Union, types.UnionType):
    literals = [v for a in args if typing.get_origin(a) is Literal for v in typing.get_args(a)]
    rest = [a for a in args if typing.get_origin(a) is not Literal]
    parts = ([_describe(Literal[tuple(literals)])] if literals else []) + [_describe(a) for a in rest]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
  if origin is Literal:
    return "one of " + ", ".join(repr(a) for a in args)
  if origin is tuple:
    if len(args) == 2 and args[1] is Ellipsis:
      return f"a tuple of {_plural(args[0])}"
    return f"a tuple of {len(args)} ({', '.join(_describe(a) for a in args)})"
  names = {type(None): "None", bool: "a bool", int: "an int", float: "a finite number",
           str: "a non-empty string"}
  if tp in names:
    return names[tp]
  if origin is not None:
    return f"a {origin.__name__}"
  name = getattr(tp, "__name__", str(tp))
  return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def _plural(tp) -> str:
  if typing.get_origin(tp) is tuple:
    return "tuples" + _describe(tp)[len("a tuple"):]
  return {int: "ints", float: "finite numbers", str: "non-empty strings", bool: "bools"}.get(
      tp, _describe(tp))
