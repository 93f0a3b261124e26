"""Autoregressive drafting with a model forward, shared by the draft-model and layer-skip
drafters."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from speculax.core.sampling import SamplingConfig, probs, sample, top_probability
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache


def draft_chain(params, config: LlamaConfig, cache: KVCache, last: jax.Array, key: jax.Array,
                k: int, sampling: SamplingConfig, extra_step: bool = False, output=None,
                exit_threshold: float | None = None):
  """Feeds last [b], then each drafted token, one forward at a time; returns k drafts.

  The cache must hold every token before `last`; afterwards it also holds last and the first
  k - 1 drafts (all k with extra_step, which feeds draft k too so that a drafter with its own
  cache is in sync when the target accepts every draft).
  output: features -> logits instead of the model's output layer (Drafter.output, VocabTrim).
  exit_threshold: Kangaroo's early exit: a row's chain ends before the first draft (after the
  first) whose top draft probability is below it; drafting stops once every row has ended.
  Returns tokens [b, k] int32, q [b, k, v] (None when greedy), length [b] int32 in [1, k] (None
  without exit_threshold) and the cache.
  """
  b, steps = last.shape[0], k + 1 if extra_step else k
  keys = jax.random.split(key, steps)

  def body(c):  # feeds the last token drawn, draws draft s
    s, cache, tok, tokens, q, length = c
    logits, _, cache = llama.forward(params, config, tok[:, None], cache.lengths[:, None], cache,
                                     output=output)
    logits = logits[:, 0]
    nxt = sample(keys[s], logits, sampling)
    law = None if sampling.greedy else probs(logits, sampling)  # [b, v]
    tokens = tokens.at[:, s].set(nxt)
    if law is not None:
      q = q.at[:, s].set(law)
    if exit_threshold is not None:
      length = exit_step(length, top_probability(logits, law), s, k, exit_threshold)
    return s + 1, cache, nxt, tokens, q, length

  def cond(c):  # a row of length L still draws drafts s < L, and feeds draft L with extra_step
    s, length = c[0], c[-1]
    return (s < steps) & jnp.any(s < length + extra_step)

  # Room for `steps` draws (the extra step's is dropped).
  q0 = None if sampling.greedy else jnp.zeros((b, steps, config.vocab_size), jnp.float32)
  init = (jnp.zeros((), jnp.int32), cache, last, jnp.zeros((b, steps), jnp.int32), q0,
          jnp.full((b,), k, jnp.int32))
  _, cache, _, tokens, q, length = jax.lax.while_loop(cond, body, init)
  return tokens[:, :k], None if q is None else q[:, :k], \
      None if exit_threshold is None else length, cache


def exit_step(length: jax.Array, top: jax.Array, s, k: int, threshold: float) -> jax.Array:
  """Kangaroo's early exit while drafting: a row still at full length k whose draft s (> 0, < k)
  has top draft probability top [b] below threshold ends before it (length s)."""
  return jnp.where((top < threshold) & (length == k) & (s > 0) & (s < k), s, length)


def exit_length(top: jax.Array, threshold: float) -> jax.Array:
  """Kangaroo's early exit on a drafted chain: top [b, k], each draft's top draft probability
  -> [b] int32 drafts before the first one after the first whose top is below threshold."""
  low = (top < threshold).at[:, 0].set(False)
  return jnp.where(low.any(1), jnp.argmax(low, 1), top.shape[1]).astype(jnp.int32)
