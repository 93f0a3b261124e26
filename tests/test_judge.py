"""The judge head (verifiers/judge.py, LOSSY) and its training (train/judge.py): the rule against
numpy, a judge that never fires leaves greedy output the target's own, one that always fires
keeps every draft, the examples against the target's own forward, the fit on separable data,
save/load, and bad input."""
import jax
import numpy as np
import pytest

from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models import llama
from speculax.models.derive import truncated
from speculax.train import judge as training
from speculax.verifiers.judge import Judge

from tiny_prompts import NEW, PROMPTS


def _judge(d: int, bias: float, seed: int = 0) -> Judge:
  w = np.random.default_rng(seed).normal(size=d) / np.sqrt(d)
  return Judge(tuple(float(x) for x in w), bias)


def test_kept_is_the_argmax_or_a_score_above_the_threshold():
  rng = np.random.default_rng(0)
  b, k, v, d = 3, 4, 6, 5
  p = rng.dirichlet(np.ones(v), (b, k)).astype(np.float32)
  tokens = rng.integers(0, v, (b, k)).astype(np.int32)
  hidden = rng.normal(size=(b, k, d)).astype(np.float32)
  judge = _judge(d, 0.2, seed=1)
  score = 1 / (1 + np.exp(-(hidden @ np.asarray(judge.weights) + judge.bias)))
  want = (tokens == p.argmax(-1)) | (score > judge.threshold)
  np.testing.assert_array_equal(np.asarray(judge.kept(p, tokens, hidden)), want)
  assert 0 < want.sum() < want.size  # both outcomes occur


def test_a_judge_that_never_fires_keeps_greedy_output_the_targets(tiny, tiny_reference):
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, lossy=_judge(cfg.d_model, -50.0))
  out = speculative_generate(params, cfg, PROMPTS, PromptLookup(), spec)
  assert out.tokens == [list(t) for t in tiny_reference]
  assert "LOSSY: judge head" in out.summary()


def test_a_judge_that_always_fires_keeps_every_draft(tiny, tiny_reference):
  """An untrained one-layer cut drafts tokens the target would not write; a judge that accepts
  everything keeps all k of every step, and the output leaves the target's."""
  cfg, params = tiny
  draft_cfg, draft = truncated(params, cfg, [0])
  k = 3
  lossless = speculative_generate(params, cfg, PROMPTS, DraftModel(draft_cfg),
                                  SpecConfig(k=k, max_new_tokens=NEW), drafter_params=draft)
  out = speculative_generate(params, cfg, PROMPTS, DraftModel(draft_cfg),
                             SpecConfig(k=k, max_new_tokens=NEW, lossy=_judge(cfg.d_model, 50.0)),
                             drafter_params=draft)
  assert lossless.tokens == [list(t) for t in tiny_reference] and lossless.tau < k
  # Every step emits k + 1 tokens but a row's last, which the budget may cut.
  assert out.step_tokens >= (k + 1) * (out.row_steps - len(PROMPTS)), (out.tau, out.row_steps)
  assert out.tokens != lossless.tokens and all(len(t) == NEW for t in out.tokens)


def test_examples_are_the_targets_features_at_right_and_wrong_tokens(tiny, tiny_reference):
  cfg, params = tiny
  rows = [list(p) + list(a) for p, a in zip(PROMPTS[:3], tiny_reference[:3])]
  starts = [len(p) for p in PROMPTS[:3]]
  t = training.JudgeTraining(negatives=2, wrong_rank=10)
  features, labels = training.examples(params, cfg, rows, starts, t, width=64)
  n_pos = sum(len(r) - s for r, s in zip(rows, starts))
  assert features.shape == (n_pos + 2 * len(rows), cfg.d_model)
  assert labels.tolist() == sum(([1.0] * (len(r) - s) + [0.0, 0.0]
                                 for r, s in zip(rows, starts)), [])
  # The first row's positives, from its own forward without padding.
  r = np.asarray(rows[0], np.int32)[None]
  _, hidden = llama.forward_jit(params, cfg, r, np.arange(r.shape[1], dtype=np.int32)[None],
                                hidden_layers=(-1,))[:2]
  np.testing.assert_allclose(features[:len(rows[0]) - starts[0]],
                             np.asarray(hidden[0, 0, starts[0]:]), rtol=1e-5, atol=1e-5)
  # Negatives are fed a wrong token: their features match no positive of the same row.
  negative = features[len(rows[0]) - starts[0]]
  assert np.abs(features[:len(rows[0]) - starts[0]] - negative).max(-1).min() > 1e-3


def test_fit_separates_separable_features_and_saves(tmp_path):
  rng = np.random.default_rng(0)
  d = 8
  direction = rng.normal(size=d)
  x = rng.normal(size=(600, d)).astype(np.float32)
  y = (x @ direction > 0.3).astype(np.float32)  # unbalanced classes
  judge = training.fit(x, y, training.JudgeTraining(steps=300, threshold=0.5))
  acc = training.accuracy(judge, x, y)
  assert acc["correct_kept"] > 0.95 and acc["incorrect_refused"] > 0.95, acc
  back = Judge.load(judge.save(tmp_path / "judge.npz"))
  np.testing.assert_allclose(back.weights, judge.weights, rtol=1e-6)
  assert back.threshold == 0.5 and Judge.load(tmp_path / "judge.npz", 0.9).threshold == 0.9


def test_bad_input(tiny, tmp_path):
  cfg, params = tiny
  with pytest.raises(ValueError, match="the judge head has 3 weights; this target's features "
                                       "have d_model=64"):
    speculative_generate(params, cfg, [[1, 2, 3]], PromptLookup(),
                         SpecConfig(k=2, max_new_tokens=4, lossy=_judge(3, 0.0)))
  eagle3 = Eagle(feature_layers=(0, 1))  # low and mid layers, not the final features
  with pytest.raises(ValueError, match="a judge head reads the target's final features"):
    speculative_generate(params, cfg, [[1, 2, 3]], eagle3,
                         SpecConfig(k=2, max_new_tokens=4, lossy=_judge(cfg.d_model, 0.0)),
                         drafter_params=eagle3.init_params(cfg, jax.random.key(0)))
  with pytest.raises(ValueError, match="labels must hold both classes"):
    training.fit(np.zeros((4, 2), np.float32), np.ones(4, np.float32), training.JudgeTraining())
  with pytest.raises(ValueError, match="an answer must start inside its row"):
    training.examples(params, cfg, [[1, 2, 3]], [3], training.JudgeTraining())
  with pytest.raises(ValueError, match="wrong_rank=256 must be below the vocabulary"):
    training.examples(params, cfg, [[1, 2, 3]], [1], training.JudgeTraining(wrong_rank=256))
  np.save(tmp_path / "w.npy", np.zeros(3))
  with pytest.raises(ValueError, match="is not a judge head"):
    Judge.load(tmp_path / "w.npy")
