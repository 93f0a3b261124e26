"""Checkpoint loaders against independent references, and their errors on bad input.

References: transformers' own GGUF loader (it undoes llama.cpp's Q/K permutation itself) for
the real SmolLM2 file, and torch state_dicts of tiny random LlamaForCausalLM models saved with
`save_pretrained`. The HF -> Params key map is restated here from the spec, not imported.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import gguf
import jax
import numpy as np
import pytest

from speculax.models import assets, gguf_loader, hf_loader, llama
from speculax.models import load as load_mod
from speculax.models.config import LlamaConfig, RopeScaling, get_preset

from hf_models import tiny_hf_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_HF_LAYER = {  # HF suffix -> (our key, torch [out, in] -> our layout)
    "input_layernorm.weight": ("attn_norm", lambda w, c: w),
    "self_attn.q_proj.weight": ("q", lambda w, c: w.T.reshape(c.d_model, c.n_heads, c.head_dim)),
    "self_attn.k_proj.weight": ("k", lambda w, c: w.T.reshape(c.d_model, c.n_kv_heads, c.head_dim)),
    "self_attn.v_proj.weight": ("v", lambda w, c: w.T.reshape(c.d_model, c.n_kv_heads, c.head_dim)),
    "self_attn.o_proj.weight": ("o", lambda w, c: w.T.reshape(c.n_heads, c.head_dim, c.d_model)),
    "post_attention_layernorm.weight": ("mlp_norm", lambda w, c: w),
    "mlp.gate_proj.weight": ("gate", lambda w, c: w.T),
    "mlp.up_proj.weight": ("up", lambda w, c: w.T),
    "mlp.down_proj.weight": ("down", lambda w, c: w.T),
}


def expected_params(sd: dict[str, np.ndarray], c: LlamaConfig) -> dict:
  """Our Params layout from an HF state_dict (numpy), per the documented key map."""
  layers = {key: np.stack([fn(sd[f"model.layers.{i}.{suffix}"], c) for i in range(c.n_layers)])
            for suffix, (key, fn) in _HF_LAYER.items()}
  out = {"embed": sd["model.embed_tokens.weight"], "layers": layers,
         "final_norm": sd["model.norm.weight"]}
  if not c.tie_embeddings:
    out["lm_head"] = sd["lm_head.weight"].T
  return out


def assert_params_equal(ours, expected, rtol=0.0, atol=0.0):
  """Same tree structure, same shapes, values equal leaf by leaf (names the leaf on failure)."""
  ours_flat = dict(jax.tree_util.tree_leaves_with_path(ours))
  exp_flat = dict(jax.tree_util.tree_leaves_with_path(expected))
  assert sorted(map(jax.tree_util.keystr, ours_flat)) == sorted(
      map(jax.tree_util.keystr, exp_flat))
  for path, want in exp_flat.items():
    got = np.asarray(ours_flat[path])
    name = jax.tree_util.keystr(path)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def state_numpy(model) -> dict[str, np.ndarray]:
  return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


# ----- SmolLM2 GGUF vs transformers' GGUF loader -----


@pytest.fixture(scope="module")
def smollm2_path() -> pathlib.Path:
  return assets.smollm2_gguf_path()  # a missing model package fails the tests, never skips them


@pytest.fixture(scope="module")
def smollm2_ours(smollm2_path):
  return gguf_loader.load_gguf(smollm2_path)


@pytest.fixture(scope="module")
def smollm2_hf_state(smollm2_path):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32)
  return model.config, state_numpy(model)


@pytest.mark.slow
def test_smollm2_gguf_config_is_the_preset(smollm2_ours):
  config, _ = smollm2_ours
  assert config == get_preset("smollm2-135m")


@pytest.mark.slow
def test_smollm2_gguf_params_match_transformers(smollm2_ours, smollm2_hf_state):
  config, params = smollm2_ours
  hf_config, sd = smollm2_hf_state
  assert hf_config.tie_word_embeddings and config.tie_embeddings and "lm_head" not in params
  # Both sides dequantize with gguf.quants, so only the layout (incl. Q/K rows) can differ.
  assert_params_equal(params, expected_params(sd, config))


@pytest.mark.slow
def test_load_preset_returns_tokenizer_and_preset_config(smollm2_path):
  m = load_mod.load("smollm2-135m")
  assert m.config == get_preset("smollm2-135m")
  assert m.params["embed"].shape == (49152, 576)
  assert m.tokenizer.decode(m.tokenizer.encode("Hello world")) == "Hello world"


# ----- tiny GGUF files written here -----


TINY = LlamaConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                   d_ff=96, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False,
                   max_seq_len=128)


def random_hf_state(c: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
  """A torch-layout ([out, in]) state_dict of random float32 weights."""
  rng = np.random.default_rng(seed)
  r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
  d, h, k, q, f = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff
  sd = {"model.embed_tokens.weight": r(c.vocab_size, d), "model.norm.weight": r(d)}
  for i in range(c.n_layers):
    p = f"model.layers.{i}."
    sd.update({p + "input_layernorm.weight": r(d), p + "post_attention_layernorm.weight": r(d),
               p + "self_attn.q_proj.weight": r(h * q, d), p + "self_attn.k_proj.weight": r(k * q, d),
               p + "self_attn.v_proj.weight": r(k * q, d), p + "self_attn.o_proj.weight": r(d, h * q),
               p + "mlp.gate_proj.weight": r(f, d), p + "mlp.up_proj.weight": r(f, d),
               p + "mlp.down_proj.weight": r(d, f)})
  if not c.tie_embeddings:
    sd["lm_head.weight"] = r(c.vocab_size, d)
  return sd


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp's converter, verbatim: interleaves each head's two rotary halves."""
  rows, cols = w.shape
  return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


_GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_tensors(sd: dict[str, np.ndarray], c: LlamaConfig) -> dict[str, np.ndarray]:
  """HF state_dict -> GGUF tensor names and llama.cpp row order."""
  out = {"token_embd.weight": sd["model.embed_tokens.weight"],
         "output_norm.weight": sd["model.norm.weight"]}
  if "lm_head.weight" in sd:
    out["output.weight"] = sd["lm_head.weight"]
  for i in range(c.n_layers):
    for hf, g in _GGUF_NAMES.items():
      w = sd[f"model.layers.{i}.{hf}.weight"]
      w = llama_cpp_permute(w, c.n_heads) if g == "attn_q" else w
      w = llama_cpp_permute(w, c.n_kv_heads) if g == "attn_k" else w
      out[f"blk.{i}.{g}.weight"] = w
  return out


def write_gguf(path: pathlib.Path, c: LlamaConfig, tensors: dict[str, np.ndarray],
               arch: str = "llama", quantize: dict[str, gguf.GGMLQuantizationType] | None = None,
               extra_kv: dict[str, str] | None = None) -> pathlib.Path:
  w = gguf.GGUFWriter(str(path), arch=arch)
  w.add_block_count(c.n_layers)
  w.add_context_length(c.max_seq_len)
  w.add_embedding_length(c.d_model)
  w.add_feed_forward_length(c.d_ff)
  w.add_head_count(c.n_heads)
  w.add_head_count_kv(c.n_kv_heads)
  w.add_rope_freq_base(c.rope_theta)
  w.add_layer_norm_rms_eps(c.norm_eps)
  w.add_rope_dimension_count(c.head_dim)
  for key, value in (extra_kv or {}).items():
    w.add_string(key, value)
  for name, t in tensors.items():
    qtype = (quantize or {}).get(name)
    if qtype is None:
      w.add_tensor(name, t)
    else:
      w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


@pytest.fixture
def tiny_gguf(tmp_path):
  sd = random_hf_state(TINY)
  return write_gguf(tmp_path / "tiny.gguf", TINY, gguf_tensors(sd, TINY)), sd


def test_tiny_gguf_roundtrip_undoes_qk_permutation(tiny_gguf):
  path, sd = tiny_gguf
  config, params = gguf_loader.load_gguf(path)
  assert config == TINY
  assert_params_equal(params, expected_params(sd, TINY))


