"""Multi-draft verification (core/multi_draft.py): each rule is lossless for its draft scheme, and
its acceptance is compared with the transport optimum solved independently by scipy's linprog.

Exact by enumeration: every draft tuple of the scheme on a 5-token vocabulary, weighted by its
probability, through the rule's law of the emitted token; the weighted sum must be p, and the
weighted probability that the emitted token is a draft is the rule's acceptance. The LP couples
the tuple law with p and maximises P(emitted token in the tuple): the best any lossless verifier
can do for the scheme. Then the real path (draw drafts, draw the emitted token) is sampled.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_speculative_sampling as sampling_test
from scipy.optimize import linprog

from speculax.core import multi_draft as md
from speculax.core.sampling import SamplingConfig, probs
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters.multi_draft import MultiDraftModel
from speculax.models import llama

from tiny_prompts import NEW, PROMPTS

V = 5
TEMPERATURES = (0.7, 1.0)


def _laws(temperature, seed=0):
  """Fixed target and draft laws p, q [V] from random logits through the sampling transform."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(scale=1.5, size=(2, V)).astype(np.float32)
  p, q = np.asarray(probs(jnp.asarray(logits), SamplingConfig(temperature=temperature)),
                    np.float64)
  return p / p.sum(), q / q.sum()  # exact laws in float64: the LP needs equal total masses


def _tuples(q, n, scheme):
  """Every draft tuple of the scheme [T, n] and its probability [T]."""
  if scheme == "iid":
    ts = list(itertools.product(range(V), repeat=n))
    return np.array(ts), np.array([np.prod(q[list(t)]) for t in ts])
  if scheme == "without_replacement":
    ts = list(itertools.permutations(range(V), n))
    w = [np.prod([q[x] / (1 - q[list(t[:i])].sum()) for i, x in enumerate(t)]) for t in ts]
    return np.array(ts), np.array(w)
  top = list(np.argsort(-q)[:n - 1])
  rest = [x for x in range(V) if x not in top]
  return np.array([top + [x] for x in rest]), q[rest] / q[rest].sum()


def _lp_optimum(p, ts, w):
  """max P(Y in tuple) over couplings of the tuple law w and p (HiGHS). Only the matched pairs
  (t, y in t) are variables, each side's mass an upper bound: whatever a coupling leaves
  unmatched can be paired arbitrarily, so the optimum is the same and 0 is always feasible."""
  pairs = [(i, y) for i, t in enumerate(ts) for y in set(t.tolist())]
  a_ub = np.zeros((len(ts) + V, len(pairs)))
  for j, (i, y) in enumerate(pairs):
    a_ub[i, j] = a_ub[len(ts) + y, j] = 1  # sum_y pi(t, y) <= w(t), sum_t pi(t, y) <= p(y)
  res = linprog(-np.ones(len(pairs)), A_ub=a_ub, b_ub=np.concatenate([w, p]), bounds=(0, None),
                method="highs")
  assert res.status == 0
  return -res.fun


_law = jax.jit(md.law, static_argnums=0)


def _enumerate(rule, p, q, n):
  """(marginal law of the emitted token [V], acceptance, LP optimum) of `rule` on its scheme."""
  ts, w = _tuples(q, n, md.RULES[rule])
  rows = lambda a: jnp.asarray(np.broadcast_to(a, (len(ts), V)), jnp.float32)
  law = np.asarray(_law(rule, jnp.asarray(ts, jnp.int32), rows(p), rows(q)), np.float64)
  in_tuple = (ts[:, :, None] == np.arange(V)).any(1)  # [T, V] token y is a draft of tuple t
  return w @ law, float(w @ (law * in_tuple).sum(1)), _lp_optimum(p, ts, w)


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("rule", list(md.RULES))
def test_rule_is_lossless_and_within_the_optimum(rule, n, temperature):
  p, q = _laws(temperature)
  marginal, accept, optimum = _enumerate(rule, p, q, n)
  np.testing.assert_allclose(marginal, p, atol=2e-6)
  assert accept <= optimum + 1e-5
  if rule == "greedy":  # the optimal verifier of its scheme
    assert accept == pytest.approx(optimum, abs=1e-5)


