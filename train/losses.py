"""Divergences for distilling a draft model q (student) from a target p (teacher).

Speculative sampling accepts a drafted token with probability sum_x min(p(x), q(x)) =
1 - TV(p, q), so the drafter is trained to move q towards p under some divergence. DistillSpec
(Zhou et al. 2023, arXiv 2310.08461) compares forward KL, reverse KL, generalized JSD and TVD;
Goel et al. 2024 (arXiv 2403.00858) add TVD++, a variance-reduced policy-gradient form of TVD.

Every loss here is a pure, jittable function returning a float32 scalar: the mean over valid
positions, where a position is valid when mask > 0. A float mask acts as per-position weights
(mean = sum(w * d) / sum(w)); an all-zero mask gives 0. Masked positions may hold anything
(NaN, inf, out-of-vocabulary ids): they are replaced before any arithmetic, so they can leak
neither into the value nor into the gradient (a plain `where` on the result would still let NaN
into the gradient).

Registry calling convention (`DIVERGENCES`, `get_divergence`):

  fn(teacher_logp [b, t, v], student_logits [b, t, v], mask [b, t], *, key=None) -> scalar

teacher_logp are normalized log-probs (train/teacher_law.py makes them from a batch's exact logits
or cached top-k, and reads fkl and lk on a top-k law without spreading it); student_logits are raw
logits. Only "tvd++" uses `key` (it samples from the student) and raises without one. Per-divergence
options (jsd's beta; tvd++'s n_samples, normalize; lk's kl_weight; every one's teacher_temperature)
are bound with `get_divergence(name, **options)`.
`cross_entropy` is not in the registry: it needs target tokens, not a teacher distribution.

Zero probabilities: a teacher log-prob of -inf is clamped to LOG_FLOOR = log(float32 tiny)
(about -87.3) inside logs, so reverse KL stays finite (a large penalty instead of inf) where the
teacher gives zero mass and the student does not; a student -inf logit (padded vocabulary) adds
nothing wherever the teacher is zero too. Terms with a zero weight are selected out with the
double-`where` pattern, so no 0 * inf appears in value or gradient. NaN at a valid position is
not hidden: it propagates (validate upstream).

Dims: b batch, t time, v vocab, K top-k, n samples per position.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Callable, Literal

import jax
import jax.numpy as jnp

LOG_FLOOR = math.log(float(jnp.finfo(jnp.float32).tiny))  # ~ -87.34
_STD_EPS = 1e-6


# ----------------------------------------------------------------------------- shared pieces

def _weights(mask: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """mask [b, t] -> (float32 weights, bool valid), zero weight wherever invalid."""
  mask = jnp.asarray(mask)
  if mask.shape != shape:
    raise ValueError(f"mask shape {mask.shape} must be {shape} (the logits without vocab)")
  w = mask.astype(jnp.float32)
  valid = w > 0
  return jnp.where(valid, w, 0.0), valid


def _masked_mean(per_pos: jax.Array, w: jax.Array, valid: jax.Array) -> jax.Array:
  """Weighted mean over valid positions; 0 when nothing is valid."""
  total = jnp.sum(jnp.where(valid, per_pos * w, 0.0))
  denom = jnp.sum(w)
  return jnp.where(denom > 0, total / jnp.where(denom > 0, denom, 1.0), 0.0)


def _student_logq(student_logits: jax.Array, valid: jax.Array) -> jax.Array:
  """float32 student log-probs [b, t, v]; masked rows are zeroed first (they may hold NaN)."""
  logits = jnp.where(valid[..., None], student_logits.astype(jnp.float32), 0.0)
  return jax.nn.log_softmax(logits, axis=-1)


def _prepare(teacher_logp, student_logits, mask):
  """Sanitized (p, logp, q, logq, logq_safe, w, valid) for the dense divergences.

  p and q hold exact zeros; logp is clamped at LOG_FLOOR; logq_safe is 0 wherever q == 0 so
  that q * logq_safe is 0 with a finite gradient.
  """
  if teacher_logp.shape != student_logits.shape:
    raise ValueError(
        f"teacher_logp {teacher_logp.shape} and student_logits {student_logits.shape} must match")
  w, valid = _weights(mask, student_logits.shape[:-1])
  vocab = student_logits.shape[-1]
  raw = jnp.where(valid[..., None], teacher_logp.astype(jnp.float32), -math.log(vocab))
  p = jnp.exp(raw)  # [b, t, v]
  logp = jnp.maximum(raw, LOG_FLOOR)  # [b, t, v]
  logq = _student_logq(student_logits, valid)  # [b, t, v]
  q = jnp.exp(logq)  # [b, t, v]
  logq_safe = jnp.where(q > 0, logq, 0.0)  # [b, t, v]
  return p, logp, q, logq, logq_safe, w, valid


def _xlogratio(x: jax.Array, log_x: jax.Array, log_y: jax.Array) -> jax.Array:
  """sum_v x * (log_x - log_y), with 0 * anything = 0 in value and gradient."""
  diff = jnp.where(x > 0, log_x - log_y, 0.0)
  return jnp.sum(jnp.where(x > 0, x * diff, 0.0), axis=-1)


# ----------------------------------------------------------------------------- divergences

def forward_kl(teacher_logp: jax.Array, student_logits: jax.Array, mask: jax.Array) -> jax.Array:
  """KL(p || q): mode-covering; its gradient w.r.t. the student logits is q - p.

  Infinite (honestly) if the student has a -inf logit where the teacher has mass.
  """
  p, logp, _, logq, _, w, valid = _prepare(teacher_logp, student_logits, mask)
  return _masked_mean(_xlogratio(p, logp, logq), w, valid)


def reverse_kl(teacher_logp: jax.Array, student_logits: jax.Array, mask: jax.Array) -> jax.Array:
  """KL(q || p): mode-seeking; teacher zeros count as log p = LOG_FLOOR (finite penalty)."""
  _, logp, q, _, logq_safe, w, valid = _prepare(teacher_logp, student_logits, mask)
  return _masked_mean(_xlogratio(q, logq_safe, logp), w, valid)


def jsd(teacher_logp: jax.Array, student_logits: jax.Array, mask: jax.Array, *,
        beta: float = 0.5) -> jax.Array:
  """Generalized JSD: beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q.

  This is the GKD / DistillSpec convention with beta weighting the teacher p. It is bounded by
  the binary entropy H(beta) (log 2 at beta = 0.5, where it is symmetric in p and q). Limits:
  JSD / beta -> KL(p || q) (forward KL) as beta -> 0 and JSD / (1 - beta) -> KL(q || p)
  (reverse KL) as beta -> 1; the divergence itself tends to 0 at both ends, so beta must lie
  strictly inside (0, 1). Check the weighting when comparing with other code: swapping which
  distribution beta multiplies swaps the two limits.
  """
  if isinstance(beta, (int, float)) and not 0.0 < beta < 1.0:
    raise ValueError(f"jsd beta must be in the open interval (0, 1), got {beta}")
  p, logp, q, logq, logq_safe, w, valid = _prepare(teacher_logp, student_logits, mask)
  logm = jnp.logaddexp(jnp.log(beta) + logp, jnp.log1p(-beta) + logq)  # [b, t, v]
  per_pos = beta * _xlogratio(p, logp, logm) + (1.0 - beta) * _xlogratio(q, logq_safe, logm)
  return _masked_mean(per_pos, w, valid)


def tvd(teacher_logp: jax.Array, student_logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Total variation 0.5 * sum |p - q| in [0, 1]; 1 - tvd is the acceptance rate."""
  p, _, q, _, _, w, valid = _prepare(teacher_logp, student_logits, mask)
  return _masked_mean(0.5 * jnp.sum(jnp.abs(p - q), axis=-1), w, valid)


