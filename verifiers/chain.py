"""Chain verification: which of k draft tokens the target keeps, and the token it adds.

Greedy keeps the longest prefix that equals the target's argmax, so greedy speculative output is
token for token the target's greedy output. Sampling uses the lossless rule of Leviathan et al.
(2023) and Chen et al. (2023): keep draft i with probability min(1, p_i(x_i) / q_i(x_i)) in
order, and at the first rejection j draw from normalize(max(0, p_j - q_j)); when all k are kept,
draw the bonus token from p_k. Every emitted token then follows the target's sampling
distribution exactly, whatever the drafter proposes.

p and q must be the distributions *after* the same SamplingConfig (temperature, top-k, top-p):
the rule is lossless with respect to the p it is given, so the target goes through
`sampling.probs` here and the drafter's q must already have gone through it too (or be one-hot
for a deterministic drafter such as prompt lookup).

Everything is pure and jittable with `sampling` static; callers jit the whole decode step.
`ChainVerifier` runs the forward over the pending token and the drafts and applies the rule; a
chain of adaptive length (Draft.length) is verified by a forward over the longest draft of the
batch only. Drafts from the first id outside the vocabulary on are not checked (a lossless
stopping rule: the next token then follows the target's law at that position).

Dims: b batch, k draft length, v vocab.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from speculax.core import rejection
from speculax.core.sampling import SamplingConfig, argmax, probs, sample
from speculax.core.types import Draft, Verified
from speculax.verifiers.base import Forward, Verifier, safe_tokens
from speculax.verifiers.judge import Judge
from speculax.verifiers.typical import Typical

Lossy = Typical | Judge  # the LOSSY acceptance rules (off by default)


@dataclasses.dataclass(frozen=True)
class ChainVerifier(Verifier):
  """k drafts in a row after the pending token; keeps the longest acceptable prefix (with
  `lossy`, by Medusa's typical acceptance or a judge head instead of the lossless rule)."""
  lossy: Lossy | None = None

  def block_shape(self, k: int) -> tuple[int, int]:
    return k, k

  def verify(self, key: jax.Array, draft: Draft, last: jax.Array, root: jax.Array,
             forward: Forward, sampling: SamplingConfig, vocab_size: int
             ) -> tuple[Verified, object]:
    drafts, valid = safe_tokens(draft.tokens, vocab_size)  # [b, k]
    b, k = drafts.shape
    block = jnp.concatenate([last[:, None], drafts], 1)  # [b, k + 1]
    q = draft.probs
    if q is None and not sampling.greedy:  # a deterministic drafter: q is one-hot
      q = jax.nn.one_hot(drafts, vocab_size, dtype=jnp.float32)
    length = rejection.accepted_prefix(valid)  # [b] drafts before the first bad id
    if draft.length is not None:
      length = jnp.minimum(length, draft.length)

    def run(m):  # verifies the first m drafts with one forward of m + 1 tokens
      logits, hidden, cache = forward(block[:, :m + 1], root[:, None] + jnp.arange(m + 1), None)
      n_acc, nxt = verify_chain(key, logits, drafts[:, :m], None if q is None else q[:, :m],
                                sampling, jnp.minimum(length, m), self.lossy,
                                hidden[-1, :, 1:])  # the final features at the drafts' slots
      pad = lambda x, axis: jnp.pad(x, [(0, k - m if a == axis else 0) for a in range(x.ndim)])
      return pad(logits, 1), pad(hidden, 2), cache, n_acc, nxt

    if draft.length is None:
      logits, hidden, cache, n_acc, nxt = run(k)
    else:  # adaptive length: the forward covers the longest draft of the batch, no more
      m = jnp.clip(jnp.max(draft.length), 1, k)
      logits, hidden, cache, n_acc, nxt = jax.lax.switch(
          m - 1, [functools.partial(run, i) for i in range(1, k + 1)])
    path = jnp.broadcast_to(jnp.arange(k + 1, dtype=jnp.int32), (b, k + 1))
    return Verified(block, logits, hidden, path, n_acc, nxt), cache

def verify_chain(
    key: jax.Array,
    target_logits: jax.Array,  # [b, k+1, v] position i predicts the slot of draft i (k: bonus)
    draft_tokens: jax.Array,  # [b, k] int32
    draft_probs: jax.Array | None,  # [b, k, v] drafter's q after `sampling`; None for greedy
    sampling: SamplingConfig,
    length: jax.Array | None = None,  # [b] int32 in [0, k] drafts to check; None: k
    lossy: Lossy | None = None,  # LOSSY: typical acceptance or a judge head
    draft_hidden: jax.Array | None = None,  # [b, k, d] the target's final features at the
    # drafts' own slots (a judge reads them)
) -> tuple[jax.Array, jax.Array]:
  """Returns (n_accepted [b] int32 in [0, length or k], next_token [b] int32); k = 0 is a plain
  decoding step (next_token drawn from p at the pending token).

  The step emits draft_tokens[:, :n_accepted] followed by next_token: the target's correction
  at the first rejected position, or its bonus token when all checked drafts are kept (drawn
  from p there: a draft the drafter withdrew has no q to correct for).
  """
  _check_shapes(target_logits, draft_tokens, draft_probs, sampling)
  k = draft_tokens.shape[1]
  if k == 0:  # nothing to check: the target's own token at the pending position
    return jnp.zeros(draft_tokens.shape[:1], jnp.int32), sample(key, target_logits[:, 0],
                                                                sampling)
  checked = jnp.ones((1, k), bool) if length is None else jnp.arange(k)[None] < length[:, None]
  if lossy is not None:
    return _verify_lossy(key, target_logits, draft_tokens, draft_hidden, sampling, checked, lossy)
  if sampling.greedy:
    return _verify_greedy(target_logits, draft_tokens, checked)
  return _verify_sampled(key, target_logits, draft_tokens, draft_probs, sampling, checked)


def emitted_tokens(
    draft_tokens: jax.Array,  # [b, k]
    n_accepted: jax.Array,  # [b]
    next_token: jax.Array,  # [b]
) -> jax.Array:
  """The step's output as [b, k+1] int32: accepted drafts, then next_token, then -1 padding.

  Row r holds n_accepted[r] + 1 real tokens; -1 marks slots past them so a ragged batch can be
  written with one masked scatter.
  """
  k = draft_tokens.shape[1]
  pos = jnp.arange(k + 1)[None]  # [1, k+1]
  padded = jnp.pad(draft_tokens, ((0, 0), (0, 1)))  # [b, k+1]
  n = n_accepted[:, None]
  out = jnp.where(pos < n, padded, jnp.where(pos == n, next_token[:, None], -1))
  return out.astype(jnp.int32)  # [b, k+1]


def _check_shapes(target_logits, draft_tokens, draft_probs, sampling) -> None:
  """Trace-time checks: shapes are static, so a mismatch fails before anything runs."""
  if target_logits.ndim != 3:
    raise ValueError(f"target_logits must be [b, k+1, v], got shape {target_logits.shape}")
  b, k1, v = target_logits.shape
  if draft_tokens.shape != (b, k1 - 1) or k1 < 1:
    raise ValueError(f"draft_tokens must be [b, k] = {(b, k1 - 1)} to match target_logits "
                     f"{target_logits.shape}, got shape {draft_tokens.shape}")
  sampling.check_vocab(v)
  if sampling.greedy:
    return
  if draft_probs is None:
    raise ValueError("draft_probs (the drafter's q) is required when sampling is not greedy")
  if draft_probs.shape != (b, k1 - 1, v):
    raise ValueError(f"draft_probs must be [b, k, v] = {(b, k1 - 1, v)}, "
                     f"got shape {draft_probs.shape}")


def _verify_greedy(target_logits, draft_tokens, checked):
  best = argmax(target_logits)  # [b, k+1]
  n = rejection.accepted_prefix((draft_tokens == best[:, :-1]) & checked)  # [b]
  next_token = jnp.take_along_axis(best, n[:, None], 1)[:, 0]  # [b]
  return n, next_token


def _verify_lossy(key, target_logits, draft_tokens, draft_hidden, sampling, checked, rule: Lossy):
  """The rule's kept prefix, then the target's token from p (one-hot when greedy, so its
  argmax) at the first draft not kept."""
  p = probs(target_logits, sampling)  # [b, k+1, v]
  n = rejection.accepted_prefix(rule.kept(p[:, :-1], draft_tokens, draft_hidden) & checked)
  u = jax.random.uniform(key, n.shape)  # [b]
  return n, rejection.inverse_cdf(u, p[jnp.arange(n.shape[0]), n])  # p, not the residual


def _verify_sampled(key, target_logits, draft_tokens, draft_probs, sampling, checked):
  b, k = draft_tokens.shape
  p = probs(target_logits, sampling)  # [b, k+1, v]
  # Unchecked drafts are rejected, and their zero q makes the residual there p itself.
  q = draft_probs.astype(jnp.float32) * checked[..., None]  # [b, k, v]
  # Columns 0..k-1 decide acceptance, column k draws next_token: all independent (the rejected
  # position's own uniform is conditioned by its rejection, so it must not be reused).
  u = jax.random.uniform(key, (b, k + 1))  # [b, k+1]
  px = jnp.take_along_axis(p[:, :k], draft_tokens[..., None], -1)[..., 0]  # [b, k]
  qx = jnp.take_along_axis(q, draft_tokens[..., None], -1)[..., 0]  # [b, k]
  n = rejection.accepted_prefix(rejection.accept(u[:, :k], px, qx) & checked)  # [b]
  # A zero q row at position k makes the residual there p_k itself: the bonus draw.
  q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], 1)  # [b, k+1, v]
  rows = jnp.arange(b)
  dist = rejection.residual(p[rows, n], q_pad[rows, n])  # [b, v] only the row that is needed
  return n, rejection.inverse_cdf(u[:, k], dist)
