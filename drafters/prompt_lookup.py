"""Prompt lookup: draft the continuation of the latest earlier occurrence of the last n-gram."""
from __future__ import annotations

import dataclasses

from speculax.core.fields import Checked, field
from speculax.core.types import Draft, TargetView
from speculax.drafters.base import Stateless
from speculax.drafters.ngram import ngram_propose


@dataclasses.dataclass(frozen=True)
class PromptLookup(Checked, Stateless):
  max_ngram: int = field(3, ge=1)
  min_ngram: int = field(1, ge=1)

  def __post_init__(self):
    super().__post_init__()
    if self.min_ngram > self.max_ngram:
      raise ValueError(f"PromptLookup needs min_ngram <= max_ngram, got "
                       f"min_ngram={self.min_ngram} max_ngram={self.max_ngram}")

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    tokens, _ = ngram_propose(view.history, view.lengths, max_ngram=self.max_ngram,
                              min_ngram=self.min_ngram, k=k)
    return Draft(tokens=tokens, probs=None), state, view
