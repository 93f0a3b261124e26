"""Multi-draft verification of one position: n draft tokens, one target law, one emitted token.

A drafter proposes n tokens x_1..x_n for the same position by a draft scheme (`SCHEMES`): i.i.d.
draws from q, draws without replacement from q, or Hu et al.'s greedy scheme (the top n - 1
tokens of q, then one draw from q with those removed). A rule returns the law of the emitted
token given the drafts (`*_law`, [b, v]); one uniform then draws it (`emit`). Averaged over the
scheme's drafts that law is exactly p, so emitting from it is lossless, and a rule is judged by
its acceptance: the probability that the emitted token is one of the drafts (the branch the
decode loop then continues).

- `recursive_law`: SpecInfer / RSD recursive rejection: try the drafts in order, each kept with
  probability min(1, p(x) / q(x)); after a rejection p becomes normalize(max(0, p - q)) (and for
  draws without replacement q loses x).
- `kseq_law`: SpecTr's K-SEQ (Sun et al. 2023) for i.i.d. drafts: each draft kept with
  probability min(1, p(x) / (gamma q(x))), one residual for all. With beta = sum min(q, p / gamma)
  the kept mass at y is min(q, p / gamma) (1 - (1 - beta)^n) / beta, which stays <= p iff
  gamma >= (1 - (1 - beta)^n) / beta; `kseq_gamma` bisects [1, n] for the smallest such gamma
  (the largest acceptance 1 - (1 - beta)^n).
- `greedy_law`: the optimal verifier for the greedy scheme (Hu et al., ICLR 2025): the top n - 1
  tokens T are always drafts, so only the sampled draft x ~ q' (q without T, renormalized) needs
  a coupling: keep x with probability min(1, p(x) / q'(x)), else draw from
  normalize(max(0, p - q')), whose mass on T is kept too. Acceptance p(T) + sum_{y not in T}
  min(p, q'), the transport optimum for this scheme.
- `iid_optimal_acceptance`: the optimum over every verifier for n i.i.d. drafts. By max-flow
  min-cut on the coupling of the draft tuple with Y ~ p it is 1 - max_H [q(H)^n - p(H)] over
  token sets H (Hu et al.'s subset form); H ranges over prefixes of the tokens sorted by p / q
  ascending (checked against every subset and the transport LP in tests/test_multi_draft.py).

p and q are laws after the same sampling transform. Dims: b batch, n drafts, v vocab.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from speculax.core import rejection
from speculax.core.sampling import draw

SCHEMES = ("iid", "without_replacement", "greedy")


# ---------------------------------------------------------------------------------------------
# Draft schemes (the drafter side)


def draw_drafts(key: jax.Array, q: jax.Array, n: int, scheme: str) -> jax.Array:
  """n drafts per row from q [b, v] by `scheme` -> [b, n] int32."""
  if scheme == "iid":
    return draw(key, q, n)
  if scheme == "without_replacement":  # Gumbel top-n: sequential draws without replacement
    return jax.lax.top_k(jnp.log(q) + jax.random.gumbel(key, q.shape), n)[1].astype(jnp.int32)
  if scheme == "greedy":
    top = jax.lax.top_k(q, n - 1)[1] if n > 1 else jnp.zeros((q.shape[0], 0), jnp.int32)
    rest = _without(q, top)
    last = draw(key, rest)[:, None]  # rest all zeros (nothing left): some zero-mass token
    return jnp.concatenate([top, last], 1).astype(jnp.int32)
  raise ValueError(f"draft scheme must be one of {SCHEMES}, got {scheme!r}")


def _without(q: jax.Array, tokens: jax.Array) -> jax.Array:
  """q [b, v] with tokens [b, m] removed, renormalized (all zeros if nothing is left)."""
  rows = jnp.arange(q.shape[0])[:, None]
  rest = q.at[rows, tokens].set(0.0)
  return rest / jnp.maximum(rest.sum(-1, keepdims=True), 1e-30)


def _at(dist: jax.Array, x: jax.Array) -> jax.Array:
  """dist [b, v] at tokens x [b] -> [b]."""
  return jnp.take_along_axis(dist, x[:, None], 1)[:, 0]


def _keep(px: jax.Array, qx: jax.Array) -> jax.Array:
  """min(1, p / q), 0 where q = 0 (a draft q could not have drawn is never kept)."""
  return jnp.where(qx > 0, jnp.minimum(1.0, px / jnp.where(qx > 0, qx, 1.0)), 0.0)


def _normalize_or(r: jax.Array, fallback: jax.Array) -> jax.Array:
  """r [b, v] normalized, or fallback where r has (numerically) no mass."""
  mass = r.sum(-1, keepdims=True)
  return jnp.where(mass > rejection.MIN_RESIDUAL_MASS,
                   r / jnp.maximum(mass, rejection.MIN_RESIDUAL_MASS), fallback)


# ---------------------------------------------------------------------------------------------
# Rules: the law of the emitted token given the drafts


def recursive_law(drafts: jax.Array, p: jax.Array, q: jax.Array,
                  without_replacement: bool) -> jax.Array:
  """Recursive rejection: drafts [b, n], p, q [b, v] -> emitted law [b, v]."""
  v = p.shape[-1]
  law, stay = jnp.zeros_like(p), jnp.ones(p.shape[:1], p.dtype)  # [b, v], [b] P(all rejected)
  for i in range(drafts.shape[1]):
    x = drafts[:, i]
    qx = _at(q, x)
    a = _keep(_at(p, x), qx)  # [b]
    law += (stay * a)[:, None] * jax.nn.one_hot(x, v, dtype=p.dtype)
    stay *= 1 - a
    p = jnp.where((qx > 0)[:, None], rejection.residual(p, q), p)
    if without_replacement:
      q = _without(q, x[:, None])
  return law + stay[:, None] * p


def _kseq_beta(p: jax.Array, q: jax.Array, gamma: jax.Array) -> jax.Array:
  return jnp.minimum(q, p / gamma[:, None]).sum(-1)  # [b] one draft's acceptance


def _kseq_growth(beta: jax.Array, n: int) -> jax.Array:
  """(1 - (1 - beta)^n) / beta = sum_{i<n} (1 - beta)^i: the kept mass per unit of min(q, p/g)."""
  return sum((1 - beta) ** i for i in range(n))


def kseq_gamma(p: jax.Array, q: jax.Array, n: int, iters: int = 40) -> jax.Array:
  """The smallest gamma in [1, n] whose residual is nonnegative, per row [b].

  gamma - growth(beta(gamma)) increases with gamma (beta falls, growth rises) and is >= 0 at
  gamma = n, so bisection keeps the feasible upper end.
  """
  def halve(_, bounds):
    lo, hi = bounds
    mid = (lo + hi) / 2
    ok = mid >= _kseq_growth(_kseq_beta(p, q, mid), n)
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

  lo = jnp.ones(p.shape[:1], p.dtype)
  return jax.lax.fori_loop(0, iters, halve, (lo, jnp.full_like(lo, float(n))))[1]


def kseq_law(drafts: jax.Array, p: jax.Array, q: jax.Array) -> jax.Array:
  """K-SEQ on i.i.d. drafts [b, n] -> emitted law [b, v]."""
  n, v = drafts.shape[1], p.shape[-1]
  gamma = kseq_gamma(p, q, n)  # [b]
  kept = jnp.minimum(q, p / gamma[:, None])  # [b, v] one draft's kept mass
  # Rounding can leave kept * growth a hair above p: the clip keeps the residual a law.
  residual = _normalize_or(jnp.maximum(
      p - kept * _kseq_growth(kept.sum(-1), n)[:, None], 0.0), p)
  law, stay = jnp.zeros_like(p), jnp.ones(p.shape[:1], p.dtype)
  for i in range(n):
    x = drafts[:, i]
    a = _keep(_at(kept, x), _at(q, x))  # min(1, p / (gamma q)) = kept(x) / q(x)
    law += (stay * a)[:, None] * jax.nn.one_hot(x, v, dtype=p.dtype)
    stay *= 1 - a
  return law + stay[:, None] * residual


def greedy_law(drafts: jax.Array, p: jax.Array, q: jax.Array) -> jax.Array:
  """The greedy scheme's optimal rule: drafts [b, n] (top n - 1 of q, then one sampled)."""
  rest = _without(q, drafts[:, :-1])  # [b, v] the law the last draft was drawn from
  x = drafts[:, -1]
  a = _keep(_at(p, x), _at(rest, x))
  return a[:, None] * jax.nn.one_hot(x, p.shape[-1], dtype=p.dtype) \
      + (1 - a)[:, None] * rejection.residual(p, rest)


