"""train/teacher_law.py: a cached top-k law spread over its ids, and the divergences and metrics
read on it as it is against the same ones on the spread law (train/losses.py, `np.argmax`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.train import losses, teacher_law

B, T, V = 2, 2, 5
N, K = 12, 4  # the top-k forms' vocabulary and top-k


def _logp(seed, scale, shape=(B, T, V)):
  """A random law's float64 log-probs."""
  x = np.random.default_rng(seed).normal(size=shape) * scale
  return x - np.log(np.sum(np.exp(x), -1, keepdims=True))


_from_topk = jax.jit(teacher_law.teacher_logprobs_from_topk, static_argnums=2)


def test_topk_full_vocab_is_exact():
  logp = _logp(7, 3.0)
  ids = np.argsort(np.random.default_rng(8).uniform(size=(B, T, V)), -1)  # shuffled order
  dense = _from_topk(jnp.asarray(ids, jnp.int32),
                     jnp.asarray(np.take_along_axis(logp, ids, -1), jnp.float32), V)
  np.testing.assert_allclose(dense, logp, atol=1e-6)


def test_topk_partial():
  logp = _logp(9, 3.0)
  ids = np.argsort(-logp, -1)[..., :2]
  vals = np.take_along_axis(logp, ids, -1)
  dense = np.asarray(_from_topk(jnp.asarray(ids, jnp.int32), jnp.asarray(vals, jnp.float32), V))
  np.testing.assert_allclose(np.exp(dense).sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(np.take_along_axis(dense, ids, -1), vals, atol=1e-6)
  rest = (1 - np.exp(vals).sum(-1)) / (V - 2)
  others = np.exp(np.sort(dense, -1)[..., : V - 2])
  np.testing.assert_allclose(others, np.broadcast_to(rest[..., None], others.shape), rtol=1e-5)
  # a top-k mass that rounds above 1 still gives finite, normalized log-probs
  over = np.asarray(_from_topk(jnp.asarray(ids, jnp.int32),
                               jnp.log(jnp.full((B, T, 2), 0.505, jnp.float32)), V))
  assert np.all(np.isfinite(over))
  np.testing.assert_allclose(np.exp(over).sum(-1), 1.0, atol=1e-6)
  with pytest.raises(ValueError, match="K=6"):
    teacher_law.teacher_logprobs_from_topk(jnp.zeros((1, 1, 6), jnp.int32), jnp.zeros((1, 1, 6)), V)


def test_teacher_law_reads_exact_logits_where_a_batch_holds_them():
  logits = _logp(10, 3.0)  # log-probs: their own log-softmax
  ids = np.argsort(-logits, -1)[..., :2]
  cached = {"ids": jnp.asarray(ids, jnp.int32),
            "logprobs": jnp.asarray(np.take_along_axis(logits, ids, -1))}
  kept = jnp.asarray([0, 2, 3])
  exact = teacher_law.teacher_law({**cached, "teacher_logits": jnp.asarray(logits)}, V)
  np.testing.assert_allclose(exact, logits, atol=1e-6)
  on_kept = teacher_law.teacher_law({"teacher_logits": jnp.asarray(logits)}, V, kept)
  np.testing.assert_allclose(on_kept, logits[..., [0, 2, 3]], atol=1e-6)
  np.testing.assert_allclose(teacher_law.dense(teacher_law.teacher_law(cached, V, kept), 3),
                             _from_topk(cached["ids"], cached["logprobs"], V)[..., kept], atol=1e-6)


def test_topk_teacher_on_kept_ids_is_the_dense_law_there():
  rng = np.random.default_rng(0)
  logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 3, 50)) * 3, jnp.float32))
  values, ids = jax.lax.top_k(logp, 8)
  dense = teacher_law.teacher_logprobs_from_topk(ids, values, 50)  # [2, 3, 50]
  np.testing.assert_allclose(jnp.exp(dense).sum(-1), 1, rtol=1e-5)
  kept = jnp.asarray(np.sort(rng.permutation(50)[:20]))
  np.testing.assert_allclose(teacher_law.teacher_logprobs_from_topk(ids, values, 50, kept),
                             dense[..., kept], rtol=1e-5, atol=1e-6)


# Every divergence, the top-k forms (fkl, lk) and those spread out first, with their gradients.
FORMS = (("fkl", {}), ("lk", {}), ("lk", {"kl_weight": 0.5}), ("tvd", {}), ("jsd", {"beta": 0.3}),
         ("fkl", {"teacher_temperature": 0.5}))


