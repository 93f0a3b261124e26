"""Prompt lookup: draft the continuation of the latest earlier occurrence of the last n-gram."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from speculax.core.fields import field
from speculax.core.types import Draft, TargetView
from speculax.drafters.base import Drafter
from speculax.drafters.ngram import match_length, ngram_propose


@dataclasses.dataclass(frozen=True)
class PromptLookup(Drafter):
  name: ClassVar[str] = "prompt-lookup"
  summary: ClassVar[str] = "n-gram lookup in the prompt and output so far (train-free, chain)"
  max_ngram: int = field(3, ge=1)
  min_ngram: int = field(1, ge=1)

  def __post_init__(self):
    super().__post_init__()
    if self.min_ngram > self.max_ngram:
      raise ValueError(f"PromptLookup needs min_ngram <= max_ngram, got "
                       f"min_ngram={self.min_ngram} max_ngram={self.max_ngram}")

  @classmethod
  def build(cls, params, config, *, max_ngram: int = 3, min_ngram: int = 1):
    return cls(max_ngram, min_ngram), None

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    tokens, _ = ngram_propose(view.history, view.lengths, max_ngram=self.max_ngram,
                              min_ngram=self.min_ngram, k=k)
    return Draft(tokens=tokens, probs=None), state, view

  @property
  def signal_bins(self) -> int:
    return self.max_ngram + 1

  def signal(self, params, state, view: TargetView, config):
    """The length of the n-gram match the next draft continues (0: none, the draft is junk)."""
    return match_length(view.history, view.lengths, max_ngram=self.max_ngram,
                        min_ngram=self.min_ngram)
