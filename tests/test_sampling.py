"""Sampling transforms against exact probabilities computed independently in numpy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.sampling import SamplingConfig, argmax, draw, probs, sample, top_probability

LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], np.float32)


def _softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def test_temperature_and_greedy():
  np.testing.assert_allclose(probs(LOGITS, SamplingConfig(temperature=0.7)), _softmax(LOGITS / 0.7),
                             rtol=1e-6)
  np.testing.assert_array_equal(probs(LOGITS, SamplingConfig()), np.eye(6)[0])


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_argmax_is_numpys_first_maximum(dtype):
  rng = np.random.default_rng(0)
  x = rng.integers(-3, 4, (5, 4, 300)).astype(np.float32)  # few values: ties in every row
  x[0, 0] = -np.inf  # a row of -inf: index 0
  x[1, 1, [7, 40]] = np.nan  # NaN wins, its first one (as jnp.argmax)
  x[2, 2, 299] = 9.0  # the last slot
  got = np.asarray(argmax(jnp.asarray(x, dtype)))
  assert got.dtype == np.int32 and got.shape == (5, 4)
  want = np.argmax(x, -1)  # numpy: the first maximum, the first NaN
  np.testing.assert_array_equal(got, want)
  assert (got[0, 0], got[1, 1], got[2, 2]) == (0, 7, 299)
  np.testing.assert_array_equal(jax.jit(argmax)(jnp.asarray(x, dtype)), want)


def test_top_probability_is_the_softmaxs_largest_entry():
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(3, 5, 200)) * np.array([0.1, 5.0, 40.0])[:, None, None]).astype(np.float32)
  x[0, 0, ::2] = -np.inf  # a trimmed law: half the ids impossible
  want = np.array([[_softmax(row).max() for row in rows] for rows in x.astype(np.float64)])
  np.testing.assert_allclose(top_probability(jnp.asarray(x)), want, rtol=2e-6)
  q = jnp.asarray(rng.dirichlet(np.ones(7), size=4), jnp.float32)  # a sampled draft's law
  np.testing.assert_array_equal(top_probability(x[0, :4, :7], q), np.asarray(q).max(-1))


def test_top_k_keeps_k_largest():
  p = np.asarray(probs(LOGITS, SamplingConfig(temperature=1.0, top_k=3)))
  np.testing.assert_allclose(p[:3], _softmax(LOGITS[:3]), rtol=1e-6)
  assert (p[3:] == 0).all()


@pytest.mark.parametrize("top_p", [0.3, 0.6, 0.9, 0.99])
def test_top_p_keeps_smallest_prefix_reaching_p(top_p):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 50)).astype(np.float32)
  got = np.asarray(probs(logits, SamplingConfig(temperature=1.0, top_p=top_p)))
  for row, g in zip(logits, got):
    full = _softmax(row)
    order = np.argsort(-full)
    n_keep = int(np.searchsorted(np.cumsum(full[order]), top_p) + 1)
    expect = np.zeros_like(full)
    expect[order[:n_keep]] = full[order[:n_keep]] / full[order[:n_keep]].sum()
    np.testing.assert_allclose(g, expect, atol=1e-6)


def test_samples_follow_exact_distribution():
  cfg = SamplingConfig(temperature=0.8, top_p=0.9)
  exact = np.asarray(probs(LOGITS, cfg))
  draws = sample(jax.random.key(0), jnp.broadcast_to(LOGITS, (20000, 6)), cfg)
  freq = np.bincount(np.asarray(draws), minlength=6) / 20000
  assert np.abs(freq - exact).sum() / 2 < 0.015  # TV distance; ~0.005 expected at n=20000
  assert freq[exact == 0].sum() == 0


def test_n_draws_a_row_follow_its_law_from_one_cdf():
  """draw(key, p, n): n independent tokens a row, each row's own law (the exact one, and never a
  zero-mass token), the same tokens as one draw from each of n copies of the row."""
  p = np.stack([_softmax(LOGITS), np.array([0, 0.5, 0, 0.25, 0.25, 0], np.float32)])  # [2, 6]
  draws = np.asarray(draw(jax.random.key(3), jnp.asarray(p), 20000))  # [2, 20000]
  assert draws.shape == (2, 20000)
  for row, law in zip(draws, p):
    freq = np.bincount(row, minlength=6) / 20000
    assert np.abs(freq - law).sum() / 2 < 0.015 and freq[law == 0].sum() == 0
  copies = jnp.broadcast_to(jnp.asarray(p)[:, None], (2, 5, 6))  # n = 5 copies of each row
  np.testing.assert_array_equal(draw(jax.random.key(4), jnp.asarray(p), 5),
                                draw(jax.random.key(4), copies))


def test_samples_keep_each_rows_law_for_any_leading_shape():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(4, 5, 6)).astype(np.float32)  # [b, k, v], as a Medusa step's
  draws = sample(jax.random.key(0), logits, SamplingConfig(temperature=1.0, top_k=1))
  assert draws.shape == (4, 5)
  np.testing.assert_array_equal(draws, logits.argmax(-1))
