"""Medusa heads: lossless chain and tree decoding, head math, bad input."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters.medusa import Medusa, heads_logits, init_heads
from speculax.models import llama
from speculax.models.config import get_preset

from tiny_prompts import NEW, PROMPTS


def _random_heads(cfg, n_heads=4):
  k1, k2 = jax.random.split(jax.random.key(3))
  d = cfg.d_model
  return {"w": jax.random.normal(k1, (n_heads, d, d)) * d ** -0.5,
          "b": jax.random.normal(k2, (n_heads, d)) * 0.1}


def test_zero_heads_copy_the_target_head(tiny):
  cfg, params = tiny
  h = jax.random.normal(jax.random.key(0), (2, 5, cfg.d_model))
  logits = heads_logits(init_heads(cfg, 3), lambda x: llama.lm_head(params, cfg, x), h)
  expect = llama.lm_head(params, cfg, h)
  for j in range(3):
    np.testing.assert_allclose(logits[:, :, j], expect, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tree", [None, StaticTree.full((3, 2, 1))], ids=["chain", "tree"])
@pytest.mark.parametrize("batch", [1, 4])
def test_medusa_greedy_equals_target_only(tiny, tiny_reference, tree, batch):
  cfg, params = tiny
  prompts, expect = (PROMPTS[:batch], tiny_reference[:batch]) if batch > 1 else (
      PROMPTS[4:5], tiny_reference[4:5])
  out = speculative_generate(params, cfg, prompts, Medusa(4, tree),
                             SpecConfig(k=3, max_new_tokens=NEW), drafter_params=_random_heads(cfg))
  assert out.tokens == expect
  assert out.row_steps > 0 and len(out.acceptance) == 3


def test_medusa_features_are_the_targets(tiny):
  """The drafter's state after a step is the target's feature at the last kept position."""
  cfg, params = tiny
  prompt = PROMPTS[1]
  out = speculative_generate(params, cfg, [prompt], Medusa(4), SpecConfig(k=3, max_new_tokens=6),
                             drafter_params=_random_heads(cfg))
  seq = jnp.asarray([prompt + out.tokens[0][:-1]])  # the last token is still pending
  _, hidden, _ = llama.forward_jit(params, cfg, seq, jnp.arange(seq.shape[1])[None])
  np.testing.assert_allclose(out.drafter_state[0], hidden[0, 0, -1], rtol=1e-4, atol=1e-4)


def test_bad_medusa_input(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match="tree depth 3 needs 3 heads, but the drafter has 2"):
    speculative_generate(params, cfg, [[1, 2]], Medusa(2, StaticTree.full((2, 1, 1))),
                         drafter_params=_random_heads(cfg, 2))
  with pytest.raises(ValueError, match="k 5 needs 5 heads, but the drafter has 4"):
    speculative_generate(params, cfg, [[1, 2]], Medusa(4), SpecConfig(k=5),
                         drafter_params=_random_heads(cfg))
  with pytest.raises(ValueError, match="Medusa.tree must be a StaticTree or None, got DynamicTree"):
    speculative_generate(params, cfg, [[1, 2]], Medusa(4, DynamicTree(2, 2, 2)),
                         drafter_params=_random_heads(cfg))
  other = get_preset("tiny-untied-llama3")
  wide = {"w": jnp.zeros((4, 32, 32)), "b": jnp.zeros((4, 32))}
  with pytest.raises(ValueError, match="trained on another target"):
    speculative_generate(params, cfg, [[1, 2]], Medusa(4), SpecConfig(k=3), drafter_params=wide)
  with pytest.raises(ValueError, match="needs its trained params"):
    speculative_generate(params, other, [[1, 2]], Medusa(4), SpecConfig(k=3))