def test_gguf_tied_and_f16_and_q8(tmp_path):
  c = dataclasses.replace(TINY, tie_embeddings=True)
  sd = random_hf_state(c, seed=1)
  tensors = gguf_tensors(sd, c)
  tensors["blk.1.ffn_up.weight"] = tensors["blk.1.ffn_up.weight"].astype(np.float16)
  q8 = {"token_embd.weight": gguf.GGMLQuantizationType.Q8_0}
  config, params = gguf_loader.load_gguf(write_gguf(tmp_path / "t.gguf", c, tensors, quantize=q8))
  assert config.tie_embeddings and "lm_head" not in params
  want = expected_params(sd, c)
  want["layers"]["up"][1] = sd["model.layers.1.mlp.up_proj.weight"].astype(np.float16).T
  # Q8_0 keeps ~8 bits per weight: values near, not equal (scale = max|block| / 127).
  assert_params_equal(params, want, atol=0.05)
  np.testing.assert_array_equal(params["layers"]["up"][1], want["layers"]["up"][1])


def test_gguf_param_dtype_bf16(tiny_gguf):
  path, _ = tiny_gguf
  config, params = gguf_loader.load_gguf(path, param_dtype="bfloat16")
  assert config.runtime.param_dtype == "bfloat16"
  assert {str(x.dtype) for x in jax.tree.leaves(params)} == {"bfloat16"}


def test_gguf_llama3_rope_freqs_become_rope_scaling(tmp_path):
  scaling = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position=64)
  c = dataclasses.replace(TINY, rope_scaling=scaling)
  tensors = gguf_tensors(random_hf_state(c), c)
  tensors["rope_freqs.weight"] = gguf_loader.llama3_rope_factors(scaling, c.rope_theta, c.head_dim)
  config, _ = gguf_loader.load_gguf(write_gguf(tmp_path / "l3.gguf", c, tensors))
  assert config.rope_scaling is not None
  # Any parameters that give the same frequencies are the same model.
  np.testing.assert_allclose(llama.rope_inv_freq(config), llama.rope_inv_freq(c), rtol=1e-6)


def test_llama3_rope_factors_agree_with_model_frequencies():
  c = dataclasses.replace(TINY, rope_scaling=RopeScaling(original_max_position=64))
  unscaled = llama.rope_inv_freq(dataclasses.replace(c, rope_scaling=None))
  factors = gguf_loader.llama3_rope_factors(c.rope_scaling, c.rope_theta, c.head_dim)
  assert 1.0 < factors.max() and factors.min() == 1.0  # all three regimes are exercised
  assert ((factors > 1.0) & (factors < 8.0)).any()
  np.testing.assert_allclose(unscaled / factors, llama.rope_inv_freq(c), rtol=1e-6)


# ----- GGUF bad input -----


def test_gguf_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.gguf"):
    gguf_loader.load_gguf(tmp_path / "nope.gguf")


@pytest.mark.parametrize("keep", [0, 3, 40, 400, 0.5, 0.999])
def test_gguf_truncated(tiny_gguf, tmp_path, keep):
  path, _ = tiny_gguf
  data = path.read_bytes()
  n = keep if isinstance(keep, int) else int(len(data) * keep)
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[:n])
  with pytest.raises(ValueError, match="cut.gguf"):
    gguf_loader.load_gguf(cut)


def test_gguf_not_a_gguf(tmp_path):
  bad = tmp_path / "text.gguf"
  bad.write_text("hello, this is not a GGUF file at all")
  with pytest.raises(ValueError, match="text.gguf"):
    gguf_loader.load_gguf(bad)


def test_gguf_wrong_architecture(tmp_path):
  path = write_gguf(tmp_path / "g.gguf", TINY, gguf_tensors(random_hf_state(TINY), TINY),
                    arch="gpt2")
  with pytest.raises(ValueError, match=r"'gpt2'.*g\.gguf|g\.gguf.*'gpt2'"):
    gguf_loader.load_gguf(path)


def test_gguf_shape_mismatch_names_tensor(tmp_path):
  tensors = gguf_tensors(random_hf_state(TINY), TINY)
  tensors["blk.1.ffn_up.weight"] = np.zeros((TINY.d_ff + 2, TINY.d_model), np.float32)
  path = write_gguf(tmp_path / "s.gguf", TINY, tensors)
  with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight.*\(98, 64\).*\(96, 64\)"):
    gguf_loader.load_gguf(path)


