"""Online adaptation: recording what verification computed, the replay buffer, the learner's
rounds (rollback, checkpoints) and the serving loop (outputs never change; bad requests refused)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_goodput

from speculax.core.sampling import SamplingConfig
from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import speculative_generate
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.medusa import Medusa
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.serve.loop import serve
from speculax.serve.online import OnlineConfig, OnlineLearner, served_row
from speculax.serve.recording import Recording
from speculax.serve.replay import ReplayBuffer

from tiny_prompts import NEW, PROMPTS

SPEC = SpecConfig(k=4, max_new_tokens=NEW)


@pytest.fixture(scope="module")
def draft():
  cfg = get_preset("tiny")
  return cfg, llama.init_params(cfg, jax.random.key(7))


def _target_laws(params, cfg, row):
  """log p(token j | tokens < j) for every slot j of row, from one plain target forward."""
  tokens = jnp.asarray(row)[None]
  logits, _, _ = llama.forward(params, cfg, tokens, jnp.arange(len(row))[None])
  return np.asarray(jax.nn.log_softmax(logits[0]))  # [n, v]: position j - 1 holds slot j's law


@pytest.mark.parametrize("all_positions", [False, True])
def test_recorded_laws_are_the_targets(tiny, draft, all_positions):
  cfg, params = tiny
  dcfg, dparams = draft
  prompts = PROMPTS[:4]
  plain = speculative_generate(params, cfg, prompts, DraftModel(dcfg), SPEC, drafter_params=dparams)
  out = speculative_generate(params, cfg, prompts, Recording(DraftModel(dcfg), 8, all_positions),
                             SPEC, drafter_params=dparams)
  assert out.tokens == plain.tokens  # recording changes nothing
  rec = out.drafter_state
  n_recorded = 0
  for i, (prompt, new) in enumerate(zip(prompts, out.tokens)):
    row = list(prompt) + new
    slots = np.flatnonzero(np.asarray(rec.recorded[i]))
    assert slots.size and slots.min() > len(prompt) and slots.max() < len(row)
    if all_positions:  # every emitted token but the prefill's first
      np.testing.assert_array_equal(slots, np.arange(len(prompt) + 1, len(row)))
    laws = _target_laws(params, cfg, row)
    draft_laws = _target_laws(dparams, dcfg, row)
    for j in slots:
      ref_ids = np.argsort(-laws[j - 1])[:8]
      np.testing.assert_array_equal(np.sort(np.asarray(rec.ids[i, j])), np.sort(ref_ids))
      np.testing.assert_allclose(np.asarray(rec.logprobs[i, j]), laws[j - 1, rec.ids[i, j]],
                                 atol=1e-4)
      if not all_positions:  # greedy: the draft model proposed another token there
        assert np.argmax(draft_laws[j - 1]) != row[j]
    n_recorded += slots.size
  if not all_positions:  # one per verify step that rejected a draft, less budget cuts
    rejecting = out.row_steps - int(out.accepted_at[-1])
    assert rejecting - len(prompts) <= n_recorded <= rejecting


def test_served_row_aligns_slot_laws_with_the_trainer():
  ids = np.arange(6)[:, None] * np.ones((1, 2), np.int32)  # slot j holds ids j
  row = served_row([5, 6], [7, 8, 9], ids, -ids.astype(np.float32),
                   np.array([0, 0, 0, 1, 1, 0], bool))
  np.testing.assert_array_equal(row["tokens"], [5, 6, 7, 8, 9])
  np.testing.assert_array_equal(row["mask"], [0, 0, 1, 1, 0])  # position j - 1 <- slot j
  np.testing.assert_array_equal(row["ids"][:, 0], [1, 2, 3, 4, 0])


def _row(value, n=6, k=2):
  return dict(tokens=np.full(n, value), ids=np.full((n, k), value), logprobs=np.zeros((n, k)),
              mask=np.ones(n))


def test_fifo_buffer_keeps_the_newest_rows_in_fixed_memory():
  buf = ReplayBuffer(capacity=3, seq_len=4, top_k=2)
  nbytes = sum(a.nbytes for a in buf.arrays.values())
  for v in range(10):
    buf.add(**_row(v))
  assert sum(a.nbytes for a in buf.arrays.values()) == nbytes
  assert buf.size == 3 and buf.seen == 10 and buf.positions == 12
  assert sorted(buf.rows()["tokens"][:, 0]) == [7, 8, 9]
  buf.add(**dict(_row(42, n=2), mask=np.array([1.0, 0.0])))  # short row: zero-padded
  assert buf.positions == 9 and 42 in buf.rows()["tokens"][:, 0]


def test_reservoir_buffer_keeps_a_uniform_sample_of_the_stream():
  n, capacity, trials = 20, 5, 400
  kept = np.zeros(n)
  for seed in range(trials):
    buf = ReplayBuffer(capacity, seq_len=2, top_k=1, policy="reservoir", seed=seed)
    for v in range(n):
      buf.add(**_row(v, n=2, k=1))
    kept[buf.rows()["tokens"][:, 0]] += 1
  # Each row survives with probability capacity / n = 0.25 (binomial sd over 400 trials: 0.022).
  np.testing.assert_allclose(kept / trials, capacity / n, atol=0.09)
  assert kept[:5].sum() / trials < 2  # FIFO-like bias toward the first rows would show here


def _stream(n_passes=2):
  return [p for _ in range(n_passes) for p in PROMPTS]


def test_online_updates_never_change_an_output_token(tiny, draft, tiny_reference):
  cfg, params = tiny
  dcfg, dparams = draft
  online = OnlineConfig(update_every=4, min_positions=1, steps=2, learning_rate=1e-2,
                        heldout_every=0, seq_len=64)
  learner = OnlineLearner(dparams, dcfg, online)
  adapted = list(serve(params, cfg, _stream(), DraftModel(dcfg), SPEC, batch_size=4,
                       learner=learner))
  frozen = list(serve(params, cfg, _stream(), DraftModel(dcfg), SPEC, dparams, batch_size=4))
  tokens = lambda reports: [s.tokens for r in reports for s in r.served]
  assert tokens(adapted) == tokens(frozen) == tiny_reference * 2
  assert sum(r.update is not None for r in adapted) == learner.rounds == 4
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), learner.params, dparams)
  assert max(jax.tree.leaves(moved)) > 1e-3  # the drafter did change


def test_online_adaptation_raises_acceptance_on_repeated_traffic(tiny, draft):
  cfg, params = tiny
  dcfg, dparams = draft
  online = OnlineConfig(update_every=4, min_positions=1, steps=8, learning_rate=3e-3,
                        heldout_every=0, seq_len=64, all_positions=True)
  stream = _stream(4)
  adapted = list(serve(params, cfg, stream, DraftModel(dcfg), SPEC, batch_size=4,
                       learner=OnlineLearner(dparams, dcfg, online)))
  frozen = list(serve(params, cfg, stream, DraftModel(dcfg), SPEC, dparams, batch_size=4))
  last = lambda reports: np.mean([r.acceptance for r in reports[-4:]])
  assert last(adapted) > last(frozen) + 0.2, (last(adapted), last(frozen))


def _filled_learner(tiny, draft, online, folder=None):
  """A learner that observed the tiny target's greedy continuations with all laws recorded."""
  cfg, params = tiny
  dcfg, dparams = draft
  learner = OnlineLearner(dparams, dcfg, online, folder)
  out = speculative_generate(params, cfg, PROMPTS, Recording(DraftModel(dcfg), online.top_k, True),
                             SPEC, drafter_params=dparams)
  rec = out.drafter_state
  for i, (prompt, new) in enumerate(zip(PROMPTS, out.tokens)):
    learner.observe(served_row(prompt, new, np.asarray(rec.ids[i]), np.asarray(rec.logprobs[i]),
                               np.asarray(rec.recorded[i])))
  return learner


