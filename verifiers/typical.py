"""Typical acceptance (Medusa, Cai et al. 2024), a LOSSY rule: off by default, and named lossy
wherever it appears (SpecConfig.lossy, the summary, the CLI flag).

Draft x at a position is kept when the target's probability of it clears an entropy-scaled bar,
p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p))), in order, and the step then draws
the target's token from p at the first position not kept (p itself, not the residual): so a
draft the target finds plausible is kept even where the lossless rule would have rejected it,
which buys longer accepted runs at the price of the exact output law. At temperature 0 p is
one-hot, the bar is min(threshold, alpha) < 1 and only the argmax clears it: greedy output stays
the target's own.

Dims: b batch, k draft length, v vocab.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from speculax.core.fields import Checked, field


@dataclasses.dataclass(frozen=True)
class Typical(Checked):
  posterior_threshold: float = field(0.09, gt=0, lt=1)  # the bar on a flat p (Medusa's epsilon)
  posterior_alpha: float = field(0.3, gt=0, lt=1)  # the bar's scale on a peaked p (delta)

  def kept(self, p: jax.Array, draft_tokens: jax.Array, hidden: jax.Array | None = None
           ) -> jax.Array:
    """p [b, k, v] the target's law at each draft's slot (after sampling settings),
    draft_tokens [b, k] -> [b, k] bool: the draft clears the typical bar there (hidden, the
    target's features, is not read)."""
    entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), -1)  # [b, k]
    bar = jnp.minimum(self.posterior_threshold, self.posterior_alpha * jnp.exp(-entropy))
    px = jnp.take_along_axis(p, draft_tokens[..., None], -1)[..., 0]  # [b, k]
    return px > bar

  def __str__(self) -> str:
    return f"typical acceptance {self.posterior_threshold}/{self.posterior_alpha}"
