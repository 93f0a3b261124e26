"""Tree speculative decoding is lossless: greedy output equals target-only decoding, per prompt."""

import jax
import numpy as np
import pytest

from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.models.sharding import MeshConfig

from tiny_prompts import NEW, PROMPTS

STATIC = StaticTree.full((3, 2, 1))  # 3 + 6 + 6 nodes, depth 3
DYNAMIC = DynamicTree(width=3, depth=3, children=3)


def _drafter(tiny, name):
  cfg, params = tiny
  other = llama.init_params(get_preset("tiny"), jax.random.key(7))
  return {"token-recycling": (TokenRecycling(), None),
          "layer-skip-static": (LayerSkip.skipping(cfg.n_layers, [1], STATIC), None),
          "draft-model-static": (DraftModel(cfg, STATIC), other),
          "draft-model-dynamic": (DraftModel(cfg, DYNAMIC), other),
          "draft-is-target-dynamic": (DraftModel(cfg, DYNAMIC), params)}[name]


NAMES = ["token-recycling", "layer-skip-static", "draft-model-static", "draft-model-dynamic",
         "draft-is-target-dynamic"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch", [1, 4])
def test_tree_greedy_equals_target_only(tiny, tiny_reference, name, batch):
  cfg, params = tiny
  drafter, dparams = _drafter(tiny, name)
  prompts, expect = (PROMPTS[:batch], tiny_reference[:batch]) if batch > 1 else (PROMPTS[4:5],
                                                                             tiny_reference[4:5])
  out = speculative_generate(params, cfg, prompts, drafter, SpecConfig(max_new_tokens=NEW),
                             drafter_params=dparams)
  assert out.tokens == expect
  assert 1.0 <= out.tau <= drafter.tree.depth + 1


@pytest.mark.parametrize("tree", [STATIC, DynamicTree(width=1, depth=3, children=2)],
                         ids=["static", "dynamic-width1"])
def test_tree_with_the_target_as_drafter_accepts_every_level(tiny, tree):
  cfg, params = tiny
  out = speculative_generate(params, cfg, PROMPTS[:4], DraftModel(cfg, tree),
                             SpecConfig(max_new_tokens=17), drafter_params=params)
  # The target's own top candidate heads every level (rank 0; a width-1 beam keeps the best
  # path): depth 3 + bonus = 4 tokens per step, which also needs the draft cache's kept path
  # moved right after each step. (A wider dynamic tree may rank the greedy path out.)
  assert out.tau == 4.0
  np.testing.assert_array_equal(out.acceptance, np.ones(3))


def test_token_recycling_learns_repetitions(tiny, tiny_reference):
  cfg, params = tiny
  out = speculative_generate(params, cfg, PROMPTS, TokenRecycling(), SpecConfig(max_new_tokens=NEW))
  assert out.tokens == tiny_reference
  assert out.tau > 1.2  # the tiny model's output repeats, so recycled candidates hit


@pytest.mark.parametrize("name", ["token-recycling", "draft-model-dynamic"])
def test_tree_sharded_equals_unsharded(tiny, tiny_reference, name):
  cfg, params = tiny
  drafter, dparams = _drafter(tiny, name)
  out = speculative_generate(params, cfg, PROMPTS, drafter, SpecConfig(max_new_tokens=NEW),
                             drafter_params=dparams, mesh=MeshConfig(data=4, tensor=2))
  assert out.tokens == tiny_reference


def test_bad_tree_input(tiny):
  cfg, params = tiny
  big = StaticTree.full((4, 4, 4))  # 84 nodes
  with pytest.raises(ValueError, match=r"\+ 85 draft slots = .* exceeds the model's max_seq_len 256"):
    speculative_generate(params, cfg, [[1] * 100], TokenRecycling(big),
                         SpecConfig(max_new_tokens=100))
  with pytest.raises(ValueError, match=r"tree choice \(1, 0\) has no parent: \(1,\) is not in"):
    StaticTree(((0,), (1, 0)))
  with pytest.raises(ValueError, match=r"tree choice \(2,\) has no elder sibling \(1,\)"):
    StaticTree(((0,), (2,)))
  with pytest.raises(ValueError, match="DynamicTree.width must be an int >= 1, got 0"):
    DynamicTree(width=0)
  with pytest.raises(ValueError, match="token-recycling matrix must have shape"):
    speculative_generate(params, cfg, [[1, 2]], TokenRecycling(),
                         drafter_params=np.zeros((5, 4), np.int32))


def test_pallas_attention_gives_identical_tokens(tiny, tiny_reference):
  """The model with the tree-attention kernel (interpret mode) decodes exactly like jnp attention."""
  cfg, params = tiny
  kernel_cfg = cfg.with_runtime(attention_impl="pallas-interpret", attention_block_kv=32)
  gen = generate(params, kernel_cfg, PROMPTS[:3], GenerateConfig(max_new_tokens=NEW))
  tree = speculative_generate(params, kernel_cfg, PROMPTS[:3], TokenRecycling(),
                              SpecConfig(max_new_tokens=NEW))
  assert gen.tokens == tiny_reference[:3] and tree.tokens == tiny_reference[:3]


def test_token_recycling_hot_start_reuses_the_matrix(tiny, tiny_reference):
  cfg, params = tiny
  spec = SpecConfig(max_new_tokens=NEW)
  cold = speculative_generate(params, cfg, PROMPTS[:4], TokenRecycling(), spec)
  warm = speculative_generate(params, cfg, PROMPTS[:4], TokenRecycling(), spec,
                              drafter_params=cold.drafter_state)
  assert warm.tokens == cold.tokens == tiny_reference[:4]
  assert cold.drafter_state.shape == (cfg.vocab_size, TokenRecycling().tree.max_children)
  assert warm.tau > cold.tau  # the same text again: the matrix already holds its successors