def test_gguf_missing_and_unexpected_tensors_named(tmp_path):
  tensors = gguf_tensors(random_hf_state(TINY), TINY)
  del tensors["blk.1.ffn_down.weight"]
  tensors["blk.0.attn_q.bias"] = np.zeros(TINY.d_model, np.float32)
  path = write_gguf(tmp_path / "m.gguf", TINY, tensors)
  with pytest.raises(ValueError, match=r"blk\.1\.ffn_down\.weight.*blk\.0\.attn_q\.bias"):
    gguf_loader.load_gguf(path)


def test_gguf_duplicate_tensor_named(tmp_path):
  """GGUFWriter refuses duplicates, so write a same-length name and patch its bytes."""
  tensors = gguf_tensors(random_hf_state(TINY), TINY)
  tensors["blk.0.ffn_up.weighX"] = tensors["blk.0.ffn_up.weight"]
  path = write_gguf(tmp_path / "d.gguf", TINY, tensors)
  data = path.read_bytes()
  assert data.count(b"blk.0.ffn_up.weighX") == 1
  path.write_bytes(data.replace(b"blk.0.ffn_up.weighX", b"blk.0.ffn_up.weight"))
  with pytest.raises(ValueError, match=r"(?i)d\.gguf.*duplicate.*blk\.0\.ffn_up\.weight"):
    gguf_loader.load_gguf(path)


def test_gguf_unsupported_rope_scaling_type(tmp_path):
  tensors = gguf_tensors(random_hf_state(TINY), TINY)
  path = write_gguf(tmp_path / "y.gguf", TINY, tensors,
                    extra_kv={"llama.rope.scaling.type": "yarn"})
  with pytest.raises(ValueError, match="yarn"):
    gguf_loader.load_gguf(path)


# ----- Hugging Face folders -----


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
HF_CASES = {"tied": (True, None), "untied": (False, None), "llama3": (False, LLAMA3)}


@pytest.mark.parametrize("case", sorted(HF_CASES))
@pytest.mark.parametrize("shard", [None, "20KB"])
def test_hf_folder_matches_state_dict(tmp_path, case, shard):
  tie, rope = HF_CASES[case]
  model = tiny_hf_model(tie, rope)
  model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
  assert (tmp_path / "model.safetensors.index.json").exists() == bool(shard)
  config, params = hf_loader.load_hf_folder(tmp_path)
  assert (config.vocab_size, config.d_model, config.n_layers, config.n_heads, config.n_kv_heads,
          config.head_dim, config.d_ff) == (128, 64, 2, 4, 2, 16, 96)
  assert config.tie_embeddings == tie and config.norm_eps == 1e-5
  want_scaling = None if rope is None else RopeScaling(8.0, 1.0, 4.0, 64)
  assert config.rope_scaling == want_scaling
  assert_params_equal(params, expected_params(state_numpy(model), config))


def test_hf_folder_bf16(tmp_path):
  model = tiny_hf_model(False).to(torch.bfloat16)
  model.save_pretrained(tmp_path)
  _, params = hf_loader.load_hf_folder(tmp_path)
  config, params16 = hf_loader.load_hf_folder(tmp_path, param_dtype="bfloat16")
  assert_params_equal(params, expected_params(state_numpy(model), config))
  assert {str(x.dtype) for x in jax.tree.leaves(params16)} == {"bfloat16"}


def test_hf_config_v4_style_rope_scaling():
  cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 10,
         "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
         "intermediate_size": 16, "rope_theta": 500000.0, "rope_scaling": {
             **{k: v for k, v in LLAMA3.items() if k != "rope_type"}, "type": "llama3"}}
  config = hf_loader.config_from_hf(cfg, pathlib.Path("config.json"))
  assert config.rope_theta == 500000.0 and config.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 64)
  assert config.n_kv_heads == 2 and config.head_dim == 4 and not config.tie_embeddings


@pytest.fixture
def saved_hf(tmp_path):
  tiny_hf_model(False).save_pretrained(tmp_path)
  return tmp_path


def _edit_config(folder: pathlib.Path, **changes):
  path = folder / "config.json"
  cfg = json.loads(path.read_text())
  cfg.update(changes)
  path.write_text(json.dumps(cfg))


def test_hf_missing_folder(tmp_path):
  with pytest.raises(FileNotFoundError, match="absent"):
    hf_loader.load_hf_folder(tmp_path / "absent")


def test_hf_missing_config(saved_hf):
  (saved_hf / "config.json").unlink()
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf_loader.load_hf_folder(saved_hf)


