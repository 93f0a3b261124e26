"""bf16 decoding (models/config.PRECISIONS): bf16 weights, and a bf16 KV cache, with logits and
sampling in float32; speculative output equals autoregressive output in the same precision.
Layer skip and draft models drafting from a bf16 (float16, int8) copy of a float32 target's
weights keep the float32 target's output.

(With bf16 weights alone a verify forward and a one-token step agree to float32 rounding, as in
float32. A bf16 cache or bf16 activations round the two paths differently, so on a near tie
greedy output can part: tested here on the tiny model, whose ties are rare, and measured on
SmolLM2 by research/bf16_agreement.py.)
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters import low_precision, registry, vocab_trim
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models import llama
from speculax.models.kvcache import KVCache
from speculax.models.load import LoadedModel, load, with_precision
from speculax.models.tables import Q8, Fused, Table

from tiny_prompts import NEW, PROMPTS

@pytest.fixture(scope="module", params=["bf16 weights", "bf16 weights + cache"])
def tiny16(tiny, request):
  """The tiny test model with its weights rounded to bf16 (and its cache in bf16)."""
  model = with_precision(LoadedModel(*tiny, tokenizer=None), request.param)
  return model.config, model.params


@pytest.fixture(scope="module")
def reference16(tiny16):
  cfg, params = tiny16
  return [generate(params, cfg, [p], GenerateConfig(max_new_tokens=NEW)).tokens[0]
          for p in PROMPTS]


def test_weights_and_cache_are_bf16_logits_float32(tiny16):
  cfg, params = tiny16
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  cache_dtype = jnp.bfloat16 if cfg.runtime.cache_dtype == "bfloat16" else jnp.float32
  cache = KVCache.init(cfg, 2, 16)
  assert cache.k.dtype == cache.v.dtype == cache_dtype
  logits, _, cache = llama.forward_jit(params, cfg, jnp.ones((2, 3), jnp.int32),
                                       jnp.broadcast_to(jnp.arange(3), (2, 3)), cache)
  assert logits.dtype == jnp.float32 and cache.k.dtype == cache_dtype


def test_bf16_weights_round_the_float32_model(tiny, tiny16):
  """The bf16 run is the float32 model rounded: close, and not the same numbers."""
  x = (jnp.asarray([PROMPTS[1]]), jnp.arange(len(PROMPTS[1]))[None])
  (cfg16, params16), (cfg, params) = tiny16, tiny
  a = llama.forward_jit(params16, cfg16, *x)[0]
  b = llama.forward_jit(params, cfg, *x)[0]
  assert 0 < float(jnp.abs(a - b).max()) < 0.5


def _drafter(cfg, params, name):
  tree = DynamicTree(width=3, depth=3, children=3)
  eagle = Eagle(tree=tree) if name == "eagle-tree" else Eagle()
  return {"prompt-lookup": (PromptLookup(), None),
          "layer-skip": (LayerSkip.skipping(cfg.n_layers, [1]), None),
          "draft-is-target-tree": (DraftModel(cfg, tree), params),
          "token-recycling": (TokenRecycling(), None),
          "eagle": (eagle, None), "eagle-tree": (eagle, None)}[name]


@pytest.mark.parametrize("name", ["prompt-lookup", "layer-skip", "draft-is-target-tree",
                                  "token-recycling", "eagle", "eagle-tree"])
def test_bf16_speculative_greedy_equals_bf16_target_only(tiny16, reference16, name):
  cfg, params = tiny16
  drafter, dparams = _drafter(cfg, params, name)
  if name.startswith("eagle"):  # an EAGLE that runs as the target does: bf16 weights
    dparams = jax.tree.map(lambda x: x.astype(jnp.bfloat16), drafter.init_params(cfg))
  out = speculative_generate(params, cfg, PROMPTS[:4], drafter,
                             SpecConfig(k=3, max_new_tokens=NEW), drafter_params=dparams)
  assert out.tokens == reference16[:4]
  assert out.tau > 1.0


def test_bf16_pallas_kernel_gives_identical_tokens(tiny16, reference16):
  """The tree-attention kernel (interpret mode) reads the bf16 cache like XLA attention does."""
  cfg, params = tiny16
  cfg = cfg.with_runtime(attention_impl="pallas-interpret", attention_block_kv=16)
  out = speculative_generate(params, cfg, PROMPTS[:2], TokenRecycling(),
                             SpecConfig(k=3, max_new_tokens=NEW))
  assert out.tokens == reference16[:2]


def test_bad_precision_is_refused_before_loading():
  with pytest.raises(ValueError, match="Runtime.param_dtype must be one of .*, got 'float64'"):
    load("smollm2-135m", dtype="float64")
  with pytest.raises(ValueError, match="Runtime.cache_dtype must be one of .*, got 'int8'"):
    load("no-such-model", cache_dtype="int8")
  with pytest.raises(ValueError, match="unknown precision 'fp8'; known: "):
    with_precision(LoadedModel(None, {}, None), "fp8")


def _self_draft(kind: str, params, cfg, **options):
  """The tiny model drafting for itself: layer skip keeping every layer, or the draft model of
  all its layers."""
  whole = {"skip": ()} if kind == "layer-skip" else {"draft_layers": cfg.n_layers}
  return registry.make(kind, params, cfg, **whole, **options)


KINDS = ["layer-skip", "draft-model"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,form", [("bfloat16", "chain"), ("bfloat16", "tree"),
                                        ("float16", "trimmed"), ("int8", "chain"),
                                        ("int8", "trimmed")])
def test_drafting_in_lower_precision_keeps_the_float32_output(tiny, tiny_reference, kind, dtype,
                                                              form):
  cfg, params = tiny
  tree = StaticTree.full((2, 2)) if form == "tree" else None
  # Every layer kept: the model itself drafts, rounded (on the tiny random model a skipped layer
  # leaves few drafts to keep: tau 1.17 at k = 3 skipping layer 0, in float32 and rounded alike).
  drafter, dparams = _self_draft(kind, params, cfg, tree=tree, draft_dtype=dtype)
  if form == "trimmed":
    drafter = dataclasses.replace(drafter, vocab_trim=24)
    dparams = {**(dparams or {}),
               vocab_trim.IDS: vocab_trim.frequency_order(tiny_reference, cfg.vocab_size)}
  out = speculative_generate(params, cfg, PROMPTS[:4], drafter,
                             SpecConfig(k=3, max_new_tokens=NEW), drafter_params=dparams)
  assert out.tokens == tiny_reference[:4]
  assert out.tau > 2.5


def _float32(w) -> np.ndarray:
  """A copy's table (an array, or Q8: int8 rows times their scales) as float32."""
  if isinstance(w, Q8):
    return np.asarray(w.rows, np.float32) * np.asarray(w.scale)[:, None]
  return np.asarray(w, np.float32)


