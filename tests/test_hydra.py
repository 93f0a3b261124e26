"""Hydra heads: lossless chain and tree decoding (with and without the Hydra++ prefix layer),
sequential dependence on the drafted tokens, the prefix layer's cache, bad input."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.sampling import SamplingConfig
from speculax.core.trees import DynamicTree, StaticTree
from speculax.core.types import TargetView
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters.feature_layer import run_layers
from speculax.drafters.hydra import Hydra, draft_heads
from speculax.drafters.medusa import Medusa
from speculax.models import llama
from speculax.models.kvcache import KVCache
from speculax.models.sharding import MeshConfig

from tiny_prompts import NEW, PROMPTS


@functools.cache
def random_params(drafter, cfg, seed=3) -> dict:
  """The drafter's initial params plus noise: heads that differ from the target's own."""
  params = drafter.init_params(cfg, jax.random.key(seed))
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  scale = lambda x: 0.5 * np.prod(x.shape[:-1]) ** -0.5 if x.ndim > 1 else 0.2
  return treedef.unflatten([x + scale(x) * jax.random.normal(k, x.shape)
                            for x, k in zip(leaves, keys)])


def _outputs(drafter, dparams, params, cfg, tokens, hidden):
  """drafter.train_outputs' logits [b, t, j, v], jitted (eager ops compile one by one)."""
  run = jax.jit(lambda *a: drafter.train_outputs(*a[:2], cfg, *a[2:])["logits"])
  return run(dparams, params, {"tokens": tokens, "hidden": hidden}, jax.random.key(0))


def _rows(cfg, params, t=12, b=2, seed=0):
  """Random token rows [b, t] and the target's final features there [1, b, t, d]."""
  tokens = jax.random.randint(jax.random.key(seed), (b, t), 0, cfg.vocab_size)
  _, hidden, _ = llama.forward_jit(params, cfg, tokens, jnp.broadcast_to(jnp.arange(t), (b, t)))
  return tokens, hidden


