"""Autoregressive drafting with a model forward: shared by the draft-model and layer-skip drafters."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from speculax.core.sampling import SamplingConfig, probs, sample
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache


def draft_chain(params, config: LlamaConfig, cache: KVCache, last: jax.Array, key: jax.Array,
                k: int, sampling: SamplingConfig, extra_step: bool = False):
  """Feeds last [b], then each drafted token, one forward at a time; returns k drafts.

  The cache must hold every token before `last`; afterwards it also holds last and the first
  k - 1 drafts (all k with extra_step, which feeds draft k too so that a drafter with its own
  cache is in sync when the target accepts every draft).
  Returns tokens [b, k] int32, q [b, k, v] (None when greedy) and the cache.
  """
  def one(carry, step_key):
    cache, tok = carry
    logits, _, cache = llama.forward(params, config, tok[:, None], cache.lengths[:, None], cache)
    logits = logits[:, 0]
    nxt = sample(step_key, logits, sampling)
    q = None if sampling.greedy else probs(logits, sampling)
    return (cache, nxt), (nxt, q)

  steps = k + 1 if extra_step else k
  (cache, _), (tokens, q) = jax.lax.scan(one, (cache, last), jax.random.split(key, steps))
  tokens = tokens[:k].T  # [b, k]
  q = None if q is None else jnp.swapaxes(q[:k], 0, 1)  # [b, k, v]
  return tokens, q, cache
