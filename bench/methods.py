"""A method's drafter built for a loaded target: the options a run adds (layer skip's calibration
prompts, a draft model loaded by name, a tree from its text form), then the registry."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from speculax.core.trees import parse_tree
from speculax.drafters import heads_io, registry
from speculax.drafters.layer_skip_search import SkipSearchResult, search_skip_set
from speculax.drafters.lookup_first import LookupFirst
from speculax.models.assets import humaneval_prompts

CALIBRATION_PROMPTS = 4  # HumanEval prompts layer skip's search calibrates on (no suite uses them)


def build_drafter(kind: str, model, load: Callable, options: dict, k: int,
                  fields: dict | None = None) -> registry.LoadedDrafter:
  """(drafter, params) of registry kind `kind` for the loaded target. options: registry.make's
  (None: not set; "tree" may be text such as "full:3,2,1"; "draft" a model name or run folder,
  loaded with `load`); fields: drafter fields replaced afterwards (e.g. stop_threshold)."""
  options = {n: v for n, v in options.items() if v is not None}
  takes = registry.options(kind)
  if "k" in takes:
    options["k"] = k
  if isinstance(options.get("tree"), str):
    options["tree"] = parse_tree(options["tree"])
  if "calibration" in takes and "skip" not in options and "calibration" not in options:
    options["searched"] = searched(model, k)
  if isinstance(options.get("draft"), str) and not heads_io.is_saved(options["draft"]):
    other = load(options["draft"])  # a model; a distilled run folder loads as a drafter
    options["draft"] = (other.config, other.params)
  drafter, params = registry.make(kind, model.params, model.config, **options)
  if fields:  # the drafter's own, under a LookupFirst that `lookup` put around it
    own = drafter.drafter if isinstance(drafter, LookupFirst) else drafter
    names = {f.name for f in dataclasses.fields(own)}
    unknown = sorted(fields.keys() - names)
    if unknown:
      raise ValueError(f"{kind} has no field {', '.join(unknown)} to set (it has: "
                       f"{', '.join(sorted(names))})")
    own = dataclasses.replace(own, **fields)
    drafter = dataclasses.replace(drafter, drafter=own) if own is not drafter else own
  return registry.LoadedDrafter(drafter, params)


def calibration_prompts(tokenizer) -> list[list[int]]:
  return [tokenizer.encode(tokenizer.chat_prompt(p)) for p in humaneval_prompts(CALIBRATION_PROMPTS)]


_SEARCHED: dict[tuple, SkipSearchResult] = {}


def searched(model, k: int) -> SkipSearchResult:
  """Layer skip's search for k on the calibration prompts, once per target and k in a process
  (a benchmark's layer-skip rows, with and without early exit, VocabTrim or switching, share
  it)."""
  key = (id(model.params), model.config, k)
  if key not in _SEARCHED:
    _SEARCHED[key] = search_skip_set(model.params, model.config,
                                     calibration_prompts(model.tokenizer), k=k)
  return _SEARCHED[key]


def params_mb(params) -> float:
  """Megabytes of a drafter's own params (0 for train-free drafters, which read the target's)."""
  leaves = [x for x in jax.tree.leaves(params) if hasattr(x, "nbytes")]
  return float(sum(np.prod(x.shape) * x.dtype.itemsize for x in leaves)) / 1e6
