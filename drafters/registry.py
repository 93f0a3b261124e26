"""Every drafter kind by name: the one table behind the CLI's choices and help, the kinds saved
head drafters record, and the benchmarks. A new kind is its own file (a Drafter subclass with a
`name`, a `summary` and a `build`) plus one entry in KINDS.

    drafter, params = registry.make("layer-skip", model.params, model.config, skip=(14,))
    drafter, params = registry.load("runs/eagle-smollm2", model.config)  # any trained kind

Both return a LoadedDrafter: the drafter and its params, unpackable as a pair.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, NamedTuple

from speculax.drafters import heads_io
from speculax.drafters.base import Drafter
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.medusa import Medusa
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models.config import LlamaConfig

KINDS: dict[str, type[Drafter]] = {cls.name: cls for cls in (
    PromptLookup, TokenRecycling, LayerSkip, DraftModel, Medusa, Hydra, Eagle)}
TRAINED = tuple(name for name, cls in KINDS.items() if cls.trained)  # loaded from a run folder


class LoadedDrafter(NamedTuple):
  """A drafter and the params it reads (None for train-free ones): what speculation takes."""
  drafter: Drafter
  params: Any = None


def get(name: str) -> type[Drafter]:
  if name not in KINDS:
    raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(KINDS)}")
  return KINDS[name]


def options(name: str) -> dict[str, inspect.Parameter]:
  """The keyword options `make` takes for a kind (its build's), by name."""
  params = inspect.signature(get(name).build).parameters
  return {n: p for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def check_options(name: str, **given) -> None:
  """Host-side, before a model loads: every option given (None = not given) is one the kind
  takes, and every option it needs is there."""
  takes, given = options(name), {k: v for k, v in given.items() if v is not None}
  if "heads" in given and "heads" not in takes:
    raise ValueError(f"trained heads (--heads {given['heads']}) are for the trained drafters "
                     f"({', '.join(TRAINED)}), not {name}")
  if "heads" in takes and "heads" not in given:
    raise ValueError(f"{name} needs trained heads: a run folder (--heads FOLDER); train one "
                     f"with `speculax train --config configs/{name}_smollm2.py`")
  unknown = sorted(given.keys() - takes.keys())
  if unknown:
    raise ValueError(f"{name} takes no option {', '.join(unknown)} (it takes: "
                     f"{', '.join(takes) or 'none'})")
  missing = [n for n, p in takes.items() if p.default is inspect.Parameter.empty
             and n not in given]
  if missing:
    raise ValueError(f"{name} needs option {', '.join(missing)}")


def make(name: str, target, config: LlamaConfig | None = None, **given) -> LoadedDrafter:
  """The drafter of kind `name` for a target, with its params. The target is a LoadedModel, or
  its params with `config`. Options set to None count as not given; see each kind's `build` for
  what they mean."""
  params, config = (target.params, target.config) if config is None else (target, config)
  check_options(name, **given)
  return LoadedDrafter(*get(name).build(params, config,
                                        **{k: v for k, v in given.items() if v is not None}))


def load(folder: str | os.PathLike, target=None, tree=None) -> LoadedDrafter:
  """The trained drafter saved in `folder`, whatever its kind, drafting `tree` (None: a
  chain). With a target (a LoadedModel or its LlamaConfig) the folder must have been trained on
  it (ValueError naming every differing field); without, the target it records is taken."""
  config = getattr(target, "config", target)
  kind = heads_io.saved_kind(folder)
  if kind not in TRAINED:
    raise ValueError(f"{folder} holds a drafter of unknown kind {kind!r}; known trained kinds: "
                     f"{', '.join(TRAINED)}")
  if config is None:
    config = heads_io.saved_target(folder)
  return LoadedDrafter(*heads_io.load_head_drafter(folder, KINDS[kind], config, tree))


def describe() -> str:
  """One line per kind, for --help."""
  return "; ".join(f"{name}: {cls.summary}" for name, cls in KINDS.items())
