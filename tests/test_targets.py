"""Targets beyond SmolLM2: Llama-3 (llama3 RoPE scaling, untied), Qwen2 (q/k/v biases) and Qwen3
(q/k RMSNorm, explicit head_dim) from Hugging Face folders that transformers writes here.

Each family: logits of our loader + model against transformers' (float32, every position),
greedy decoding against transformers' generate, and the speculative loop (prompt lookup, layer
skip) token for token against our target-only greedy decoding. Then the loaders' refusals, and
the Llama-3 / Qwen2 pre-tokenizers against transformers' PreTrainedTokenizerFast.
"""
from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models import hf_loader, llama, sharding
from speculax.models.config import LlamaConfig, get_preset
from speculax.models.sharding import MeshConfig
from speculax.models.tokenizer import Tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REL_TOL = 1e-4
VOCAB = 256
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
SIZES = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
         "rms_norm_eps": 1e-5}
# family -> (transformers config class name, its extra arguments, what our config must say)
FAMILIES = {
    "llama3": ("LlamaConfig", {"rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE,
                               "tie_word_embeddings": False}, {"tie_embeddings": False}),
    "qwen2": ("Qwen2Config", {"rope_theta": 1e6, "tie_word_embeddings": True},
              {"qkv_bias": True, "tie_embeddings": True}),
    # head_dim 32 is not hidden_size / heads (16), as in the real Qwen3s.
    "qwen3": ("Qwen3Config", {"rope_theta": 1e6, "head_dim": 32, "tie_word_embeddings": False},
              {"qk_norm": True, "head_dim": 32}),
}
PROMPTS = [[5, 9, 200, 31, 5, 9, 200, 31, 5, 9], [77, 3, 140, 12, 250, 18, 99]]
NEW = 12


def tiny_hf(family: str, seed: int = 0):
  """A random transformers model: norms around 1 and biases nonzero (transformers' init sets
  them to 1 and 0, where a swapped or dropped one would not show), weights x4 so logits are far
  from uniform and greedy margins comfortable."""
  name, extra, _ = FAMILIES[family]
  cfg = getattr(transformers, name)(**SIZES, **extra)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
  with torch.no_grad():
    for key, p in model.named_parameters():
      if key.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      elif key.endswith(".bias"):
        p.copy_(0.5 * torch.randn_like(p))
      else:
        p.mul_(4.0)
  return model


def saved_and_loaded(family: str, tmp_path_factory):
  """(family, transformers model, our config, our params) read from a save_pretrained folder."""
  model = tiny_hf(family)
  folder = tmp_path_factory.mktemp(family)
  model.save_pretrained(folder)
  assert (folder / "model.safetensors").is_file()
  config, params = hf_loader.load_hf_folder(folder)
  return family, model, config, params


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def target(request, tmp_path_factory):
  return saved_and_loaded(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def reference(target) -> list[list[int]]:
  """Our target-only greedy tokens for PROMPTS (batched)."""
  _, _, config, params = target
  return generate(params, config, PROMPTS, GenerateConfig(max_new_tokens=NEW)).tokens


def rel_err(ours, ref) -> float:
  ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
  return float(np.abs(ours - ref).max() / np.abs(ref).max())


def test_config_reads_the_family(target):
  family, model, config, _ = target
  for field, value in FAMILIES[family][2].items():
    assert getattr(config, field) == value, field
  assert config.head_dim == getattr(model.config, "head_dim", 16)
  assert (config.rope_scaling is not None) == (family == "llama3")


def test_logits_match_transformers(target):
  _, model, config, params = target
  # 40 positions: past original_max_position (32), where llama3 scaling matters most.
  tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 40))
  with torch.no_grad():
    ref = model(torch.from_numpy(tokens)).logits.float().numpy()
  positions = jnp.broadcast_to(jnp.arange(40, dtype=jnp.int32), (2, 40))
  ours, _, _ = llama.forward_jit(params, config, jnp.asarray(tokens, jnp.int32), positions)
  assert ours.shape == ref.shape
  assert rel_err(ours, ref) < REL_TOL


def test_greedy_decoding_matches_transformers_generate(target, reference):
  model = target[1]
  for prompt, ours in zip(PROMPTS, reference):
    with torch.no_grad():
      ref = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                           pad_token_id=0)
    assert ours == ref[0, len(prompt):].tolist()


@pytest.mark.parametrize("drafter", ["prompt-lookup", "layer-skip"])
def test_speculative_equals_target_only_greedy(target, reference, drafter):
  _, _, config, params = target
  make = {"prompt-lookup": PromptLookup, "layer-skip": lambda: LayerSkip.skipping(3, [1])}
  out = speculative_generate(params, config, PROMPTS, make[drafter](),
                             SpecConfig(k=3, max_new_tokens=NEW))
  assert out.tokens == reference


