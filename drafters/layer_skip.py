"""Self-speculation by layer skipping: the target with a subset of its layers drafts for itself.

The drafter shares the target's weights and its per-layer cache: the kept layers read the
target's K/V for the verified prefix (an approximation that only costs acceptance, never
correctness), and write their draft K/V into the slots the verify forward overwrites next.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from speculax.core.fields import field
from speculax.core.trees import Tree
from speculax.core.types import Draft, TargetView
from speculax.drafters.base import Drafter
from speculax.drafters.chain import draft_chain
from speculax.drafters.layer_skip_search import search_skip_set
from speculax.drafters.tree_draft import draft_tree
from speculax.models.kvcache import KVCache


@dataclasses.dataclass(frozen=True)
class LayerSkip(Drafter):
  name: ClassVar[str] = "layer-skip"
  summary: ClassVar[str] = ("the target with some layers skipped drafts for itself (train-free; "
                            "chain or tree)")
  keep: tuple[int, ...] = field(ge=0)  # indices of the target layers the drafter runs, ascending
  tree: Tree | None = None  # None: a chain of k drafts

  @classmethod
  def skipping(cls, n_layers: int, skip, tree: Tree | None = None) -> LayerSkip:
    """The drafter that runs every layer except those in `skip`."""
    skip = set(skip)
    bad = sorted(i for i in skip if not 0 <= i < n_layers)
    if bad:
      raise ValueError(f"layer-skip set names layer {bad[0]}, but the target has layers "
                       f"0..{n_layers - 1}")
    return cls(tuple(i for i in range(n_layers) if i not in skip), tree)

  @classmethod
  def build(cls, params, config, *, skip: tuple[int, ...] | None = None, calibration=None,
            k: int = 5, tree: Tree | None = None):
    """`skip` layers, or the set searched on `calibration` prompts (token-id lists) for k."""
    if skip is None:
      if not calibration:
        raise ValueError("layer-skip needs a skip set or calibration prompts to search one on")
      skip = search_skip_set(params, config, calibration, k=k).skip
    return cls.skipping(config.n_layers, skip, tree), None

  def check(self, target, params, k: int) -> None:
    super().check(target, params, k)
    if not self.keep:
      raise ValueError(f"layer-skip set skips every one of the target's {target.n_layers} layers")
    bad = [i for i in self.keep if not 0 <= i < target.n_layers]
    if bad:
      raise ValueError(f"layer-skip drafter keeps layer {bad[0]}, but the target has layers "
                       f"0..{target.n_layers - 1}")
    if list(self.keep) != sorted(set(self.keep)):
      raise ValueError(f"layer-skip keep list must be ascending without repeats, got {self.keep}")

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    target = view.params
    sub_params = {**target, "layers": tuple(target["layers"][i] for i in self.keep)}
    cache = view.cache
    sub_cache = KVCache(k=tuple(cache.k[i] for i in self.keep),
                        v=tuple(cache.v[i] for i in self.keep), lengths=cache.lengths)
    sub_config = dataclasses.replace(config, n_layers=len(self.keep))
    last = view.pending
    parents = None
    if self.tree is not None:
      tokens, q, parents, sub_cache = draft_tree(sub_params, sub_config, sub_cache, last, key,
                                                 self.tree, sampling)
    else:
      tokens, q, sub_cache = draft_chain(sub_params, sub_config, sub_cache, last, key, k, sampling)
    # Hand the scribbled buffers back so XLA keeps updating the one cache in place.
    ks, vs = list(cache.k), list(cache.v)
    for j, i in enumerate(self.keep):
      ks[i], vs[i] = sub_cache.k[j], sub_cache.v[j]
    return Draft(tokens=tokens, probs=q, parents=parents), state, view.replace(
        cache=cache.replace(k=tuple(ks), v=tuple(vs)))
