"""Speculative decoding is lossless: greedy output equals target-only decoding, per prompt."""
import jax
import numpy as np
import pytest

from speculax.core.sampling import SamplingConfig
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.models.sharding import MeshConfig

from tiny_prompts import NEW, PROMPTS


@pytest.fixture(scope="module")
def draft(tiny):
  """A different random model with the target's vocabulary."""
  cfg = get_preset("tiny")
  return DraftModel(cfg), llama.init_params(cfg, jax.random.key(7))


def _drafters(tiny, draft):
  cfg, params = tiny
  return {"prompt-lookup": (PromptLookup(), None),
          "layer-skip": (LayerSkip.skipping(cfg.n_layers, [1]), None),
          "draft-model": draft,
          "draft-is-target": (DraftModel(cfg), params)}


@pytest.mark.parametrize("name", ["prompt-lookup", "layer-skip", "draft-model", "draft-is-target"])
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_greedy_equals_target_only(tiny, draft, tiny_reference, name, batch):
  cfg, params = tiny
  drafter, dparams = _drafters(tiny, draft)[name]
  prompts = PROMPTS[:batch] if batch > 1 else PROMPTS[4:5]
  expect = tiny_reference[:batch] if batch > 1 else tiny_reference[4:5]
  out = speculative_generate(params, cfg, prompts, drafter, SpecConfig(k=4, max_new_tokens=NEW),
                             drafter_params=dparams)
  assert out.tokens == expect
  assert out.row_steps > 0 and 1.0 <= out.tau <= 5.0


def test_metrics_when_the_drafter_is_the_target(tiny):
  cfg, params = tiny
  out = speculative_generate(params, cfg, PROMPTS[:4], DraftModel(cfg),
                             SpecConfig(k=4, max_new_tokens=21), drafter_params=params)
  # Every draft is accepted: each verify step emits k + 1 = 5 tokens; 20 tokens after the
  # first one take exactly 4 steps, so 1 prefill + 4 verify forwards.
  assert out.forwards == 5 and out.tau == 5.0
  np.testing.assert_array_equal(out.acceptance, np.ones(4))
  assert out.new_tokens == 4 * 21 and out.draft_length == 4.0
  assert out.rows_active == 1.0  # every row finishes in the same step


def test_prompt_lookup_accepts_on_repetitive_text(tiny, tiny_reference):
  cfg, params = tiny
  out = speculative_generate(params, cfg, PROMPTS, PromptLookup(), SpecConfig(k=4, max_new_tokens=NEW))
  assert out.tokens == tiny_reference
  assert out.tau > 1.2  # the tiny model repeats itself, so lookups hit
  assert np.all(np.diff(out.acceptance) <= 0)  # a later position is never accepted more often


def test_eos_stops_like_target_only(tiny, tiny_reference):
  cfg, params = tiny
  eos = tiny_reference[1][5]
  gen = generate(params, cfg, PROMPTS[:4], GenerateConfig(max_new_tokens=NEW, eos_ids=(eos,)))
  spec = speculative_generate(params, cfg, PROMPTS[:4], PromptLookup(),
                              SpecConfig(k=3, max_new_tokens=NEW, eos_ids=(eos,)))
  assert spec.tokens == gen.tokens
  assert spec.tokens[1][-1] == eos and len(spec.tokens[1]) <= 6
  # Row 1 is done after a few steps and rides along in the rest: the batch's later steps serve
  # at most 3 of 4 rows.
  steps = spec.forwards - 1
  assert spec.row_steps < 4 * steps and spec.rows_active == spec.row_steps / (4 * steps)
  assert "of the batch's row-steps on unfinished rows" in spec.summary()


@pytest.mark.parametrize("name", ["layer-skip", "draft-model"])
def test_sharded_equals_unsharded(tiny, draft, tiny_reference, name):
  cfg, params = tiny
  drafter, dparams = _drafters(tiny, draft)[name]
  out = speculative_generate(params, cfg, PROMPTS, drafter, SpecConfig(k=3, max_new_tokens=NEW),
                             drafter_params=dparams, mesh=MeshConfig(data=4, tensor=2))
  assert out.tokens == tiny_reference


