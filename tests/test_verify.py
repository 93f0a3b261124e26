"""Chain verification: greedy by hand, sampling against exact probabilities computed in numpy.

The sampling tests simulate many independent speculative steps as one batch (one row per
simulated step, one jit) with a tiny vocabulary and k = 2, and compare the empirical law of the
first two emitted tokens with the target's p0(x) p1(y | x). Planted bugs (drawing the correction
from p instead of the residual, or skipping the acceptance test) must fail the same bound, so the
bound is known to be tight enough to catch them.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core import rejection
from speculax.core.sampling import SamplingConfig, probs
from speculax.verifiers.chain import emitted_tokens, verify_chain

V = 6  # vocab
N = 40_000  # simulated speculative steps per distribution test
# Total-variation bounds at N = 40k. Sampling noise alone measured 0.003-0.005 (first token, 6
# cells) and 0.006-0.011 (pair, 36 cells) over seeds; the planted bugs are exactly >= 0.19 away
# from the target on the pair (asserted > 2 * TV_PAIR below, at every config).
TV_FIRST = 0.015
TV_PAIR = 0.03

CONFIGS = {
    "t1.0": SamplingConfig(temperature=1.0),
    "t0.7": SamplingConfig(temperature=0.7),
    "t0.7_top_p0.9": SamplingConfig(temperature=0.7, top_p=0.9),
}

# ---------------------------------------------------------------------------------------------
# Exact probabilities (numpy, float64)


def _first_token_law(p, q, variant="exact"):
  """Exact law of the first token a verify step emits, target p and drafter q at position 0.

  exact: min(p, q) is kept outright; with the remaining mass the correction comes from
  normalize(max(0, p - q)) (or p when that is empty). The variants model the planted bugs.
  """
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  if variant == "always_accept":
    return q
  kept = np.minimum(p, q)
  residual = np.maximum(p - q, 0)
  if variant == "resample_from_p" or residual.sum() <= 1e-6:
    residual = p
  return kept + (1 - kept.sum()) * residual / residual.sum()


def _exact_pair_law(p0, p1, q0, q1, variant="exact"):
  """Exact law [v, v] of the first two emitted tokens in the simulation below.

  p1[x] / q1[x] are the target / drafter laws at position 1 given token x at position 0. The
  second token comes from the same step (draft 1 kept, or the correction at position 1) when
  draft 0 was kept, and otherwise from the next step, which drafts from q1[first] against
  p1[first]; both cases emit the first-token law of (p1[x], q1[x]), so the pair law factors.
  Under the exact rule this is p0(x) p1(y | x).
  """
  first = _first_token_law(p0, q0, variant)  # [v]
  second = np.stack([_first_token_law(p1[x], q1[x], variant) for x in range(len(p0))])  # [v, v]
  return first[:, None] * second


def _tv(a, b):
  return 0.5 * np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).sum()


def test_exact_rule_is_lossless_by_enumeration():
  """The numpy rule itself reproduces p (incl. zeros in p or q), and the bugs do not."""
  rng = np.random.default_rng(0)
  for _ in range(20):
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    p[rng.integers(V)] = 0
    q[rng.integers(V)] = 0
    p, q = p / p.sum(), q / q.sum()
    np.testing.assert_allclose(_first_token_law(p, q), p, atol=1e-12)
    assert _tv(_first_token_law(p, q, "resample_from_p"), p) > 1e-3
    assert _tv(_first_token_law(p, q, "always_accept"), p) > 1e-3
  np.testing.assert_allclose(_first_token_law(p, p), p, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Simulation: N independent speculative steps as one batch


_probs_jit = jax.jit(probs, static_argnums=1)


def _tables(seed, sampling):
  """Target and drafter laws after `sampling`: position 1 conditioned on token 0, etc."""
  rng = np.random.default_rng(seed)
  t0, t1, t2 = (rng.normal(scale=1.5, size=(V,) * n).astype(np.float32) for n in (1, 2, 3))
  d0, d1 = (rng.normal(scale=1.5, size=(V,) * n).astype(np.float32) for n in (1, 2))
  rows = np.concatenate([t0[None], t1, d0[None], d1])  # [2 + 2v, v] one transform, one compile
  laws = np.asarray(_probs_jit(rows, sampling), np.float64)
  p0, p1, q0, q1 = np.split(laws, [1, 1 + V, 2 + V])
  return dict(t0=t0, t1=t1, t2=t2, p0=p0[0], p1=p1, q0=q0[0], q1=q1)


def _simulate(key, tables, *, sampling, one_hot):
  """First and second emitted tokens and n_accepted of step 1, for N independent runs.

  Step 1 drafts x0 ~ q0, x1 ~ q1[x0] (or, one_hot, the argmax of each: a deterministic drafter
  whose q is the one-hot of its proposal) and verifies against target logits that depend on the
  drafted prefix. Step 2 supplies the second token when step 1 kept no draft.
  """
  q0 = jnp.asarray(tables["q0"], jnp.float32)  # [v]
  q1 = jnp.asarray(tables["q1"], jnp.float32)  # [v, v]
  t0, t1, t2 = (jnp.asarray(tables[n]) for n in ("t0", "t1", "t2"))
  key_draft, key_step1, key_step2 = jax.random.split(key, 3)
  gumbel = jax.random.gumbel(key_draft, (4, N, V))  # one draw for all four drafts (fast compile)

  def draft(i, q):  # q [N, v] -> tokens [N] ~ q, their q rows [N, v]
    if one_hot:
      x = jnp.argmax(q, -1).astype(jnp.int32)
      return x, jax.nn.one_hot(x, V, dtype=jnp.float32)
    return jnp.argmax(jnp.log(q) + gumbel[i], -1).astype(jnp.int32), q

  x0, qx0 = draft(0, jnp.broadcast_to(q0, (N, V)))
  x1, qx1 = draft(1, q1[x0])
  logits = jnp.stack([jnp.broadcast_to(t0, (N, V)), t1[x0], t2[x0, x1]], 1)  # [N, 3, v]
  n, nxt = verify_chain(key_step1, logits, jnp.stack([x0, x1], 1), jnp.stack([qx0, qx1], 1),
                        sampling)
  first = jnp.where(n >= 1, x0, nxt)

  y0, qy0 = draft(2, q1[first])
  y1, qy1 = draft(3, q1[y0])
  logits2 = jnp.stack([t1[first], t2[first, y0], t2[y0, y1]], 1)  # only position 0 matters
  n2, nxt2 = verify_chain(key_step2, logits2, jnp.stack([y0, y1], 1), jnp.stack([qy0, qy1], 1),
                          sampling)
  second = jnp.where(n >= 2, x1, jnp.where(n == 1, nxt, jnp.where(n2 >= 1, y0, nxt2)))
  return first, second, n


def _empirical(sampling, tables, one_hot=False, seed=0):
  """Runs the simulation under a fresh jit (so monkeypatched helpers are traced in)."""
  run = jax.jit(functools.partial(_simulate, sampling=sampling, one_hot=one_hot))
  first, second, n = (np.asarray(a) for a in run(jax.random.key(seed), tables))
  pair = np.bincount(first * V + second, minlength=V * V).reshape(V, V) / N
  return pair, n


def _target_pair(tables):
  return tables["p0"][:, None] * tables["p1"]  # [v, v] p0(x) p1(y | x)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampling_is_lossless(name):
  sampling = CONFIGS[name]
  tables = _tables(1, sampling)
  pair, n = _empirical(sampling, tables)
  target = _target_pair(tables)
  np.testing.assert_allclose(_exact_pair_law(tables["p0"], tables["p1"], tables["q0"],
                                             tables["q1"]), target, atol=1e-6)
  assert _tv(pair.sum(1), tables["p0"]) < TV_FIRST
  assert _tv(pair, target) < TV_PAIR
  assert pair[target == 0].sum() == 0  # top-p: tokens outside the nucleus are never emitted
  accept0 = np.minimum(tables["p0"], tables["q0"]).sum()  # exact P(draft 0 kept)
  assert abs((n >= 1).mean() - accept0) < 0.015
  assert 0.1 < accept0 < 0.9  # p and q really differ, and both branches are exercised
  for bug in PLANTED:  # every planted bug is far outside the bound here (exact, no sampling)
    exact_bug = _exact_pair_law(tables["p0"], tables["p1"], tables["q0"], tables["q1"], bug)
    assert _tv(exact_bug, target) > 2 * TV_PAIR


def _resample_from_p(p, q):
  return p


def _always_accept(u, px, qx):
  return jnp.ones_like(px, bool)


PLANTED = {"resample_from_p": ("residual", _resample_from_p),
           "always_accept": ("accept", _always_accept)}


@pytest.mark.parametrize("bug,name", [("resample_from_p", "t1.0"), ("always_accept", "t0.7"),
                                      ("resample_from_p", "t0.7_top_p0.9")])
def test_planted_bug_violates_the_bound(monkeypatch, bug, name):
  sampling = CONFIGS[name]
  tables = _tables(1, sampling)
  target = _target_pair(tables)
  exact_bug = _exact_pair_law(tables["p0"], tables["p1"], tables["q0"], tables["q1"], bug)
  assert _tv(exact_bug, target) > 2 * TV_PAIR  # the bug is big enough for this test to see
  monkeypatch.setattr(rejection, *PLANTED[bug])
  pair, _ = _empirical(sampling, tables)
  assert _tv(pair, exact_bug) < TV_PAIR  # the numpy model of the bug matches the code
  assert _tv(pair, target) > TV_PAIR


def test_deterministic_drafter_is_lossless():
  """q = one-hot of the proposal; with top-p some proposals are outside the nucleus (p = 0)."""
  sampling = CONFIGS["t0.7_top_p0.9"]
  tables = _tables(2, sampling)
  assert (tables["p1"][np.arange(V), tables["q1"].argmax(1)] == 0).any()
  pair, n = _empirical(sampling, tables, one_hot=True)
  target = _target_pair(tables)
  assert _tv(pair.sum(1), tables["p0"]) < TV_FIRST
  assert _tv(pair, target) < TV_PAIR
  assert abs((n >= 1).mean() - tables["p0"][np.argmax(tables["q0"])]) < 0.015


# ---------------------------------------------------------------------------------------------
# Greedy and edge cases


def _logits_with_argmax(best):
  """[b, k+1, v] logits whose argmax at [r, i] is best[r][i]."""
  best = np.asarray(best)
  logits = np.random.default_rng(0).normal(size=best.shape + (V,)).astype(np.float32)
  np.put_along_axis(logits, best[..., None], 10.0, -1)
  return jnp.asarray(logits)


def test_greedy_hand_cases():
  best = [[1, 2, 3, 4],  # all three kept: bonus 4
          [1, 2, 3, 4],  # first differs: correction 1
          [1, 2, 3, 4],  # mismatch at position 1: keep 1, correction 2
          [5, 5, 0, 2]]  # mismatch at the last draft: keep 2, correction 0
  drafts = jnp.asarray([[1, 2, 3], [0, 2, 3], [1, 0, 3], [5, 5, 1]], jnp.int32)
  run = jax.jit(functools.partial(verify_chain, sampling=SamplingConfig()))
  n, nxt = run(jax.random.key(0), _logits_with_argmax(best), drafts, None)
  assert n.dtype == jnp.int32 and nxt.dtype == jnp.int32
  assert n.tolist() == [3, 0, 1, 2]
  assert nxt.tolist() == [4, 1, 2, 0]
  out = emitted_tokens(drafts, n, nxt)
  assert out.tolist() == [[1, 2, 3, 4], [1, -1, -1, -1], [1, 2, -1, -1], [5, 5, 0, -1]]


def test_adaptive_length_checks_only_the_first_drafts():
  """Drafts past a row's length count as rejected: greedy takes the target's token there, and
  sampling draws from p itself there (no q to correct for), whatever the withdrawn draft was."""
  best = [[1, 2, 3, 4]] * 3
  drafts = jnp.asarray([[1, 2, 3]] * 3, jnp.int32)  # all would be kept
  length = jnp.asarray([1, 2, 3], jnp.int32)
  n, nxt = verify_chain(jax.random.key(0), _logits_with_argmax(best), drafts, None,
                        SamplingConfig(), length)
  assert n.tolist() == [1, 2, 3] and nxt.tolist() == [2, 3, 4]
  # Sampled, length 1, the second draft certain under q: the next token follows p at position 1.
  rows, sampling = 4000, SamplingConfig(temperature=1.0)
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(1, 3, V)), jnp.float32)
  p1 = np.asarray(probs(logits[0, 1], sampling))
  q = jax.nn.one_hot(jnp.asarray([[int(np.argmax(logits[0, 0])), 0]]), V)  # [1, 2, v]
  toks = jnp.asarray([[int(np.argmax(logits[0, 0])), 0]], jnp.int32)

  def tv_after_first(length):  # TV of the next token's law after a kept first draft vs p_1
    run = jax.vmap(lambda key: verify_chain(key, logits, toks, q, sampling, jnp.asarray([length])))
    n, nxt = run(jax.random.split(jax.random.key(2), rows))
    kept = np.asarray(n[:, 0]) == 1
    freq = np.bincount(np.asarray(nxt[:, 0])[kept], minlength=V) / kept.sum()
    return 0.5 * np.abs(freq - p1).sum()

  # Measured 0.022 (noise at ~1000 kept rows); with the second draft verified (length 2) the
  # rows that stop after one draft never emit token 0: TV = p_1(0) = 0.074.
  assert tv_after_first(1) < 0.05 < tv_after_first(2)


def test_greedy_ignores_draft_probs():
  logits = _logits_with_argmax([[1, 2]])
  junk = jnp.full((1, 1, V), jnp.nan)
  for q in (None, junk):
    n, nxt = verify_chain(jax.random.key(0), logits, jnp.asarray([[1]], jnp.int32), q,
                          SamplingConfig(top_k=2))
    assert (n.tolist(), nxt.tolist()) == ([1], [2])


def test_zero_draft_probability_is_handled_without_nan():
  """q(x) = 0: keep x iff p(x) > 0 (ratio inf), never NaN; p(x) = 0 always rejects."""
  sampling = SamplingConfig(temperature=1.0, top_k=2)
  logits = jnp.asarray([[[3.0, 2.0, 0, 0, 0, 0], [0, 3.0, 2.0, 0, 0, 0]]] * 2)  # [2, 2, v]
  drafts = jnp.asarray([[1], [4]], jnp.int32)  # p(1) > 0 at position 0; p(4) = 0 (top-k)
  q = jnp.asarray([[[1.0, 0, 0, 0, 0, 0]]] * 2)  # q puts no mass on either draft
  run = jax.jit(jax.vmap(functools.partial(verify_chain, sampling=sampling),
                         in_axes=(0, None, None, None)))
  n, nxt = run(jax.random.split(jax.random.key(0), 500), logits, drafts, q)
  n, nxt = np.asarray(n), np.asarray(nxt)
  assert (n[:, 0] == 1).all() and (n[:, 1] == 0).all()
  assert set(nxt[:, 0]) == {1, 2}  # bonus from p at position 1 (top-2: tokens 1, 2)
  assert set(nxt[:, 1]) == {1}  # residual max(0, p - q) removes token 0: only 1 remains


def test_residual_without_mass_falls_back_to_p():
  p = jnp.asarray([[0.5, 0.5, 0, 0]])
  np.testing.assert_array_equal(rejection.residual(p, p), p)
  np.testing.assert_allclose(rejection.residual(p, jnp.asarray([[1.0, 0, 0, 0]])), [[0, 1, 0, 0]])


def test_bad_shapes_raise():
  logits = jnp.zeros((2, 3, V))
  drafts = jnp.zeros((2, 2), jnp.int32)
  key = jax.random.key(0)
  sampling = SamplingConfig(temperature=1.0)
  with pytest.raises(ValueError, match="draft_probs .* is required"):
    verify_chain(key, logits, drafts, None, sampling)
  with pytest.raises(ValueError, match=r"draft_probs must be \[b, k, v\]"):
    verify_chain(key, logits, drafts, jnp.zeros((2, 3, V)), sampling)
  with pytest.raises(ValueError, match=r"draft_tokens must be \[b, k\]"):
    verify_chain(key, logits, jnp.zeros((2, 3), jnp.int32), None, SamplingConfig())
  with pytest.raises(ValueError, match="top_k=7 exceeds"):
    verify_chain(key, logits, drafts, None, SamplingConfig(top_k=7))


def test_inverse_cdf_never_picks_zero_probability_tokens():
  dist = jnp.asarray([[0, 0.5, 0, 0.5, 0, 0]] * 4)
  u = jnp.asarray([0.0, 0.4999, 0.5, np.nextafter(np.float32(1), np.float32(0))])
  assert rejection.inverse_cdf(u, dist).tolist() == [1, 1, 3, 3]
