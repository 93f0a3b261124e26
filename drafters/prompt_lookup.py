"""Prompt lookup: draft the continuation of the latest earlier occurrence of the last n-gram."""
from __future__ import annotations

import dataclasses

from drafters.base import Draft, Stateless, TargetView
from drafters.ngram import ngram_propose


@dataclasses.dataclass(frozen=True)
class PromptLookup(Stateless):
  max_ngram: int = 3
  min_ngram: int = 1

  def check(self, target, params, k: int) -> None:
    if not 1 <= self.min_ngram <= self.max_ngram:
      raise ValueError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got "
                       f"min_ngram={self.min_ngram} max_ngram={self.max_ngram}")

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    tokens, _ = ngram_propose(view.history, view.lengths, max_ngram=self.max_ngram,
                              min_ngram=self.min_ngram, k=k)
    return Draft(tokens=tokens, probs=None), state, view