# The laws the acceptance claims are documented on: t = 1, seed 0 (enumeration / LP), measured:
# n = 2, i.i.d.: recursive 0.7790 < K-SEQ 0.7895 < optimum 0.8142; without replacement:
# recursive 0.8095 < optimum 0.8418; greedy scheme: 0.8198 = optimum. n = 3, i.i.d.: 0.8014 <
# 0.8120 < 0.8486; without replacement: 0.8473 < 0.9967; greedy: 0.9659 = optimum.
@pytest.mark.parametrize("n", [2, 3])
def test_acceptance_against_the_transport_optimum(n):
  p, q = _laws(1.0)
  rec, kseq, wor, greedy = (_enumerate(r, p, q, n)[1:] for r in
                            ("recursive", "kseq", "recursive_without_replacement", "greedy"))
  iid_opt = rec[1]
  print(f"n={n} iid: recursive {rec[0]:.4f} kseq {kseq[0]:.4f} optimum {iid_opt:.4f}; "
        f"without replacement: recursive {wor[0]:.4f} optimum {wor[1]:.4f}; "
        f"greedy {greedy[0]:.4f} optimum {greedy[1]:.4f}")
  assert rec[0] < kseq[0] <= iid_opt + 1e-5  # K-SEQ gains on recursive rejection, not past LP
  assert rec[0] < iid_opt - 0.02 and wor[0] < wor[1] - 0.02  # recursive rejection is not optimal
  assert greedy[0] == pytest.approx(greedy[1], abs=1e-5)
  closed = float(md.iid_optimal_acceptance(jnp.asarray(p[None], jnp.float32),
                                           jnp.asarray(q[None], jnp.float32), n)[0])
  assert closed == pytest.approx(iid_opt, abs=1e-5)


def test_iid_optimum_prefix_form_equals_every_subset():
  """The sorted-prefix search finds the same max_H [q(H)^n - p(H)] as all 2^V subsets."""
  rng = np.random.default_rng(3)
  for _ in range(20):
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V) * 0.5)
    for n in (2, 3, 4):
      gap = max(q[list(h)].sum() ** n - p[list(h)].sum()
                for m in range(V + 1) for h in itertools.combinations(range(V), m))
      got = md.iid_optimal_acceptance(jnp.asarray(p[None], jnp.float32),
                                      jnp.asarray(q[None], jnp.float32), n)
      assert float(got[0]) == pytest.approx(1 - gap, abs=1e-5)


def test_kseq_gamma_is_the_smallest_valid_one():
  """The residual of the chosen gamma is a law (nonnegative); a slightly smaller gamma's is not,
  and the planted gamma = 1 (plain per-draft rejection with one shared residual) is lossy."""
  p, q = (jnp.asarray(a[None], jnp.float32) for a in _laws(1.0))
  for n in (2, 3):
    gamma = md.kseq_gamma(p, q, n)
    for g, valid in ((gamma, True), (gamma - 1e-3, False)):
      kept = jnp.minimum(q, p / g[:, None])
      slack = p - kept * md._kseq_growth(kept.sum(-1), n)[:, None]
      assert bool(jnp.all(slack >= -1e-6)) == valid
    assert 1 < float(gamma[0]) < n


def test_planted_kseq_without_gamma_is_lossy(monkeypatch):
  p, q = _laws(1.0)
  monkeypatch.setattr(md, "kseq_gamma", lambda p, q, n: jnp.ones(p.shape[:1], p.dtype))
  ts, w = _tuples(q, 2, "iid")
  rows = lambda a: jnp.asarray(np.broadcast_to(a, (len(ts), V)), jnp.float32)
  law = np.asarray(md.kseq_law(jnp.asarray(ts, jnp.int32), rows(p), rows(q)), np.float64)
  assert 0.5 * np.abs(w @ law - p).sum() > 0.01


N_SAMPLES = 100_000


