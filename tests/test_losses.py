"""Distillation divergences against plain-numpy references on tiny hand-built distributions.

Compilation dominates on a shared 2-core CPU, so every check goes through a few jitted programs
with one input signature ([2, 2, 5] logits), the data is built in numpy, and keys use the "rbg"
PRNG, which compiles several times faster than threefry on CPU.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.train import losses, teacher_law

B, T, V = 2, 2, 5
KEY = jax.random.key(0, impl="rbg")


@jax.jit
def _evaluate(teacher_logp, student_logits, mask, targets, key, beta):
  """(values, grads w.r.t. student logits) of every loss, plus the acceptance metric."""

  def all_losses(s):
    out = {name: losses.get_divergence(name)(teacher_logp, s, mask, key=key)
           for name in losses.DIVERGENCES}
    out["jsd_beta"] = losses.jsd(teacher_logp, s, mask, beta=beta)
    out["ce"] = losses.cross_entropy(targets, s, mask)
    return out

  values = all_losses(student_logits)
  values["acceptance"] = teacher_law.token_acceptance(teacher_logp, student_logits, mask)
  return values, jax.jacrev(all_losses)(student_logits)


def evaluate(teacher_logp, student_logits, mask=None, targets=None, beta=0.5):
  """numpy in, numpy out; mask defaults to all valid, targets to zeros."""
  mask = np.ones((B, T)) if mask is None else mask
  targets = np.zeros((B, T)) if targets is None else targets
  values, grads = _evaluate(jnp.asarray(teacher_logp, jnp.float32),
                            jnp.asarray(student_logits, jnp.float32),
                            jnp.asarray(mask, jnp.float32), jnp.asarray(targets, jnp.int32),
                            KEY, beta)
  return ({k: float(v) for k, v in values.items()}, {k: np.asarray(g) for k, g in grads.items()})


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  m = np.max(x, -1, keepdims=True)
  return x - m - np.log(np.sum(np.exp(x - m), -1, keepdims=True))


def _rand(seed, scale=1.0):
  return np.random.default_rng(seed).normal(size=(B, T, V)) * scale


@pytest.fixture(scope="module")
def example():
  """A teacher zero where the student is not (0, 1); a padded vocab entry where both are zero
  (1, 0); a masked position holding NaN / inf garbage (1, 1)."""
  t_logits, s_logits = _rand(0, 1.5), _rand(1)
  t_logits[0, 1, 3] = -np.inf
  t_logits[1, 0, 4] = s_logits[1, 0, 4] = -np.inf
  teacher_logp = _log_softmax(t_logits)
  teacher_logp[1, 1] = np.nan
  s_logits[1, 1] = [np.inf, -np.inf, np.nan, 1e30, 0.0]
  mask = np.array([[1.0, 1.0], [1.0, 0.0]])
  targets = np.array([[2, 0], [1, 10**6]])  # the masked position holds an impossible id
  valid = [(0, 0), (0, 1), (1, 0)]
  p = np.stack([np.exp(teacher_logp[i]) for i in valid])  # [3, v]
  q = np.stack([np.exp(_log_softmax(s_logits[i])) for i in valid])  # [3, v]
  return dict(teacher_logp=teacher_logp, student_logits=s_logits, mask=mask, targets=targets,
              p=p, q=q)


def _np_kl(a, b):
  """Mean over rows of sum a log(a / b), 0 log 0 = 0."""
  safe = np.where(a > 0, a, 1.0) / np.where(a > 0, b, 1.0)
  return np.mean(np.sum(np.where(a > 0, a * np.log(safe), 0.0), -1))


def _np_rkl(p, q):
  logp = np.maximum(np.log(np.maximum(p, 1e-300)), losses.LOG_FLOOR)
  logq = np.log(np.maximum(q, 1e-300))
  return np.mean(np.sum(np.where(q > 0, q * (logq - logp), 0.0), -1))


def _np_jsd(p, q, beta):
  m = beta * p + (1 - beta) * q
  return beta * _np_kl(p, m) + (1 - beta) * _np_kl(q, m)


def test_reference_values(example):
  """Every loss equals its numpy definition over the 3 valid positions only."""
  p, q = example["p"], example["q"]
  ex = {k: example[k] for k in ("teacher_logp", "student_logits", "mask", "targets")}
  values, _ = evaluate(**ex, beta=0.2)
  np.testing.assert_allclose(values["fkl"], _np_kl(p, q), rtol=1e-5)
  np.testing.assert_allclose(values["rkl"], _np_rkl(p, q), rtol=1e-5)
  np.testing.assert_allclose(values["jsd"], _np_jsd(p, q, 0.5), rtol=1e-5)
  np.testing.assert_allclose(values["jsd_beta"], _np_jsd(p, q, 0.2), rtol=1e-5)
  np.testing.assert_allclose(values["tvd"], np.mean(0.5 * np.abs(p - q).sum(-1)), rtol=1e-5)
  np.testing.assert_allclose(values["acceptance"], np.mean(np.minimum(p, q).sum(-1)), rtol=1e-5)
  np.testing.assert_allclose(values["acceptance"], 1.0 - values["tvd"], atol=1e-6)
  np.testing.assert_allclose(values["lk"], -np.mean(np.log(np.minimum(p, q).sum(-1))), rtol=1e-5)
  mixed = losses.get_divergence("lk", kl_weight=0.3)(*(jnp.asarray(ex[k], jnp.float32) for k in (
      "teacher_logp", "student_logits", "mask")))
  np.testing.assert_allclose(mixed, values["lk"] + 0.3 * values["fkl"], rtol=1e-5)
  ce = -np.mean(np.log([q[0, 2], q[1, 0], q[2, 1]]))
  np.testing.assert_allclose(values["ce"], ce, rtol=1e-5)


def test_literal_values():
  """p = [1/2, 1/2, 0, 0, 0], q = [1/4, 1/4, 1/2, 0, 0]: FKL = log 2, TVD = 1/2 = acceptance."""
  with np.errstate(divide="ignore"):
    logp = np.broadcast_to(np.log([0.5, 0.5, 0.0, 0.0, 0.0]), (B, T, V))
    logits = np.broadcast_to(np.log([0.25, 0.25, 0.5, 0.0, 0.0]), (B, T, V))
  values, _ = evaluate(logp, logits)
  np.testing.assert_allclose(values["fkl"], math.log(2), rtol=1e-6)
  np.testing.assert_allclose(values["tvd"], 0.5, rtol=1e-6)
  np.testing.assert_allclose(values["acceptance"], 0.5, rtol=1e-6)
  # RKL pays 0.5 * (log 0.5 - LOG_FLOOR) for the teacher zero: large but finite.
  rkl = 0.5 * math.log(0.5) + 0.5 * (math.log(0.5) - losses.LOG_FLOOR)
  np.testing.assert_allclose(values["rkl"], rkl, rtol=1e-5)


def test_masked_garbage_and_weights(example):
  """Other garbage at the masked position changes nothing; float masks weight positions."""
  ex = {k: example[k] for k in ("teacher_logp", "student_logits", "mask", "targets")}
  base, _ = evaluate(**ex)
  other = dict(ex, student_logits=ex["student_logits"].copy(), targets=ex["targets"].copy())
  other["student_logits"][1, 1] = np.arange(V)
  other["targets"][1, 1] = -3
  changed, _ = evaluate(**other)
  assert changed == base
  ones = evaluate(ex["teacher_logp"], ex["student_logits"], np.array([[1, 0], [0, 0]]))[0]
  twos = evaluate(ex["teacher_logp"], ex["student_logits"], np.array([[0, 0], [1, 0]]))[0]
  weighted = evaluate(ex["teacher_logp"], ex["student_logits"], np.array([[2.0, 0], [1, 0]]))[0]
  np.testing.assert_allclose(weighted["tvd"], (2 * ones["tvd"] + twos["tvd"]) / 3, rtol=1e-6)
  nothing = evaluate(ex["teacher_logp"], ex["student_logits"], np.zeros((B, T)))[0]
  assert all(v == 0.0 for v in nothing.values())
  bool_mask = jnp.asarray(ex["mask"] > 0)
  np.testing.assert_allclose(
      jax.jit(losses.tvd)(jnp.asarray(ex["teacher_logp"], jnp.float32),
                          jnp.asarray(ex["student_logits"], jnp.float32), bool_mask),
      base["tvd"], rtol=1e-6)


def test_gradients_finite_and_masked(example):
  """Finite gradients despite zeros and garbage; masked positions get exactly zero."""
  ex = {k: example[k] for k in ("teacher_logp", "student_logits", "mask", "targets")}
  values, grads = evaluate(**ex)
  for name, g in grads.items():
    assert np.isfinite(values[name]), name
    assert np.all(np.isfinite(g)), name
    assert not np.any(g[1, 1]), name
    if name != "tvd++":  # three one-sample rewards may all be equal: a legitimately zero grad
      assert np.any(g), name
  # closed forms: d FKL / d logits = q - p and d CE / d logits = q - onehot, over 3 positions
  valid = ex["mask"] > 0
  np.testing.assert_allclose(grads["fkl"][valid], (example["q"] - example["p"]) / 3, atol=1e-6)
  onehot = np.eye(V)[ex["targets"][valid]]
  np.testing.assert_allclose(grads["ce"][valid], (example["q"] - onehot) / 3, atol=1e-6)


def test_zero_when_equal():
  logits = _rand(2)
  values, grads = evaluate(_log_softmax(logits), logits)
  for name in ("fkl", "rkl", "jsd", "jsd_beta", "tvd", "lk"):
    assert abs(values[name]) < 1e-6, name
  np.testing.assert_allclose(values["acceptance"], 1.0, rtol=1e-6)
  for name in ("fkl", "rkl", "jsd", "jsd_beta"):
    np.testing.assert_allclose(grads[name], 0.0, atol=1e-6)


def test_asymmetry_symmetry_and_bounds():
  a, b = _rand(3, 2.0), _rand(4, 2.0)
  ab, _ = evaluate(_log_softmax(a), b)
  ba, _ = evaluate(_log_softmax(b), a)
  assert ab["fkl"] > 0 and ab["rkl"] > 0 and abs(ab["fkl"] - ab["rkl"]) > 1e-2
  np.testing.assert_allclose(ab["fkl"], ba["rkl"], rtol=1e-5)  # KL(p||q) with roles swapped
  np.testing.assert_allclose(ab["jsd"], ba["jsd"], rtol=1e-5)
  assert 0 < ab["tvd"] < 1 and 0 < ab["jsd"] < math.log(2)
  # near-disjoint supports: JSD -> log 2 and TVD -> 1, from below
  left = np.broadcast_to([30.0, 30.0, -30.0, -30.0, -30.0], (B, T, V))
  apart, _ = evaluate(_log_softmax(left), -left)
  assert math.log(2) - 1e-4 < apart["jsd"] <= math.log(2) + 1e-6
  assert 1 - 1e-4 < apart["tvd"] <= 1.0


def test_jsd_limits():
  """JSD / beta -> forward KL as beta -> 0; JSD / (1 - beta) -> reverse KL as beta -> 1."""
  logp, s = _log_softmax(_rand(5)), _rand(6)
  eps = 1e-3
  low, _ = evaluate(logp, s, beta=eps)
  high, _ = evaluate(logp, s, beta=1 - eps)
  np.testing.assert_allclose(low["jsd_beta"] / eps, low["fkl"], rtol=1e-2)
  np.testing.assert_allclose(high["jsd_beta"] / eps, high["rkl"], rtol=1e-2)
  for beta in (0.0, 1.0):
    with pytest.raises(ValueError, match="beta"):
      losses.jsd(jnp.zeros((1, 1, 2)), jnp.zeros((1, 1, 2)), jnp.ones((1, 1)), beta=beta)


@functools.partial(jax.jit, static_argnames="n")
def _tvd_pp_grads(teacher_logp, student_logits, mask, key, n):
  """grad of tvd, TVD++ and unnormalized TVD++ with n samples; tvd++ via both entry points."""
  grad = lambda f: jax.grad(f)(student_logits)
  exact = grad(lambda s: losses.tvd(teacher_logp, s, mask))
  pp = grad(lambda s: losses.tvd_plus_plus(teacher_logp, s, mask, key=key, n_samples=n))
  plain = grad(lambda s: losses.tvd_plus_plus(teacher_logp, s, mask, key=key, n_samples=n,
                                              normalize=False))
  valid = (mask > 0)[..., None]
  samples = losses.student_samples(key, jnp.where(valid, student_logits, 0.0), n)
  pair = (losses.tvd_plus_plus(teacher_logp, student_logits, mask, key=key, n_samples=n),
          losses.tvd_plus_plus_from_samples(teacher_logp, student_logits, samples, mask))
  return exact, pp, plain, pair


def _cosine(a, b):
  a, b = np.ravel(a), np.ravel(b)
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_tvd_plus_plus_gradient_direction():
  """With many samples TVD++'s gradient points along grad(tvd); unnormalized it equals it."""
  mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
  exact, pp, plain, (drawn, given) = _tvd_pp_grads(
      jnp.asarray(_log_softmax(_rand(10, 2.0)), jnp.float32),
      jnp.asarray(_rand(11), jnp.float32), mask, jax.random.key(12, impl="rbg"), n=20000)
  assert _cosine(pp, exact) > 0.99  # measured ~0.9999 over several keys
  assert _cosine(plain, exact) > 0.99
  np.testing.assert_allclose(plain, exact, atol=0.01)  # largest component of exact: 0.07
  assert not np.any(np.asarray(pp[1, 1]))
  np.testing.assert_allclose(drawn, given, rtol=1e-6)  # key form == explicit-samples form


