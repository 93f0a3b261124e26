"""Token tree arrays and tree verification (greedy by hand, sampling against exact laws)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core import trees
from speculax.core.sampling import SamplingConfig, candidates, probs
from speculax.core.trees import DynamicTree, StaticTree
from speculax.verifiers.tree import verify_tree

TREE = StaticTree(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))


def test_static_tree_arrays():
  # Node order: root, (0,), (1,), (0,0), (0,1), (1,0), (0,0,0)
  np.testing.assert_array_equal(TREE.parents, [-1, 0, 0, 1, 1, 2, 3])
  np.testing.assert_array_equal(TREE.ranks, [0, 0, 1, 0, 1, 0, 0])
  np.testing.assert_array_equal(TREE.node_depths, [0, 1, 1, 2, 2, 2, 3])
  assert (TREE.n_nodes, TREE.depth, TREE.max_children, TREE.levels) == (6, 3, 2, (2, 3, 1))
  assert StaticTree.full((3, 2)).n_nodes == 9 and StaticTree.chain(4).levels == (1, 1, 1, 1)
  assert DynamicTree(width=4, depth=3, children=3).levels == (3, 4, 4)


def _ancestors_brute(parents):
  n1 = len(parents)
  mask = np.zeros((n1, n1), bool)
  for i in range(n1):
    j = i
    while j >= 0:
      mask[i, j] = True
      j = parents[j]
  return mask


def test_derived_arrays_match_brute_force():
  rng = np.random.default_rng(0)
  parents = np.stack([np.array([-1] + [rng.integers(0, i) for i in range(1, 12)])
                      for _ in range(3)])  # random trees, parents before children
  depth = 11
  p = jnp.asarray(parents, jnp.int32)
  mask = np.asarray(trees.ancestor_mask(p, depth))
  for row, m in zip(parents, mask):
    np.testing.assert_array_equal(m, _ancestors_brute(row))
  d = np.asarray(trees.depths(p, depth))
  np.testing.assert_array_equal(d, mask.sum(-1) - 1)
  kids = np.asarray(trees.children_table(p, 11))
  for row, table in zip(parents, kids):
    for u in range(12):
      expect = [i for i in range(12) if row[i] == u]
      np.testing.assert_array_equal(table[u, :len(expect)], expect)
      assert np.all(table[u, len(expect):] == -1)
  node = jnp.array([11, 5, 0])
  path = np.asarray(trees.path_to(node, jnp.asarray(d)[jnp.arange(3), node], p, depth))
  for r in range(3):
    expect = sorted(np.flatnonzero(mask[r, node[r]]), key=lambda j: d[r, j])
    np.testing.assert_array_equal(path[r, :len(expect)], expect)
    assert np.all(path[r, len(expect):] == int(node[r]))


def test_greedy_tree_verify_keeps_the_deepest_matching_path():
  v = 10
  parents = jnp.asarray(TREE.parents)[None]
  # Target argmax at each node: root -> 4, (0,) -> 7, (1,) -> 2, (0,0) -> 9, ...
  best = jnp.array([[4, 7, 2, 9, 1, 1, 3]])
  logits = jax.nn.one_hot(best, v) * 5.0
  # Drafts: (0,)=4 ok, (1,)=5 no, (0,0)=6 no, (0,1)=7 ok, (1,0)=2 (parent rejected), (0,0,0)=9
  tokens = jnp.array([[0, 4, 5, 6, 7, 2, 9]])
  path, n_acc, nxt = verify_tree(None, logits, tokens, parents, None, SamplingConfig(), 3, 2)
  assert int(n_acc[0]) == 2 and path[0, :3].tolist() == [0, 1, 4] and int(nxt[0]) == 1
  none_ok = tokens.at[0, 1].set(0).at[0, 2].set(0)
  path, n_acc, nxt = verify_tree(None, logits, none_ok, parents, None, SamplingConfig(), 3, 2)
  assert int(n_acc[0]) == 0 and int(nxt[0]) == 4


N = 40000
V = 6
SIBLINGS = StaticTree(((0,), (1,), (2,), (0, 0), (0, 1), (1, 0)))  # 3 siblings at the root


def _tv(samples, exact):
  return 0.5 * np.abs(np.bincount(samples, minlength=len(exact)) / len(samples) - exact).sum()


def _first_tokens(without_replacement, sampling, deterministic=False):
  """First emitted token of N independent tree steps over one fixed target and drafter law."""
  rng = np.random.default_rng(3)
  n1 = SIBLINGS.n_nodes + 1
  target = jnp.asarray(rng.normal(size=(n1, V)) * 1.5, jnp.float32)
  draft = jnp.asarray(rng.normal(size=(n1, V)) * 3.0, jnp.float32)  # sharp, unlike p
  parents = jnp.broadcast_to(jnp.asarray(SIBLINGS.parents), (N, n1))
  k_draft, k_verify = jax.random.split(jax.random.key(0))
  # Each node's candidates come from its parent's draft law, in rank order.
  cand, q = candidates(k_draft, jnp.broadcast_to(draft, (N, n1, V)),
                       SamplingConfig() if deterministic else sampling, SIBLINGS.max_children)
  par, rank = jnp.asarray(SIBLINGS.parents[1:]), jnp.asarray(SIBLINGS.ranks[1:])
  tokens = jnp.concatenate([jnp.zeros((N, 1), jnp.int32), cand[:, par, rank]], 1)
  q_nodes = None if q is None else q[:, par]
  logits = jnp.broadcast_to(target, (N, n1, V))
  path, n_acc, nxt = jax.jit(functools.partial(
      verify_tree, sampling=sampling, depth=SIBLINGS.depth, max_children=SIBLINGS.max_children,
      without_replacement=without_replacement))(k_verify, logits, tokens, parents, q_nodes)
  first = jnp.where(n_acc > 0, tokens[jnp.arange(N), path[:, 1]], nxt)
  return np.asarray(first), np.asarray(probs(target[0], sampling), np.float64)


# TV noise at 40000 draws over 6 cells is ~0.006.
@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0),
                                      SamplingConfig(temperature=0.7, top_p=0.9)],
                         ids=["t1.0", "t0.7_top_p0.9"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled", "top-candidates"])
def test_sampled_tree_verify_follows_target(sampling, deterministic):
  first, exact = _first_tokens(True, sampling, deterministic)
  assert _tv(first, exact) < 0.015
  assert np.all(exact[first] > 0)


def test_planted_with_replacement_verifier_fails():
  first, exact = _first_tokens(False, SamplingConfig(temperature=1.0))
  assert _tv(first, exact) > 0.05