def law(rule: str, drafts: jax.Array, p: jax.Array, q: jax.Array) -> jax.Array:
  """The emitted law [b, v] of `rule` (see RULES) on drafts [b, n]."""
  if rule == "recursive":
    return recursive_law(drafts, p, q, without_replacement=False)
  if rule == "recursive_without_replacement":
    return recursive_law(drafts, p, q, without_replacement=True)
  if rule == "kseq":
    return kseq_law(drafts, p, q)
  if rule == "greedy":
    return greedy_law(drafts, p, q)
  raise ValueError(f"multi-draft rule must be one of {tuple(RULES)}, got {rule!r}")


# The draft scheme each rule is lossless for.
RULES = {"recursive": "iid", "recursive_without_replacement": "without_replacement",
         "kseq": "iid", "greedy": "greedy"}


def emit(u: jax.Array, dist: jax.Array, drafts: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One token per row from dist [b, v] with uniforms u [b] -> (token [b], branch [b]): the
  first draft equal to it, or -1. A residual draw that equals a draft continues that branch as
  well as an acceptance does: the branch's later drafts were drawn given its token alone."""
  y = rejection.inverse_cdf(u, dist)
  hit = drafts == y[:, None]  # [b, n]
  return y, jnp.where(hit.any(1), jnp.argmax(hit, 1), -1).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# Optimal acceptance


def iid_optimal_acceptance(p: jax.Array, q: jax.Array, n: int) -> jax.Array:
  """max over lossless verifiers of P(emitted token is a draft), n i.i.d. drafts -> [b]."""
  ratio = jnp.where(q > 0, p / jnp.where(q > 0, q, 1.0), jnp.inf)
  order = jnp.argsort(ratio, -1)
  q_h = jnp.cumsum(jnp.take_along_axis(q, order, -1), -1)  # [b, v] q(H) of each prefix H
  p_h = jnp.cumsum(jnp.take_along_axis(p, order, -1), -1)
  gap = jnp.maximum(jnp.max(jnp.minimum(q_h, 1.0) ** n - p_h, -1), 0.0)  # H = {} gives 0
  return 1 - gap