def test_an_update_that_lowers_heldout_acceptance_is_rolled_back(tiny, draft):
  good = _filled_learner(tiny, draft, OnlineConfig(heldout_every=2, min_positions=1, steps=4,
                                                   learning_rate=3e-3, seq_len=64))
  report = good.update()
  assert not report["rolled_back"] and report["heldout_after"] > report["heldout_before"]
  # A step size of 3 wrecks the drafter: its held-out acceptance falls and the round is undone.
  bad = _filled_learner(tiny, draft, OnlineConfig(heldout_every=2, min_positions=1, steps=2,
                                                  learning_rate=3.0, seq_len=64))
  before = jax.tree.map(np.asarray, bad.params)
  report = bad.update()
  assert report["rolled_back"] and bad.rollbacks == 1
  assert report["heldout_after"] < report["heldout_before"]
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, bad.params), before)
  assert bad.heldout_acceptance() == pytest.approx(report["heldout_before"], abs=1e-6)


def test_a_restarted_learner_resumes_from_its_checkpoint(tiny, draft, tmp_path):
  online = OnlineConfig(heldout_every=3, min_positions=1, steps=2, learning_rate=3e-3,
                        seq_len=64, buffer_policy="reservoir")
  learner = _filled_learner(tiny, draft, online, tmp_path)
  learner.update()
  again = OnlineLearner(draft[1], draft[0], online, tmp_path)
  assert (again.requests, again.rounds, again.since_round) == (len(PROMPTS), 1, 0)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, again.state),
               jax.tree.map(np.asarray, learner.state))
  for buf, ref in ((again.buffer, learner.buffer), (again.heldout, learner.heldout)):
    assert buf.seen == ref.seen
    for name in ref.arrays:
      np.testing.assert_array_equal(buf.arrays[name], ref.arrays[name])


