"""Kangaroo's early exit: a chain ends before the first draft whose top draft probability falls
below a threshold, for every drafter that drafts a chain from a law. Greedy output stays the
target's; the drafts checked per step fall as the threshold rises; bad thresholds are refused.
The sampling law with early exit is checked in test_speculative_sampling.py.
"""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.trees import StaticTree
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters.chain import exit_length
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.medusa import Medusa
from speculax.models.derive import truncated

from test_hydra import random_params
from tiny_prompts import NEW, PROMPTS

K = 4


def test_exit_length_stops_before_the_first_low_draft_after_the_first():
  top = jnp.array([[0.9, 0.8, 0.2, 0.9], [0.1, 0.9, 0.9, 0.9], [0.1, 0.1, 0.9, 0.9],
                   [0.9, 0.9, 0.9, 0.9]])
  np.testing.assert_array_equal(exit_length(top, 0.5), [2, 4, 1, 4])


def _chains(cfg, params):
  draft = truncated(params, cfg, range(1))
  return {"draft-model": (DraftModel(draft[0]), draft[1]),
          "layer-skip": (LayerSkip.skipping(cfg.n_layers, (0,)), None),
          "medusa": (Medusa(K), random_params(Medusa(K), cfg)),
          "hydra": (Hydra(K), random_params(Hydra(K), cfg)),
          "eagle": (Eagle(), random_params(Eagle(), cfg))}


@pytest.mark.parametrize("name", ["draft-model", "layer-skip", "medusa", "hydra", "eagle"])
def test_early_exit_greedy_equals_target_and_drafts_less(tiny, tiny_reference, name):
  cfg, params = tiny
  drafter, dparams = _chains(cfg, params)[name]
  spec = SpecConfig(k=K, max_new_tokens=NEW)
  drafted = {}
  for threshold in (None, 0.02, 0.99):
    out = speculative_generate(params, cfg, PROMPTS[:4], dataclasses.replace(
        drafter, exit_threshold=threshold), spec, drafter_params=dparams)
    assert out.tokens == tiny_reference[:4], threshold
    drafted[threshold] = out.drafted / out.row_steps  # drafts checked per step
  assert drafted[None] == K
  # A random tiny model's draft laws are flat (top probabilities ~0.01-0.1): 0.99 cuts every
  # chain to its first draft, 0.02 only some.
  assert drafted[0.99] == 1
  assert drafted[0.99] <= drafted[0.02] <= K


def test_bad_exit_thresholds(tiny):
  cfg, params = tiny
  for bad in (0.0, 1.0, -0.5, 2.0):
    with pytest.raises(ValueError, match=rf"LayerSkip.exit_threshold must be .*got {bad}"):
      LayerSkip((1,), exit_threshold=bad)
  drafter = LayerSkip((1,), StaticTree.full((2, 1)), exit_threshold=0.5)
  with pytest.raises(ValueError, match="exit_threshold=0.5 .* applies to chains; drop the tree"):
    speculative_generate(params, cfg, [[1, 2]], drafter)
