"""Trained head drafters on disk: what `speculax train` writes, what `--heads` loads.

  <folder>/drafter.json    the drafter's kind and constructor fields (not its tree: a decode-time
                           choice), the target it was trained on (preset name, config fields),
                           the training step
  <folder>/drafter_params  its params at that step (train/checkpoints.py, one orbax step)

    drafter, params = load_head_drafter("runs/medusa-smollm2", model.config, tree=tree)
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib
from typing import Any

import jax

from speculax.models.config import LlamaConfig
from speculax.models.checkpoints import Checkpointer

FORMAT = "speculax-head-drafter-v1"
SPEC, PARAMS = "drafter.json", "drafter_params"
# kind -> "module.Class" of every head drafter; a new one is one more line here.
KINDS = {"medusa": "speculax.drafters.medusa.Medusa", "hydra": "speculax.drafters.hydra.Hydra",
         "eagle": "speculax.drafters.eagle.Eagle"}
# LlamaConfig fields chosen when the target is loaded or run, not by its weights.
_RUNTIME_FIELDS = ("dtype", "param_dtype", "attention_impl", "attention_block_kv")


def save_head_drafter(folder: str | os.PathLike, drafter, params, target: str,
                      target_config: LlamaConfig, step: int) -> pathlib.Path:
  """Writes the params (unless that step is already there), then drafter.json; returns it."""
  folder = pathlib.Path(folder)
  with Checkpointer(folder / PARAMS, every=1, keep=1, async_save=False) as ck:
    if ck.latest_step() != step:
      ck.save(step, params, force=True)
  spec = {"format": FORMAT, "kind": kind_of(drafter), "fields": _fields(drafter),
          "target": {"name": target, "config": target_fields(target_config)}, "step": step}
  out, tmp = folder / SPEC, folder / f".{SPEC}.tmp"
  tmp.write_text(json.dumps(spec, indent=1), encoding="utf-8")
  os.replace(tmp, out)  # atomic: a reader sees the old file or the whole new one
  return out


def load_head_drafter(folder: str | os.PathLike, target_config: LlamaConfig, tree=None, *,
                      kind: str | None = None) -> tuple[Any, Any]:
  """(drafter, params) of the head drafter saved in `folder`, drafting `tree` (None: a chain).

  Raises ValueError if it was trained on a target other than `target_config` (naming every
  differing field) or is not of `kind` (when given); FileNotFoundError if nothing is saved.
  """
  folder = pathlib.Path(folder)
  spec = _read_spec(folder, kind)
  if kind is not None and spec["kind"] != kind:
    raise ValueError(f"{folder} holds a {spec['kind']} drafter, not {kind}")
  _check_target(folder, spec["target"], target_config)
  drafter = drafter_class(spec["kind"])(**_as_tuples(spec["fields"]), tree=tree)
  like = jax.eval_shape(lambda key: drafter.init_params(target_config, key), jax.random.key(0))
  with Checkpointer(folder / PARAMS, every=1, keep=1, async_save=False) as ck:
    return drafter, ck.restore(spec["step"], like=like)


def kind_of(drafter) -> str:
  """The KINDS name of a head drafter instance."""
  path = f"{type(drafter).__module__}.{type(drafter).__qualname__}"
  for kind, cls in KINDS.items():
    if cls == path:
      return kind
  raise ValueError(f"{path} is not a known head drafter; add it to drafters.heads_io.KINDS "
                   f"(known: {', '.join(KINDS)})")


def drafter_class(kind: str) -> type:
  """The class of a head drafter kind, imported on first use."""
  if kind not in KINDS:
    raise ValueError(f"unknown head drafter kind {kind!r}; known: {', '.join(KINDS)}")
  module, name = KINDS[kind].rsplit(".", 1)
  return getattr(importlib.import_module(module), name)


def target_fields(config: LlamaConfig) -> dict:
  """The fields that define a target (JSON-ready), without the runtime-only ones."""
  fields = json.loads(json.dumps(dataclasses.asdict(config)))
  return {k: v for k, v in fields.items() if k not in _RUNTIME_FIELDS}


def _fields(drafter) -> dict:
  """Constructor fields but the tree; each must survive a JSON round trip (tuples as lists)."""
  fields = {f.name: getattr(drafter, f.name) for f in dataclasses.fields(drafter)
            if f.name != "tree"}
  for name, value in fields.items():
    try:
      back = _as_tuples(json.loads(json.dumps(value)))
    except TypeError:  # not JSON at all (an array, a config object, ...)
      back = None
    if back != value:
      raise ValueError(f"{kind_of(drafter)} field {name}={value!r} cannot be saved in {SPEC}, "
                       "which holds numbers, strings, bools, None and tuples of them")
  return fields


def _as_tuples(value):
  """JSON lists back to tuples (drafters are hashable static arguments)."""
  if isinstance(value, dict):
    return {k: _as_tuples(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_as_tuples(v) for v in value)
  return value


def _read_spec(folder: pathlib.Path, kind: str | None) -> dict:
  file = folder / SPEC
  if not file.is_file():
    raise FileNotFoundError(f"no head drafter in {folder} (missing {file}); train one with "
                            f"`speculax train --config configs/{kind or 'medusa'}_smollm2.py`")
  try:
    spec = json.loads(file.read_text(encoding="utf-8"))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{file}: not valid JSON: {e}") from e
  if not isinstance(spec, dict) or spec.get("format") != FORMAT:
    got = spec.get("format") if isinstance(spec, dict) else type(spec).__name__
    raise ValueError(f"{file}: format {got!r}, expected {FORMAT!r}")
  return spec


def _check_target(folder: pathlib.Path, saved: dict, config: LlamaConfig) -> None:
  now = target_fields(config)
  diffs = [f"{k} {saved['config'].get(k)!r}, this target has {now.get(k)!r}"
           for k in sorted(saved["config"].keys() | now.keys())
           if saved["config"].get(k) != now.get(k)]
  if diffs:
    raise ValueError(f"head drafter in {folder} was trained on a target ({saved['name']}) with "
                     + "; ".join(diffs))
