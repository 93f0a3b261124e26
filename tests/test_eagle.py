"""EAGLE drafter: lossless chains/trees/adaptive length, its cache against a recomputation, the
training-time-test rollouts against decode-time drafting, training, bad input."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.sampling import SamplingConfig
from speculax.core.trees import DynamicTree, StaticTree
from speculax.core.types import TargetView
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters import eagle, low_precision, vocab_trim
from speculax.drafters.eagle import Eagle
from speculax.drafters.feature_layer import run_layers
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.models.kvcache import KVCache
from speculax.models.sharding import MeshConfig
from speculax.models.tables import Q8, Fused, Table

from tiny_prompts import NEW, PROMPTS


def _params(cfg, params, drafter, seed=1):
  """Random EAGLE params (nonzero everywhere, so a test can tell the pieces apart)."""
  p = drafter.init_params(cfg, jax.random.key(seed))
  keys = iter(jax.random.split(jax.random.key(seed + 1), 8))
  p["fc"] = p["fc"] + jax.random.normal(next(keys), p["fc"].shape) * 0.1
  # The init's layers are residual identities (zero output projections): make them attend, mix.
  for name in [k for k in p if k.startswith("layer")]:
    p[name] = {**p[name], **{n: jax.random.normal(next(keys), p[name][n].shape) * 0.1
                             for n in ("o", "down")}}
  p["accept"] = {"w": jax.random.normal(next(keys), (cfg.d_model,)) * 0.3, "b": jnp.asarray(1.0)}
  if "fuse" in p:
    p["fuse"] = p["fuse"] + jax.random.normal(next(keys), p["fuse"].shape) * 0.1
  return p


MODES = {"chain": Eagle(), "static-tree": Eagle(tree=StaticTree.full((3, 2, 1))),
         "dynamic-tree": Eagle(tree=DynamicTree(width=4, depth=3, children=3)),
         "eagle3": Eagle.eagle3(2), "adaptive": Eagle(stop_threshold=0.5),
         "two-layer": Eagle(draft_layers=2, tree=DynamicTree(width=4, depth=3, children=3)),
         "shallow": Eagle(shallow_layers=1, ttt_steps=2, stop_threshold=0.5)}


@pytest.mark.parametrize("mode", list(MODES))
def test_eagle_greedy_equals_target_only(tiny, tiny_reference, mode):
  cfg, params = tiny
  drafter = MODES[mode]
  out = speculative_generate(params, cfg, PROMPTS[:4], drafter, SpecConfig(k=4, max_new_tokens=NEW),
                             drafter_params=_params(cfg, params, drafter))
  assert out.tokens == tiny_reference[:4]
  assert out.row_steps > 0


@pytest.mark.parametrize("mode", ["dynamic-tree", "adaptive", "shallow"])
def test_eagle_sharded_equals_target_only(tiny, tiny_reference, mode):
  cfg, params = tiny
  drafter = MODES[mode]
  out = speculative_generate(params, cfg, PROMPTS, drafter, SpecConfig(k=4, max_new_tokens=NEW),
                             drafter_params=_params(cfg, params, drafter),
                             mesh=MeshConfig(data=4, tensor=2))
  assert out.tokens == tiny_reference


def test_eagle_batch_one_and_sampled_run(tiny, tiny_reference):
  cfg, params = tiny
  drafter = MODES["dynamic-tree"]
  out = speculative_generate(params, cfg, PROMPTS[4:5], drafter, SpecConfig(k=4, max_new_tokens=NEW),
                             drafter_params=_params(cfg, params, drafter))
  assert out.tokens == tiny_reference[4:5]
  sampled = speculative_generate(
      params, cfg, PROMPTS[:2], MODES["adaptive"],
      SpecConfig(k=4, max_new_tokens=NEW, sampling=SamplingConfig(temperature=1.0)),
      drafter_params=_params(cfg, params, MODES["adaptive"]), key=jax.random.key(3))
  assert all(len(t) == NEW for t in sampled.tokens)


@pytest.mark.parametrize("mode", ["chain", "static-tree", "eagle3", "two-layer", "shallow"])
def test_eagle_cache_matches_a_recomputation(tiny, mode):
  """After decoding, the drafter's feature and cache equal a from-scratch pass of the draft
  layers over the real entries (target features, next tokens): the cache kept the right path's
  entries."""
  cfg, params = tiny
  drafter = MODES[mode]
  dparams = _params(cfg, params, drafter)
  prompt = PROMPTS[1]
  out = speculative_generate(params, cfg, [prompt], drafter, SpecConfig(k=3, max_new_tokens=9),
                             drafter_params=dparams)
  seq = prompt + out.tokens[0]  # the last token is the pending one
  ids = jnp.asarray([seq])
  _, hidden, _ = llama.forward_jit(params, cfg, ids, jnp.arange(len(seq))[None],
                                   hidden_layers=drafter.hidden_layers)
  view = TargetView(params, None, jnp.pad(ids, ((0, 0), (0, 4))), jnp.asarray([len(seq)]),
                    prompt_hidden=hidden[:, :, :-1])
  fresh, kept = drafter.init(dparams, view, cfg, 64), out.drafter_state
  np.testing.assert_allclose(kept.feature, fresh.feature, rtol=2e-4, atol=2e-4)
  n = int(fresh.cache.lengths[0])  # the pending token's slot, or the one before (shallow)
  assert int(kept.cache.lengths[0]) == n == len(seq) - 1 - bool(drafter.shallow_layers)
  for ours, theirs in zip(kept.cache.k + kept.cache.v, fresh.cache.k + fresh.cache.v):
    np.testing.assert_allclose(ours[:, :, :n], theirs[:, :, :n], rtol=2e-4, atol=2e-4)


def _layer_tables(prepared, name="layer") -> list:
  """A prepared draft layer's dense tables: o and down alone, q/k/v and gate/up fused."""
  layer = prepared[name]
  return [layer[n] for n in ("o", "down")] + [layer["+".join(g)] for g in llama.FUSABLE]


