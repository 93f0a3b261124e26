"""Rejection rules shared by every verifier: accept a draft, the residual law after a rejection,
one draw by inverse CDF, and the accepted prefix of a chain.

Leviathan et al. (2023), Chen et al. (2023): draft x drawn from q is kept with probability
min(1, p(x) / q(x)); after a rejection the next token follows normalize(max(0, p - q)). Pure
jnp functions, called by module attribute (`rejection.residual`) so tests can plant a wrong rule.

Dims: b batch, k draft length, v vocab.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

# Below this residual mass the residual is rounding noise (p == q up to float error), and a
# rejection there happens with probability about that mass, so falling back to p_j changes the
# output distribution by at most this much.
MIN_RESIDUAL_MASS = 1e-6


def accepted_prefix(accept: jax.Array) -> jax.Array:
  """Length of the leading run of True per row: [b, k] bool -> [b] int32."""
  return jnp.cumprod(accept.astype(jnp.int32), -1).sum(-1).astype(jnp.int32)


def accept(u: jax.Array, px: jax.Array, qx: jax.Array) -> jax.Array:
  """u < min(1, p/q) for u ~ U[0, 1), written without a division.

  q = 0 (a junk or deterministic proposal) accepts iff p > 0 and p = 0 always rejects, with no
  inf or NaN on the way.
  """
  return u * qx < px


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
  """normalize(max(0, p - q)) over the last axis, or p where that has (numerically) no mass."""
  r = jnp.maximum(p - q, 0.0)
  mass = r.sum(-1, keepdims=True)
  return jnp.where(mass > MIN_RESIDUAL_MASS, r / jnp.maximum(mass, MIN_RESIDUAL_MASS), p)


def inverse_cdf(u: jax.Array, dist: jax.Array) -> jax.Array:
  """One token per row from dist [b, v] (unnormalized is fine) with uniforms u [b] -> [b] int32;
  with u [b, n], n tokens per row from one cdf -> [b, n].

  Needs b uniforms where `jax.random.categorical` needs b * v Gumbel draws (the whole vocab per
  row), and it never returns a zero-probability token: such a token's cdf equals its
  predecessor's, so the first index whose cdf exceeds u * total is never it (and the clip to the
  last positive entry covers u * total rounding up to the total).
  """
  v = dist.shape[-1]
  cdf = jnp.cumsum(dist, -1)  # [b, v]
  draws = u.reshape(u.shape[0], -1) * cdf[:, -1:]  # [b, n] (n = 1 for u [b]): u * total
  idx = jnp.sum(cdf[:, None] <= draws[..., None], -1)  # [b, n] first index with cdf > u * total
  # [b] the last token with mass (v - 1 where none has), as one max: jnp.argmax over the reversed
  # row ran an element at a time on XLA:CPU (core.sampling.argmax)
  last_positive = jnp.max(jnp.where(dist > 0, jnp.arange(v), -1), -1)
  last_positive = jnp.where(last_positive < 0, v - 1, last_positive)
  return jnp.minimum(idx, last_positive[:, None]).reshape(u.shape).astype(jnp.int32)
