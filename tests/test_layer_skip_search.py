"""The forward's layer_mask and the greedy layer-skip search (drafters/layer_skip_search.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters import registry
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.layer_skip_search import (
  estimated_speedup,
  search_skip_set,
)
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.derive import truncated
from speculax.models.kvcache import KVCache

# Deep enough for a search with a few rounds (candidates are layers 1..4).
CFG = LlamaConfig(vocab_size=256, d_model=64, n_layers=6, n_heads=4, n_kv_heads=2, head_dim=16,
                  d_ff=128, max_seq_len=128)
K = 4


# Per-layer scale of the residual writes (o, down). At init every layer rewrites the residual
# stream and dropping any one scrambles the argmax; trained models are residual-dominated, with
# some layers mattering more than others. This mimics that, so the search has a real choice.
RESIDUAL_SCALE = (1.0, 0.05, 0.3, 0.1, 0.2, 1.0)


@pytest.fixture(scope="module")
def model():
  params = llama.init_params(CFG, jax.random.key(1))
  scale = jnp.asarray(RESIDUAL_SCALE)
  layers = {**params["layers"], "o": params["layers"]["o"] * scale[:, None, None, None],
            "down": params["layers"]["down"] * scale[:, None, None]}
  return CFG, {**params, "layers": layers}


@pytest.fixture(scope="module")
def calibration():
  rng = np.random.default_rng(0)
  return [rng.integers(0, CFG.vocab_size, n).tolist() for n in (24, 17, 30)]


@pytest.fixture(scope="module")
def result(model, calibration):
  cfg, params = model
  return search_skip_set(params, cfg, calibration, k=K)


def _inputs(b=2, t=9, seed=0):
  tokens = jax.random.randint(jax.random.key(seed), (b, t), 0, CFG.vocab_size)
  return tokens, jnp.broadcast_to(jnp.arange(t), (b, t))


def _truncated_agreement(params, cfg, calibration, skip, pad_to=40):
  """Independent recomputation: the truncated model against the full one, padded to another
  length than the search used (padding must not matter under causal attention)."""
  sub_cfg, sub = truncated(params, cfg, [i for i in range(cfg.n_layers) if i not in skip])
  tokens = np.zeros((len(calibration), pad_to), np.int32)
  for i, prompt in enumerate(calibration):
    tokens[i, :len(prompt)] = prompt
  positions = jnp.broadcast_to(jnp.arange(pad_to), tokens.shape)
  full = llama.forward_jit(params, cfg, tokens, positions)[0].argmax(-1)
  part = llama.forward_jit(sub, sub_cfg, tokens, positions)[0].argmax(-1)
  same = sum(int((full[i, :len(p)] == part[i, :len(p)]).sum()) for i, p in enumerate(calibration))
  return same / sum(len(p) for p in calibration)


def test_layer_mask_all_true_matches_plain_forward(model):
  cfg, params = model
  tokens, positions = _inputs()
  plain = llama.forward_jit(params, cfg, tokens, positions, hidden_layers=(2, -1))
  masked = jax.jit(llama.forward, static_argnames=("config", "hidden_layers"))(
      params, cfg, tokens, positions, hidden_layers=(2, -1), layer_mask=jnp.ones(6, bool))
  np.testing.assert_allclose(masked[0], plain[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(masked[1], plain[1], rtol=1e-5, atol=1e-5)
  assert masked[2] is None


@pytest.mark.parametrize("j", [0, 3, 5])
def test_layer_mask_skip_matches_truncated_model(model, j):
  cfg, params = model
  tokens, positions = _inputs(seed=j)
  sub_cfg, sub = truncated(params, cfg, [i for i in range(cfg.n_layers) if i != j])
  want, want_hidden, _ = llama.forward_jit(sub, sub_cfg, tokens, positions)
  got, hidden, _ = llama.forward_jit(params, cfg, tokens, positions,
                                     layer_mask=jnp.arange(cfg.n_layers) != j)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(hidden, want_hidden, rtol=1e-5, atol=1e-5)


def test_layer_mask_rejects_cache_unstacked_and_bad_shape(model):
  cfg, params = model
  tokens, positions = _inputs()
  keep = jnp.ones(cfg.n_layers, bool)
  cache = KVCache.init(cfg, 2, 16, per_layer=False)
  with pytest.raises(ValueError, match="layer_mask"):
    llama.forward(params, cfg, tokens, positions, cache, layer_mask=keep)
  with pytest.raises(ValueError, match="layer_mask"):
    llama.forward(llama.unstack_layers(params), cfg, tokens, positions, layer_mask=keep)
  with pytest.raises(ValueError, match="shape"):
    llama.forward(params, cfg, tokens, positions, layer_mask=jnp.ones(3, bool))


def test_search_returns_valid_drafter(result):
  d = LayerSkip.skipping(CFG.n_layers, result.skip)
  assert isinstance(d, LayerSkip)
  d.check(CFG, None, K)
  assert set(d.keep) | set(result.skip) == set(range(CFG.n_layers))
  assert not set(d.keep) & set(result.skip)
  assert 0 in d.keep and CFG.n_layers - 1 in d.keep
  assert len(result.skip) <= int(0.6 * CFG.n_layers)
  assert 0.0 <= result.agreement <= 1.0


def test_reported_agreement_matches_truncated_model(model, calibration, result):
  cfg, params = model
  assert result.skip, "the fixed-seed search is expected to skip something"
  assert result.agreement == _truncated_agreement(params, cfg, calibration, result.skip)


def test_trace_is_consistent(result):
  trace = result.trace
  assert len(trace) == int(0.6 * CFG.n_layers) + 1
  assert trace[0].skip == () and trace[0].agreement == 1.0
  for r, rec in enumerate(trace):
    assert len(rec.skip) == r
    assert set(trace[r - 1].skip) <= set(rec.skip) if r else True
    c = (CFG.n_layers - r) / CFG.n_layers
    assert rec.estimated_speedup == pytest.approx(estimated_speedup(rec.agreement, K, c))
  # Not a theorem of ranked elimination (layers interact), but true here.
  agreements = [rec.agreement for rec in trace]
  assert agreements == sorted(agreements, reverse=True)
  best = max(rec.estimated_speedup for rec in trace[1:])  # a drafter must skip something
  assert result.skip != ()
  assert result.estimated_speedup == best
  chosen = next(rec for rec in trace if rec.skip == result.skip)
  assert (chosen.agreement, chosen.estimated_speedup) == (result.agreement, best)


def test_planted_noop_layer_is_removed_first(model, calibration):
  cfg, params = model
  layers = dict(params["layers"])
  for name in ("o", "down"):
    layers[name] = layers[name].at[2].set(0.0)
  res = search_skip_set({**params, "layers": layers}, cfg, calibration, k=K,
                        max_skip_fraction=0.2)
  assert res.trace[1].skip == (2,)
  assert res.trace[1].agreement == 1.0
  assert res.skip == (2,)  # same agreement, fewer layers: the best estimate


def test_speedup_model():
  """tau / step cost, tau from core/tau.py (tested in test_goodput.py) with i.i.d. acceptance."""
  assert float(estimated_speedup(1.0, 5, 1.0)) == pytest.approx(1.0)  # the full model drafting
  assert float(estimated_speedup(0.0, 5, 0.1)) == pytest.approx(1 / 1.5)  # 1 token for 1.5
  assert float(estimated_speedup(0.5, 2, 0.5, 0.25)) == pytest.approx(1.75 / 2.5)
  both = estimated_speedup(jnp.array([0.5, 1.0]), 2, 0.5)  # [c] candidates at once
  np.testing.assert_allclose(both, [1.75 / 2, 3 / 2], rtol=1e-6)


def test_registry_builds_a_searched_drafter(model, calibration):
  cfg, params = model
  drafter, dparams = registry.make("layer-skip", params, cfg, k=K, calibration=calibration)
  assert isinstance(drafter, LayerSkip) and dparams is None


def test_two_layer_model_keeps_everything(model):
  cfg, params = truncated(model[1], model[0], [0, 5])  # no candidate: both ends are kept
  with pytest.warns(UserWarning, match="beat autoregressive"):
    res = search_skip_set(params, cfg, [[1, 2, 3]], k=2)
  assert res.skip == () and len(res.trace) == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(calibration=[]), "calibration"),
    (dict(calibration=None), "calibration"),
    (dict(calibration=[[1, 2], []]), "prompt 1"),
    (dict(calibration=[[1, 256]]), "token id 256"),
    (dict(calibration=[[-1, 3]]), "token id -1"),
    (dict(calibration=[[1.5, 2.0]]), "non-integer"),
    (dict(k=0), "k"),
    (dict(max_skip_fraction=0.0), "max_skip_fraction"),
    (dict(max_skip_fraction=1.0), "max_skip_fraction"),
    (dict(cost_floor=-0.1), "cost_floor"),
    (dict(calibration=[list(range(129))]), "max_seq_len"),
])
def test_bad_inputs_raise(model, kwargs, match):
  cfg, params = model
  args = {"calibration": [[1, 2, 3]], **kwargs}
  calib = args.pop("calibration")
  with pytest.raises(ValueError, match=match):
    search_skip_set(params, cfg, calib, **args)


def test_unstacked_params_raise(model):
  cfg, params = model
  with pytest.raises(ValueError, match="stacked"):
    search_skip_set(llama.unstack_layers(params), cfg, [[1, 2]])


def test_on_the_fly_switching_is_lossless_and_learns_which_set_pays(model, calibration):
  """SWIFT-style: the drafter starts on the cheapest set (every estimate starts at acceptance
  1), measures it on the served tokens, and moves to a set that pays more; output stays the
  target's own."""
  cfg, params = model
  prompts = [p[:12] for p in calibration]
  spec = SpecConfig(k=K, max_new_tokens=64)
  want = generate(params, cfg, prompts, GenerateConfig(max_new_tokens=64)).tokens
  # Skipping layer 1 (scale 0.05) keeps almost every draft, skipping 1 and 3 fewer.
  drafter = LayerSkip.skipping(cfg.n_layers, (1,), alternatives=[(1, 3)])
  out = speculative_generate(params, cfg, prompts, drafter, spec)
  assert out.tokens == want
  state = out.drafter_state
  steps, acceptance = np.asarray(state.steps), np.asarray(state.acceptance())
  assert steps.sum() == out.forwards - 1  # one set drafted each verify step
  assert steps[0] > steps[1] > 0  # tried the cheap set first, then kept the one that pays
  assert acceptance[0] > acceptance[1]


def test_adapt_builds_alternatives_from_the_search(model, calibration):
  cfg, params = model
  drafter, _ = registry.make("layer-skip", params, cfg, calibration=calibration, k=K, adapt=2)
  assert len(drafter.alternatives) == 2 and drafter.keep not in drafter.alternatives
  with pytest.raises(ValueError, match="adapt takes its skip sets from the search"):
    registry.make("layer-skip", params, cfg, skip=(1,), adapt=2)
  with pytest.raises(ValueError, match="adapt must be >= 0"):
    registry.make("layer-skip", params, cfg, calibration=calibration, adapt=-1)
  with pytest.raises(ValueError, match="skips every one of the target's 6 layers"):
    speculative_generate(params, cfg, [[1, 2]], LayerSkip((1, 2), alternatives=((),)))