def test_bad_speculative_input(tiny, draft):
  cfg, params = tiny
  with pytest.raises(ValueError, match="SpecConfig.k must be an int >= 1, got 0"):
    SpecConfig(k=0)
  with pytest.raises(ValueError, match="\\+ 41 draft slots = 258 exceeds the model's max_seq_len 256"):
    speculative_generate(params, cfg, [[1] * 17], PromptLookup(), SpecConfig(k=40, max_new_tokens=200))
  other = get_preset("tiny-untied-llama3")
  with pytest.raises(ValueError, match="draft model vocabulary size 128 differs from the target.s 256"):
    import dataclasses
    small = dataclasses.replace(cfg, vocab_size=128)
    speculative_generate(params, cfg, [[1, 2]], DraftModel(small),
                         drafter_params=llama.init_params(small, jax.random.key(0)))
  with pytest.raises(ValueError, match="skips every one of the target's 2 layers"):
    speculative_generate(params, cfg, [[1, 2]], LayerSkip.skipping(cfg.n_layers, [0, 1]))
  with pytest.raises(ValueError, match="names layer 5, but the target has layers 0..1"):
    LayerSkip.skipping(cfg.n_layers, [5])
  with pytest.raises(ValueError, match="keeps layer 3"):
    speculative_generate(params, cfg, [[1, 2]], LayerSkip((0, 3)))
  with pytest.raises(ValueError, match="top_k=999 exceeds the vocabulary size 256"):
    speculative_generate(params, cfg, [[1, 2]], PromptLookup(),
                         SpecConfig(sampling=SamplingConfig(temperature=1.0, top_k=999)))
  with pytest.raises(ValueError, match="needs its params"):
    speculative_generate(params, cfg, [[1, 2]], DraftModel(other))


def test_no_recompilation_within_a_prompt_bucket(tiny):
  from speculax.decode.speculative import spec_loop
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=6, prompt_bucket=32)
  speculative_generate(params, cfg, [[1, 2, 3], [4, 5]], PromptLookup(), spec)
  compiled = spec_loop._cache_size()
  speculative_generate(params, cfg, [[1] * 30, [4, 5, 6, 7, 8]], PromptLookup(), spec)  # same bucket
  assert spec_loop._cache_size() == compiled
  speculative_generate(params, cfg, [[1] * 33, [4]], PromptLookup(), spec)  # next bucket
  assert spec_loop._cache_size() == compiled + 1


def test_one_program_for_every_sampled_temperature(tiny):
  """Temperature and top-p's value are traced: a new value reuses the loops' programs (and
  changes the draws); greedy, top-p on or off and top_k compile apart."""
  from speculax.decode.generate import decode_loop
  from speculax.decode.speculative import spec_loop
  cfg, params = tiny
  prompts, key = [[1, 2, 3], [4, 5]], jax.random.key(0)
  run = lambda **s: speculative_generate(params, cfg, prompts, PromptLookup(), SpecConfig(
      k=3, max_new_tokens=12, sampling=SamplingConfig(**s)), key=key).tokens
  hot = run(temperature=1.0, top_p=0.9)
  compiled = spec_loop._cache_size()
  cold = run(temperature=0.05, top_p=0.5)
  assert spec_loop._cache_size() == compiled and not np.array_equal(hot, cold)
  np.testing.assert_array_equal(cold, run(temperature=0.05, top_p=0.5))  # one key, one draw
  run(temperature=1.0)  # top-p off
  run(temperature=0.0)  # greedy
  run(temperature=1.0, top_k=4)
  assert spec_loop._cache_size() == compiled + 3
  gen = lambda t: generate(params, cfg, prompts, GenerateConfig(
      max_new_tokens=12, sampling=SamplingConfig(temperature=t)), key=key).tokens
  gen(0.7)
  compiled = decode_loop._cache_size()
  gen(1.3)
  assert decode_loop._cache_size() == compiled
