"""research/skip_frontier.py: sublayer skipping by zeroed projections, its cost model, the
ranked frontier at both granularities."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.models import llama
from speculax.research import skip_frontier as sf
from test_layer_skip_search import CFG, model  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def params(model):  # the search tests' target: layers that matter unequally
  return model[1]


@pytest.fixture(scope="module")
def scorer(params):
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (7, 11)]
  answers = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (9, 5)]
  return sf.Scorer(params, CFG, prompts, answers)


def _forward(params, tokens, **kw):
  return llama.forward(params, CFG, tokens, llama.row_positions(*tokens.shape), **kw)[0]


def test_zeroed_units_skip_the_layer(params):
  """Zeroing a layer's o and down is the forward that skips the layer; zeroing one of them
  changes the output (so each unit is really cut)."""
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, CFG.vocab_size)
  mask = jnp.ones(CFG.n_layers, bool).at[2].set(False)
  skipped = _forward(params, tokens, layer_mask=mask)
  both = _forward(sf.zeroed(params, [("attention", 2), ("mlp", 2)]), tokens)
  np.testing.assert_allclose(both, skipped, atol=1e-5)
  full = _forward(params, tokens)
  for unit in sf.UNITS:
    one = _forward(sf.zeroed(params, [(unit, 2)]), tokens)
    assert float(jnp.abs(one - full).max()) > 1e-3, unit
    assert float(jnp.abs(one - skipped).max()) > 1e-3, unit


def test_unit_weights_count_the_params(params):
  sizes = {name: int(np.prod(w.shape[1:])) for name, w in params["layers"].items()}
  w = sf.unit_weights(CFG)
  assert w["attention"] == sum(sizes[n] for n in ("q", "k", "v", "o"))
  assert w["mlp"] == sum(sizes[n] for n in ("gate", "up", "down"))
  assert sf.draft_cost(CFG, [], CFG.vocab_size) == pytest.approx(1.0)
  layers = CFG.n_layers * (w["attention"] + w["mlp"])
  full = layers + CFG.vocab_size * CFG.d_model
  assert sf.draft_cost(CFG, [("mlp", 1), ("attention", 3)], 64) == pytest.approx(
      (layers - w["mlp"] - w["attention"] + 64 * CFG.d_model) / full)


def test_scorer_counts_answer_positions_only(params, scorer):
  assert scorer([]) == 1.0
  assert scorer.counted.sum() == 9 + 5
  assert scorer.counted[0, 6] and not scorer.counted[0, 5]  # 7 prompt tokens: 6 predicts 7
  everything = [(u, i) for i in range(CFG.n_layers) for u in sf.UNITS]
  assert scorer(everything) < 1.0


def test_frontier_at_both_granularities(scorer):
  result = sf.frontier(scorer, CFG, rounds=3, vocab_trim=128)
  assert set(result) == {"layers", "sublayers"}
  for name, per_round in (("layers", 2), ("sublayers", 1)):
    trace, alone = result[name]["rounds"], result[name]["alone"]
    assert len(alone) == (CFG.n_layers - 2) * (len(sf.UNITS) // per_round)
    assert all(len(a["skipped"]) == per_round and a["agreement"] == scorer(a["skipped"])
               for a in alone)
    assert len(trace) == 4 and trace[0]["skipped"] == [] and trace[0]["agreement"] == 1.0
    costs = [r["cost"] for r in trace]
    assert all(a > b for a, b in zip(costs, costs[1:])), costs
    for r, entry in enumerate(trace):
      assert len(entry["skipped"]) == per_round * r
      assert 0.0 <= entry["agreement"] <= 1.0
      assert entry["agreement"] == scorer(entry["skipped"])
  # Layer 1 writes the residual at 0.05 of the others' scale: the first whole layer to go.
  assert {i for _, i in result["layers"]["rounds"][1]["skipped"]} == {1}
  table = sf.markdown({"model": "tiny", "machine": "m", "date": "d", "command": "c",
                       "frontier": {g: {"rounds": [{**r, "heldout_agreement": r["agreement"],
                                                    "estimated_speedup_k1": 1.0}
                                                   for r in grain["rounds"]]}
                                    for g, grain in result.items()}})
  assert "| layers | 1 |" in table
  assert any(f"| sublayers | {i}{u[0]} |" in table for i in range(1, 5) for u in sf.UNITS)


@pytest.mark.parametrize("kw, match", [(dict(rounds=0), "rounds must be >= 1, got 0"),
                                       (dict(vocab_trim=0), "vocab_trim must be in 1..256, got 0"),
                                       (dict(vocab_trim=257), "got 257")])
def test_bad_input(scorer, kw, match):
  with pytest.raises(ValueError, match=match):
    sf.frontier(scorer, CFG, **{"rounds": 2, "vocab_trim": 128, **kw})
