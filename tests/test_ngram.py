"""Prompt lookup against a plain-Python reference, plus hand cases for each preference rule."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.drafters.ngram import match_length, ngram_propose


def _reference(row, length, max_ngram, min_ngram, k):
  """(draft, n of the match, 0: none): longest n first, then the most recent earlier
  occurrence; extend past the end by period."""
  h = [int(x) for x in row[:length]]
  for n in range(max_ngram, min_ngram - 1, -1):
    suffix = h[length - n:] if length >= n else None
    for j in range(length - n - 1, -1, -1):  # j + n <= length - 1
      if h[j:j + n] == suffix:
        out = h[j + n:j + n + k]
        period = length - j - n
        while len(out) < k:
          out.append(out[len(out) - period])
        return out, n
  return [h[length - 1]] * k, 0


@functools.lru_cache(maxsize=None)
def _jitted(max_ngram, min_ngram, k):
  return jax.jit(functools.partial(ngram_propose, max_ngram=max_ngram, min_ngram=min_ngram, k=k))


def _propose(rows, lengths, max_ngram, min_ngram, k):
  """Pads hand-written rows with garbage that would match if it were read."""
  s = max(len(r) for r in rows) + 3
  history = np.full((len(rows), s), 7, np.int32)
  for i, r in enumerate(rows):
    history[i, :len(r)] = r
  draft, found = _jitted(max_ngram, min_ngram, k)(jnp.asarray(history),
                                                  jnp.asarray(lengths, jnp.int32))
  return np.asarray(draft).tolist(), np.asarray(found).tolist()


@pytest.mark.parametrize("max_ngram,min_ngram,k", [(3, 1, 4), (2, 2, 3), (4, 1, 1), (1, 1, 5),
                                                   (5, 3, 6)])
def test_matches_reference_on_random_histories(max_ngram, min_ngram, k):
  rng = np.random.default_rng(max_ngram * 100 + min_ngram * 10 + k)
  b, s = 128, 24
  history = rng.integers(0, 3, size=(b, s)).astype(np.int32)  # tiny vocab: repeats everywhere
  lengths = rng.integers(1, s + 1, size=b).astype(np.int32)
  lengths[:4] = [1, 2, s, s]
  draft, found = _jitted(max_ngram, min_ngram, k)(jnp.asarray(history), jnp.asarray(lengths))
  n = match_length(jnp.asarray(history), jnp.asarray(lengths), max_ngram=max_ngram,
                   min_ngram=min_ngram)  # [b] prompt lookup's goodput signal
  draft, found, n = np.asarray(draft), np.asarray(found), np.asarray(n)
  assert draft.shape == (b, k) and draft.dtype == np.int32 and found.dtype == bool
  for i in range(b):
    want, want_n = _reference(history[i], lengths[i], max_ngram, min_ngram, k)
    assert found[i] == (want_n > 0) and n[i] == want_n, (i, history[i, :lengths[i]])
    assert draft[i].tolist() == want, (i, history[i, :lengths[i]])
  assert found.any() and not found.all()


def test_match_at_the_very_start():
  draft, found = _propose([[5, 6, 1, 2, 3, 5, 6]], [7], 2, 1, 3)
  assert found == [True] and draft == [[1, 2, 3]]


def test_continuation_past_the_end_repeats_the_period():
  # Final 2-gram [1, 2] matched at j=0: continuation 3 1 2, then the period (3) continues.
  draft, found = _propose([[1, 2, 3, 1, 2]], [5], 2, 1, 5)
  assert found == [True] and draft == [[3, 1, 2, 3, 1]]
  draft, _ = _propose([[4, 4, 4]], [3], 2, 1, 4)  # period 1
  assert draft == [[4, 4, 4, 4]]


def test_no_match_repeats_last_token():
  draft, found = _propose([[1, 2, 3, 4], [9]], [4, 1], 3, 1, 3)
  assert found == [False, False] and draft == [[4, 4, 4], [9, 9, 9]]


def test_min_ngram_excludes_shorter_matches():
  rows = [[1, 2, 8, 3, 2]]  # only the 1-gram [2] occurs earlier
  assert _propose(rows, [5], 3, 1, 2) == ([[8, 3]], [True])
  assert _propose(rows, [5], 3, 2, 2)[1] == [False]


def test_longest_ngram_wins_over_more_recent_shorter_match():
  row = [1, 2, 9, 3, 2, 8, 1, 2]  # [1, 2] at j=0 -> 9; [2] most recently at j=4 -> 8
  assert _propose([row], [8], 2, 1, 1) == ([[9]], [True])
  assert _propose([row], [8], 1, 1, 1) == ([[8]], [True])


def test_most_recent_occurrence_wins():
  row = [1, 2, 3, 1, 2, 4, 1, 2]  # [1, 2] at j=0 -> 3 and at j=3 -> 4
  assert _propose([row], [8], 2, 1, 4) == ([[4, 1, 2, 4]], [True])


def test_garbage_past_length_is_ignored_and_rows_are_independent():
  rows = [[5, 6, 5, 6, 1, 1, 1], [5, 6, 5, 6, 1, 1, 1]]
  draft, found = _propose(rows, [3, 7], 2, 1, 2)
  assert draft[0] == [6, 5] and found[0]  # row 0 is [5, 6, 5]: [5] at j=0
  assert draft[1] == [1, 1] and found[1]  # row 1 ends [1, 1]: [1, 1] at j=4


def test_vmap_matches_batched_call():
  rng = np.random.default_rng(1)
  history = jnp.asarray(rng.integers(0, 3, size=(2, 4, 16)), jnp.int32)
  lengths = jnp.asarray(rng.integers(1, 17, size=(2, 4)), jnp.int32)
  fn = functools.partial(ngram_propose, max_ngram=3, min_ngram=1, k=4)
  got = jax.jit(jax.vmap(fn))(history, lengths)
  want = jax.jit(fn)(history.reshape(8, 16), lengths.reshape(8))
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g).reshape(w.shape), w)


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_ngram=2, min_ngram=1, k=0), "k must be >= 1, got 0"),
    (dict(max_ngram=2, min_ngram=0, k=3), "min_ngram must be >= 1, got 0"),
    (dict(max_ngram=1, min_ngram=2, k=3), "max_ngram must be >= min_ngram=2, got 1"),
    (dict(max_ngram=2.5, min_ngram=1, k=3), "max_ngram must be an int, got 2.5"),
])
def test_bad_static_args_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ngram_propose(jnp.zeros((1, 4), jnp.int32), jnp.ones((1,), jnp.int32), **kwargs)


def test_bad_shapes_raise():
  with pytest.raises(ValueError, match="history must be"):
    ngram_propose(jnp.zeros((4,), jnp.int32), jnp.ones((1,), jnp.int32), max_ngram=2,
                  min_ngram=1, k=2)
  with pytest.raises(ValueError, match="lengths must be"):
    ngram_propose(jnp.zeros((2, 4), jnp.int32), jnp.ones((3,), jnp.int32), max_ngram=2,
                  min_ngram=1, k=2)