def test_a_bfloat16_draft_trains_float32_weights(draft):
  """A draft model stored in bfloat16 decodes in it beside a float32 target; its learner keeps
  float32 weights (the draft config's), the same values to start."""
  cfg, params = draft
  narrow = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  learner = OnlineLearner(narrow, cfg, OnlineConfig())
  for got, want in zip(jax.tree.leaves(learner.params), jax.tree.leaves(narrow)):
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got, want.astype(jnp.float32))


def test_token_recycling_runs_hot_in_the_same_loop(tiny, tiny_reference):
  cfg, params = tiny
  spec = SpecConfig(k=4, max_new_tokens=6)  # short answers: little time to learn within one
  reports = list(serve(params, cfg, _stream(), TokenRecycling(), spec, batch_size=4))
  assert [s.tokens for r in reports for s in r.served] == [t[:6] for t in tiny_reference] * 2
  # The second pass meets the same text: the matrix carried over from the first pass drafts it
  # (a cold start there would repeat the first pass's acceptance exactly: greedy, same prompts).
  first, second = (np.mean([r.acceptance for r in reports[i:i + 2]]) for i in (0, 2))
  assert second > first + 0.02, (first, second)


def test_sampled_stream_with_updates_runs(tiny, draft):
  cfg, params = tiny
  dcfg, dparams = draft
  learner = OnlineLearner(dparams, dcfg, OnlineConfig(update_every=2, min_positions=1, steps=1,
                                                      heldout_every=0, seq_len=64))
  spec = SpecConfig(k=3, max_new_tokens=8, sampling=SamplingConfig(temperature=1.0))
  reports = list(serve(params, cfg, PROMPTS, DraftModel(dcfg), spec, batch_size=4,
                       learner=learner))
  assert [len(s.tokens) for r in reports for s in r.served] == [8] * len(PROMPTS)
  assert learner.rounds == 2 and all(1 <= r.tau <= 4 for r in reports)


# Bad input.
@pytest.mark.parametrize("field, value, match", [
    ("buffer_size", 0, "OnlineConfig.buffer_size must be an int >= 1, got 0"),
    ("update_every", 0, "OnlineConfig.update_every must be an int >= 1, got 0"),
    ("divergence", "kl-ish", "kl-ish"),
    ("buffer_policy", "lifo", "lifo"),
    ("heldout_every", 1, "heldout_every")])
def test_bad_online_config(field, value, match):
  with pytest.raises(ValueError, match=match):
    OnlineConfig(**{field: value})


def test_empty_buffer_is_refused():
  with pytest.raises(ValueError, match="capacity must be >= 1"):
    ReplayBuffer(0, 8, 4)


def test_a_request_longer_than_the_cache_is_refused_and_the_rest_served(tiny, tiny_reference):
  cfg, params = tiny
  stream = [PROMPTS[0], [3] * cfg.max_seq_len, PROMPTS[1], [cfg.vocab_size], PROMPTS[2]]
  reports = list(serve(params, cfg, stream, TokenRecycling(), SPEC, batch_size=2))
  served = sorted((s for r in reports for s in r.served), key=lambda s: s.index)
  assert [s.tokens for s in served if s.error is None] == tiny_reference[:3]
  assert "request 1 refused" in served[1].error and "max_seq_len 256" in served[1].error
  assert "request 3 refused: its prompt has token id" in served[3].error
  assert "prompt 0" not in served[3].error


def test_goodput_serving_carries_the_estimate_and_calibrates_per_batch_size(
    tiny, tiny_reference, calibrations):
  """Goodput while serving: a drafter that is never kept costs the first batch its optimistic
  long draft and no later batch one, since the estimate goes on from batch to batch; the step
  costs are calibrated once for each batch size; outputs stay the target's."""
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, goodput=Goodput())
  reports = list(serve(params, cfg, PROMPTS[:5], test_goodput.Contrary(), spec, batch_size=2,
                       carry_estimate=True))
  assert [s.tokens for r in reports for s in r.served] == tiny_reference[:5]
  assert calibrations == [2, 1]  # batches of 2, 2 and 1
  first, *later = (r.k_steps for r in reports)
  assert first[3] >= 1 and all(k[2:].sum() == 0 for k in later), [r.k_steps for r in reports]
  with pytest.raises(ValueError, match="step_costs go with spec.goodput and only with it.* "
                                       "goodput=None"):
    next(serve(params, cfg, PROMPTS[:1], test_goodput.Contrary(), SpecConfig(k=3),
               step_costs=test_goodput.COSTS))


def test_learner_needs_the_draft_model_it_trains(tiny, draft):
  cfg, params = tiny
  dcfg, dparams = draft
  learner = OnlineLearner(dparams, dcfg, OnlineConfig())
  with pytest.raises(ValueError, match="hot start"):
    next(serve(params, cfg, PROMPTS, TokenRecycling(), SPEC, learner=learner))
  with pytest.raises(ValueError, match="Medusa is not that model"):
    next(serve(params, cfg, PROMPTS, Medusa(4), SPEC, learner=learner))
