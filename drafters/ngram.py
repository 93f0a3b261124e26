"""Prompt lookup (n-gram) drafting: propose what followed the last n-gram earlier in the text.

Train-free and deterministic: the drafter's q is the one-hot of its proposal, so sampling
verification stays lossless (see decode/verify.py).

Which match: the longest n in [min_ngram, max_ngram] whose final n-gram occurs earlier, and
among the occurrences of that n the most recent one. Hugging Face's PromptLookupCandidateGenerator
also prefers the longest n but takes the earliest occurrence. We take the most recent because
local context (the function being edited, the list being continued) predicts the next tokens
best, and because in periodic text the most recent match gives the shortest period, which the
fill rule below extends exactly.

Fill past the history: the match's continuation history[j+n : j+n+k] may run past the last valid
token. Since the final n-gram equals history[j:j+n], the text just repeated itself with period
d = length - j - n, so positions past the end are filled by continuing that period:
draft[i] = history[j + n + (i mod d)]. Those are real tokens of the row, the exact continuation
if the repetition goes on, and otherwise simply rejected by verification.

No match: found is False and the draft repeats the last token (length - 1); a decode loop may
verify it anyway (it costs the same k+1 forward) or skip drafting for that row.

Dims: b batch, s history length, k draft length.
"""
from __future__ import annotations

import operator

import jax
import jax.numpy as jnp


def ngram_propose(
    history: jax.Array,  # [b, s] int32 prompt + generated; entries at >= lengths[b] are garbage
    lengths: jax.Array,  # [b] int32 valid tokens per row, >= 1
    *,
    max_ngram: int,
    min_ngram: int,
    k: int,
) -> tuple[jax.Array, jax.Array]:
  """Returns (draft_tokens [b, k] int32, found [b] bool). Pure; works under jit and vmap."""
  _check_args(history, lengths, max_ngram=max_ngram, min_ngram=min_ngram, k=k)
  end, n_best = _best_match_end(history, lengths, max_ngram)  # [b], [b]
  found = n_best >= min_ngram  # [b]
  period = jnp.maximum(lengths - 1 - end, 1)  # [b] d = length - j - n >= 1 when found
  idx = end[:, None] + 1 + jnp.arange(k)[None] % period[:, None]  # [b, k]
  idx = jnp.where(found[:, None], idx, (lengths - 1)[:, None])  # [b, k]
  idx = jnp.clip(idx, 0, history.shape[1] - 1)
  draft = jnp.take_along_axis(history, idx, 1).astype(jnp.int32)  # [b, k]
  return draft, found


def match_length(history: jax.Array, lengths: jax.Array, *, max_ngram: int,
                 min_ngram: int) -> jax.Array:
  """[b] int32 the n of the match ngram_propose drafts from, 0 where it finds none (the same
  inputs, k aside)."""
  _check_args(history, lengths, max_ngram=max_ngram, min_ngram=min_ngram, k=1)
  n_best = _best_match_end(history, lengths, max_ngram)[1]  # [b]
  return jnp.where(n_best >= min_ngram, n_best, 0)


def _check_args(history, lengths, *, max_ngram, min_ngram, k) -> None:
  """Host-side checks of the static settings and (static) shapes."""
  for name, value in (("k", k), ("min_ngram", min_ngram), ("max_ngram", max_ngram)):
    try:
      operator.index(value)
    except TypeError:
      raise ValueError(f"{name} must be an int, got {value!r}") from None
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  if min_ngram < 1:
    raise ValueError(f"min_ngram must be >= 1, got {min_ngram}")
  if max_ngram < min_ngram:
    raise ValueError(f"max_ngram must be >= min_ngram={min_ngram}, got {max_ngram}")
  if history.ndim != 2:
    raise ValueError(f"history must be [b, s], got shape {history.shape}")
  if lengths.shape != history.shape[:1]:
    raise ValueError(f"lengths must be [b] = {history.shape[:1]}, got shape {lengths.shape}")


def _best_match_end(history, lengths, max_ngram):
  """Where the chosen match ends and how long it is, in one pass over alignments.

  run[b, e] counts how many tokens ending at e equal the final tokens of the row (capped at
  max_ngram): an n-gram match ending at e exists iff run >= n. Ends must leave at least one
  token of continuation (e <= length - 2), so the final n-gram never matches itself. The best
  n is the largest run; the most recent match of that n is the largest e reaching it.
  Returns (end [b] int32, -1 if none; n_best [b] int32, 0 if none).
  """
  b, s = history.shape
  pos = jnp.arange(s)[None]  # [1, s]
  last = (lengths - 1)[:, None]  # [b, 1]
  alive = jnp.ones((b, s), bool)  # [b, s]
  run = jnp.zeros((b, s), jnp.int32)  # [b, s]
  for t in range(max_ngram):  # static: compare token e - t with token last - t
    shifted = jnp.pad(history, ((0, 0), (t, 0)))[:, :s]  # [b, s] shifted[:, e] = history[e-t]
    tail = jnp.take_along_axis(history, jnp.clip(last - t, 0, s - 1), 1)  # [b, 1]
    alive &= (pos >= t) & (last - t >= 0) & (shifted == tail)
    run += alive
  run = jnp.where(pos <= last - 1, run, 0)  # [b, s] e <= length - 2
  n_best = run.max(-1)  # [b]
  hit = (run >= n_best[:, None]) & (run > 0)  # [b, s]
  end = jnp.where(hit, pos, -1).max(-1)  # [b]
  return end.astype(jnp.int32), n_best.astype(jnp.int32)