def test_sharded_speculative_equals_target_only_greedy(tmp_path_factory):
  """Qwen2's biases carry logical axes: heads split over the tensor axis like q itself. (Qwen3's
  q/k norms are [q], replicated like every norm; an 8-device compile costs ~15 s, so one family.)"""
  _, _, config, params = saved_and_loaded("qwen2", tmp_path_factory)
  reference = generate(params, config, PROMPTS, GenerateConfig(max_new_tokens=NEW)).tokens
  mesh = MeshConfig(data=2, tensor=2)
  layers = sharding.shard_params(params, config, sharding.make_mesh(mesh), mesh.rules)["layers"]
  for key in ("q_bias", "k_bias", "v_bias"):
    l, n, q = layers[key].shape  # heads or kv heads split 2 ways
    assert layers[key].sharding.shard_shape((l, n, q)) == (l, n // 2, q), key
  out = speculative_generate(params, config, PROMPTS, LayerSkip.skipping(3, [1]),
                             SpecConfig(k=3, max_new_tokens=NEW), mesh=mesh)
  assert out.tokens == reference


# ----- config records and export of the new fields -----


def test_architecture_omits_new_fields_at_their_default():
  """Shipped drafters recorded targets before qkv_bias / qk_norm existed; they must still match."""
  tiny = get_preset("tiny")
  assert "qkv_bias" not in tiny.architecture() and "qk_norm" not in tiny.architecture()
  qwen = dataclasses.replace(tiny, qkv_bias=True, qk_norm=True)
  record = json.loads(json.dumps(qwen.architecture()))
  assert record["qkv_bias"] is True and LlamaConfig.from_architecture(record) == qwen
  assert LlamaConfig.from_architecture(tiny.architecture()) == tiny


@pytest.mark.parametrize("changes,model_type", [
    ({}, "llama"), ({"qkv_bias": True}, "qwen2"), ({"qk_norm": True}, "qwen3")])
def test_config_to_hf_round_trips(tmp_path, changes, model_type):
  config = dataclasses.replace(get_preset("tiny-untied-llama3"), **changes)
  cfg = hf_loader.config_to_hf(config, torch_dtype="float32")
  assert cfg["model_type"] == model_type
  assert hf_loader.config_from_hf(cfg, tmp_path / "config.json") == config
  # transformers reads it as the same model.
  theirs = transformers.AutoConfig.for_model(**cfg)
  assert (theirs.model_type, theirs.num_hidden_layers) == (model_type, config.n_layers)


def test_config_to_hf_refuses_bias_and_norm_together():
  config = dataclasses.replace(get_preset("tiny"), qkv_bias=True, qk_norm=True)
  with pytest.raises(ValueError, match="qkv_bias=True and qk_norm=True"):
    hf_loader.config_to_hf(config, torch_dtype="float32")


# ----- bad input -----


@pytest.fixture
def saved(tmp_path):
  """A save_pretrained folder of a tiny Qwen2 (biases) and one of a tiny Qwen3 (q/k norm)."""
  out = {}
  for family in ("qwen2", "qwen3"):
    tiny_hf(family).save_pretrained(tmp_path / family)
    out[family] = tmp_path / family
  return out


def _edit_config(folder, **changes):
  path = folder / "config.json"
  path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("family,changes,match", [
    ("qwen2", {"model_type": "qwen2_moe"}, r"model_type='qwen2_moe'.*'llama', 'qwen2', 'qwen3'"),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window=True"),
    ("qwen3", {"layer_types": ["full_attention", "sliding_attention", "full_attention"]},
     "layer_types lists 'sliding_attention'"),
    ("qwen3", {"attention_bias": True}, "attention_bias=True"),
    ("qwen3", {"architectures": ["Qwen2ForCausalLM"]}, r"Qwen2ForCausalLM.*Qwen3ForCausalLM"),
])
def test_unsupported_configs_are_named(saved, family, changes, match):
  _edit_config(saved[family], **changes)
  with pytest.raises(ValueError, match=match) as e:
    hf_loader.load_hf_folder(saved[family])
  assert "config.json" in str(e.value)


@pytest.mark.parametrize("family,key", [("qwen2", "model.layers.1.self_attn.k_proj.bias"),
                                        ("qwen3", "model.layers.2.self_attn.q_norm.weight")])
def test_missing_bias_or_norm_is_named(saved, family, key):
  from safetensors.numpy import load_file, save_file
  path = saved[family] / "model.safetensors"
  tensors = load_file(str(path))
  del tensors[key]
  save_file(tensors, str(path))
  with pytest.raises(ValueError, match=rf"{saved[family]}.*missing keys \['{key}'\]"):
    hf_loader.load_hf_folder(saved[family])


def test_a_llama_folder_with_qwen_keys_is_refused(saved):
  """A bias in a folder whose config says llama is an unexpected key, not silently dropped."""
  _edit_config(saved["qwen2"], model_type="llama", architectures=["LlamaForCausalLM"])
  with pytest.raises(ValueError, match=r"unexpected keys \['model.layers.0.self_attn.k_proj.bias'"):
    hf_loader.load_hf_folder(saved["qwen2"])


# ----- Llama-3 / Qwen2 pre-tokenizers -----

# Written out as Llama-3's and Qwen2's own tokenizer.json files write them (not from our code).
_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}%s"
          "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