def acceptance(teacher_logp: jax.Array, student_logits: jax.Array, mask: jax.Array) -> jax.Array:
  """The chance a sampled draft is kept, sum min(p, q) = 1 - TV, per position [b, t] (masked
  positions: 0)."""
  p, _, q, _, _, _, valid = _prepare(teacher_logp, student_logits, mask)
  return jnp.where(valid, jnp.sum(jnp.minimum(p, q), axis=-1), 0.0)


def check_kl_weight(kl_weight: float) -> None:
  """lk's kl_weight must be >= 0."""
  if kl_weight < 0:
    raise ValueError(f"lk kl_weight must be >= 0, got {kl_weight}")


def log_acceptance(teacher_logp: jax.Array, student_logits: jax.Array, mask: jax.Array, *,
                   kl_weight: float = 0.0) -> jax.Array:
  """-log sum min(p, q): the acceptance itself as the objective (SpecForge's LK loss), whose
  gradient grows as acceptance falls, unlike TVD's; plus kl_weight * KL(p || q), which also
  moves q where it already exceeds p (TV's gradient there is flat in the ordering of p)."""
  check_kl_weight(kl_weight)
  p, logp, q, logq, _, w, valid = _prepare(teacher_logp, student_logits, mask)
  accept = jnp.sum(jnp.minimum(p, q), axis=-1)  # [b, t]
  per_pos = -jnp.log(jnp.maximum(accept, jnp.finfo(jnp.float32).tiny))
  if kl_weight:
    per_pos += kl_weight * _xlogratio(p, logp, logq)
  return _masked_mean(per_pos, w, valid)