def test_registry_errors(example):
  args = [jnp.asarray(example[k], jnp.float32) for k in ("teacher_logp", "student_logits")]
  assert set(losses.DIVERGENCES) == {"fkl", "rkl", "jsd", "tvd", "tvd++", "lk"}
  assert losses.get_divergence("jsd", beta=0.2).keywords == {"beta": 0.2}
  with pytest.raises(ValueError, match=r"'kl2'.*fkl, jsd, lk, rkl, tvd, tvd\+\+"):
    losses.get_divergence("kl2")
  with pytest.raises(ValueError, match="temperature"):
    losses.get_divergence("fkl", temperature=2.0)
  with pytest.raises(ValueError, match="key"):
    losses.get_divergence("tvd++")(*args, jnp.ones((B, T)))
  for bad in (-0.5, float("inf"), "0"):
    with pytest.raises(ValueError, match=f"teacher_temperature must be a finite number >= 0, "
                                         f"got {bad!r}"):
      losses.get_divergence("lk", teacher_temperature=bad)
  with pytest.raises(ValueError, match="mask shape"):
    losses.tvd(*args, jnp.ones((B, T + 1)))


def test_teacher_temperature_sharpens_the_teacher(example):
  """T = 0 turns every divergence against the teacher into CE on its top token (lk and fkl
  alike); T = 0.5 is the teacher squared and renormalized; T = 1 is the plain divergence."""
  teacher, student = (jnp.asarray(example[k], jnp.float32) for k in ("teacher_logp",
                                                                     "student_logits"))
  mask = jnp.asarray(example["mask"])  # the masked position holds garbage: it must stay out
  top = jnp.argmax(teacher, -1)
  ce = losses.cross_entropy(top, student, mask)
  for name in ("lk", "fkl"):
    np.testing.assert_allclose(losses.get_divergence(name, teacher_temperature=0)(
        teacher, student, mask), ce, rtol=1e-5)
  squared = jax.nn.log_softmax(2 * teacher, -1)
  np.testing.assert_allclose(losses.get_divergence("tvd", teacher_temperature=0.5)(
      teacher, student, mask), losses.tvd(squared, student, mask), rtol=1e-6)
  assert losses.get_divergence("tvd", teacher_temperature=1) is losses.DIVERGENCES["tvd"]
  assert not np.isclose(losses.tvd(squared, student, mask), losses.tvd(teacher, student, mask))
