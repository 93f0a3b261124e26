"""Token Recycling (Luo et al. 2024): train-free tree drafting from the target's own past top-k.

An adjacency matrix [v, c] holds, for each token, the target's top-c next tokens the last time
that token was scored. Every verify step refills the rows of all the block's tokens from the
logits the target just computed (accepted or not: "recycled" candidates). Drafting expands a
static tree template breadth-first: the child of rank r of a node with token x is matrix[x, r].
Deterministic, so verification treats each node as a one-hot draw. SmolLM2: 49152 x c int32
(1.5 MB at c = 8). The paper keeps the matrix across queries ("hot start"): pass the
`drafter_state` of one run's output as the next run's `drafter_params`.

Dims: b batch, n nodes, c candidates per token, v vocab.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.trees import StaticTree
from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters.base import Drafter

# A skewed template in the paper's spirit (more branches near the root and along rank 0),
# sized for CPU verification: 18 nodes, depth 5, up to 4 candidates per node.
DEFAULT_TREE = StaticTree((
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0),
    (0, 0, 0, 0, 0)))


@dataclasses.dataclass(frozen=True)
class TokenRecycling(Drafter):
  name: ClassVar[str] = "token-recycling"
  summary: ClassVar[str] = ("the target's own past top-k successors, expanded as a static tree "
                            "(train-free; carry out.drafter_state over for a hot start)")
  hot_start: ClassVar[bool] = True  # a serving loop passes each run's final state to the next
  tree: StaticTree = DEFAULT_TREE

  @classmethod
  def build(cls, params, config, *, tree: StaticTree | None = None):
    return (cls() if tree is None else cls(tree)), None

  def check(self, target, params, k: int) -> None:
    """A hot-start matrix must be token ids of this target: [vocab, candidates] integers in
    [0, vocab)."""
    super().check(target, params, k)
    if params is None:
      return
    shape = (target.vocab_size, self.tree.max_children)
    if tuple(np.shape(params)) != shape:
      raise ValueError(f"token-recycling matrix must have shape {shape} (vocab x candidates), "
                       f"got {tuple(np.shape(params))}")
    matrix = np.asarray(params)
    if not np.issubdtype(matrix.dtype, np.integer):
      raise ValueError(f"token-recycling matrix must hold integer token ids, got dtype "
                       f"{matrix.dtype}")
    bad = matrix[(matrix < 0) | (matrix >= target.vocab_size)]
    if bad.size:
      raise ValueError(f"token-recycling matrix holds token id {int(bad[0])}, outside the "
                       f"vocabulary [0, {target.vocab_size})")

  def init(self, params, view: TargetView, config, max_len: int) -> jax.Array:
    """The adjacency matrix [v, c] int32: params (a warm one from earlier traffic) or zeros."""
    if params is not None:
      return jnp.asarray(params, jnp.int32)
    return jnp.zeros((config.vocab_size, self.tree.max_children), jnp.int32)

  def propose(self, params, state: jax.Array, view: TargetView, key, config, k: int, sampling):
    b = view.history.shape[0]
    last = view.pending
    parents, ranks = self.tree.parents, self.tree.ranks
    tokens = [last]
    for i in range(1, self.tree.n_nodes + 1):  # parents come first: breadth-first expansion
      tokens.append(state[tokens[parents[i]], ranks[i]])
    return Draft(tokens=jnp.stack(tokens[1:], 1), probs=None,
                 parents=self.tree.batch_parents(b)), state, view

  def update(self, params, state: jax.Array, view: TargetView, verified: Verified) -> jax.Array:
    c = state.shape[1]
    top = jax.lax.top_k(verified.logits, c)[1].astype(jnp.int32)  # [b, n + 1, c]
    return state.at[verified.block.reshape(-1)].set(top.reshape(-1, c))