HF_PIPELINES = {
    "llama-bpe": (None, _SPLIT % "{1,3}", True),
    "qwen2": ({"type": "NFC"}, _SPLIT % "", False),
}
CORPUS = ["Hello world", "12345 123 1234 they're we'll    ", "x = [\n    1,\n    22]\n",
          "café naïve 日本語", "don't stop", "  \n\n\t\t  "]
TEXTS = ["Hello world", "I'VE got 12345 zebras, they're 3.14159 each", "x = [\n    1,\n    22]\n",
         "a  1    2\t\t3", "  leading and trailing   ", "\n\n\nnewlines\r\n\r\n",
         "café naïve 日本語 😀 ½² ٣", "cafe\u0301 decomposed", "don't WE'LL it's", " zebra"]


def _tiny_bpe() -> tuple[list[str], list[str]]:
  """A byte-level vocabulary with merges across digits, spaces and contractions (trained with
  GPT-2's split, so a wrong split shows up as other ids), plus ' zebra' as a whole entry with
  no merge path (only ignore_merges finds it)."""
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers
  backend = tokenizers.Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  trainer = trainers.BpeTrainer(vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  backend.train_from_iterator(CORPUS * 5, trainer)
  spec = json.loads(backend.to_str())["model"]
  tokens = sorted(spec["vocab"], key=spec["vocab"].get) + ["Ġzebra"]
  merges = [m if isinstance(m, str) else " ".join(m) for m in spec["merges"]]
  return tokens, merges


def _tokenizer_gguf(path, pre: str, tokens, merges):
  """A tensor-less GGUF holding only byte-level BPE tokenizer metadata."""
  import gguf
  writer = gguf.GGUFWriter(str(path), "llama")
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre(pre)
  writer.add_token_list(tokens)
  writer.add_token_types([1] * len(tokens))
  writer.add_token_merges(merges)
  writer.add_add_bos_token(False)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def _hf_tokenizer_json(path, pre: str, tokens, merges):
  normalizer, split, ignore_merges = HF_PIPELINES[pre]
  spec = {
      "version": "1.0", "added_tokens": [], "normalizer": normalizer, "post_processor": None,
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
          {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
           "use_regex": False}]},
      "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                  "use_regex": True},
      "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                "ignore_merges": ignore_merges, "vocab": {t: i for i, t in enumerate(tokens)},
                "merges": merges}}
  path.mkdir()
  (path / "tokenizer.json").write_text(json.dumps(spec))
  return path


@pytest.mark.parametrize("pre", sorted(HF_PIPELINES))
def test_pre_tokenizer_ids_match_transformers(tmp_path, pre):
  tokens, merges = _tiny_bpe()
  folder = _hf_tokenizer_json(tmp_path / "hf", pre, tokens, merges)
  reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
  from_folder = Tokenizer.from_hf_folder(folder)
  from_gguf = Tokenizer.from_gguf(_tokenizer_gguf(tmp_path / "t.gguf", pre, tokens, merges))
  for text in TEXTS:
    want = reference.encode(text, add_special_tokens=False)
    assert from_folder.encode(text) == want, text
    assert from_gguf.encode(text) == want, text
  whole = from_gguf.encode(" zebra") == [len(tokens) - 1]
  assert whole == (pre == "llama-bpe")  # ignore_merges: Llama-3 only
  # The splits differ where they should: Llama-3 cuts numbers in threes, Qwen2 digit by digit.
  pieces = [p for p, _ in from_gguf.backend.pre_tokenizer.pre_tokenize_str("12345")]
  assert pieces == (["123", "45"] if pre == "llama-bpe" else list("12345"))