@pytest.mark.parametrize("rule", list(md.RULES))
def test_sampled_drafts_and_emission_follow_p(rule):
  """The drafter-side scheme and one uniform per row: 100k rows in one jit, n = 3, t = 0.7."""
  p, q = _laws(0.7)
  _, accept, _ = _enumerate(rule, p, q, 3)

  @jax.jit
  def run(key):
    k_draft, k_emit = jax.random.split(key)
    pp, qq = (jnp.broadcast_to(jnp.asarray(a, jnp.float32), (N_SAMPLES, V)) for a in (p, q))
    drafts = md.draw_drafts(k_draft, qq, 3, md.RULES[rule])
    return md.emit(jax.random.uniform(k_emit, (N_SAMPLES,)), md.law(rule, drafts, pp, qq),
                   drafts)

  y, branch = (np.asarray(a) for a in run(jax.random.key(0)))
  freq = np.bincount(y, minlength=V) / N_SAMPLES
  assert 0.5 * np.abs(freq - p).sum() < 0.006  # noise ~0.002 over 5 cells at 100k
  assert abs((branch >= 0).mean() - accept) < 0.006  # ~4 standard errors


# ---------------------------------------------------------------------------------------------
# Through the decode loop: MultiDraftModel + MultiDraftVerifier on tiny models


def test_greedy_multi_draft_equals_target_only(tiny, tiny_reference):
  """Temperature 0: the branch whose first draft is the target's argmax is kept; output equals
  target-only decoding for a batch of mixed prompts."""
  cfg, params = tiny
  other = llama.init_params(cfg, jax.random.key(7))
  out = speculative_generate(params, cfg, PROMPTS, MultiDraftModel(cfg, n=3, rule="greedy"),
                             SpecConfig(k=3, max_new_tokens=NEW), drafter_params=other)
  for got, want in zip(out.tokens, tiny_reference):
    assert list(got) == list(want)


@pytest.fixture(scope="module")
def models():
  """tests/test_speculative_sampling.py's target and a sharper, different draft model."""
  target = llama.init_params(sampling_test.CFG, jax.random.key(1))
  draft = llama.init_params(sampling_test.CFG, jax.random.key(2))
  return target, {**draft, "embed": draft["embed"] * 3.0}


# Each run compiles the loop (~15 s of CPU here), so the loop checks the wiring twice: the
# optimal rule at t = 0.7 and K-SEQ (whose residual draws can land on a draft and continue its
# branch) at t = 1.0. Every rule's law is checked exactly at both temperatures above, and
# recursive rejection without replacement is the tree verifier's rule, which
# tests/test_speculative_sampling.py covers through the loop.
def _target_laws(target, sampling):
  """Exact marginal laws [3, V] of the first three generated tokens after the prompt."""
  cfg, prompt, v = sampling_test.CFG, sampling_test.PROMPT, sampling_test.CFG.vocab_size
  seqs = jnp.array([prompt + [x, y] for x in range(v) for y in range(v)])  # [v v, t]
  t = seqs.shape[1]
  logits, _, _ = llama.forward_jit(target, cfg, seqs, jnp.broadcast_to(jnp.arange(t), seqs.shape))
  laws = np.asarray(probs(logits, sampling), np.float64)
  p1 = laws[0, t - 3]  # [v]
  p2 = laws[::v, t - 2]  # [v x, v y]
  p3 = laws[:, t - 1].reshape(v, v, v)  # [x, y, z]
  joint12 = p1[:, None] * p2
  return np.stack([p1, p1 @ p2, np.einsum("xy,xyz->z", joint12, p3)])


@pytest.mark.parametrize("rule,temperature", [("greedy", 0.7), ("kseq", 1.0)])
def test_generated_tokens_follow_target(models, rule, temperature):
  """The sampling-law test of tests/test_speculative_sampling.py through the real loop: 6000
  rows of one prompt, 3 branches of 2 drafts. The first token comes from the prefill, the second
  from the multi-draft rule, the third from the kept branch's chain rejection (or the next step)."""
  target, draft = models
  sampling = SamplingConfig(temperature=temperature)
  exact = _target_laws(target, sampling)
  cfg, rows = sampling_test.CFG, sampling_test.ROWS
  out = speculative_generate(target, cfg, [sampling_test.PROMPT] * rows,
                             MultiDraftModel(cfg, n=3, rule=rule),
                             SpecConfig(k=2, max_new_tokens=3, sampling=sampling,
                                        prompt_bucket=sampling_test.BUCKET),
                             drafter_params=draft, key=jax.random.key(0))
  toks = np.array(out.tokens)
  for i in range(3):
    assert sampling_test._tv(toks[:, i], exact[i]) < sampling_test.BOUND, i
  assert np.all(out.accepted_at > 0)  # branches and their second drafts were kept
