"""The teacher's law p as a training batch holds it, and the divergences that read a cached top-k
law as it is, without spreading it over the vocabulary.

A batch holds the target's exact logits ("teacher_logits" [b, t, v]) or its cached top-k ("ids",
"logprobs" [b, t, K], train/teacher_cache.py). A top-k law gives each of its other ids the same
share of the mass the K leave, so it is a `TopK`: K log-probs, their ids and one log-prob for the
rest. `dense` spreads it over the ids ([b, t, n]), as every divergence in train/losses.py reads
it; but the acceptance sum min(p, q), forward KL and the LK objective need of the student only
its log-normaliser, one reduction over its logits and its K entries, so `get_divergence`,
`acceptance` and `top` read a TopK as it is. Spreading the law and the passes over it took ~40% of
an EAGLE update (VocabTrim 16384, top-32) on the CPU.

Dims: b batch, t time, v vocab, n the ids a law is over (v, or a trimmed drafter's kept ids),
K top-k.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from speculax.train import losses

_MIN_REST_MASS = 1e-10  # floor on the mass a top-k cache leaves for the other v - K tokens


class TopK(NamedTuple):
  """A law over n ids given by its top K (a pytree: slicing maps over its fields)."""
  ids: jax.Array  # [b, t, K] int32 index among the n ids; n where an id is not among them
  logp: jax.Array  # [b, t, K] float32 normalized log-probs of those ids
  log_rest: jax.Array  # [b, t, 1] float32 log-prob of each of the other ids


def from_topk(ids: jax.Array, logprobs: jax.Array, vocab: int,
              kept: jax.Array | None = None) -> TopK:
  """The law a cached top-k (ids, logprobs [b, t, K]) stands for.

  Caching the full teacher distribution costs v floats per token (49152 for SmolLM2); a top-k
  cache keeps the mass that matters. `logprobs` must be full-vocabulary log-probs (log_softmax
  then top_k). The leftover mass 1 - sum(exp(logprobs)) is spread uniformly over the other
  v - K tokens, floored at a tiny positive mass so every log stays finite, and the result is
  normalized over the vocabulary so it sums to 1 even when rounding makes the top-k mass exceed
  1. With K == v it is the full distribution.

  kept: sorted token ids [n] (a VocabTrim drafter's): the same law on those ids only, not
  renormalized, so sum min(p, q) over them is still the acceptance of a draft whose q is zero
  elsewhere (a top-k id not kept gets index n).
  """
  if ids.shape != logprobs.shape:
    raise ValueError(f"top-k ids {ids.shape} and logprobs {logprobs.shape} must match")
  k = ids.shape[-1]
  if not 1 <= k <= vocab:
    raise ValueError(f"top-k size K={k} must be in [1, vocab={vocab}]")
  logprobs = logprobs.astype(jnp.float32)
  top_mass = jnp.sum(jnp.exp(logprobs), axis=-1, keepdims=True)  # [b, t, 1]
  rest = jnp.maximum(1.0 - top_mass, _MIN_REST_MASS)
  others = vocab - k
  log_rest = jnp.log(rest) - math.log(max(others, 1))  # [b, t, 1] each other token's
  log_z = jnp.log(top_mass + (rest if others else 0.0))  # [b, t, 1]
  ids = ids.astype(jnp.int32)
  if kept is not None:  # where each top-k id sits among the kept ones; n (dropped) if absent
    n = kept.shape[0]
    at = jnp.clip(jnp.searchsorted(kept, ids), 0, n - 1)
    ids = jnp.where(kept[at] == ids, at, n)
  return TopK(ids, logprobs - log_z, log_rest - log_z)


def dense(law: TopK, n: int) -> jax.Array:
  """The law's log-probs over its n ids [b, t, n]."""
  out = jnp.broadcast_to(law.log_rest, (*law.ids.shape[:-1], n))  # [b, t, n]
  lead = jnp.indices(law.ids.shape, sparse=True)[:-1]
  return out.at[(*lead, law.ids)].set(law.logp, mode="drop")


def teacher_logprobs_from_logits(logits: jax.Array) -> jax.Array:
  """Full teacher logits [..., v] -> float32 log-probs [..., v]."""
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def teacher_logprobs_from_topk(ids: jax.Array, logprobs: jax.Array, vocab: int,
                               kept: jax.Array | None = None) -> jax.Array:
  """Dense teacher log-probs [b, t, v] (or [b, t, n] on `kept`) from a cached top-k
  (`from_topk`)."""
  return dense(from_topk(ids, logprobs, vocab, kept), vocab if kept is None else kept.shape[0])


def teacher_law(batch: dict, vocab: int, kept: jax.Array | None = None) -> jax.Array | TopK:
  """The teacher's law from a batch: the log-probs [b, t, v] of its exact logits
  ("teacher_logits") where it holds them, else the TopK of its cached top-k ("ids",
  "logprobs"). kept: sorted ids [n]: the law on those ids only, not renormalized."""
  if "teacher_logits" in batch:
    logp = teacher_logprobs_from_logits(batch["teacher_logits"])
    return logp if kept is None else jnp.take(logp, kept, axis=-1)
  return from_topk(batch["ids"], batch["logprobs"], vocab, kept)


# ----------------------------------------------------------------------------- top-k forms

def _prepare(law: TopK, student_logits: jax.Array, mask: jax.Array):
  """(law, z, lse, w, valid): the student's float32 logits z [b, t, n] and log-normaliser lse
  [b, t], with masked rows replaced (z zeros, the law uniform) so they leak nothing."""
  if law.ids.shape[:-1] != student_logits.shape[:-1]:
    raise ValueError(f"teacher top-k {law.ids.shape} and student_logits {student_logits.shape} "
                     f"must share their leading dims")
  w, valid = losses._weights(mask, student_logits.shape[:-1])
  n = student_logits.shape[-1]
  row = valid[..., None]
  z = jnp.where(row, student_logits.astype(jnp.float32), 0.0)  # [b, t, n]
  law = TopK(jnp.where(row, law.ids, n), jnp.where(row, law.logp, -math.log(n)),
             jnp.where(row, law.log_rest, -math.log(n)))
  return law, z, jax.nn.logsumexp(z, axis=-1), w, valid


def _at_top(law: TopK, z: jax.Array, lse: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(inside, logq) [b, t, K]: which top-k ids are among the n, and the student's log-probs
  there."""
  inside = law.ids < z.shape[-1]
  at = jnp.take_along_axis(z, jnp.where(inside, law.ids, 0), axis=-1)  # [b, t, K]
  return inside, at - lse[..., None]


def _acceptance(law: TopK, z: jax.Array, lse: jax.Array) -> jax.Array:
  """sum min(p, q) [b, t]: min(rest, q) summed over every id, then the top-k ids' terms
  swapped in."""
  inside, logq = _at_top(law, z, lse)
  rest, q = jnp.exp(law.log_rest), jnp.exp(logq)  # [b, t, 1], [b, t, K]
  swap = jnp.where(inside, jnp.minimum(jnp.exp(law.logp), q) - jnp.minimum(rest, q), 0.0)
  return jnp.sum(jnp.minimum(rest, jnp.exp(z - lse[..., None])), -1) + jnp.sum(swap, -1)


def _forward_kl(law: TopK, z: jax.Array, lse: jax.Array) -> jax.Array:
  """sum p (log p - log q) [b, t]: the top-k ids' terms, plus the rest's share times the sum of
  log(rest / q) over the other ids (sum log q over all ids is sum z - n lse)."""
  n = z.shape[-1]
  inside, logq = _at_top(law, z, lse)
  logp = jnp.maximum(law.logp, losses.LOG_FLOOR)  # as the dense divergences clamp it
  top = jnp.sum(jnp.where(inside, jnp.exp(logp) * (logp - logq), 0.0), -1)
  others = n - jnp.sum(inside, -1)  # [b, t]
  logq_others = jnp.sum(z, -1) - n * lse - jnp.sum(jnp.where(inside, logq, 0.0), -1)
  log_rest = law.log_rest[..., 0]
  return top + jnp.exp(log_rest) * (others * log_rest - logq_others)


def _log_acceptance(law, z, lse, *, kl_weight: float = 0.0) -> jax.Array:
  """losses.log_acceptance per position [b, t]."""
  losses.check_kl_weight(kl_weight)
  per_pos = -jnp.log(jnp.maximum(_acceptance(law, z, lse), jnp.finfo(jnp.float32).tiny))
  return per_pos + kl_weight * _forward_kl(law, z, lse) if kl_weight else per_pos


_TOP_K_FORMS: dict[str, Callable[..., jax.Array]] = {
    "fkl": _forward_kl, "lk": _log_acceptance}


def get_divergence(name: str, **options) -> Callable[..., jax.Array]:
  """losses.get_divergence's divergence, taking a TopK teacher as well as dense log-probs: read
  as it is where the divergence has a top-k form (fkl, lk; at teacher_temperature 1), else
  spread out (`dense`)."""
  on_dense = losses.get_divergence(name, **options)
  form = _TOP_K_FORMS.get(name) if options.get("teacher_temperature", 1.0) == 1 else None
  bound = {k: v for k, v in options.items() if k != "teacher_temperature"}

  def divergence(teacher, student_logits, mask, *, key=None):
    if not isinstance(teacher, TopK):
      return on_dense(teacher, student_logits, mask, key=key)
    if form is None:
      return on_dense(dense(teacher, student_logits.shape[-1]), student_logits, mask, key=key)
    law, z, lse, w, valid = _prepare(teacher, student_logits, mask)
    return losses._masked_mean(form(law, z, lse, **bound), w, valid)

  return divergence


def acceptance(teacher: jax.Array | TopK, student_logits: jax.Array,
               mask: jax.Array) -> jax.Array:
  """losses.acceptance (sum min(p, q) per position [b, t], masked positions 0) of dense teacher
  log-probs [b, t, n] or of a TopK, read as it is."""
  if not isinstance(teacher, TopK):
    return losses.acceptance(teacher, student_logits, mask)
  law, z, lse, _, valid = _prepare(teacher, student_logits, mask)
  return jnp.where(valid, _acceptance(law, z, lse), 0.0)


def token_acceptance(teacher: jax.Array | TopK, student_logits: jax.Array,
                     mask: jax.Array) -> jax.Array:
  """Expected acceptance of one drafted token: `acceptance`'s mean over the valid positions (a
  metric, not a loss), of dense teacher log-probs [b, t, n] or of a TopK."""
  w, valid = losses._weights(mask, student_logits.shape[:-1])
  return losses._masked_mean(acceptance(teacher, student_logits, mask), w, valid)


def top(teacher: jax.Array | TopK, n: int) -> jax.Array:
  """The teacher's most likely id [b, t] among the n it is over (ties aside): for a TopK its
  best top-k id among them, or where the rest's share outweighs every such id, the lowest
  other id (each of which holds that share)."""
  if not isinstance(teacher, TopK):
    return jnp.argmax(teacher, axis=-1)
  k = teacher.ids.shape[-1]
  listed = jnp.where(teacher.ids < n, teacher.logp, -jnp.inf)  # [b, t, K]
  best = jnp.argmax(listed, axis=-1)[..., None]  # [b, t, 1]
  best_id = jnp.take_along_axis(teacher.ids, best, -1)[..., 0]
  taken = jnp.any(teacher.ids[..., None, :] == jnp.arange(k + 1)[:, None], -1)  # [b, t, K + 1]
  lowest_other = jnp.argmin(taken, axis=-1)  # one of 0..K is not a top-k id
  return jnp.where(jnp.take_along_axis(listed, best, -1)[..., 0] >= teacher.log_rest[..., 0],
                   best_id, lowest_other)