@jax.jit
def _both_ways(law, student, mask):
  """{form: ((value, grad) on the TopK, (value, grad) on its dense log-probs)}, plus each
  way's per-position acceptance and the teacher's top id."""
  spread = teacher_law.dense(law, student.shape[-1])
  out = {}
  for name, options in FORMS:
    on_topk = teacher_law.get_divergence(name, **options)
    on_dense = losses.get_divergence(name, **options)
    out[f"{name}{options}"] = (jax.value_and_grad(lambda s: on_topk(law, s, mask))(student),
                               jax.value_and_grad(lambda s: on_dense(spread, s, mask))(student))
  out["acceptance"] = (teacher_law.acceptance(law, student, mask),
                       teacher_law.acceptance(spread, student, mask))
  out["token_acceptance"] = (teacher_law.token_acceptance(law, student, mask),
                             teacher_law.token_acceptance(spread, student, mask))
  out["top"] = (teacher_law.top(law, student.shape[-1]), jnp.argmax(spread, -1))
  return out


def _case(seed: int, kept: np.ndarray | None):
  """A top-K law of a random teacher over N ids (on `kept` only when given), student logits
  over its ids with a masked row of NaN, and a fractional mask."""
  logp = _logp(seed, 3.0, (2, 3, N))
  rng = np.random.default_rng(seed + 100)
  ids = np.argsort(-logp, -1)[..., :K]
  law = teacher_law.from_topk(jnp.asarray(ids, jnp.int32),
                              jnp.asarray(np.take_along_axis(logp, ids, -1), jnp.float32), N,
                              None if kept is None else jnp.asarray(kept))
  student = rng.normal(size=(2, 3, N if kept is None else len(kept))) * 2
  student[0, 2] = np.nan
  mask = np.array([[1.0, 1.0, 0.0], [1.0, 0.5, 1.0]])
  return law, jnp.asarray(student, jnp.float32), jnp.asarray(mask, jnp.float32), ids


@pytest.mark.parametrize("trimmed", [False, True])
def test_topk_forms_match_the_spread_law_in_value_and_gradient(trimmed):
  ids = _case(0, None)[3]
  # trimmed: every id but row (1, 0)'s top-k is kept, so there the law holds only its rest
  kept = np.setdiff1d(np.arange(N), ids[1, 0]) if trimmed else None
  law, student, mask, _ = _case(0, kept)
  if trimmed:
    assert bool(jnp.all(law.ids[1, 0] == len(kept))) and bool(jnp.any(law.ids[0, 0] < len(kept)))
  out = jax.device_get(_both_ways(law, student, mask))
  for form, ((value, grad), (want, want_grad)) in (
      (k, v) for k, v in out.items() if k not in ("acceptance", "token_acceptance", "top")):
    assert np.isfinite(value) and np.all(np.isfinite(grad)), form
    np.testing.assert_allclose(value, want, rtol=2e-5, atol=1e-6, err_msg=form)
    np.testing.assert_allclose(grad, want_grad, rtol=2e-4, atol=1e-6, err_msg=form)
  got, want = out["acceptance"]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert got[0, 2] == 0 and 0 < got.min(initial=1, where=np.asarray(mask) > 0)
  np.testing.assert_allclose(*out["token_acceptance"], rtol=1e-5)
  got, want = out["top"]
  valid = np.asarray(mask) > 0
  np.testing.assert_array_equal(got[valid], want[valid])
  if trimmed:
    assert got[1, 0] == 0  # every id there holds the rest: the lowest


def test_top_is_the_lowest_other_id_where_the_rest_outweighs_the_top_k():
  """Top-k mass 0.14 leaves 0.86 / 8 = 0.1075 to each other id, more than any listed one."""
  ids = jnp.asarray([[[3, 0, 1, 5]]], jnp.int32)
  law = teacher_law.from_topk(ids, jnp.log(jnp.asarray([[[0.05, 0.04, 0.03, 0.02]]])), 12)
  spread = teacher_law.dense(law, 12)
  assert int(teacher_law.top(law, 12)[0, 0]) == int(jnp.argmax(spread, -1)[0, 0]) == 2


def test_topk_forms_refuse_what_does_not_fit_by_name():
  law, student, mask, _ = _case(1, None)
  with pytest.raises(ValueError, match=r"top-k \(2, 3, 4\).*\(2, 2, 12\)"):
    teacher_law.get_divergence("fkl")(law, student[:, :2], mask[:, :2])
  with pytest.raises(ValueError, match="kl_weight must be >= 0, got -1"):
    teacher_law.get_divergence("lk", kl_weight=-1)(law, student, mask)
  with pytest.raises(ValueError, match="no option"):
    teacher_law.get_divergence("fkl", beta=0.5)
