"""Prompt lookup first (drafters/lookup_first.py): rows whose text repeats draft prompt lookup's
continuation, the others the wrapped drafter's chain. Lossless (greedy equality here, with fixed
and goodput-driven length; the sampling law in test_speculative_sampling.py), each row's draft
is its drafter's exactly, and what it cannot wrap is refused by name.
"""
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.cli.args import add_drafter, drafter_options
from speculax.core.sampling import SamplingConfig
from speculax.core.trees import StaticTree
from speculax.core.types import Draft, TargetView
from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import speculative_generate
from speculax.drafters import registry
from speculax.drafters.base import Drafter
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.lookup_first import LookupFirst
from speculax.drafters.medusa import Medusa
from speculax.drafters.ngram import ngram_propose
from speculax.drafters.prompt_lookup import PromptLookup

from test_hydra import random_params
from tiny_prompts import NEW, PROMPTS

K = 4
V = 16


@dataclasses.dataclass(frozen=True)
class Constant(Drafter):
  """Drafts `token` k times from the uniform law, with an adaptive length of 1."""
  name: ClassVar[str] = "constant"
  summary: ClassVar[str] = "a test drafter"
  token: int = 0

  def propose(self, params, state, view, key, config, k, sampling):
    b = view.lengths.shape[0]
    q = None if sampling.greedy else jnp.full((b, k, V), 1.0 / V)
    return Draft(jnp.full((b, k), self.token, jnp.int32), q,
                 length=jnp.ones((b,), jnp.int32)), state, view


def _view(history):
  history = jnp.array(history, jnp.int32)
  return TargetView(None, None, history, jnp.full((history.shape[0],), history.shape[1]))


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0)],
                         ids=["greedy", "t1.0"])
def test_each_row_drafts_from_its_own_drafter(sampling):
  drafter = LookupFirst(Constant(token=15), PromptLookup(max_ngram=3, min_ngram=2))
  rows = [[5, 6, 7, 8, 9, 5, 6, 7],  # "5 6 7" occurred before: copies 8 9 5 6
          [1, 2, 3, 4, 5, 6, 7, 3],  # a 1-gram match only, under min_ngram: the constant
          [9, 8, 7, 6, 5, 4, 5, 4]]  # "5 4" occurred before: copies the period 5 4 5 4
  draft, _, _ = drafter.propose(None, (), _view(rows), None, None, K, sampling)
  copied, _ = ngram_propose(jnp.array(rows), jnp.full((3,), 8), max_ngram=3, min_ngram=2, k=K)
  np.testing.assert_array_equal(draft.tokens, [copied[0], [15] * K, copied[2]])
  np.testing.assert_array_equal(copied[jnp.array([0, 2])], [[8, 9, 5, 6], [5, 4, 5, 4]])
  np.testing.assert_array_equal(draft.length, [K, 1, K])  # copied rows check all k
  if sampling.greedy:
    assert draft.probs is None
  else:  # one-hot where copied, the wrapped drafter's law elsewhere
    np.testing.assert_array_equal(draft.probs[0], np.eye(V)[[8, 9, 5, 6]])
    np.testing.assert_array_equal(draft.probs[1], np.full((K, V), 1.0 / V))
  # Every row matched: the wrapped drafter's drafting is skipped, the drafts the same.
  all_copied, _, _ = drafter.propose(None, (), _view([rows[0], rows[2]]), None, None, K,
                                     sampling)
  np.testing.assert_array_equal(all_copied.tokens, copied[jnp.array([0, 2])])


@dataclasses.dataclass(frozen=True)
class Counting(Constant):
  """A Constant whose propose writes its state (counts its drafts), as layer skip writes the
  target cache."""

  def propose(self, params, state, view, key, config, k, sampling):
    draft, _, view = super().propose(params, state, view, key, config, k, sampling)
    return draft, state + 1, view


