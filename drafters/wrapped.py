"""A drafter that drafts through another one (`Wrapped.drafter`), for what adds to any drafter
without changing it: recording verify outcomes for online adaptation (serve/recording.py) and
drafting prompt lookup's continuation where the text repeats (drafters/lookup_first.py).

Everything the loop reads goes to the wrapped drafter; a subclass overrides what it adds. Its
state is the wrapped drafter's, unless it keeps more around it (`inner` / `with_inner`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax

from speculax.core.types import TargetView, Verified
from speculax.drafters.base import Drafter


@dataclasses.dataclass(frozen=True)
class Wrapped(Drafter):
  drafter: Drafter

  def inner(self, state) -> Any:
    """The wrapped drafter's state inside this one's."""
    return state

  def with_inner(self, state, inner) -> Any:
    """This drafter's state holding the wrapped drafter's `inner`."""
    return inner

  @property
  def name(self) -> str:
    return self.drafter.name

  @property
  def trained(self) -> bool:
    return self.drafter.trained

  @property
  def hot_start(self) -> bool:
    return self.drafter.hot_start

  @property
  def tree(self):
    return self.drafter.tree

  @property
  def hidden_layers(self) -> tuple[int, ...]:
    return self.drafter.hidden_layers

  @property
  def keeps_own_drafts(self) -> bool:
    return self.drafter.keeps_own_drafts

  @property
  def max_lag(self) -> int:
    return self.drafter.max_lag

  def verifier(self):
    return self.drafter.verifier()

  def check(self, target, params, k: int) -> None:
    self.drafter.check(target, params, k)

  def prepare(self, params, target_params, target):
    return self.drafter.prepare(params, target_params, target)

  def init(self, params, view: TargetView, config, max_len: int):
    return self.drafter.init(params, view, config, max_len)

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    draft, inner, view = self.drafter.propose(params, self.inner(state), view, key, config, k,
                                              sampling)
    return draft, self.with_inner(state, inner), view

  def update(self, params, state, view: TargetView, verified: Verified):
    return self.with_inner(state, self.drafter.update(params, self.inner(state), view, verified))

  def lag(self, state, view: TargetView) -> jax.Array:
    return self.drafter.lag(self.inner(state), view)

  def catch_up(self, params, state, view: TargetView):
    return self.with_inner(state, self.drafter.catch_up(params, self.inner(state), view))

  @property
  def signal_bins(self) -> int:
    return self.drafter.signal_bins

  def signal(self, params, state, view: TargetView, config) -> jax.Array:
    return self.drafter.signal(params, self.inner(state), view, config)
