"""Prompt lookup first: in a row whose last tokens occurred earlier in its text (a match of at
least `lookup.min_ngram` tokens), draft what followed them (drafters/prompt_lookup.py); elsewhere,
the wrapped drafter's chain. Code repeats its context (names, signatures, the lines being edited), which
prompt lookup copies long and for free, while a trained drafter guesses a token or two anywhere.

A match copies only while copies after matches of its length keep their first draft at least
as often as the wrapped drafter keeps its own (decayed counts of the verify outcomes, every source
starting from optimistic pseudo-outcomes, so each is tried): in chat, whose two-token repeats
rarely continue alike, the wrapped drafter drafts; in code, whose repeats do, the copies.
Which drafter drafts a row depends on its history and past verify outcomes alone, and a copied
draft's law q is the one-hot of its token, so verification stays lossless (greedy output the
target's, the sampling law exact). The wrapped drafter's `update` sees every verify outcome, whoever drafted, so it
must not take the kept drafts for its own (`Drafter.keeps_own_drafts`: a draft model's cache
would keep the K/V of its tokens where copied ones were kept). A step whose rows all found a
match skips the wrapped drafter's drafting (`lax.cond`: most steps at batch 1 on code), unless
its drafting writes state that outlives the step (layer skip's K/V in the target cache). For
goodput-driven length the signal is the match length where the row copies (0: the wrapped
drafter drafts) crossed with the wrapped drafter's own, so each estimate is one drafter's.

Dims: b batch, k chain drafts, v vocab, c sources (0: the wrapped drafter; n: a copy after an
n-token match).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.wrapped import Wrapped


DECAY = 0.95  # weight of the counts before each outcome at a source (recent text counts most)
PRIOR = 2.0  # pseudo-outcomes, all kept, behind every source's estimate (optimism: try each)


@flax.struct.dataclass
class LookupState:
  inner: Any  # the wrapped drafter's state
  kept: jax.Array  # [c] float32 decayed count of first drafts kept, per source
  checked: jax.Array  # [c] float32 decayed count of first drafts checked
  source: jax.Array  # [b] int32 where each row's last draft came from
  start: jax.Array  # [b] int32 history length when the step began (a row that has not grown
  # since is finished: its verify outcome is stale)

  def acceptance(self) -> jax.Array:
    """[c] estimated P(first draft kept) per source."""
    return (self.kept + PRIOR) / (self.checked + PRIOR)


@dataclasses.dataclass(frozen=True)
class LookupFirst(Wrapped):
  # Its n-gram settings: the shortest match whose continuation is drafted (min_ngram) and the
  # longest looked for (longer ones win).
  lookup: PromptLookup = PromptLookup(max_ngram=3, min_ngram=2)

  @classmethod
  def of(cls, drafter, min_ngram: int) -> LookupFirst:
    """`drafter` drafting after prompt lookup's matches of at least min_ngram tokens (the
    longest looked for: min_ngram, at least 3)."""
    return cls(drafter, PromptLookup(max_ngram=max(min_ngram, 3), min_ngram=min_ngram))

  def check(self, target, params, k: int) -> None:
    if self.drafter.tree is not None:
      raise ValueError(f"prompt lookup first drafts chains; the {self.name} drafter drafts a "
                       f"tree: drop the tree")
    if self.drafter.keeps_own_drafts:
      raise ValueError(f"prompt lookup first needs a drafter that follows whatever drafts were "
                       f"kept; the {self.name} drafter takes them for its own (a draft model "
                       f"keeps its drafts' K/V, layer skip's switching counts them)")
    self.drafter.check(target, params, k)

  def inner(self, state: LookupState):
    return state.inner

  def with_inner(self, state: LookupState, inner) -> LookupState:
    return state.replace(inner=inner)

  def init(self, params, view: TargetView, config, max_len: int) -> LookupState:
    c, b = self.lookup.signal_bins, view.lengths.shape[0]
    return LookupState(self.drafter.init(params, view, config, max_len),
                       jnp.zeros((c,), jnp.float32), jnp.zeros((c,), jnp.float32),
                       jnp.zeros((b,), jnp.int32), view.lengths)

  def copying(self, state: LookupState, view: TargetView, config) -> jax.Array:
    """[b] int32 the match length a row copies after, 0 where the wrapped drafter drafts (no
    match, or copies after matches that long are kept less often than its drafts)."""
    n = self.lookup.signal(None, (), view, config)  # [b] 0: no match of >= min_ngram
    rate = state.acceptance()  # [c]
    return jnp.where((n > 0) & (rate[n] >= rate[0]), n, 0)

  def propose(self, params, state: LookupState, view: TargetView, key, config, k: int,
              sampling):
    copied = self.lookup.propose(None, (), view, key, config, k, sampling)[0].tokens  # [b, k]
    source = self.copying(state, view, config)  # [b]
    found = source > 0  # [b] the row copies
    outer, state = state, state.inner

    def merged(draft: Draft) -> Draft:  # copied drafts where found, the wrapped drafter's else
      q = draft.probs  # [b, k, v] or None (one-hot)
      if q is not None:
        q = jnp.where(found[:, None, None], jax.nn.one_hot(copied, q.shape[-1], dtype=q.dtype), q)
      length = None if draft.length is None else jnp.where(found, k, draft.length)
      return Draft(jnp.where(found[:, None], copied, draft.tokens), q, None, length)

    def drafted():  # the wrapped drafter's (draft, state, view)
      return self.drafter.propose(params, state, view, key, config, k, sampling)

    # Most drafters' propose returns its state and the view as they came (the drafts' cache
    # entries are scratch): then only the draft leaves a conditional that skips drafting in a
    # step whose rows all copy, and the caches stay outside it (XLA copies the buffers a
    # conditional updates: decode/speculative.py measured a KV-cache copy a step). Layer skip
    # writes its drafts' K/V into the target cache: it drafts in every step.
    unchanged = []

    def draft_only():
      draft, inner, drafted_view = drafted()
      unchanged.append(_same(inner, state) and _same(drafted_view, view))
      return draft

    shapes = jax.eval_shape(draft_only)  # [Draft of ShapeDtypeStructs]
    if unchanged[0]:
      placeholder = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
      draft = jax.lax.cond(jnp.all(found), placeholder, lambda: drafted()[0])
    else:
      draft, state, view = drafted()
    return merged(draft), outer.replace(inner=state, source=source, start=view.lengths), view

  def update(self, params, state: LookupState, view: TargetView,
             verified: Verified) -> LookupState:
    """The wrapped drafter's update, and each active row's first-draft outcome counted at the
    source it drafted from."""
    state = state.replace(inner=self.drafter.update(params, state.inner, view, verified))
    if verified.plain:  # goodput's plain step: nothing was drafted
      return state
    active = (view.lengths > state.start).astype(jnp.float32)  # [b]
    rows = jax.nn.one_hot(state.source, state.kept.shape[0]) * active[:, None]  # [b, c]
    seen = rows.sum(0)  # [c]
    kept = rows.T @ (verified.n_accepted >= 1).astype(jnp.float32)  # [c]
    decay = DECAY ** seen  # each outcome decays the counts before it at its source
    return state.replace(kept=decay * state.kept + kept, checked=decay * state.checked + seen)

  @property
  def signal_bins(self) -> int:
    return self.lookup.signal_bins * self.drafter.signal_bins

  def signal(self, params, state: LookupState, view: TargetView, config) -> jax.Array:
    """[b] int32: the match length a row copies after (0: the wrapped drafter drafts) times
    the wrapped drafter's bins, plus its own signal."""
    return (self.copying(state, view, config) * self.drafter.signal_bins
            + self.drafter.signal(params, state.inner, view, config))


def _same(after, before) -> bool:
  """Whether a pytree came back as it went in, leaf for leaf (the same arrays or tracers)."""
  a, b = jax.tree.leaves(after), jax.tree.leaves(before)
  return len(a) == len(b) and all(x is y for x, y in zip(a, b))
