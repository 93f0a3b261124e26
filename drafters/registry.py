"""Every drafter kind by name: the one table behind the CLI's choices and help, the kinds saved
head drafters record, and the benchmarks. A new kind is its own file (a Drafter subclass with a
`name`, a `summary` and a `build`) plus one entry in KINDS.

    drafter, params = registry.make("layer-skip", model.params, model.config, skip=(14,))
    drafter, params = registry.load("runs/eagle-smollm2", model.config)  # any trained kind

Both return a LoadedDrafter: the drafter and its params, unpackable as a pair.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any, NamedTuple

import numpy as np

from speculax.drafters import heads_io
from speculax.drafters import vocab_trim as vocab_trim_lib
from speculax.drafters.base import Drafter
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.lookup_first import LookupFirst
from speculax.drafters.medusa import Medusa
from speculax.drafters.multi_draft import MultiDraftModel
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models.config import LlamaConfig

KINDS: dict[str, type[Drafter]] = {cls.name: cls for cls in (
    PromptLookup, TokenRecycling, LayerSkip, DraftModel, MultiDraftModel, Medusa, Hydra, Eagle)}
TRAINED = tuple(name for name, cls in KINDS.items() if cls.trained)  # loaded from a run folder
SAVED = (*TRAINED, DraftModel.name)  # kinds `speculax train` saves as run folders
# Options `make` takes for every kind that has the drafter field named: VocabTrim's size and the
# token frequency order (an array or .npy file; a trained run folder carries its own), Kangaroo's
# early-exit threshold, and the dtype of the weight copy a drafter's own forward reads.
COMMON = {"vocab_trim": "vocab_trim", "vocab_ids": "vocab_trim", "exit_threshold": "exit_threshold",
          "draft_dtype": "draft_dtype"}
# `lookup=N`, for every chain drafter that follows whatever drafts were kept: prompt lookup's
# continuation first, in rows whose last N or more tokens occurred earlier (LookupFirst).
LOOKUP = "lookup"


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
  if LOOKUP in given:
    check_lookup(name, given.pop(LOOKUP))
  for option, field in COMMON.items():
    if option in given:
      if not _has_field(get(name), field):
        raise ValueError(f"{name} takes no {option} ({field} is for "
                         f"{', '.join(n for n, c in KINDS.items() if _has_field(c, field))})")
      given.pop(option)
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
  what they mean, COMMON for the ones every kind with the matching field takes, and LOOKUP
  (`lookup=N`: the drafter behind prompt lookup's copies, drafters/lookup_first.py)."""
  params, config = (target.params, target.config) if config is None else (target, config)
  check_options(name, **given)
  given = {k: v for k, v in given.items() if v is not None}
  common = {k: given.pop(k) for k in COMMON if k in given}
  lookup = given.pop(LOOKUP, None)
  drafter, params = get(name).build(params, config, **given)
  for attr in ("exit_threshold", "draft_dtype"):
    if attr in common:
      drafter = dataclasses.replace(drafter, **{attr: common[attr]})
  loaded = LoadedDrafter(drafter, params)
  if "vocab_trim" in common or "vocab_ids" in common:
    loaded = trimmed(loaded, common.get("vocab_trim", 0), common.get("vocab_ids"), config)
  if lookup is not None:
    loaded = LoadedDrafter(LookupFirst.of(loaded.drafter, lookup), loaded.params)
  return loaded


def check_lookup(name: str, lookup) -> None:
  """`lookup` (the shortest prompt-lookup match drafted first) fits kind `name`."""
  if isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 1:
    raise ValueError(f"lookup is the shortest match prompt lookup drafts from, an int >= 1; "
                     f"got {lookup!r}")
  if name == PromptLookup.name:
    raise ValueError(f"lookup={lookup} puts prompt lookup before another drafter; "
                     f"{name} is prompt lookup already (set its min_ngram)")
  if get(name).keeps_own_drafts is True:
    raise ValueError(f"lookup={lookup} needs a drafter that follows whatever drafts were kept; "
                     f"{name} takes them for its own (its cache keeps its drafts' K/V)")


def load(folder: str | os.PathLike, target=None, tree=None, vocab_trim: int = 0) -> LoadedDrafter:
  """The trained drafter saved in `folder`, whatever its kind, drafting `tree` (None: a
  chain), scoring the `vocab_trim` tokens most frequent in its training corpus (0: as trained,
  all of them or the kept ids of a drafter trained with VocabTrim). With a
  target (a LoadedModel or its LlamaConfig) the folder must have been trained on it (ValueError
  naming every differing field); without, the target it records is taken."""
  config = getattr(target, "config", target)
  kind = heads_io.saved_kind(folder)
  if kind not in SAVED:
    raise ValueError(f"{folder} holds a drafter of unknown kind {kind!r}; known trained kinds: "
                     f"{', '.join(SAVED)}")
  if config is None:
    config = heads_io.saved_target(folder)
  loaded = LoadedDrafter(*heads_io.load_drafter(folder, KINDS[kind], config, tree))
  return trimmed(loaded, vocab_trim, None, config) if vocab_trim else loaded


def trimmed(loaded: LoadedDrafter, vocab_trim: int, vocab_ids,
            config: LlamaConfig) -> LoadedDrafter:
  """VocabTrim (drafters/vocab_trim.py): the drafter scoring only the first `vocab_trim` ids of
  `vocab_ids` (the target's tokens by frequency: an array or an .npy file), or of the order a
  trained run folder saved when vocab_ids is None."""
  drafter, params = loaded
  if not _has_field(type(drafter), "vocab_trim"):
    raise ValueError(f"{drafter.name} has no output layer to trim (vocab_trim is for "
                     f"{', '.join(n for n, c in KINDS.items() if _has_field(c, 'vocab_trim'))})")
  if vocab_ids is None:
    if not isinstance(params, dict) or vocab_trim_lib.IDS not in params:
      raise ValueError(f"vocab_trim={vocab_trim} for {drafter.name} needs the target's token "
                       f"frequency order (vocab_ids=, an array or .npy file from "
                       f"drafters/vocab_trim.frequency_order); only trained run folders carry one")
    vocab_ids = params[vocab_trim_lib.IDS]
  elif isinstance(vocab_ids, (str, os.PathLike)):
    vocab_ids = np.load(vocab_ids)
  order = vocab_trim_lib.check_order(vocab_ids, config.vocab_size, vocab_trim)
  params = {**({} if params is None else params), vocab_trim_lib.IDS: order}
  return LoadedDrafter(dataclasses.replace(drafter, vocab_trim=vocab_trim), params)


def _has_field(cls: type[Drafter], name: str) -> bool:
  return dataclasses.is_dataclass(cls) and any(f.name == name for f in dataclasses.fields(cls))


def describe() -> str:
  """One line per kind, for --help."""
  return "; ".join(f"{name}: {cls.summary}" for name, cls in KINDS.items())
