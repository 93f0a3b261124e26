"""Multi-draft chains: n branches of k drafts each after the pending token, one target forward.

The drafter proposes n first tokens by a draft scheme and continues each branch as a chain
(core/multi_draft.py). The block is the tree StaticTree.full((n, 1, ..., 1)): nodes 1..n are the
branches' first drafts, node d n + 1 + j is branch j's draft at depth d + 1, and the tree's
ancestor mask keeps the branches apart in the one forward. The first level is verified by a
multi-draft rule (recursive rejection, K-SEQ, or the greedy scheme's optimal rule): it emits a
token whose law is the target's, and when that token is one of the drafts the walk continues
down the first branch holding it, whose later drafts are checked by ordinary chain rejection
(they were drawn given that token alone, so the selection does not bias them). Greedy keeps the
branch whose first draft is the target's argmax. The kept path's K/V is moved to contiguous
cache slots as for any tree.

Faulty first drafts (ids outside the vocabulary) break the scheme's law, so then no branch is
kept and the token is drawn from p; a faulty later draft ends its chain.

Dims: b batch, n branches, k drafts per branch, v vocab.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from speculax.core import multi_draft as md
from speculax.core import rejection
from speculax.core.fields import Checked, field
from speculax.core.sampling import SamplingConfig, argmax, probs
from speculax.core.trees import StaticTree, ancestor_mask
from speculax.core.types import Draft, Verified
from speculax.verifiers.base import Forward, Verifier, safe_tokens
from speculax.verifiers.chain import verify_chain

Rule = Literal["recursive", "recursive_without_replacement", "kseq", "greedy"]


def branch_tree(n: int, k: int) -> StaticTree:
  """n disjoint chains of k nodes under the root."""
  return StaticTree.full((n,) + (1,) * (k - 1))


@dataclasses.dataclass(frozen=True)
class MultiDraftVerifier(Verifier, Checked):
  n: int = field(2, ge=1)  # branches
  rule: Rule = "greedy"  # the first level's rule; its draft scheme is md.RULES[rule]

  def block_shape(self, k: int) -> tuple[int, int]:
    return self.n * k, k

  def verify(self, key: jax.Array, draft: Draft, last: jax.Array, root: jax.Array,
             forward: Forward, sampling: SamplingConfig, vocab_size: int
             ) -> tuple[Verified, object]:
    nodes, valid = safe_tokens(draft.tokens, vocab_size)  # [b, n k]
    b, n = nodes.shape[0], self.n
    k = nodes.shape[1] // n
    tree = branch_tree(n, k)
    block = jnp.concatenate([last[:, None], nodes], 1)  # [b, n k + 1]
    positions = root[:, None] + jnp.asarray(tree.node_depths)[None]
    logits, hidden, cache = forward(block, positions, ancestor_mask(tree.batch_parents(b), k))
    k_first, k_chain = jax.random.split(key)
    first, first_ok = nodes[:, :n], valid[:, :n].all(1)  # [b, n], [b]
    if sampling.greedy:
      y = argmax(logits[:, 0])
      hit = first == y[:, None]
      branch = jnp.where(hit.any(1), jnp.argmax(hit, 1), -1)
    else:
      if draft.probs is None:
        raise ValueError("multi-draft sampling needs the drafter's law q (Draft.probs)")
      p0 = probs(logits[:, 0], sampling)  # [b, v]
      dist = md.law(self.rule, first, p0, draft.probs[:, 0].astype(jnp.float32))
      y, branch = md.emit(jax.random.uniform(k_first, (b,)),
                          jnp.where(first_ok[:, None], dist, p0), first)
    branch = jnp.where(first_ok, branch, -1).astype(jnp.int32)  # [b]
    # [b, k] branch's nodes by depth (branch 0's where none is kept: computed, then ignored)
    chain = 1 + jnp.arange(k)[None] * n + jnp.maximum(branch, 0)[:, None]
    m, nxt = _continue(k_chain, logits, nodes, valid, draft.probs, chain, sampling)
    kept = branch >= 0
    n_acc = jnp.where(kept, 1 + m, 0).astype(jnp.int32)
    nxt = jnp.where(kept, nxt, y)
    full = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), chain.astype(jnp.int32)], 1)
    path = jnp.take_along_axis(full, jnp.minimum(jnp.arange(k + 1)[None], n_acc[:, None]), 1)
    return Verified(block, logits, hidden, path, n_acc, nxt), cache.gather_path(root, path)


def _continue(key, logits, nodes, valid, draft_probs, chain, sampling):
  """Chain rejection down the kept branch's nodes chain [b, k] -> (drafts kept after its first
  [b], the next token [b])."""
  at = lambda x, idx: jnp.take_along_axis(x, idx.reshape(idx.shape + (1,) * (x.ndim - 2)), 1)
  chain_logits = at(logits, chain)  # [b, k, v] each predicts the next depth; the last: bonus
  if chain.shape[1] == 1:  # no later drafts: the bonus token
    p = probs(chain_logits[:, 0], sampling)
    u = jax.random.uniform(key, p.shape[:1])
    nxt = argmax(p) if sampling.greedy else rejection.inverse_cdf(u, p)
    return jnp.zeros(p.shape[:1], jnp.int32), nxt.astype(jnp.int32)
  later = chain[:, 1:] - 1  # [b, k - 1] their index among the drafts
  q = None if sampling.greedy else at(draft_probs, later).astype(jnp.float32)
  length = rejection.accepted_prefix(at(valid, later))  # drafts before the first faulty one
  return verify_chain(key, chain_logits, at(nodes, later), q, sampling, length)
