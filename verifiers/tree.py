"""Tree verification: which root-to-node path of a drafted tree the target keeps, and what follows.

Greedy: a node is accepted when its token is the target's argmax at its parent and its parent is
accepted; the deepest accepted node (first in node order on ties) ends the path, and the target's
argmax there is the next token. Output is token for token the target's greedy output.

Sampling: recursive rejection sampling down the tree (SpecInfer, Miao et al. 2024; Recursive
Speculative Decoding, Jeon et al. 2024). At node u with target law p, try u's children in order:
child x drawn from q is kept with probability min(1, p(x) / q(x)); on rejection p becomes
normalize(max(0, p - q)) and the next sibling is tried. Siblings drawn *without replacement*
(the default) were drawn from q with the earlier siblings removed, so q loses x before the next
try; siblings drawn *with replacement* (i.i.d. from q) keep q. A deterministic drafter's child is
a draw from the point mass on its token (q one-hot). When a child is kept the walk moves to it;
when all are rejected, or u is a leaf, the next token is drawn from the current p. Every emitted
token then follows the target's sampling distribution exactly.

`TreeVerifier` runs one forward over the root and every node with the tree's ancestor mask and
moves the kept path's K/V into contiguous cache slots after the root's.

Dims: b batch, n draft nodes (node 0 is the root), v vocab, c children per node, d depth.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from speculax.core import rejection
from speculax.core.sampling import SamplingConfig, argmax, probs
from speculax.core.trees import Tree, ancestor_mask, children_table, depths, path_to
from speculax.core.types import Draft, Verified
from speculax.verifiers.base import Forward, Verifier, safe_tokens


@dataclasses.dataclass(frozen=True)
class TreeVerifier(Verifier):
  """A tree of draft nodes (static or dynamic) after the pending token."""
  tree: Tree
  without_replacement: bool = True  # sampled siblings were drawn without replacement

  def block_shape(self, k: int) -> tuple[int, int]:
    return self.tree.n_nodes, self.tree.depth

  def verify(self, key: jax.Array, draft: Draft, last: jax.Array, root: jax.Array,
             forward: Forward, sampling: SamplingConfig, vocab_size: int
             ) -> tuple[Verified, object]:
    nodes, valid = safe_tokens(draft.tokens, vocab_size)  # [b, n]
    b = nodes.shape[0]
    block = jnp.concatenate([last[:, None], nodes], 1)  # [b, n + 1]
    depth = self.tree.depth
    positions = root[:, None] + depths(draft.parents, depth)  # [b, n + 1]
    logits, hidden, cache = forward(block, positions, ancestor_mask(draft.parents, depth))
    valid = jnp.concatenate([jnp.ones((b, 1), bool), valid], 1)  # [b, n + 1] the root is kept
    path, n_acc, nxt = verify_tree(key, logits, block, draft.parents, draft.probs, sampling,
                                   depth, self.tree.max_children, self.without_replacement,
                                   valid)
    return Verified(block, logits, hidden, path, n_acc, nxt), cache.gather_path(root, path)



def verify_tree(
    key: jax.Array,
    target_logits: jax.Array,  # [b, n + 1, v] at each node: the target's next-token logits
    tokens: jax.Array,  # [b, n + 1] int32 node tokens (0: the root)
    parents: jax.Array,  # [b, n + 1] int32 (root -1), parents before children
    draft_probs: jax.Array | None,  # [b, n, v] law nodes 1..n were drawn from; None: one-hot
    sampling: SamplingConfig,
    depth: int,
    max_children: int,
    without_replacement: bool = True,
    valid: jax.Array | None = None,  # [b, n + 1] bool: False marks a node never to keep
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Returns (path [b, depth + 1] node indices from the root, n_accepted [b], next_token [b]).

  path[:, :n_accepted + 1] is the kept path (path[:, 0] is the root); entries past it repeat
  its last node. draft_probs[:, i - 1] is the law node i was drawn from before its earlier
  siblings were removed (the drafter's q at node i's parent, after `sampling`). A node that is
  not `valid` (a draft id outside the vocabulary) ends its parent's tries: neither it nor a
  later sibling is kept (the next token is then drawn from what the earlier rejections left,
  which stays lossless).
  """
  _check_shapes(target_logits, tokens, parents, draft_probs, sampling)
  node_depths = depths(parents, depth)  # [b, n + 1]
  valid = jnp.ones(tokens.shape, bool) if valid is None else valid
  if sampling.greedy:
    best = argmax(target_logits)  # [b, n + 1]
    node = _greedy_node(best, tokens, parents, node_depths, depth, valid)
    nxt = jnp.take_along_axis(best, node[:, None], 1)[:, 0]
  else:
    node, nxt = _sampled_walk(key, target_logits, tokens, parents, draft_probs, sampling, depth,
                              max_children, without_replacement, valid)
  n_acc = jnp.take_along_axis(node_depths, node[:, None], 1)[:, 0]
  return path_to(node, n_acc, parents, depth), n_acc, nxt