def _out_shapes(w: Table | Fused) -> tuple:
  return w.out_shapes if isinstance(w, Fused) else (w.out_shape,)


def _rounded(x, dtype) -> np.ndarray:
  """What a copy in dtype holds of x, as float32 (int8: a table rounded row by row)."""
  return _float32(Q8.of(x) if dtype == "int8" else x.astype(dtype))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("trim", [0, 24])
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_draft_weights_are_the_drafting_layers_rounded(tiny, tiny_reference, kind, trim, dtype):
  """bfloat16: every weight of a drafting layer cast; int8: its tables (Q8), norms as they are;
  q/k/v and gate/up fused (tests/test_tables.py: their outputs unchanged)."""
  cfg, params = tiny
  if kind == "layer-skip":
    drafter, dparams = LayerSkip.skipping(cfg.n_layers, (0,), draft_dtype=dtype), None
  else:
    drafter, dparams = _self_draft(kind, params, cfg, draft_dtype=dtype)
  drafter = dataclasses.replace(drafter, vocab_trim=trim)
  order = vocab_trim.frequency_order(tiny_reference, cfg.vocab_size)
  prepared = drafter.prepare({**(dparams or {}), vocab_trim.IDS: order} if trim else dparams,
                             params, cfg)
  layers = prepared["layers"]
  layers = layers if isinstance(layers, dict) else dict(enumerate(layers))
  assert sorted(layers) == (list(drafter.keep) if kind == "layer-skip"
                            else list(range(cfg.n_layers)))
  for i, got in layers.items():
    want = llama.fused_layer(llama.decoding_layer(params, i))
    assert want.keys() == got.keys()
    for name, w in want.items():
      if isinstance(w, (Table, Fused)):
        assert _out_shapes(got[name]) == _out_shapes(w)
        rows = got[name].rows
        assert (rows.rows.dtype if dtype == "int8" else rows.dtype) == jnp.dtype(dtype)
        np.testing.assert_array_equal(_float32(rows), _rounded(w.rows, dtype))
      else:
        np.testing.assert_array_equal(_float32(got[name]),
                                      w if dtype == "int8" else _rounded(w, dtype))
  head = prepared[vocab_trim.TRIM]["rows"] if trim else prepared[low_precision.HEAD]
  want = params["embed"][np.sort(order[:trim])] if trim else params["embed"]
  np.testing.assert_array_equal(_float32(head), _rounded(want, dtype))