def tvd_plus_plus_from_samples(teacher_logp: jax.Array, student_logits: jax.Array,
                               samples: jax.Array, mask: jax.Array, *,
                               normalize: bool = True) -> jax.Array:
  """TVD++ surrogate on given student samples x ~ q: [b, t] or [b, t, n] token ids.

  Use this form for on-policy data, where the samples are the tokens the drafter generated.
  Why it works: d TV / d theta = 0.5 sum_x sign(q - p) dq = -E_{x~q}[r(x) d log q(x)] with
  reward r(x) = 1[p(x) > q(x)] (E_q[d log q] = 0 absorbs the constant; ties p == q have zero
  probability). TVD++ (Goel et al. 2024) replaces r by the advantage (r - mean) / std, the mean
  and std taken over all valid (position, sample) pairs of the batch: a baseline plus a scale,
  which lowers variance and keeps the expected direction.

  Returns -mean(stop_gradient(advantage) * log q(x)) over valid positions and samples. The VALUE
  is only a surrogate (it can be negative; log `tvd` to monitor the divergence). Its GRADIENT
  w.r.t. the student logits is, in expectation, grad(tvd) / std(r) with normalize=True
  (the batch statistics make it slightly biased for tiny batches), and exactly grad(tvd) with
  normalize=False (plain REINFORCE, as in DistillSpec). Rewards are 0 for every sample when
  q == p, and so is the gradient.
  """
  _, logp, _, logq, _, w, valid = _prepare(teacher_logp, student_logits, mask)
  if samples.ndim == valid.ndim:
    samples = samples[..., None]
  if samples.shape[:-1] != valid.shape:
    raise ValueError(
        f"samples {samples.shape} must be [b, t] or [b, t, n] with [b, t] = {valid.shape}")
  n = samples.shape[-1]
  valid_s = jnp.broadcast_to(valid[..., None], samples.shape)  # [b, t, n]
  w_s = jnp.broadcast_to(w[..., None], samples.shape)  # [b, t, n]
  x = jnp.where(valid_s, samples, 0).astype(jnp.int32)  # [b, t, n]
  logq_x = jnp.take_along_axis(logq, x, axis=-1)  # [b, t, n]
  logp_x = jnp.take_along_axis(logp, x, axis=-1)  # [b, t, n]
  reward = (logp_x > jax.lax.stop_gradient(logq_x)).astype(jnp.float32)  # [b, t, n]
  if normalize:
    denom = jnp.maximum(jnp.sum(w_s), 1e-30)
    mean = jnp.sum(w_s * reward) / denom
    std = jnp.sqrt(jnp.sum(w_s * jnp.square(reward - mean)) / denom)
    advantage = (reward - mean) / (std + _STD_EPS)
  else:
    advantage = reward
  advantage = jax.lax.stop_gradient(jnp.where(valid_s, advantage, 0.0))
  per_pos = -jnp.sum(jnp.where(valid_s, advantage * logq_x, 0.0), axis=-1) / n  # [b, t]
  return _masked_mean(per_pos, w, valid)


def student_samples(key: jax.Array, student_logits: jax.Array, n: int) -> jax.Array:
  """n tokens per position drawn from softmax(stop_gradient(logits)) [..., v] -> [..., n] int32.

  Inverse-CDF draws by binary search: memory O(b t v), where categorical's Gumbel noise for n
  samples is [b, t, n, v] (25 GB for SmolLM2's vocabulary at b 8, t 256, n 16).
  """
  logits = jax.lax.stop_gradient(student_logits.astype(jnp.float32))
  cdf = jnp.cumsum(jax.nn.softmax(logits, -1), -1)  # [..., v]
  u = jax.random.uniform(key, (*logits.shape[:-1], n)) * cdf[..., -1:]  # [..., n]
  search = functools.partial(jnp.searchsorted, side="right")  # first index with cdf > u
  for _ in range(logits.ndim - 1):
    search = jax.vmap(search)
  return jnp.minimum(search(cdf, u), logits.shape[-1] - 1).astype(jnp.int32)


def tvd_plus_plus(teacher_logp: jax.Array, student_logits: jax.Array, mask: jax.Array, *,
                  key: jax.Array, n_samples: int = 1, normalize: bool = True) -> jax.Array:
  """TVD++ with n_samples tokens per position drawn here from the (stop-gradient) student.

  For off-policy data (tokens from the target), the reward expectation is still taken under q,
  so the samples must come from the student: that is what this function draws. See
  `tvd_plus_plus_from_samples` for exactly what is returned (a surrogate value).
  """
  if n_samples < 1:
    raise ValueError(f"n_samples must be >= 1, got {n_samples}")
  _, valid = _weights(mask, student_logits.shape[:-1])
  logits = jnp.where(valid[..., None], student_logits.astype(jnp.float32), 0.0)  # [b, t, v]
  samples = student_samples(key, logits, n_samples)  # [b, t, n]
  return tvd_plus_plus_from_samples(teacher_logp, student_logits, samples, mask,
                                    normalize=normalize)