def test_hf_missing_weights(saved_hf):
  (saved_hf / "model.safetensors").unlink()
  with pytest.raises(FileNotFoundError, match="model.safetensors"):
    hf_loader.load_hf_folder(saved_hf)


def test_hf_missing_shard(tmp_path):
  tiny_hf_model(False).save_pretrained(tmp_path, max_shard_size="20KB")
  shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
  shard.unlink()
  with pytest.raises(FileNotFoundError, match=shard.name):
    hf_loader.load_hf_folder(tmp_path)


def test_hf_truncated_weights(saved_hf):
  f = saved_hf / "model.safetensors"
  f.write_bytes(f.read_bytes()[:1000])
  with pytest.raises(ValueError, match="model.safetensors"):
    hf_loader.load_hf_folder(saved_hf)


@pytest.mark.parametrize("changes,match", [
    ({"model_type": "mistral"}, "mistral"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "LlamaForSequenceClassification"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "yarn"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_hf_unsupported_config(saved_hf, changes, match):
  _edit_config(saved_hf, **changes)
  with pytest.raises(ValueError, match=match):
    hf_loader.load_hf_folder(saved_hf)


def test_hf_config_missing_key_named(saved_hf):
  cfg = json.loads((saved_hf / "config.json").read_text())
  del cfg["hidden_size"]
  (saved_hf / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"config\.json.*hidden_size"):
    hf_loader.load_hf_folder(saved_hf)


def _rewrite_weights(folder: pathlib.Path, edit):
  from safetensors.numpy import load_file, save_file
  path = folder / "model.safetensors"
  tensors = load_file(str(path))
  edit(tensors)
  save_file(tensors, str(path))


def test_hf_missing_and_unexpected_keys_named(saved_hf):
  def edit(t):
    del t["model.layers.1.mlp.down_proj.weight"]
    t["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    t["model.rotary_emb.inv_freq"] = np.zeros(8, np.float32)  # ignored buffer
  _rewrite_weights(saved_hf, edit)
  with pytest.raises(ValueError, match=r"layers\.1\.mlp\.down_proj\.weight.*q_proj\.bias") as e:
    hf_loader.load_hf_folder(saved_hf)
  assert "inv_freq" not in str(e.value)


def test_hf_shape_mismatch_names_tensor(saved_hf):
  def edit(t):
    t["model.layers.0.mlp.up_proj.weight"] = np.zeros((97, 64), np.float32)
  _rewrite_weights(saved_hf, edit)
  with pytest.raises(ValueError, match=r"layers\.0\.mlp\.up_proj\.weight.*\(97, 64\).*\(96, 64\)"):
    hf_loader.load_hf_folder(saved_hf)


# ----- load() -----


def test_load_unknown_name_lists_presets():
  with pytest.raises(ValueError, match=r"smollm2-135m.*\.gguf.*folder"):
    load_mod.load("no-such-model")


def test_load_missing_path():
  with pytest.raises(FileNotFoundError, match="nowhere"):
    load_mod.load("/definitely/nowhere")


def test_load_hf_folder_with_tokenizer(saved_hf):
  tokenizers = pytest.importorskip("tokenizers")
  vocab = {f"w{i}": i for i in range(128)}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(str(saved_hf / "tokenizer.json"))
  m = load_mod.load(saved_hf)
  assert m.config.n_layers == 2 and m.tokenizer.encode("w5 w7") == [5, 7]
  with pytest.raises(dataclasses.FrozenInstanceError):
    m.config = None  # type: ignore[misc]


def test_load_gguf_path_missing_tokenizer_metadata_fails_loudly(tiny_gguf):
  path, _ = tiny_gguf
  with pytest.raises(ValueError, match="tiny.gguf"):
    load_mod.load(str(path))


def test_preset_mismatch_names_fields():
  preset = get_preset("smollm2-135m")
  wrong = dataclasses.replace(preset, n_kv_heads=9, rope_theta=1e4).with_runtime(
      param_dtype="bfloat16")
  with pytest.raises(ValueError, match=r"n_kv_heads.*rope_theta") as e:
    load_mod.check_matches_preset(wrong, preset, "smollm2-135m")
  assert "param_dtype" not in str(e.value)
