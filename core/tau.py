"""Expected tokens a verify step emits (tau) from per-position acceptance: the one formula that
goodput-driven draft length (decode/goodput.py) and the layer-skip search
(drafters/layer_skip_search.py) both weigh against a step's cost."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def expected_tokens(alpha) -> jax.Array:
  """[..., K] P(draft i kept | drafts before it kept) -> [..., K + 1] expected tokens a step
  drafting k = 0..K emits: 1 + sum_{j<=k} prod_{i<=j} alpha_i (the target's own token plus each
  draft kept; i.i.d. alpha = a gives Leviathan et al.'s 1 + a + ... + a^k). Traced too."""
  alpha = jnp.asarray(alpha, jnp.float32)
  ones = jnp.ones(alpha.shape[:-1] + (1,), jnp.float32)
  return jnp.concatenate([ones, 1 + jnp.cumsum(jnp.cumprod(alpha, -1), -1)], -1)
