"""Tree drafting with a model forward, level by level (the draft-model and layer-skip drafters).

The root (the pending token) is fed at its slot, then each level's nodes are fed as one block of
width w_d whose mask covers the tree nodes already in the cache (ancestors only), so node i sits
at slot root + i and depth d feeds at position root + d. A level's children come from the
logits of the level before: a static tree picks fixed (parent, rank) pairs of each parent's
candidates; a dynamic tree keeps the `width` children with the largest product of draft
probabilities along their path (EAGLE-2 style), always deterministic top candidates so the tree
is a function of the context alone (verification then treats each node as a one-hot draw).
Static trees under sampling draw each parent's candidates without replacement from q.

Dims: b batch, w level width, c candidates per node, n nodes, v vocab.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.sampling import SamplingConfig, candidates, top_probability
from speculax.core.trees import StaticTree, Tree, ancestor_mask
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache


def draft_tree(params, config: LlamaConfig, cache: KVCache, last: jax.Array, key: jax.Array,
               tree: Tree, sampling: SamplingConfig, feed_leaves: bool = False, output=None):
  """Drafts one tree per row after `last` [b]; the cache holds every token before it.

  Returns tokens [b, n] int32, q [b, n, v] (None when deterministic), parents [b, n + 1] int32
  and the cache with the root and every fed level written at slots root + node (lengths back at
  the root's slot). feed_leaves also feeds the last level, so a drafter with its own cache has
  every node's K/V whichever path the target keeps. output: as in drafters/chain.draft_chain.
  """
  root = cache.lengths  # [b] the root's slot
  logits, _, cache = llama.forward(params, config, last[:, None], root[:, None], cache,
                                   output=output)

  def feed(cache, d, level, local, mask):
    positions = (root + d)[:, None] + jnp.zeros(level.shape, jnp.int32)
    logits, _, cache = llama.forward(params, config, level, positions, cache, mask, output=output)
    return logits, cache

  tokens, q, parents, cache, _ = grow_tree(feed, cache, logits, key, tree, sampling, feed_leaves)
  return tokens, q, parents, cache.with_lengths(root)


def grow_tree(feed, carry, logits: jax.Array, key: jax.Array, tree: Tree,
              sampling: SamplingConfig, feed_leaves: bool = False):
  """Grows one tree per row from the root's logits [b, 1, v], level by level.

  feed(carry, d, level [b, w], local [b, w], mask [b, w, nodes so far]) -> (logits [b, w, v],
  carry) runs the drafter on depth d's nodes: local is each node's parent within depth d - 1,
  mask its ancestors among all nodes so far, the root (node 0) first. Returns tokens [b, n],
  q [b, n, v] or None, parents [b, n + 1], the final carry and top [b, n], the largest
  probability of the law each node was drawn from (q, or the softmax where deterministic).
  """
  b = logits.shape[0]
  tokens, parents, q_rows, tops = [], [jnp.full((b, 1), -1, jnp.int32)], [], []
  score = jnp.zeros((b, 1), jnp.float32)  # log draft probability of each node of the last level
  start, keys = 0, jax.random.split(key, len(tree.levels))
  for d, width in enumerate(tree.levels, 1):
    prev = logits.shape[1]
    if isinstance(tree, StaticTree):
      cand, q = candidates(keys[d - 1], logits, sampling, tree.max_children)  # [b, prev, c]
      local, rank = _static_level(tree, d, start)
      local, rank = jnp.broadcast_to(local, (b, width)), jnp.broadcast_to(rank, (b, width))
    else:
      cand, q = candidates(keys[d - 1], logits, SamplingConfig(), tree.children)
      logp = jax.nn.log_softmax(logits, -1)  # [b, prev, v]
      path_score = score[:, :, None] + jnp.take_along_axis(logp, cand, -1)  # [b, prev, c]
      score, flat = jax.lax.top_k(path_score.reshape(b, -1), width)  # [b, w]
      local, rank = flat // tree.children, flat % tree.children
    level = jnp.take_along_axis(cand.reshape(b, -1), local * cand.shape[-1] + rank, 1)  # [b, w]
    tokens.append(level)
    parents.append((start + local).astype(jnp.int32))
    if q is not None:
      q_rows.append(jnp.take_along_axis(q, local[..., None], 1))  # [b, w, v]
    top = top_probability(logits, q)  # [b, prev]
    tops.append(jnp.take_along_axis(top, local, 1))  # [b, w]
    start += prev
    if d < tree.depth or feed_leaves:
      mask = ancestor_mask(jnp.concatenate(parents, 1), d)[:, -width:]  # [b, w, nodes so far]
      logits, carry = feed(carry, d, level, local, mask)
  q = jnp.concatenate(q_rows, 1) if q_rows else None
  return jnp.concatenate(tokens, 1), q, jnp.concatenate(parents, 1), carry, \
      jnp.concatenate(tops, 1)


def _static_level(tree: StaticTree, d: int, start: int) -> tuple[np.ndarray, np.ndarray]:
  """Depth d of a static tree: each node's parent (index within level d - 1) and rank."""
  nodes = np.flatnonzero(tree.node_depths == d)
  return tree.parents[nodes] - start, tree.ranks[nodes]


def check_heads(tree: Tree | None, k: int, n_heads: int) -> None:
  """Host-side, for head drafters: the chain of k or the tree needs one head per depth."""
  depth = tree.depth if tree is not None else k
  if depth > n_heads:
    raise ValueError(f"{'tree depth' if tree is not None else 'k'} {depth} needs {depth} heads, "
                     f"but the drafter has {n_heads}")
