"""Continuous batching (decode/continuous.py): a finished row refilled with the next prompt keeps
every prompt's output its own (greedy: what it decodes alone), for AR and every kind of drafter
state, and spends fewer row-steps on finished rows than fixed batches do."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.trees import DynamicTree
from speculax.decode import continuous
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.calibrate import calibrate
from speculax.decode.generate import generate
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import speculative_generate
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.models.sharding import MeshConfig

from tiny_prompts import NEW, PROMPTS, cut_at_eos


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_autoregressive_rows_equal_each_prompt_alone(tiny, tiny_reference, eos, rows):
  cfg, params = tiny
  out = generate(params, cfg, PROMPTS, GenerateConfig(max_new_tokens=NEW, eos_ids=eos),
                 rows=rows, warmup=True)
  expect = [cut_at_eos(t, eos) for t in tiny_reference]
  assert len({len(t) for t in expect}) > 2  # rows finish at different steps
  assert out.tokens == expect and out.batch == rows and out.compile_s > 0


def _drafters(cfg, params):
  draft_cfg = get_preset("tiny")
  eagle, tree = Eagle(), Eagle(tree=DynamicTree(width=4, depth=3, children=3))
  return {"prompt-lookup": (PromptLookup(), None),
          "draft-model": (DraftModel(draft_cfg), llama.init_params(draft_cfg, jax.random.key(7))),
          "eagle": (eagle, eagle.init_params(cfg, jax.random.key(1))),
          "eagle-tree": (tree, tree.init_params(cfg, jax.random.key(1))),
          "token-recycling": (TokenRecycling(), None)}


@pytest.mark.parametrize("name", ["prompt-lookup", "draft-model", "eagle", "eagle-tree",
                                  "token-recycling"])
def test_speculative_rows_equal_each_prompt_alone(tiny, tiny_reference, eos, name):
  cfg, params = tiny
  drafter, dparams = _drafters(cfg, params)[name]
  spec = SpecConfig(k=3, max_new_tokens=NEW, eos_ids=eos)
  out = speculative_generate(params, cfg, PROMPTS, drafter, spec, drafter_params=dparams,
                             rows=3)
  assert out.tokens == [cut_at_eos(t, eos) for t in tiny_reference]
  assert out.row_steps > 0 and out.batch == 3


def test_goodput_rows_equal_each_prompt_alone(tiny, tiny_reference):
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, goodput=Goodput())
  costs, estimate = calibrate(params, cfg, PROMPTS[:3], PromptLookup(), spec)
  out = speculative_generate(params, cfg, PROMPTS, PromptLookup(), spec, step_costs=costs,
                             estimate=estimate, rows=3, warmup=True)
  assert out.tokens == tiny_reference and out.k_steps.sum() == out.forwards - 1


def test_refilled_rows_spend_fewer_steps_than_fixed_batches(tiny, eos):
  """The same 8 prompts, 4 rows: refilled, the loop runs fewer steps than two fixed batches of
  4 and more of its row-steps are on unfinished rows (counts, not time)."""
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, eos_ids=eos)
  fixed = [speculative_generate(params, cfg, PROMPTS[i:i + 4], PromptLookup(), spec)
           for i in (0, 4)]
  refilled = speculative_generate(params, cfg, PROMPTS, PromptLookup(), spec, rows=4)
  fixed_steps = sum(o.forwards - 1 for o in fixed)
  assert refilled.tokens == fixed[0].tokens + fixed[1].tokens
  assert refilled.forwards - 1 < fixed_steps
  assert refilled.rows_active > sum(o.row_steps for o in fixed) / (4 * fixed_steps)


def test_batch_axes_are_found_from_two_starts():
  def start(tokens, lengths):  # r rows -> leaves with the rows on axis 0, axis 1, or none
    r = tokens.shape[0]
    return {"a": jnp.zeros((r, 3)), "b": jnp.zeros((2, r)), "c": jnp.zeros(5)}

  tokens, lengths = jnp.ones((1, 4), jnp.int32), jnp.ones((1,), jnp.int32)
  assert continuous.batch_axes(start, tokens, lengths) == (0, 1, None)
  square = lambda tokens, lengths: jnp.zeros((tokens.shape[0],) * 2)
  with pytest.raises(ValueError, match="several row axes"):
    continuous.batch_axes(square, tokens, lengths)


def test_bad_rows_are_refused(tiny):
  cfg, params = tiny
  gen = GenerateConfig(max_new_tokens=4)
  for rows in (0, 2.5, True):
    with pytest.raises(ValueError, match=f"rows must be an int >= 1, got {rows!r}"):
      generate(params, cfg, PROMPTS[:2], gen, rows=rows)
  with pytest.raises(ValueError, match="continuous batching .* one device"):
    speculative_generate(params, cfg, PROMPTS[:2], PromptLookup(), SpecConfig(max_new_tokens=4),
                         rows=2, mesh=MeshConfig())
  np.testing.assert_equal(generate(params, cfg, PROMPTS[:2], gen, rows=5).batch, 2)
