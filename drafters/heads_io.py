"""Trained drafters on disk: what `speculax train` writes, what `--heads` (head drafters) and
`--draft-model` (a distilled draft model) load.

  <folder>/drafter.json    the drafter's kind (its registry name) and constructor fields (not
                           its tree: a decode-time choice), the target it was trained on (preset
                           name, architecture), the training step, the stored dtype, the
                           VocabTrim size it was trained with (if any)
  <folder>/drafter_params  its params at that step (models/checkpoints.py, one orbax step),
                           float32 or, to ship small, bfloat16 (decoded in bfloat16:
                           decode_dtype)
  <folder>/vocab_ids.npy   the target's tokens by frequency on the training corpus, most
                           frequent first ([v] int32): VocabTrim keeps a prefix of it
                           (drafters/vocab_trim.py)

    drafter, params = speculax.drafters.load("runs/medusa-smollm2", model.config, tree=tree)
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax
import numpy as np

from speculax.core.dtypes import floats_as
from speculax.core.jsonfile import read_json_object, write_json_atomic
from speculax.drafters import vocab_trim
from speculax.models import distributed
from speculax.models.checkpoints import Checkpointer
from speculax.models.config import LlamaConfig

FORMAT = "speculax-head-drafter-v1"
SPEC, PARAMS, ORDER = "drafter.json", "drafter_params", "vocab_ids.npy"
# Decode-time choices, not saved: what a drafter drafts (tree), how much vocabulary it scores,
# when a chain exits early and how many plain steps it feeds in one block.
DECODE_FIELDS = ("tree", "vocab_trim", "exit_threshold", "max_lag")


def save_drafter(folder: str | os.PathLike, drafter, params, target: str,
                 target_config: LlamaConfig, step: int, vocab_ids: np.ndarray | None = None,
                 dtype: str = "float32") -> pathlib.Path:
  """Writes the params (unless that step is already there) with their floats in `dtype`, the
  frequency order `vocab_ids` if given, then drafter.json; returns it."""
  folder = pathlib.Path(folder)
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
  if vocab_ids is not None:
    vocab_trim.check_order(vocab_ids, target_config.vocab_size, 1)
  with Checkpointer(folder / PARAMS, every=1, keep=1, async_save=False) as ck:
    if ck.latest_step() != step:  # every process saves its shards (params may span processes)
      ck.save(step, floats_as(params, dtype), force=True)
  if not distributed.is_primary():  # the rest is one process's to write
    return folder / SPEC
  if vocab_ids is not None:
    np.save(folder / ORDER, np.asarray(vocab_ids, np.int32))
  spec = {"format": FORMAT, "kind": drafter.name, "fields": _fields(drafter),
          "target": {"name": target, "config": _json(target_config.architecture())},
          "step": step, "dtype": dtype}
  if getattr(drafter, "vocab_trim", 0):  # trained on the kept ids only: served so by default
    if vocab_ids is None:
      raise ValueError(f"{drafter.name} with vocab_trim={drafter.vocab_trim} needs its vocab_ids")
    spec["vocab_trim"] = drafter.vocab_trim
  write_json_atomic(folder / SPEC, spec)
  return folder / SPEC


def saved_kind(folder: str | os.PathLike, expected: str | None = None) -> str:
  """The kind (registry name) of the head drafter saved in `folder`."""
  return _read_spec(pathlib.Path(folder), expected)["kind"]


def saved_target(folder: str | os.PathLike) -> LlamaConfig:
  """The architecture of the target the drafter in `folder` was trained on."""
  return LlamaConfig.from_architecture(_read_spec(pathlib.Path(folder), None)["target"]["config"])


def is_saved(folder: str | os.PathLike) -> bool:
  """Whether `folder` holds a saved drafter (a run folder, not a model)."""
  return (pathlib.Path(folder) / SPEC).is_file()


def load_drafter(folder: str | os.PathLike, cls: type, target_config: LlamaConfig,
                 tree=None) -> tuple[Any, Any]:
  """(drafter, params) of the `cls` drafter saved in `folder`, drafting `tree` (None: a chain);
  a drafter trained with VocabTrim scores the kept ids it was trained on.

  Raises ValueError if the folder holds another kind or was trained on a target other than
  `target_config` (naming every differing field); FileNotFoundError if nothing is saved.
  """
  folder = pathlib.Path(folder)
  spec = _read_spec(folder, cls.name)
  if spec["kind"] != cls.name:
    raise ValueError(f"{folder} holds a {spec['kind']} drafter, not {cls.name}")
  _check_target(folder, spec["target"], target_config)
  fields = {k: dataclasses.replace(v, runtime=target_config.runtime)  # a draft model runs as
            if isinstance(v, LlamaConfig) else v  # the target does
            for k, v in _as_tuples(spec["fields"]).items()}
  drafter = cls(**fields, tree=tree)
  like = jax.eval_shape(lambda key: drafter.init_params(target_config, key), jax.random.key(0))
  with Checkpointer(folder / PARAMS, every=1, keep=1, async_save=False) as ck:
    params = ck.restore(spec["step"], like=floats_as(like, spec.get("dtype", "float32")))
  params = floats_as(params, decode_dtype(spec.get("dtype", "float32"),
                                          target_config.runtime.param_dtype))
  if (folder / ORDER).is_file():
    order = vocab_trim.check_order(np.load(folder / ORDER), target_config.vocab_size, 1,
                                   where=str(folder / ORDER))
    params = {**params, vocab_trim.IDS: order}
  if spec.get("vocab_trim"):
    vocab_trim.check_order(params.get(vocab_trim.IDS), target_config.vocab_size,
                           spec["vocab_trim"], where=str(folder / ORDER))
    drafter = dataclasses.replace(drafter, vocab_trim=spec["vocab_trim"])
  return drafter, params


def decode_dtype(stored: str, target: str) -> str:
  """The dtype a saved drafter's weights decode in: the narrower of how it was stored and the
  target's weights. Stored in bfloat16, its values are exact in bfloat16, and a draft step then
  reads half the bytes beside a float32 target (EAGLE + TTT, the same drafts: +2-4% decode
  tokens/s on a 2-core CPU); a bfloat16 target runs it in bfloat16 too. Trainers start from
  float32 copies (train/experiment.warm_start casts to the run's params)."""
  return "bfloat16" if "bfloat16" in (stored, target) else "float32"


def _json(value):
  """What a JSON round trip gives back (tuples become lists)."""
  return json.loads(json.dumps(value))


def _fields(drafter) -> dict:
  """Constructor fields but the decode-time ones, as JSON; each must survive a JSON round trip
  (tuples as lists; a model config as {"llama": its architecture}, the runtime left to the
  target)."""
  saved = {}
  for f in dataclasses.fields(drafter):
    if f.name in DECODE_FIELDS:
      continue
    value = getattr(drafter, f.name)
    config = isinstance(value, LlamaConfig)
    saved[f.name] = {"llama": value.architecture()} if config else value
    try:
      back = _as_tuples(_json(saved[f.name]))
    except TypeError:  # not JSON at all (an array, another config object, ...)
      back = None
    if (back.architecture() == value.architecture()) if config else back == value:
      continue
    raise ValueError(f"{drafter.name} field {f.name}={value!r} cannot be saved in {SPEC}, "
                     "which holds numbers, strings, bools, None, tuples of them and model "
                     "configs")
  return saved


def _as_tuples(value):
  """JSON lists back to tuples (drafters are hashable static arguments), model configs back to
  LlamaConfig."""
  if isinstance(value, dict) and set(value) == {"llama"}:
    return LlamaConfig.from_architecture(value["llama"])
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
  spec = read_json_object(file)
  if spec.get("format") != FORMAT:
    raise ValueError(f"{file}: format {spec.get('format')!r}, expected {FORMAT!r}")
  return spec


def _check_target(folder: pathlib.Path, saved: dict, config: LlamaConfig) -> None:
  now = _json(config.architecture())
  diffs = [f"{k} {saved['config'].get(k)!r}, this target has {now.get(k)!r}"
           for k in sorted(saved["config"].keys() | now.keys())
           if saved["config"].get(k) != now.get(k)]
  if diffs:
    raise ValueError(f"head drafter in {folder} was trained on a target ({saved['name']}) with "
                     + "; ".join(diffs))
