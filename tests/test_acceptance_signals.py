"""research/acceptance_signals.py: each signal is paired with the acceptance of the draft after
it, and the bound of goodput per bin is exact where it can be computed by hand."""
import types

import jax
import numpy as np
import pytest

from speculax.drafters.eagle import Eagle
from speculax.models import llama
from speculax.research.acceptance_gap import first_draft_signals
from speculax.research.acceptance_signals import bin_table, bins, bound, pairs, report

from test_eagle import _params as eagle_params
from tiny_prompts import PROMPTS


def test_free_signals_come_from_the_position_before():
  kept = [np.array([1.0, 0.0, 1.0]), np.array([0.0, 1.0])]
  p_top = [np.array([0.1, 0.2, 0.3]), np.array([0.4, 0.5])]
  q_top = [np.array([0.6, 0.7, 0.8]), np.array([0.9, 0.95])]
  agree = [np.array([True, False, True]), np.array([False, True])]
  got = pairs(kept, p_top, q_top, agree)
  np.testing.assert_array_equal(got["kept"], [0.0, 1.0, 1.0])
  np.testing.assert_array_equal(got["drafter confidence"], [0.7, 0.8, 0.95])  # the draft's own
  np.testing.assert_array_equal(got["target confidence"], [0.1, 0.2, 0.4])  # one before
  np.testing.assert_array_equal(got["previous kept"], [1.0, 0.0, 0.0])


def test_bins_and_their_acceptance():
  np.testing.assert_array_equal(bins(np.array([0.0, 0.19, 0.2, 0.79, 0.95, 1.0]), "x"),
                                [0, 0, 1, 3, 4, 4])
  np.testing.assert_array_equal(bins(np.array([1.0, 0.0]), "previous kept"), [1, 0])
  share, accept = bin_table(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0, 0, 3, 3]))
  np.testing.assert_allclose(share, [0.5, 0.5])  # bin 1, 2 empty: dropped
  np.testing.assert_allclose(accept, [0.5, 1.0])


def test_bound_at_batch_one_by_hand():
  # half the positions never kept, half always; a one-draft step costs 1.5 plain ones: fixed
  # k = 1 emits 1.5 per 1.5 (= plain); per bin: plain where never kept, a draft where always:
  # (0.5 * 1 + 0.5 * 2) / (0.5 * 1 + 0.5 * 1.5) = 1.2
  got = bound(np.array([0.5, 0.5]), np.array([0.0, 1.0]), 1.5, batch=1)
  assert got == pytest.approx({"fixed k=1": 1.0, "pooled best": 1.0, "per bin": 1.2,
                               "drafting share": 0.5})
  got = bound(np.array([0.5, 0.5]), np.array([0.2, 0.6]), 1.3, batch=1)
  assert got["per bin"] == pytest.approx(1.3 / 1.15)
  assert got["fixed k=1"] == pytest.approx(1.4 / 1.3)


def test_a_large_batch_averages_the_signal_away():
  share, accept = np.array([0.5, 0.5]), np.array([0.2, 0.6])
  one, many = bound(share, accept, 1.3, batch=1), bound(share, accept, 1.3, batch=64)
  assert one["per bin"] > one["pooled best"] * 1.04
  assert many["drafting share"] > 0.99  # the batch's mean (0.4) pays every step
  assert many["per bin"] == pytest.approx(many["fixed k=1"], rel=2e-3)


def test_report_shows_each_signal_and_gain():
  entry = {"positions": 10, "acceptance": 0.5, "signals": {
      s: {"share": [0.5, 0.5], "acceptance": [0.0, 1.0],
          "bound": {"c=1.5 b=1": bound(np.array([0.5, 0.5]), np.array([0.0, 1.0]), 1.5, 1)}}
      for s in ("drafter confidence", "previous kept")}}
  text = report({"command": "c", "heads": "h", "machine": "m", "date": "d",
                 "sets": {"held-out greedy": entry}})
  assert "| drafter confidence | 0.50/0.00 0.50/1.00 | +20.0% |" in text
  assert "| previous kept |" in text and "held-out greedy: 10 positions" in text


def test_first_draft_signals_cover_the_drafted_positions(tiny, tiny_reference):
  cfg, params = tiny
  eagle = Eagle()
  model = types.SimpleNamespace(params=params, config=cfg)
  docs = [list(p) + list(a) for p, a in zip(PROMPTS, tiny_reference)]
  got = first_draft_signals(eagle, eagle_params(cfg, params, eagle), model, docs,
                            [len(p) for p in PROMPTS])
  assert [len(x) for x in got["p_top"]] == [len(a) - 1 for a in tiny_reference]
  for name in ("p_top", "q_top", "accept"):
    values = np.concatenate(got[name])
    assert ((values > 0) & (values <= 1 + 1e-6)).all(), name
  # the answers are the target's greedy ones: its top probability at m is that of token m + 1
  doc, start = np.array(docs[0], np.int32), len(PROMPTS[0])
  logits = llama.forward(params, cfg, doc[None], np.arange(len(doc))[None])[0][0]
  law = np.asarray(jax.nn.softmax(logits.astype(np.float32)))
  want = law[np.arange(start, len(doc) - 1), doc[start + 1:]]
  np.testing.assert_allclose(got["p_top"][0], want, rtol=1e-5)
