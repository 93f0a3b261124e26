"""The serving loop with continuous batching (serve(..., continuous=True)): every request's
output is the target's own, reports cover `batch_size` finished requests each, and what carries
from request to request in the one loop state (a learner's params, Token Recycling's matrix,
goodput's estimate) does carry."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_goodput

from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.serve.loop import serve
from speculax.serve.online import OnlineConfig, OnlineLearner

from tiny_prompts import NEW, PROMPTS, cut_at_eos


@pytest.fixture(scope="module")
def draft():
  cfg = get_preset("tiny")
  return cfg, llama.init_params(cfg, jax.random.key(7))


def _by_index(reports):
  return sorted((s for r in reports for s in r.served), key=lambda s: s.index)


def test_each_request_is_the_targets_and_reports_cover_batch_size(tiny, tiny_reference, eos,
                                                                  draft):
  cfg, params = tiny
  dcfg, dparams = draft
  stream = PROMPTS[:3] + [[cfg.vocab_size]] + PROMPTS[3:]  # request 3 is refused
  spec = SpecConfig(k=3, max_new_tokens=NEW, eos_ids=eos)
  reports = list(serve(params, cfg, stream, DraftModel(dcfg), spec, dparams, batch_size=3,
                       continuous=True))
  served = _by_index(reports)
  assert [s.index for s in served] == list(range(len(stream)))
  assert "request 3 refused: its prompt has token id" in served[3].error
  expect = [cut_at_eos(t, eos) for t in tiny_reference]
  assert [s.tokens for s in served if s.error is None] == expect
  assert len({len(t) for t in expect}) > 2  # rows finish at different steps: refills happen
  # The refused request rides in the first report; then 3 finished requests each, 2 in the last.
  assert [len(r.served) for r in reports] == [4, 3, 2]
  assert [s.index for s in reports[0].served][0] == 3
  assert sum(r.new_tokens for r in reports) == sum(map(len, expect))
  assert all(r.seconds > 0 and 1 <= r.tau <= 4 and r.k_steps is None for r in reports)
  fixed = list(serve(params, cfg, stream, DraftModel(dcfg), spec, dparams, batch_size=3))
  assert [s.tokens for s in _by_index(fixed)] == [s.tokens for s in served]


def test_online_rounds_run_between_requests_and_draft_the_rows_after(tiny, tiny_reference,
                                                                     draft):
  """The learner's new params reach the loop: on repeated traffic acceptance climbs over the
  frozen drafter's, as in fixed batches, and no output token changes."""
  cfg, params = tiny
  dcfg, dparams = draft
  online = OnlineConfig(update_every=4, min_positions=1, steps=8, learning_rate=3e-3,
                        heldout_every=0, seq_len=64, all_positions=True)
  learner = OnlineLearner(dparams, dcfg, online)
  spec = SpecConfig(k=4, max_new_tokens=NEW)
  stream = PROMPTS * 4
  adapted = list(serve(params, cfg, stream, DraftModel(dcfg), spec, batch_size=4,
                       learner=learner, continuous=True))
  frozen = list(serve(params, cfg, stream, DraftModel(dcfg), spec, dparams, batch_size=4,
                      continuous=True))
  for reports in (adapted, frozen):
    assert [s.tokens for s in _by_index(reports)] == tiny_reference * 4
  assert learner.rounds == sum(r.update is not None for r in adapted) == 8
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), learner.params, dparams)
  assert max(jax.tree.leaves(moved)) > 1e-3
  last = lambda reports: np.mean([r.acceptance for r in reports[-4:]])
  assert last(adapted) > last(frozen) + 0.2, (last(adapted), last(frozen))


def test_token_recycling_matrix_carries_from_request_to_request(tiny, tiny_reference):
  cfg, params = tiny
  spec = SpecConfig(k=4, max_new_tokens=6)
  n = len(PROMPTS)
  # One row: each report is one request, refilled in arrival order, so the second pass's reports
  # are drafted from a matrix that has seen the first (a cold one would repeat its acceptance).
  reports = list(serve(params, cfg, PROMPTS * 2, TokenRecycling(), spec, batch_size=1,
                       continuous=True))
  assert [s.index for r in reports for s in r.served] == list(range(2 * n))
  assert [s.tokens for r in reports for s in r.served] == [t[:6] for t in tiny_reference] * 2
  first, second = (np.mean([r.acceptance for r in reports[i:i + n]]) for i in (0, n))
  assert second > first + 0.02, (first, second)


def test_goodput_estimate_carries_and_costs_are_calibrated_once(tiny, tiny_reference,
                                                                calibrations):
  """A drafter that is never kept pays the optimistic prior's long draft in the first report
  only; the step costs are calibrated once, on the first batch_size requests."""
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, goodput=Goodput())
  reports = list(serve(params, cfg, PROMPTS[:6], test_goodput.Contrary(), spec, batch_size=2,
                       continuous=True))
  assert [s.tokens for s in _by_index(reports)] == tiny_reference[:6]
  assert calibrations == [2]
  first, *later = (r.k_steps for r in reports)
  assert first[3] >= 1 and all(k[2:].sum() == 0 for k in later), [r.k_steps for r in reports]
  with pytest.raises(ValueError, match="carries from request to request already"):
    next(serve(params, cfg, PROMPTS[:2], test_goodput.Contrary(), spec, batch_size=2,
               continuous=True, carry_estimate=True))