def _check_shapes(target_logits, tokens, parents, draft_probs, sampling) -> None:
  b, n1, v = target_logits.shape
  if tokens.shape != (b, n1) or parents.shape != (b, n1):
    raise ValueError(f"tokens and parents must be [b, n + 1] = {(b, n1)} to match target_logits "
                     f"{target_logits.shape}, got {tokens.shape} and {parents.shape}")
  sampling.check_vocab(v)
  if not sampling.greedy and draft_probs is not None and draft_probs.shape != (b, n1 - 1, v):
    raise ValueError(f"draft_probs must be [b, n, v] = {(b, n1 - 1, v)}, got {draft_probs.shape}")


def _greedy_node(best, tokens, parents, node_depths, depth, valid):
  """The deepest valid node whose whole path matches the target's argmax best [b, n + 1] (first
  on ties) -> [b]."""
  safe = jnp.maximum(parents, 0)
  match = ((tokens == jnp.take_along_axis(best, safe, 1)) & valid) | (parents < 0)  # root kept
  ok = match
  for _ in range(depth):  # kept = matches and parent kept, settled one level per round
    ok = match & jnp.take_along_axis(ok, safe, 1)
  d = jnp.where(ok, node_depths, -1)
  return jnp.argmax(d, 1).astype(jnp.int32)  # argmax takes the first of equal maxima


def _sampled_walk(key, target_logits, tokens, parents, draft_probs, sampling, depth,
                  max_children, without_replacement, valid):
  b, n1, v = target_logits.shape
  rows = jnp.arange(b)
  p_all = probs(target_logits, sampling)  # [b, n + 1, v]
  kids = children_table(parents, max_children)  # [b, n + 1, c]
  u = jax.random.uniform(key, (b, depth * max_children + 1))  # one per sibling try, + the draw
  u_try, u_next = u[:, :-1], u[:, -1]
  node = jnp.zeros((b,), jnp.int32)
  p = p_all[:, 0]  # [b, v] the current node's target law, minus rejected siblings' q
  stopped = jnp.zeros((b,), bool)
  for d in range(depth):
    first = jnp.maximum(kids[rows, node, 0] - 1, 0)  # row of node's first child in draft_probs
    q = None if draft_probs is None else draft_probs[rows, first].astype(jnp.float32)  # [b, v]
    moved = jnp.zeros((b,), bool)
    blocked = jnp.zeros((b,), bool)  # an invalid sibling came up: no more tries at this node
    for r in range(max_children):
      child = kids[rows, node, r]  # [b]
      x = tokens[rows, jnp.maximum(child, 0)]
      blocked |= (child >= 0) & ~valid[rows, jnp.maximum(child, 0)]
      live = (child >= 0) & ~stopped & ~moved & ~blocked
      q_try = jax.nn.one_hot(x, v, dtype=jnp.float32) if q is None else q
      qx = q_try[rows, x]
      if q is not None:  # a sibling from an exhausted law (no mass left) was never a real draw
        live &= qx > 0
      keep = live & rejection.accept(u_try[:, d * max_children + r], p[rows, x], qx)
      drop = live & ~keep
      p = jnp.where(keep[:, None], p_all[rows, jnp.maximum(child, 0)],
                    jnp.where(drop[:, None], rejection.residual(p, q_try), p))
      if q is not None and without_replacement:
        q_less = q.at[rows, x].set(0.0)
        q = jnp.where(drop[:, None], q_less / jnp.maximum(q_less.sum(-1, keepdims=True), 1e-30), q)
      node = jnp.where(keep, child, node)
      moved |= keep
    stopped |= ~moved
  return node, rejection.inverse_cdf(u_next, p)
