"""The verifier interface: how one target forward checks a draft, and what the step keeps.

The speculative loop hands a verifier the draft, the pending token, its slot (the root) and a
`forward(tokens [b, t], positions [b, t], mask [b, t, t] or None) -> (logits [b, t, v], hidden
[l, b, t, d], cache)` closure over the target and its cache. The verifier lays out the block
(the pending token, then the drafts), runs the forward, decides what is kept and returns
`Verified` (block, logits, features, the kept path, its length and the next token) with the
cache holding the kept path's K/V in contiguous slots after the root's. The loop never looks at
the draft's shape, so a new verification rule (multi-draft, optimal transport) is one new file.

Faulty drafts are the verifier's to survive: an id outside the vocabulary reaches neither the
model nor the output (`safe_tokens`).

Dims: b batch, n drafts (chain k or tree nodes), v vocab.
"""
from __future__ import annotations

import abc
from typing import Callable

import jax
import jax.numpy as jnp

from speculax.core.sampling import SamplingConfig
from speculax.core.types import Draft, Verified

Forward = Callable[[jax.Array, jax.Array, jax.Array | None], tuple[jax.Array, jax.Array, object]]


class Verifier(abc.ABC):
  """A frozen dataclass (a static jit argument) that verifies one kind of draft."""

  @abc.abstractmethod
  def block_shape(self, k: int) -> tuple[int, int]:
    """(draft tokens fed per step after the pending one, most drafts one step can keep)."""

  @abc.abstractmethod
  def verify(self, key: jax.Array, draft: Draft, last: jax.Array, root: jax.Array,
             forward: Forward, sampling: SamplingConfig, vocab_size: int
             ) -> tuple[Verified, object]:
    """last [b] the pending token, root [b] its slot and position -> (Verified, cache)."""


def safe_tokens(tokens: jax.Array, vocab_size: int) -> tuple[jax.Array, jax.Array]:
  """Draft ids [b, n] -> (ids with token 0 where out of range, valid [b, n] bool).

  An out-of-range embedding lookup gives NaN, whose K/V would poison every later step through
  the masked attention (0 x NaN); verifiers feed token 0 there instead and never keep it.
  """
  valid = (tokens >= 0) & (tokens < vocab_size)
  return jnp.where(valid, tokens, 0), valid
