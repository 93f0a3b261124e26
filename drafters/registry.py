"""Drafters by name, as the CLI and the benchmarks build them."""
from __future__ import annotations

import dataclasses
import os

from speculax.models.config import LlamaConfig
from speculax.core.trees import StaticTree, Tree
from speculax.drafters import heads_io
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling

HEADS = tuple(heads_io.KINDS)  # head drafters: trained on the target, loaded from a run folder
NAMES = ("none", "prompt-lookup", "layer-skip", "draft-model", "token-recycling", *HEADS)


def check_heads(name: str, heads: str | os.PathLike | None) -> None:
  """A head drafter needs a trained run folder, and only a head drafter takes one."""
  if name in HEADS and heads is None:
    raise ValueError(f"{name} needs trained heads: a run folder (--heads FOLDER); train one "
                     f"with `speculax train --config configs/{name}_smollm2.py`")
  if name not in HEADS and heads is not None:
    raise ValueError(f"trained heads (--heads {heads}) are for the head drafters "
                     f"({', '.join(HEADS)}), not {name}")


def make(name: str, params, config: LlamaConfig, *, k: int = 5, calibration=None,
         skip: tuple[int, ...] | None = None, draft=None, draft_layers: int = 4,
         tree: Tree | None = None, heads: str | os.PathLike | None = None):
  """Returns (drafter, drafter_params), or (None, None) for "none".

  layer-skip: `skip` layers, or a set searched on `calibration` prompts (token-id lists).
  draft-model: `draft` = (config, params) of a model sharing the vocabulary, or else the
  target's first `draft_layers` layers (an untrained cut; train it with `speculax train`).
  medusa (every name in HEADS): `heads`, the folder a head-drafter experiment wrote; it must
  have been trained on this target.
  tree: layer-skip, draft-model and head drafters draft it instead of a chain of k;
  token-recycling expands it (a StaticTree; default its own template).
  """
  check_heads(name, heads)
  if name in HEADS:
    return heads_io.load_head_drafter(heads, config, tree, kind=name)
  if name == "none":
    return None, None
  if name == "prompt-lookup":
    if tree is not None:
      raise ValueError("prompt-lookup drafts a chain only; drop the tree")
    return PromptLookup(), None
  if name == "token-recycling":
    if tree is not None and not isinstance(tree, StaticTree):
      raise ValueError(f"token-recycling expands a static tree template, got {tree}")
    return (TokenRecycling(tree) if tree is not None else TokenRecycling()), None
  if name == "layer-skip":
    from speculax.drafters.layer_skip import LayerSkip
    if skip is not None:
      return LayerSkip.skipping(config.n_layers, skip, tree), None
    if not calibration:
      raise ValueError("layer-skip needs a skip set or calibration prompts to search one on")
    from speculax.drafters.layer_skip_search import search_skip_set
    found = search_skip_set(params, config, calibration, k=k).drafter
    return dataclasses.replace(found, tree=tree), None
  if name == "draft-model":
    if draft is None:
      from speculax.models.derive import truncated
      draft = truncated(params, config, range(draft_layers))
    draft_config, draft_params = draft
    return DraftModel(draft_config, tree), draft_params
  raise ValueError(f"unknown drafter {name!r}; choose from {', '.join(NAMES)}")
