"""Token trees as static-shaped arrays: tree shapes, and the arrays derived from parents.

A tree step feeds the target one block of n + 1 nodes: node 0 is the root (the pending last
token), nodes 1..n are drafts, numbered so that every parent comes before its children and the
nodes of one depth are contiguous ("levels"). A row's tree is its parents array [b, n + 1]
(root: -1); depths, the ancestor mask, the children table and the accepted path all derive from it.

Two shapes, both with a static node count so the loop compiles once:
- StaticTree: Medusa-style choice lists; (0, 1) is "the second candidate after the first
  candidate". The same tree for every row and step.
- DynamicTree: grown level by level by cumulative draft probability (EAGLE-2 / DySpec style):
  each level keeps the `width` best children (of `children` per node) of the previous level by
  the product of draft probabilities along the path, so the tree follows where the drafter is
  confident. Node budget = width x depth.

Dims: b batch, n draft nodes (n + 1 with the root), c children per node, d depth.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.fields import Checked, field


@dataclasses.dataclass(frozen=True)
class StaticTree(Checked):
  """A fixed tree from a choice list: each choice is the path of candidate ranks from the root."""
  choices: tuple[tuple[int, ...], ...] = field(ge=0)

  def __post_init__(self):
    if isinstance(self.choices, (list, tuple)):  # Medusa's choice lists are lists of lists
      object.__setattr__(self, "choices", tuple(
          tuple(c) if isinstance(c, (list, tuple)) else c for c in self.choices))
    super().__post_init__()
    choices = self.choices
    if not choices:
      raise ValueError("StaticTree.choices must hold at least one choice (draft node), got ()")
    seen = set()
    for c in choices:
      if not c:
        raise ValueError(f"StaticTree.choices: choice {c} must be a non-empty path of ranks")
      if c in seen:
        raise ValueError(f"tree choice {c} appears twice")
      seen.add(c)
    for c in choices:
      if len(c) > 1 and c[:-1] not in seen:
        raise ValueError(f"tree choice {c} has no parent: {c[:-1]} is not in the choice list")
      # Sampled siblings are draws without replacement in rank order: verifying rank r undoes
      # the draws of ranks < r, so those must be in the tree too.
      if c[-1] > 0 and c[:-1] + (c[-1] - 1,) not in seen:
        raise ValueError(f"tree choice {c} has no elder sibling {c[:-1] + (c[-1] - 1,)}: each "
                         f"node's children must be candidates 0, 1, ... without gaps")

  @functools.cached_property
  def _order(self) -> list[tuple[int, ...]]:  # nodes 1..n: by depth, then lexicographically
    return sorted(self.choices, key=lambda c: (len(c), c))

  @property
  def n_nodes(self) -> int:
    return len(self.choices)

  @property
  def depth(self) -> int:
    return max(len(c) for c in self.choices)

  @property
  def max_children(self) -> int:
    return max(c[-1] for c in self.choices) + 1

  @functools.cached_property
  def parents(self) -> np.ndarray:  # [n + 1] int32, root -1
    index = {(): 0, **{c: i + 1 for i, c in enumerate(self._order)}}
    return np.array([-1] + [index[c[:-1]] for c in self._order], np.int32)

  @functools.cached_property
  def ranks(self) -> np.ndarray:  # [n + 1] int32: candidate rank of each node (root 0)
    return np.array([0] + [c[-1] for c in self._order], np.int32)

  @functools.cached_property
  def node_depths(self) -> np.ndarray:  # [n + 1] int32 (root 0)
    return np.array([0] + [len(c) for c in self._order], np.int32)

  def batch_parents(self, b: int) -> jax.Array:  # [b, n + 1] int32
    return jnp.broadcast_to(jnp.asarray(self.parents), (b, self.n_nodes + 1))

  @property
  def levels(self) -> tuple[int, ...]:
    """Nodes per depth 1..depth."""
    return tuple(sum(len(c) == d for c in self.choices) for d in range(1, self.depth + 1))

  @classmethod
  def chain(cls, k: int) -> StaticTree:
    return cls(tuple((0,) * d for d in range(1, k + 1)))

  @classmethod
  def full(cls, branching: tuple[int, ...]) -> StaticTree:
    """Every node at depth d has branching[d] children, e.g. (3, 2, 1): 3 + 6 + 6 nodes."""
    paths, level = [], [()]
    for width in branching:
      level = [p + (r,) for p in level for r in range(width)]
      paths += level
    return cls(tuple(paths))


@dataclasses.dataclass(frozen=True)
class DynamicTree(Checked):
  """Per level, the `width` most probable children (of `children` per node) of the last level."""
  width: int = field(4, ge=1)
  depth: int = field(4, ge=1)
  children: int = field(4, ge=1)

  @property
  def levels(self) -> tuple[int, ...]:
    sizes, prev = [], 1
    for _ in range(self.depth):
      prev = min(self.width, prev * self.children)
      sizes.append(prev)
    return tuple(sizes)

  @property
  def n_nodes(self) -> int:
    return sum(self.levels)

  @property
  def max_children(self) -> int:
    return min(self.children, self.width)


Tree = StaticTree | DynamicTree


def parse_tree(text: str | None) -> Tree | None:
  """A tree from its command-line form: "chain" (None), "full:3,2,1" or "dynamic:W,D,C"."""
  if text is None or text == "chain":
    return None
  kind, _, args = text.partition(":")
  try:
    numbers = tuple(int(x) for x in args.split(",") if x.strip())
  except ValueError:
    numbers = ()
  if kind == "full" and numbers and min(numbers) >= 1:
    return StaticTree.full(numbers)
  if kind == "dynamic" and len(numbers) == 3:
    return DynamicTree(*numbers)
  raise ValueError(f"tree must be 'chain', 'full:B1,B2,...' (children per level, each >= 1) or "
                   f"'dynamic:WIDTH,DEPTH,CHILDREN', got {text!r}")


def depths(parents: jax.Array, depth: int) -> jax.Array:
  """[b, n + 1] parents -> [b, n + 1] int32 depth of each node (root 0)."""
  d = jnp.zeros_like(parents)
  for _ in range(depth):  # a node's depth is final once its parent's is
    d = jnp.where(parents >= 0, jnp.take_along_axis(d, jnp.maximum(parents, 0), 1) + 1, 0)
  return d


def ancestor_mask(parents: jax.Array, depth: int) -> jax.Array:
  """[b, n + 1] parents -> [b, n + 1, n + 1] bool: [i, j] = node j is an ancestor-or-self of i."""
  b, n1 = parents.shape
  mask = jnp.broadcast_to(jnp.eye(n1, dtype=bool), (b, n1, n1))
  rows = jnp.arange(b)[:, None]
  for _ in range(depth):  # OR in the parent's row: after d rounds, all ancestors within d
    parent_rows = mask[rows, jnp.maximum(parents, 0)]  # [b, n + 1, n + 1]
    mask = mask | (parent_rows & (parents >= 0)[..., None])
  return mask


def children_table(parents: jax.Array, max_children: int) -> jax.Array:
  """[b, n + 1] parents -> [b, n + 1, c] int32: node u's children in node order, then -1."""
  b, n1 = parents.shape
  same = parents[:, :, None] == parents[:, None, :]  # [b, n + 1, n + 1]
  earlier = jnp.tril(jnp.ones((n1, n1), bool), -1)[None]
  rank = jnp.sum(same & earlier, -1)  # [b, n + 1] siblings before each node
  table = jnp.full((b, n1, max_children), -1, jnp.int32)
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, n1))
  node = jnp.broadcast_to(jnp.arange(n1, dtype=jnp.int32), (b, n1))
  # The root (parent -1) is nobody's child: its write goes out of range and is dropped.
  return table.at[rows, jnp.where(parents >= 0, parents, n1), rank].set(node, mode="drop")


def path_to(node: jax.Array, d: jax.Array, parents: jax.Array, depth: int) -> jax.Array:
  """Root-to-node path [b, depth + 1] int32 of node indices, padded with `node` past its depth.

  node [b] and its depth d [b]; parents [b, n + 1]; depth: the tree's.
  """
  rows = jnp.arange(parents.shape[0])
  path, cur = [], node
  for level in range(depth, -1, -1):  # walk up; the entry at level i is the ancestor at depth i
    path.append(jnp.where(level <= d, cur, node))
    cur = jnp.where(level <= d, jnp.maximum(parents[rows, cur], 0), cur)
  return jnp.stack(path[::-1], 1).astype(jnp.int32)