def cross_entropy(targets: jax.Array, student_logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Next-token CE -log q(target) on target-sampled tokens [b, t]: the no-teacher baseline.

  In expectation over targets drawn from p this is forward KL plus the teacher entropy, so it is
  a one-sample estimate of forward KL's gradient. Ids at valid positions must be < vocab
  (validate on the host); ids at masked positions are ignored.
  """
  if targets.shape != student_logits.shape[:-1]:
    raise ValueError(f"targets {targets.shape} must be {student_logits.shape[:-1]}")
  w, valid = _weights(mask, targets.shape)
  logq = _student_logq(student_logits, valid)  # [b, t, v]
  ids = jnp.where(valid, targets, 0).astype(jnp.int32)  # [b, t]
  nll = -jnp.take_along_axis(logq, ids[..., None], axis=-1)[..., 0]  # [b, t]
  return _masked_mean(nll, w, valid)


# ----------------------------------------------------------------------------- registry

def _keyless(fn: Callable) -> Callable:
  """Adapt a deterministic divergence to the registry convention (accepts and ignores key)."""

  @functools.wraps(fn)
  def wrapped(teacher_logp, student_logits, mask, *, key=None, **options):
    del key
    return fn(teacher_logp, student_logits, mask, **options)

  return wrapped


def _tvd_plus_plus_entry(teacher_logp, student_logits, mask, *, key=None, n_samples: int = 1,
                         normalize: bool = True):
  """Registry form of `tvd_plus_plus`; key is required."""
  if key is None:
    raise ValueError("divergence 'tvd++' samples from the student: pass key=")
  return tvd_plus_plus(teacher_logp, student_logits, mask, key=key, n_samples=n_samples,
                       normalize=normalize)


Divergence = Literal["fkl", "rkl", "jsd", "tvd", "tvd++", "lk"]  # the registry's names

DIVERGENCES: dict[str, Callable[..., jax.Array]] = {
    "fkl": _keyless(forward_kl),
    "rkl": _keyless(reverse_kl),
    "jsd": _keyless(jsd),
    "tvd": _keyless(tvd),
    "tvd++": _tvd_plus_plus_entry,
    "lk": _keyless(log_acceptance),
}


def _options_of(fn: Callable) -> set[str]:
  """Keyword-only options a registry entry accepts (beyond key)."""
  params = inspect.signature(fn).parameters.values()
  return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY} - {"key"}


def sharpened(teacher_logp: jax.Array, temperature: float) -> jax.Array:
  """The teacher's law at a temperature, renormalized over its ids [..., v]: T < 1 sharpens it
  towards its top token, T = 0 is one-hot there (log-probs 0 and -inf): the one token a greedy
  verifier keeps, so a divergence against it trains greedy acceptance (top-1 agreement)."""
  if temperature == 0:
    top = jnp.argmax(teacher_logp, axis=-1)[..., None]  # [..., 1]
    return jnp.where(jnp.arange(teacher_logp.shape[-1]) == top, 0.0, -jnp.inf)
  return jax.nn.log_softmax(teacher_logp / temperature, axis=-1)


def get_divergence(name: str, **options) -> Callable[..., jax.Array]:
  """Registry lookup; options (e.g. beta=0.1 for jsd) are bound and checked by name.

  Every divergence also takes teacher_temperature (default 1): the teacher's law is
  `sharpened` to it first, so a drafter for greedy decoding can train on what greedy keeps.
  The metrics that report acceptance keep the teacher's own law.
  """
  if name not in DIVERGENCES:
    raise ValueError(f"unknown divergence {name!r}; known: {', '.join(sorted(DIVERGENCES))}")
  fn = DIVERGENCES[name]
  temperature = options.pop("teacher_temperature", 1.0)
  unknown = set(options) - _options_of(fn)
  if unknown:
    raise ValueError(f"divergence {name!r} has no option(s) {sorted(unknown)}; "
                     f"it accepts {sorted(_options_of(fn) | {'teacher_temperature'})}")
  fn = functools.partial(fn, **options) if options else fn
  if not (isinstance(temperature, (int, float)) and 0 <= temperature < math.inf):
    raise ValueError(f"teacher_temperature must be a finite number >= 0, got {temperature!r}")
  if temperature == 1:
    return fn
  return lambda teacher_logp, *args, **kw: fn(sharpened(teacher_logp, temperature), *args, **kw)