@pytest.mark.parametrize("prefix", [False, True], ids=["hydra", "hydra++"])
def test_untrained_heads_copy_the_target_head(tiny, prefix):
  cfg, params = tiny
  drafter = Hydra(3, prefix_attention=prefix, mlp_layers=2)
  tokens, hidden = _rows(cfg, params)
  logits = _outputs(drafter, drafter.init_params(cfg), params, cfg, tokens, hidden)
  expect = llama.lm_head(params, cfg, hidden[0])  # [b, t, v]
  assert logits.shape == (*tokens.shape, 3, cfg.vocab_size)
  for j in range(3):
    np.testing.assert_allclose(logits[:, :, j], expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prefix", [False, True], ids=["hydra", "hydra++"])
def test_heads_depend_on_the_tokens_drafted_before_them(tiny, prefix):
  """Changing token i + 2 moves heads 2.. at position i but not head 1; Medusa never moves."""
  cfg, params = tiny
  drafter = Hydra(3, prefix_attention=prefix)
  dparams = random_params(drafter, cfg)
  tokens, hidden = _rows(cfg, params)
  i = 4
  changed = tokens.at[:, i + 2].set((tokens[:, i + 2] + 1) % cfg.vocab_size)
  logits = [_outputs(drafter, dparams, params, cfg, t, hidden)[:, i] for t in (tokens, changed)]
  np.testing.assert_allclose(logits[0][:, 0], logits[1][:, 0], rtol=1e-6, atol=1e-6)
  assert np.abs(logits[0][:, 1:] - logits[1][:, 1:]).max(-1).min() > 1e-3  # every row, head
  medusa = Medusa(3)
  mparams = {"w": jax.random.normal(jax.random.key(1), (3, cfg.d_model, cfg.d_model)) * 0.1,
             "b": jnp.zeros((3, cfg.d_model))}
  m = [_outputs(medusa, mparams, params, cfg, t, hidden) for t in (tokens, changed)]
  np.testing.assert_array_equal(m[0], m[1])


def test_tree_siblings_get_their_own_children_law(tiny):
  """In a drafted tree, the two depth-1 nodes' children are drawn from different q (each from
  head 2 on its own path); Medusa's share one q."""
  cfg, params = tiny
  tree, sampling = StaticTree.full((2, 3)), SamplingConfig(temperature=1.0)
  base = jax.random.normal(jax.random.key(0), (2, cfg.d_model))
  last = jnp.array([5, 9])
  tokens, q, parents, _ = draft_heads(random_params(Hydra(2), cfg), params, cfg,
                                   lambda x: llama.lm_head(params, cfg, x), base, last,
                                   jax.random.key(0), tree, sampling)
  assert tokens.shape == (2, 8) and q.shape == (2, 8, cfg.vocab_size)
  np.testing.assert_array_equal(parents, tree.batch_parents(2))
  # Nodes 3..5 are node 1's children, 6..8 node 2's (tokens and q index node - 1).
  assert np.abs(q[:, 2] - q[:, 5]).sum(-1).min() > 1e-3
  np.testing.assert_array_equal(q[:, 2], q[:, 4])  # siblings share their parent's q
  medusa, _, _ = Medusa(2, tree).propose(
      {"w": jnp.ones((2, cfg.d_model, cfg.d_model)) * 0.01, "b": jnp.zeros((2, cfg.d_model))},
      base, TargetView(params, None, None, None), jax.random.key(0), cfg, 2, sampling)
  np.testing.assert_array_equal(medusa.probs[:, 2], medusa.probs[:, 5])


def _check_state(cfg, params, drafter, dparams, prompts, out):
  """The prefix layer's K/V over every kept position equals one fresh causal pass's; a lone
  row's base (it ran the last step) is the fresh pass's base at its last kept position."""
  seqs = [p + o[:-1] for p, o in zip(prompts, out.tokens)]  # each row's last token is pending
  t = np.array([len(s) for s in seqs])
  padded = jnp.asarray([s + [0] * (t.max() - len(s)) for s in seqs])  # causal: pads change nothing
  base, fresh = jax.jit(_fresh_pass, static_argnums=(2, 3))(params, dparams, cfg, drafter, padded)
  state = out.drafter_state
  if len(prompts) == 1:
    np.testing.assert_allclose(state.base[0], base[0, t[0] - 1], rtol=1e-4, atol=1e-4)
  if drafter.prefix_attention:
    np.testing.assert_array_equal(state.prefix.lengths, t)
    for row, n in enumerate(t):
      for got, want in ((state.prefix.k[0], fresh.k[0]), (state.prefix.v[0], fresh.v[0])):
        np.testing.assert_allclose(got[row, :, :n], want[row, :, :n], rtol=1e-4, atol=1e-4)


def _fresh_pass(params, dparams, cfg, drafter, tokens):
  """The heads' base at every position [b, t, d] and the prefix layer's cache (or None)."""
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  _, hidden, _ = llama.forward(params, cfg, tokens, positions)
  if not drafter.prefix_attention:
    return hidden[0], None
  cache = KVCache.init(dataclasses.replace(cfg, n_layers=1), *tokens.shape, jnp.float32,
                       per_layer=True)
  return run_layers((dparams["prefix"],), cfg, hidden[0], positions, cache)


@pytest.mark.parametrize("tree", [None, StaticTree.full((3, 2, 1))], ids=["chain", "tree"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("prefix", [False, True], ids=["hydra", "hydra++"])
def test_hydra_greedy_equals_target_only(tiny, tiny_reference, tree, batch, prefix):
  cfg, params = tiny
  prompts, expect = (PROMPTS[:batch], tiny_reference[:batch]) if batch > 1 else (
      PROMPTS[4:5], tiny_reference[4:5])
  drafter = Hydra(4, tree, prefix_attention=prefix)
  dparams = random_params(drafter, cfg)
  out = speculative_generate(params, cfg, prompts, drafter, SpecConfig(k=3, max_new_tokens=NEW),
                             drafter_params=dparams)
  assert out.tokens == expect
  assert out.row_steps > 0 and len(out.acceptance) == 3
  _check_state(cfg, params, drafter, dparams, prompts, out)


def test_hydra_dynamic_tree_greedy_equals_target_only(tiny, tiny_reference):
  cfg, params = tiny
  drafter = Hydra(3, DynamicTree(width=3, depth=3, children=2), prefix_attention=True)
  out = speculative_generate(params, cfg, PROMPTS[:4], drafter, SpecConfig(max_new_tokens=NEW),
                             drafter_params=random_params(drafter, cfg))
  assert out.tokens == tiny_reference[:4]


def test_hydra_and_medusa_sharded_equal_target_only(tiny, tiny_reference):
  cfg, params = tiny
  for drafter in (Hydra(3, StaticTree.full((3, 2, 1)), prefix_attention=True), Medusa(3)):
    out = speculative_generate(params, cfg, PROMPTS, drafter, SpecConfig(k=3, max_new_tokens=NEW),
                               drafter_params=random_params(drafter, cfg),
                               mesh=MeshConfig(data=4, tensor=2))
    assert out.tokens == tiny_reference, drafter


def test_bad_hydra_input(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match="tree depth 3 needs 3 heads, but the drafter has 2"):
    speculative_generate(params, cfg, [[1, 2]], Hydra(2, StaticTree.full((2, 1, 1))),
                         drafter_params=Hydra(2).init_params(cfg))
  with pytest.raises(ValueError, match="k 5 needs 5 heads, but the drafter has 4"):
    speculative_generate(params, cfg, [[1, 2]], Hydra(4), SpecConfig(k=5),
                         drafter_params=Hydra(4).init_params(cfg))
  narrow = dataclasses.replace(cfg, d_model=32)
  with pytest.raises(ValueError, match="trained on another target"):
    speculative_generate(params, cfg, [[1, 2]], Hydra(4), SpecConfig(k=3),
                         drafter_params=Hydra(4).init_params(narrow))
  with pytest.raises(ValueError, match=r"missing \['prefix/attn_norm'"):
    speculative_generate(params, cfg, [[1, 2]], Hydra(4, prefix_attention=True), SpecConfig(k=3),
                         drafter_params=Hydra(4).init_params(cfg))
  with pytest.raises(ValueError, match="needs its trained params"):
    speculative_generate(params, cfg, [[1, 2]], Hydra(4), SpecConfig(k=3))
  with pytest.raises(ValueError, match="Hydra.n_heads must be an int >= 1, got 0"):
    Hydra(0)
  with pytest.raises(ValueError, match="Hydra.mlp_layers must be an int >= 1, got 0"):
    Hydra(mlp_layers=0)
