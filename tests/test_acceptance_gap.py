"""research/acceptance_gap.py: the teacher-forced first draft (the training path) replayed
through the k = 1 greedy rule keeps exactly the drafts the decode loop keeps, for a head drafter
(EAGLE with and without VocabTrim, in float32 and bf16 weights, Medusa, Hydra) and a draft model;
a draft model equal to the target scores 1."""
import dataclasses
import types

import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.dtypes import floats_as
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters import vocab_trim
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.medusa import Medusa
from speculax.models.derive import truncated
from speculax.models.load import LoadedModel
from speculax.research import acceptance_gap
from speculax.research.acceptance_gap import plot, position_sets, replay_k1, report, score
from speculax.train.corpus import token_rows
from speculax.train.experiment import DataConfig

from test_eagle import _params as eagle_params
from test_hydra import random_params
from test_medusa import _random_heads
from test_heads_experiment import ByteTokenizer
from tiny_prompts import NEW, PROMPTS


@pytest.fixture
def model_bytes(tiny):
  return LoadedModel(*tiny, ByteTokenizer())


def _drafters(cfg, params):
  eagle = Eagle()
  order = np.random.default_rng(0).permutation(cfg.vocab_size)
  trimmed = dataclasses.replace(eagle, vocab_trim=cfg.vocab_size // 2)
  e = eagle_params(cfg, params, eagle)
  hydra = Hydra(3)
  bf16 = floats_as(e, jnp.bfloat16)  # as a bf16-stored drafter decodes
  return {"eagle": (eagle, e), "eagle-trimmed": (trimmed, {**e, vocab_trim.IDS: order}),
          "eagle-trimmed-bf16": (trimmed, {**bf16, vocab_trim.IDS: order}),
          "medusa": (Medusa(4), _random_heads(cfg)), "hydra": (hydra, random_params(hydra, cfg)),
          "draft-model": (DraftModel(*truncated(params, cfg, range(1))[:1]),
                          truncated(params, cfg, range(1))[1])}


@pytest.mark.parametrize("name", ["eagle", "eagle-trimmed", "eagle-trimmed-bf16", "medusa",
                                  "hydra", "draft-model"])
def test_replay_keeps_what_the_decode_loop_keeps(tiny, tiny_reference, name):
  cfg, params = tiny
  drafter, dparams = _drafters(cfg, params)[name]
  model = types.SimpleNamespace(params=params, config=cfg)
  docs = [list(p) + list(a) for p, a in zip(PROMPTS, tiny_reference)]
  got = score(drafter, dparams, model, docs, [len(p) for p in PROMPTS])
  kept = steps = 0
  for p in PROMPTS:  # decoded alone: batch 1, as the research script's loop
    out = speculative_generate(params, cfg, [p], drafter, SpecConfig(k=1, max_new_tokens=NEW),
                               drafter_params=dparams)
    kept, steps = kept + int(out.accepted_at[0]), steps + out.row_steps
  assert steps > len(PROMPTS)
  assert 0 < kept < steps  # a rate strictly inside (0, 1), so a misaligned replay shows
  assert got["replay"] == pytest.approx(kept / steps)
  assert 0 < got["accept"] < 1 and got["positions"] == sum(len(a) - 1 for a in tiny_reference)


def test_a_draft_model_equal_to_the_target_scores_one(tiny, tiny_reference):
  cfg, params = tiny
  model = types.SimpleNamespace(params=params, config=cfg)
  docs = [list(p) + list(a) for p, a in zip(PROMPTS, tiny_reference)]
  got = score(DraftModel(cfg), params, model, docs, [len(p) for p in PROMPTS])
  assert got["top1"] == 1.0 and got["replay"] == 1.0
  assert got["accept"] == pytest.approx(1.0, abs=1e-5)


def test_replay_moves_two_tokens_on_a_kept_draft():
  # answer at 2..8 (7 tokens): g = 1 drafts from 2 (kept, g = 3), from 4 (rejected, g = 4),
  # from 5 (kept, g = 6), from 7 (rejected, g = 7): 2 of 4
  top1 = np.array([0, 0, 1, 0, 0, 1, 0, 0, 1], bool)
  assert replay_k1(top1, start=2, length=9) == (2, 4)
  assert replay_k1(np.ones(9, bool), start=2, length=9) == (3, 3)
  assert replay_k1(np.ones(9, bool), start=8, length=9) == (0, 0)


def test_plot_and_report_show_every_drafter(tmp_path):
  score_ = lambda accept: {"accept": accept, "top1": 0.45, "replay": 0.3, "positions": 10}
  rows = {name: {"held-out rows": score_(0.5 + 0.1 * (name == "b")), "chat answers": score_(0.4),
                 "chat decode": 0.25} for name in ("a", "b")}
  assert position_sets(rows) == ["held-out rows", "chat answers"]
  path = plot(rows, position_sets(rows), ["chat"], tmp_path / "gap.png")
  assert path.stat().st_size > 5000
  text = report({"command": "c", "machine": "m", "date": "d", "suites": ["chat"], "rows": rows})
  assert "| a | 0.500 (0.45) | 0.400 (0.45) | 0.30 / 0.25 |" in text
  assert "| b | 0.600 (0.45) |" in text


def test_heldout_rows_are_the_recipes_held_out_rows_from_position_1(model_bytes, monkeypatch,
                                                                     tmp_path):
  """The rows train_drafters' held-out figures read (the recipe's DataConfig), scored from the
  first position a head drafter drafts from."""
  data = DataConfig(files=40, seq_len=32, rows=4, heldout_rows=3, answers_dir=str(tmp_path))
  monkeypatch.setattr(acceptance_gap, "DATA", data)
  rows, starts = acceptance_gap.heldout_rows(model_bytes)
  want = token_rows(data, model_bytes, tmp_path)[1].tokens
  assert np.array_equal(np.asarray(rows), want) and want.shape == (3, 32) and starts == [1, 1, 1]
