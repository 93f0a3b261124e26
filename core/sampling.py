"""Sampling settings and the logits -> probabilities transform shared by every decode path.

Speculative verification must apply temperature, top-k and top-p identically to the target and
the drafter, so both go through `probs` here. Temperature 0 means greedy, handled explicitly
(dividing by zero would give inf and then NaN). Any positive temperature works, however small:
the logits are shifted so their maximum is 0 before the division, so a tiny temperature sends
the others to -inf (probability 0) instead of overflowing to inf - inf = NaN.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from speculax.core import rejection
from speculax.core.fields import Checked, field


@dataclasses.dataclass(frozen=True)
class SamplingConfig(Checked):
  temperature: float = field(0.0, ge=0)  # 0 = greedy
  top_k: int = field(0, ge=0)  # 0 = off
  top_p: float = field(1.0, gt=0, le=1)  # 1 = off

  @property
  def greedy(self) -> bool:
    # A traced temperature is a sampled one: a greedy config keeps its 0 static (_flatten).
    return not isinstance(self.temperature, jax.Array) and self.temperature == 0

  @property
  def nucleus(self) -> bool:
    """Whether top-p truncates (top_p < 1; a traced top_p is one that does)."""
    return isinstance(self.top_p, jax.Array) or self.top_p < 1

  def check_vocab(self, vocab_size: int) -> None:
    if self.top_k > vocab_size:
      raise ValueError(f"top_k={self.top_k} exceeds the vocabulary size {vocab_size}")


def _flatten(cfg: SamplingConfig):
  """A pytree whose leaves are the temperature and top_p values in use (None where greedy or
  top-p is off) and whose structure is the rest: jitted code that takes a config as an argument
  compiles once for every sampled temperature and top-p value, and apart for greedy, top-p on or
  off and each top_k (a shape)."""
  return (None if cfg.greedy else cfg.temperature, cfg.top_p if cfg.nucleus else None), cfg.top_k


def _unflatten(top_k: int, values) -> SamplingConfig:
  # Leaves may be tracers (or whatever a tree map puts there): not validated again.
  temperature, top_p = values
  cfg = object.__new__(SamplingConfig)
  for name, value in (("temperature", 0.0 if temperature is None else temperature),
                      ("top_k", top_k), ("top_p", 1.0 if top_p is None else top_p)):
    object.__setattr__(cfg, name, value)
  return cfg


jax.tree_util.register_pytree_node(SamplingConfig, _flatten, _unflatten)


def argmax(x: jax.Array) -> jax.Array:
  """[..., v] -> [...] int32: `jnp.argmax(x, -1)` (the first maximum; where a row holds NaN, its
  first NaN) as two reductions XLA vectorizes. XLA:CPU runs jnp.argmax's (value, index) reduce
  an element at a time: over SmolLM2's 49152 logits 218 us a row against 38 this way (AMD EPYC,
  2 cores), paid each decode step by the target's argmax and each greedy draft's."""
  nan = jnp.isnan(x)
  # XLA:CPU's max may pass over a NaN, so rows holding one are told apart first.
  at = jnp.where(nan.any(-1, keepdims=True), nan, x == jnp.max(x, -1, keepdims=True))
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  return jnp.min(jnp.where(at, index, x.shape[-1]), -1)


def probs(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
  """Sampling distribution [..., v] float32 after temperature, top-k and top-p.

  Greedy gives the one-hot of the argmax, so exact-probability verification code can treat
  greedy as a degenerate distribution.
  """
  logits = logits.astype(jnp.float32)
  if cfg.greedy:
    return jax.nn.one_hot(argmax(logits), logits.shape[-1], dtype=jnp.float32)
  shifted = logits - jnp.max(logits, -1, keepdims=True)  # <= 0
  # The max stays 0 even where the temperature rounds to 0 in float32 (0 / 0 is never taken).
  logits = jnp.where(shifted < 0, shifted / cfg.temperature, 0.0)
  neg = jnp.finfo(jnp.float32).min
  if cfg.top_k:
    kth = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, neg, logits)
  if cfg.nucleus:
    # Keep the smallest prefix of the sorted distribution whose mass reaches top_p (the token
    # that crosses the threshold stays in, as in Hugging Face's TopPLogitsWarper).
    order = jnp.argsort(-logits, axis=-1)
    sorted_p = jnp.take_along_axis(jax.nn.softmax(logits, -1), order, -1)
    mass_before = jnp.cumsum(sorted_p, -1) - sorted_p
    keep_sorted = mass_before < cfg.top_p
    keep = jnp.zeros_like(keep_sorted).at[
        tuple(jnp.indices(order.shape)[:-1]) + (order,)].set(keep_sorted)
    logits = jnp.where(keep, logits, neg)
  return jax.nn.softmax(logits, -1)


def sample(key: jax.Array, logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
  """One token per row: logits [..., v] -> [...] int32 (greedy: the argmax; else `draw` from
  probs(logits))."""
  if cfg.greedy:
    return argmax(logits)
  return draw(key, probs(logits, cfg))


def draw(key: jax.Array, p: jax.Array, n: int | None = None) -> jax.Array:
  """One token per row from probabilities p [..., v] (unnormalized is fine) -> [...] int32, or n
  independent ones -> [..., n] (one cdf a row), by the inverse of its cdf: one uniform a token
  where `jax.random.categorical` draws v Gumbel values (SmolLM2's 49152-token law on a 2-core CPU:
  0.37 ms against 1.37, a step of a sampled draft chain)."""
  flat = p.reshape(-1, p.shape[-1])  # [rows, v]
  draws = () if n is None else (n,)
  u = jax.random.uniform(key, flat.shape[:1] + draws)  # [rows] or [rows, n]
  return rejection.inverse_cdf(u, flat).reshape(p.shape[:-1] + draws)


def top_probability(logits: jax.Array, q: jax.Array | None = None) -> jax.Array:
  """[...] the largest probability of a draft's law: q's [..., v] where it was sampled, the
  softmax of logits [..., v] where it was deterministic (Kangaroo's early-exit confidence).

  The softmax's largest entry is 1 / sum(exp(logits - max)), with no [..., v] probabilities
  written. The max is shifted where it is not finite, as logsumexp does; beside keeping an
  all -inf row NaN as the softmax has it, that select keeps XLA's CPU reduction from writing the
  max out broadcast over [..., v] (30 ms of a 0.49 s EAGLE update)."""
  if q is not None:
    return jnp.max(q, -1)
  top = jnp.max(logits, -1, keepdims=True)  # [..., 1]
  shift = jnp.where(jnp.isfinite(top), top, 0.0)
  return (jnp.exp(top - shift) / jnp.sum(jnp.exp(logits - shift), -1, keepdims=True))[..., 0]


def candidates(key: jax.Array, logits: jax.Array, cfg: SamplingConfig,
               c: int) -> tuple[jax.Array, jax.Array | None]:
  """c distinct candidate tokens per row: logits [..., v] -> tokens [..., c] int32, q [..., v].

  Greedy: the top c by logit (q None: deterministic). Sampling: c draws without replacement
  from q = probs(logits) in draw order (Gumbel top-k), the law tree verification undoes sibling
  by sibling.
  """
  if cfg.greedy:
    return jax.lax.top_k(logits, c)[1].astype(jnp.int32), None
  q = probs(logits, cfg)
  gumbel = jax.random.gumbel(key, q.shape)
  return jax.lax.top_k(jnp.log(q) + gumbel, c)[1].astype(jnp.int32), q