def test_drafting_is_skipped_only_where_nothing_outlives_it():
  rows = _view([[5, 6, 7, 8, 9, 5, 6, 7]])  # every row copies
  greedy = SamplingConfig()
  for inner, skips in ((Constant(), True), (Counting(), False)):
    drafter = LookupFirst(inner)  # matches of 2 to 3 tokens
    jaxpr = jax.make_jaxpr(lambda s: drafter.propose(None, s, rows, None, None, K, greedy))
    assert ("cond" in str(jaxpr(jnp.zeros((), jnp.int32)))) == skips
  _, state, _ = LookupFirst(Counting()).propose(None, jnp.zeros((), jnp.int32), rows, None,
                                                     None, K, greedy)
  assert int(state) == 1  # its state as drafting left it, though every row copied


def test_signal_is_the_match_length_crossed_with_the_wrapped_drafters():
  drafter = LookupFirst(Constant())  # matches of 2 to 3 tokens
  assert drafter.signal_bins == 4
  rows = [[5, 6, 7, 8, 5, 6, 7], [1, 2, 3, 4, 5, 6, 3], [9, 8, 5, 4, 7, 5, 4]]
  np.testing.assert_array_equal(drafter.signal(None, (), _view(rows), None), [3, 0, 2])


def _wrapped(cfg, name):
  inner = {"eagle": Eagle(), "medusa": Medusa(K), "hydra": Hydra(K, prefix_attention=True)}[name]
  return LookupFirst.of(inner, 1), random_params(inner, cfg)


@pytest.mark.parametrize("name", ["eagle", "medusa", "hydra"])
def test_greedy_equals_target_and_lookups_are_kept(tiny, tiny_reference, name):
  cfg, params = tiny
  drafter, dparams = _wrapped(cfg, name)
  spec = SpecConfig(k=K, max_new_tokens=NEW)
  out = speculative_generate(params, cfg, PROMPTS, drafter, spec, drafter_params=dparams)
  alone = speculative_generate(params, cfg, PROMPTS, drafter.drafter, spec,
                               drafter_params=dparams)
  assert out.tokens == tiny_reference and alone.tokens == tiny_reference
  # Random heads are rarely kept; the tiny model repeats itself, which lookup copies.
  assert out.tau > alone.tau + 0.2


def test_goodput_length_with_lookup_first_equals_target(tiny, tiny_reference):
  cfg, params = tiny
  drafter, dparams = _wrapped(cfg, "eagle")
  spec = SpecConfig(k=K, max_new_tokens=NEW, goodput=Goodput())
  out = speculative_generate(params, cfg, PROMPTS, drafter, spec, drafter_params=dparams,
                             step_costs=np.array([1.0, 1.05, 1.1, 1.15, 1.2]))
  assert out.tokens == tiny_reference
  assert out.k_steps[1:].sum() > 0  # it drafted


def test_lookup_flag_and_bad_lookups(tiny):
  import argparse
  parser = argparse.ArgumentParser()
  add_drafter(parser, "eagle", allow_none=False)
  assert drafter_options(parser.parse_args(["--lookup", "2"]))[0]["lookup"] == 2
  with pytest.raises(SystemExit):
    parser.parse_args(["--lookup", "0"])
  for bad in (0, -1, 1.5, True):
    with pytest.raises(ValueError, match=rf"lookup is the shortest match .*got {bad!r}"):
      registry.check_options("eagle", heads="runs/x", lookup=bad)
  with pytest.raises(ValueError, match="prompt-lookup is prompt lookup already"):
    registry.check_options("prompt-lookup", lookup=2)
  with pytest.raises(ValueError, match="draft-model takes them for its own"):
    registry.check_options("draft-model", lookup=2)
  cfg, params = tiny
  spec = SpecConfig(k=K, max_new_tokens=4)
  tree = Eagle(tree=StaticTree.full((2, 1)))
  with pytest.raises(ValueError, match="drafts chains; the eagle drafter drafts a tree"):
    speculative_generate(params, cfg, PROMPTS[:1], LookupFirst.of(tree, 2), spec,
                         drafter_params=random_params(tree, cfg))
  switching = LayerSkip.skipping(cfg.n_layers, (0,), alternatives=((1,),))
  with pytest.raises(ValueError, match="the layer-skip drafter takes them for its own"):
    speculative_generate(params, cfg, PROMPTS[:1], LookupFirst.of(switching, 2), spec)