@pytest.mark.parametrize("kind", KINDS)
def test_lower_precision_drafts_read_the_copy(tiny, tiny_reference, monkeypatch, kind):
  """With the copy's layers zeroed the drafts are the embedding read back through the head:
  still lossless, far fewer kept. So the drafts read the copy, not the weights as they are."""
  cfg, params = tiny
  drafter, dparams = _self_draft(kind, params, cfg, draft_dtype="bfloat16")
  run = lambda: speculative_generate(params, cfg, PROMPTS[:4], drafter,
                                     SpecConfig(k=3, max_new_tokens=NEW), drafter_params=dparams)
  copied = run()
  cls = type(drafter)
  prepare = cls.prepare
  monkeypatch.setattr(cls, "prepare", lambda self, *args: (
      lambda p: {**p, "layers": jax.tree.map(jnp.zeros_like, p["layers"])})(prepare(self, *args)))
  zeroed = run()
  assert copied.tokens == zeroed.tokens == tiny_reference[:4]
  assert zeroed.tau < copied.tau - 1


@pytest.mark.parametrize("kind", KINDS)
def test_bad_draft_dtype_is_refused(tiny, kind):
  cfg, params = tiny
  with pytest.raises(ValueError, match="draft_dtype must be one of .*got 'int4'"):
    _self_draft(kind, params, cfg, draft_dtype="int4")


def test_draft_dtype_is_for_drafters_with_a_forward_of_their_own(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match=r"prompt-lookup takes no draft_dtype \(draft_dtype is for "
                                       r"layer-skip, draft-model, multi-draft-model, eagle\)"):
    registry.make("prompt-lookup", params, cfg, draft_dtype="int8")


@pytest.mark.slow
def test_smollm2_bf16_speculative_equals_bf16_autoregressive(smollm2):
  """SmolLM2 with bf16 weights: prompt lookup and the shipped EAGLE (its heads bf16 too, as
  the target runs) decode exactly the bf16 target's own greedy tokens on three HumanEval
  prompts."""
  from speculax.drafters import registry
  from speculax.models.assets import humaneval_prompts
  model = load("smollm2-135m", dtype="bfloat16")
  assert jax.tree.leaves(model.params)[0].dtype == jnp.bfloat16
  tok = model.tokenizer
  prompts = [tok.encode(tok.chat_prompt(p)) for p in humaneval_prompts(3)]
  reference = generate(model.params, model.config, prompts,
                       GenerateConfig(max_new_tokens=24)).tokens
  f32 = generate(smollm2.params, smollm2.config, prompts, GenerateConfig(max_new_tokens=24)).tokens
  assert sum(a == b for a, b in zip(reference, f32)) >= 1  # the same model, rounded
  eagle = registry.load("results/drafters/eagle-ttt-smollm2", model)
  floats = {x.dtype for x in jax.tree.leaves(eagle.params) if jnp.issubdtype(x.dtype, jnp.floating)}
  assert floats == {jnp.dtype(jnp.bfloat16)}  # heads run as the target does
  for drafter, dparams in [registry.make("prompt-lookup", model.params, model.config),
                           (eagle.drafter, eagle.params)]:
    out = speculative_generate(model.params, model.config, prompts, drafter,
                               SpecConfig(k=2, max_new_tokens=24), drafter_params=dparams)
    assert out.tokens == reference
    assert out.tau > 1.2