def _drafter_features(p, params, cfg, f, tokens):
  """The draft layers' output on the entries of features f [l, b, t, d] and tokens [b, t]."""
  x = eagle._entries(p, eagle._fuse(p, f), eagle._embed(params, cfg, tokens))
  positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return run_layers(eagle._layers(p), cfg, x, positions)[0]


def test_decoding_drafts_through_tables(tiny):
  """prepare stores the draft layers', fc's and fuse's dense weights as tables of output rows
  (the form the CPU rows kernel multiplies; q/k/v and gate/up one table each), and the draft
  layers give on them what they give on the arrays (training's form)."""
  cfg, params = tiny
  drafter = Eagle.eagle3(cfg.n_layers, draft_layers=2)
  dparams = _params(cfg, params, drafter)
  prepared = drafter.prepare(dparams, params, cfg)
  for name in ("layer", "layer1"):
    layer = _layer_tables(prepared, name)
    assert [type(t) for t in layer] == [Table, Table, Fused, Fused]
  assert isinstance(prepared["fc"], Table) and isinstance(prepared["fuse"], Table)
  f = jax.random.normal(jax.random.key(5), (len(drafter.feature_layers), 1, 3, cfg.d_model))
  tokens = jnp.asarray([[1, 2, 3]])
  out = [_drafter_features(p, params, cfg, f, tokens) for p in (prepared, dparams)]
  np.testing.assert_allclose(*out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,trim", [("int8", 0), ("int8", 24), ("bfloat16", 24)])
def test_eagle_drafts_from_its_tables_in_draft_dtype(tiny, tiny_reference, dtype, trim):
  """draft_dtype: the draft layer's and fc's tables and the output rows it scores with (VocabTrim's,
  or a copy of the target's whole output layer) in that dtype (int8: rows and a scale a row);
  the entries stay those of the float32 tables to the dtype's rounding, output the target's."""
  cfg, params = tiny
  drafter = Eagle(vocab_trim=trim, draft_dtype=dtype)
  dparams = _params(cfg, params, drafter)
  if trim:
    dparams[vocab_trim.IDS] = vocab_trim.frequency_order(tiny_reference, cfg.vocab_size)
  prepared = drafter.prepare(dparams, params, cfg)
  head = prepared[vocab_trim.TRIM]["rows"] if trim else prepared[low_precision.HEAD]
  for rows in [t.rows for t in _layer_tables(prepared)] + [prepared["fc"].rows, head]:
    assert (rows.rows.dtype if isinstance(rows, Q8) else rows.dtype) == jnp.dtype(dtype)
    assert isinstance(rows, Q8) == (dtype == "int8")
  f = jax.random.normal(jax.random.key(5), (1, 1, 3, cfg.d_model))
  tokens = jnp.asarray([[1, 2, 3]])
  full = Eagle(vocab_trim=trim).prepare(dparams, params, cfg)
  out = [_drafter_features(p, params, cfg, f, tokens) for p in (prepared, full)]
  np.testing.assert_allclose(*out, rtol=0.05, atol=0.05)
  out = speculative_generate(params, cfg, PROMPTS[:4], drafter, SpecConfig(k=4, max_new_tokens=NEW),
                             drafter_params=dparams)
  assert out.tokens == tiny_reference[:4]
  assert out.row_steps > 0


@functools.partial(jax.jit, static_argnames=("drafter", "cfg"))
def _train_logits(drafter, dparams, params, cfg, batch):
  """The drafter's training logits [b, t, J, v], jitted (run op by op, each op compiles apart)."""
  return drafter.train_outputs(dparams, params, cfg, batch, jax.random.key(0))["logits"]


def test_training_time_test_matches_decode_time_drafting(tiny):
  """Step s of the training rollout from r gives the logits chain drafting gives at its s-th
  draft after the real entries up to r, with the same (teacher-forced) tokens (two draft layers:
  every layer's cache and mask line up)."""
  cfg, params = tiny
  drafter = Eagle.eagle3(cfg.n_layers, ttt_steps=3, draft_layers=2)
  dparams = _params(cfg, params, drafter)
  tokens = jnp.asarray([sum(PROMPTS, [])[:14]])
  t = tokens.shape[1]
  _, hidden, _ = llama.forward_jit(params, cfg, tokens, jnp.arange(t)[None],
                                   hidden_layers=drafter.hidden_layers)
  batch = {"tokens": tokens, "hidden": hidden, "mask": jnp.ones((1, t))}
  train = _train_logits(drafter, dparams, params, cfg, batch)
  # Jitted: op by op, the rollout compiled each op apart (~35 s of the test's time).
  init = jax.jit(drafter.init, static_argnums=(2, 3))
  step = jax.jit(eagle._step, static_argnums=1)
  head = jax.jit(llama.lm_head, static_argnums=1)
  for r in (2, 6):
    view = TargetView(params, None, jnp.pad(tokens, ((0, 0), (0, 8))), jnp.asarray([r + 2]),
                      prompt_hidden=hidden[:, :, :r + 1])
    state = init(dparams, view, cfg, 32)  # real entries 0..r; pending token r + 1
    feature, cache = state.feature, state.cache
    for s in range(1, 4):
      np.testing.assert_allclose(train[0, r, s - 1], head(params, cfg, feature)[0],
                                 rtol=2e-4, atol=2e-4)
      e = eagle._embed(params, cfg, tokens[:, r + s + 1, None])
      a, cache = step(dparams, cfg, feature[:, None], e, jnp.asarray([[r + s]]), cache,
                      jnp.ones((1, 1, 1), bool))
      feature = a[:, 0]


@pytest.mark.parametrize("shallow", [0, 1])
def test_drafting_gives_the_training_rollout_laws(tiny, shallow):
  """Chain drafting at t = 1 after the real entries up to r draws its s-th draft from the law
  step s of the training rollout from r gives, the drafts themselves as the teacher-forced
  tokens: with shallow_layers the target's layers run on the pending token and each draft
  against the target's cache as the teacher's forward runs them on the whole row."""
  cfg, params = tiny
  drafter = Eagle(ttt_steps=3, shallow_layers=shallow)
  dparams = _params(cfg, params, drafter)
  prepared = drafter.prepare(dparams, params, cfg)
  tokens, r, k = jnp.asarray([sum(PROMPTS, [])[:8]]), 6, 3  # pending token r + 1
  unstacked, cache = llama.unstack_layers(params), KVCache.init(cfg, 1, 16, per_layer=True)
  _, hidden, cache = llama.forward_jit(unstacked, cfg, tokens[:, :r + 1],
                                       jnp.arange(r + 1)[None], cache,
                                       hidden_layers=drafter.hidden_layers)
  view = TargetView(unstacked, cache, jnp.pad(tokens, ((0, 0), (0, 8))), jnp.asarray([r + 2]),
                    prompt_hidden=hidden)
  state = drafter.init(prepared, view, cfg, 16)
  draft, _, _ = jax.jit(drafter.propose, static_argnums=(4, 5, 6))(
      prepared, state, view, jax.random.key(0), cfg, k, SamplingConfig(temperature=1.0))
  row = jnp.concatenate([tokens, draft.tokens], 1)  # the drafts after the pending token
  _, hidden, _ = llama.forward_jit(params, cfg, row, jnp.arange(row.shape[1])[None],
                                   hidden_layers=drafter.hidden_layers)
  batch = {"tokens": row, "hidden": hidden, "mask": jnp.ones(row.shape)}
  train = jax.nn.softmax(_train_logits(drafter, dparams, params, cfg, batch)[0, r], -1)  # [s, v]
  np.testing.assert_allclose(draft.probs[0], train, rtol=2e-4, atol=2e-6)


def _row_logits(cfg, params, drafter, dparams):
  """The drafter's training logits on one row of 14 prompt tokens, its features the target's."""
  tokens = jnp.asarray([sum(PROMPTS, [])[:14]])
  _, hidden, _ = llama.forward_jit(params, cfg, tokens, jnp.arange(14)[None],
                                   hidden_layers=drafter.hidden_layers)
  batch = {"tokens": tokens, "hidden": hidden, "mask": jnp.ones((1, 14))}
  return _train_logits(drafter, dparams, params, cfg, batch)


def test_a_shallow_drafter_grows_from_an_eagle_drafter(tiny):
  """warm_params: an EAGLE drafter's params start one that reads tokens through the target's
  first layer with fc's token half at zero, so both draft from the target feature alone as the
  EAGLE drafter does with its token half zeroed."""
  cfg, params = tiny
  one, shallow = Eagle(), Eagle(shallow_layers=1)
  p1 = _params(cfg, params, one)
  grown = shallow.warm_params(one, p1, shallow.init_params(cfg), cfg)
  d = cfg.d_model
  np.testing.assert_array_equal(grown["fc"][:d], p1["fc"][:d])
  assert not np.any(grown["fc"][d:]) and np.any(p1["fc"][d:])
  logits = functools.partial(_row_logits, cfg, params)

  np.testing.assert_allclose(logits(shallow, grown), logits(one, {**p1, "fc": grown["fc"]}),
                             rtol=1e-5, atol=1e-5)


def test_eagle3_grows_from_an_eagle_drafter(tiny):
  """warm_params: EAGLE-1 params start an EAGLE-3 drafter whose fusion passes EAGLE-1's feature
  alone, so both give the same training logits; a drafter of a layer not fused is refused."""
  cfg, params = tiny
  one, three = Eagle(), Eagle.eagle3(cfg.n_layers, ttt_steps=1)
  p1 = _params(cfg, params, one)
  grown = three.warm_params(one, p1, three.init_params(cfg), cfg)
  logits = functools.partial(_row_logits, cfg, params)

  np.testing.assert_allclose(logits(three, grown), logits(one, p1), rtol=1e-5, atol=1e-5)
  averaged = {**p1, "fuse": three.init_params(cfg)["fuse"]}  # the fresh init: a mean of features
  assert not np.allclose(logits(three, averaged), logits(one, p1), atol=1e-3)
  with pytest.raises(ValueError, match=r"layer 0 cannot start a run fusing layers \(1, 2\)"):
    three.warm_params(Eagle(feature_layers=(0,)), p1, three.init_params(cfg), cfg)


def test_two_layers_grow_from_one(tiny):
  """warm_params: a one-layer drafter starts a two-layer one whose second layer is the identity,
  so both give the same training logits until that layer trains."""
  cfg, params = tiny
  one, two = Eagle(), Eagle(draft_layers=2)
  p1 = _params(cfg, params, one)
  grown = two.warm_params(one, p1, two.init_params(cfg), cfg)
  assert sorted(grown) == sorted(two.init_params(cfg))
  logits = functools.partial(_row_logits, cfg, params)
  np.testing.assert_allclose(logits(two, grown), logits(one, p1), rtol=1e-5, atol=1e-5)
  trained = {**grown, "layer1": _params(cfg, params, two, seed=5)["layer1"]}
  assert not np.allclose(logits(two, trained), logits(one, p1), atol=1e-3)


def test_ttt_mask_structure():
  m = eagle.ttt_mask(4, 3)  # rows/cols: step-major, position-minor
  assert m[:4, :4].tolist() == np.tril(np.ones((4, 4), bool)).tolist()  # step 1 is causal
  # Step 3 at position 3 started its rollout at r = 1: real entries 0, 1, then its own.
  assert np.flatnonzero(m[8 + 3]).tolist() == [0, 1, 4 + 2, 8 + 3]
  assert m.sum(1).min() >= 1


def test_adaptive_length_stops_early(tiny):
  """The acceptance head's stop rule: drafts beyond the stop are not verified."""
  cfg, params = tiny
  drafter = MODES["adaptive"]
  dparams = _params(cfg, params, drafter)
  dparams["accept"] = {"w": jnp.zeros((cfg.d_model,)), "b": jnp.asarray(-30.0)}  # P(kept) ~ 0
  out = speculative_generate(params, cfg, PROMPTS[:2], drafter, SpecConfig(k=4, max_new_tokens=NEW),
                             drafter_params=dparams)
  # 1 - P(kept) > 0.5 after the first draft: one draft per step, never a second.
  assert out.accepted_at[1:].sum() == 0 and out.accepted_at[0] > 0 and out.draft_length == 1.0


def test_untrained_acceptance_head_is_the_drafts_confidence(tiny):
  """Before training, the acceptance head predicts each draft's top probability (EAGLE-2's
  proxy), finite even where the drafter is certain."""
  from speculax.drafters.eagle import _accept_logit
  cfg, _ = tiny
  p = Eagle().init_params(cfg)
  a = jax.random.normal(jax.random.key(0), (3, cfg.d_model))
  logits = jax.random.normal(jax.random.key(1), (3, cfg.vocab_size)) * jnp.array([[0.], [2.], [9.]])
  np.testing.assert_allclose(jax.nn.sigmoid(_accept_logit(p, a, logits)),
                             jax.nn.softmax(logits).max(-1), rtol=1e-5)
  certain = jnp.zeros((1, cfg.vocab_size)).at[0, 0].set(1e4)
  assert np.isfinite(_accept_logit(p, a[:1], certain)).all()


def test_bad_eagle_input(tiny):
  cfg, params = tiny
  for bad in (0.0, 1.0, -0.2, 1.5):
    with pytest.raises(ValueError, match=f"Eagle.stop_threshold must be a finite number > 0 and < 1 or None, got {bad}"):
      Eagle(stop_threshold=bad)
  with pytest.raises(ValueError, match="applies to chains"):
    Eagle(stop_threshold=0.5, tree=StaticTree.full((2,)))
  with pytest.raises(ValueError, match="shallow_layers=2 drafts chains"):
    Eagle(shallow_layers=2, tree=StaticTree.full((2,)))
  with pytest.raises(ValueError, match=f"shallow_layers={cfg.n_layers} must be below the "
                                       f"target's {cfg.n_layers} layers"):
    Eagle(shallow_layers=cfg.n_layers).check(cfg, Eagle().init_params(cfg), 3)
  other = get_preset("tiny-untied-llama3")
  foreign = Eagle().init_params(other)
  with pytest.raises(ValueError, match="trained on another target"):
    speculative_generate(params, cfg, [[1, 2]], Eagle(), SpecConfig(k=3), drafter_params=foreign)
  with pytest.raises(ValueError, match="trained on another target"):  # EAGLE-1 params, EAGLE-3
    speculative_generate(params, cfg, [[1, 2]], Eagle.eagle3(2), SpecConfig(k=3),
                         drafter_params=Eagle().init_params(cfg))
  with pytest.raises(ValueError, match=r"missing \['layer1/"):  # one layer's params, two
    speculative_generate(params, cfg, [[1, 2]], Eagle(draft_layers=2), SpecConfig(k=3),
                         drafter_params=Eagle().init_params(cfg))
  with pytest.raises(ValueError, match="needs its trained params"):
    speculative_generate(params, cfg, [[1, 2]], Eagle(), SpecConfig(k=3))


@pytest.mark.parametrize("drafter", [Eagle(stop_threshold=0.5),
                                     Eagle.eagle3(2, ttt_steps=2, stop_threshold=0.5)],
                         ids=["eagle1", "eagle3"])
def test_eagle_learns_the_target_and_its_acceptance(tiny, drafter):
  """Self-distillation on target features: held-out acceptance of every trained depth rises and
  the acceptance head's loss falls; the target stays frozen."""
  from speculax.train.distill import eval_metrics, init_state, train_step
  from speculax.train.heads import HeadsConfig
  from speculax.train.optim import OptimConfig
  cfg, params = tiny
  heads = HeadsConfig(drafter, optim=OptimConfig(learning_rate=3e-3, warmup_steps=2,
                                                 total_steps=30))
  rng = np.random.default_rng(0)

  def batch():
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (8, 24)))
    logits, hidden, _ = llama.forward_jit(params, cfg, tokens, jnp.arange(24)[None],
                                          hidden_layers=drafter.hidden_layers)
    logprobs, ids = jax.lax.top_k(jax.nn.log_softmax(logits), 16)
    return {"tokens": tokens, "hidden": hidden, "ids": ids.astype(jnp.int32),
            "logprobs": logprobs, "mask": jnp.ones(tokens.shape, jnp.float32)}

  train, held = batch(), batch()
  frozen = jax.tree.map(np.copy, params)
  state = init_state(_params(cfg, params, drafter), heads)
  before = eval_metrics(state.params, cfg, heads, held, params)
  for _ in range(heads.optim.total_steps):
    state, _ = train_step(state, train, cfg, heads, params)
  after = eval_metrics(state.params, cfg, heads, held, params)
  for j in range(1, drafter.ttt_steps + 1):
    assert after[f"acceptance/depth{j}"] > before[f"acceptance/depth{j}"] + 0.01, j
    assert after[f"acceptance_head_bce/depth{j}"] < before[f"acceptance_head_bce/depth{j}"], j
  jax.tree.map(np.testing.assert_array_equal, params, frozen)
