"""Prompt lookup first: in a row whose last tokens occurred earlier in its text (a match of at
least `lookup.min_ngram` tokens), draft what followed them (drafters/prompt_lookup.py); elsewhere,
the wrapped drafter's chain. Code repeats its context (names, signatures, the lines being edited),
which prompt lookup copies long and for free, while a trained drafter guesses a token or two
anywhere.

Which drafter drafts a row depends on its history alone, and a copied draft's law q is the
one-hot of its token, so verification stays lossless (greedy output the target's, the sampling
law exact). The wrapped drafter's `update` sees every verify outcome, whoever drafted, so it
must not take the kept drafts for its own (`Drafter.keeps_own_drafts`: a draft model's cache
would keep the K/V of its tokens where copied ones were kept). A step whose rows all found a
match skips the wrapped drafter's drafting (`lax.cond`: most steps at batch 1 on code), unless
its drafting writes state that outlives the step (layer skip's K/V in the target cache). For
goodput-driven length the signal is the match length (0: the wrapped drafter drafts) crossed
with the wrapped drafter's own, so each estimate is one drafter's.

Dims: b batch, k chain drafts, v vocab.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from speculax.core.types import Draft, TargetView
from speculax.drafters.ngram import ngram_propose
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.wrapped import Wrapped


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

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    # One pass over the history gives both (prompt lookup's propose and signal each make one).
    copied, found = ngram_propose(view.history, view.lengths, max_ngram=self.lookup.max_ngram,
                                  min_ngram=self.lookup.min_ngram, k=k)  # [b, k], [b]

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
    return merged(draft), state, view

  @property
  def signal_bins(self) -> int:
    return self.lookup.signal_bins * self.drafter.signal_bins

  def signal(self, params, state, view: TargetView, config) -> jax.Array:
    """[b] int32: the match length (0: none at least min_ngram long) times the wrapped
    drafter's bins, plus its own signal."""
    n = self.lookup.signal(None, (), view, config)  # [b]
    return n * self.drafter.signal_bins + self.drafter.signal(params, state, view, config)


def _same(after, before) -> bool:
  """Whether a pytree came back as it went in, leaf for leaf (the same arrays or tracers)."""
  a, b = jax.tree.leaves(after), jax.tree.leaves(before)
  return len(a) == len(b) and all(x is y for x, y in zip(a, b))
