"""`export` writes a Hugging Face-style folder that `load()` reads back to the same logits."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from speculax.cli.main import main
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.models.export import INDEX, export
from speculax.models.load import LoadedModel, load
from speculax.models.tokenizer import Tokenizer

TEXTS = ["Hello, world!", "  spaces and ünïcode 123", "def f(x):\n  return x"]


def byte_tokenizer() -> Tokenizer:
  """A real byte-level tokenizer with exactly the tiny models' 256 ids (no merges)."""
  vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
  backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  return Tokenizer(backend=backend, bos_id=1, eos_id=0, eos_ids=(0, 2), pad_id=None,
                   add_bos=True, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}",
                   source="test")


def model_of(preset: str, **sizes) -> LoadedModel:
  cfg = dataclasses.replace(get_preset(preset), **sizes)
  return LoadedModel(cfg, llama.init_params(cfg, jax.random.key(1)), byte_tokenizer())


def logits(params, cfg) -> np.ndarray:
  tokens = jnp.asarray([[1, 5, 77, 200, 3, 9, 120, 42]])
  return np.asarray(llama.forward(params, cfg, tokens, jnp.arange(8)[None])[0])


@pytest.mark.parametrize("preset,changes", [
    ("tiny", {}), ("tiny-untied-llama3", {}), ("tiny", {"qkv_bias": True}),  # Qwen2
    ("tiny-untied-llama3", {"qk_norm": True, "head_dim": 32})])  # Qwen3
def test_float32_export_loads_back_to_identical_logits(tmp_path, preset, changes):
  model = model_of(preset, **changes)
  noise = lambda x: x + 0.1 * jax.random.normal(jax.random.key(2), x.shape)  # biases start at 0
  model = dataclasses.replace(model, params=jax.tree.map(noise, model.params))
  export(model, tmp_path / "m", dtype="float32")
  back = load(tmp_path / "m")
  assert back.config == model.config  # rope scaling, tying, eps... survive config.json
  assert ("lm_head" in back.params) == (not model.config.tie_embeddings)
  np.testing.assert_array_equal(logits(back.params, back.config),
                                logits(model.params, model.config))


def test_bf16_export_equals_params_rounded_to_bf16(tmp_path):
  model = model_of("tiny")
  export(model, tmp_path / "m")  # bfloat16 by default
  assert json.loads((tmp_path / "m/config.json").read_text())["torch_dtype"] == "bfloat16"
  back = load(tmp_path / "m")
  rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), model.params)
  jax.tree.map(np.testing.assert_array_equal, back.params, rounded)
  np.testing.assert_array_equal(logits(back.params, back.config),
                                logits(rounded, model.config))


def test_shards_respect_the_limit_and_index_lists_each_tensor_once(tmp_path):
  model = model_of("tiny", d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512)
  files = export(model, tmp_path / "m", dtype="float32", shard_mb=1)
  index = json.loads((tmp_path / "m" / INDEX).read_text())
  weight_map = index["weight_map"]
  shards = sorted(set(weight_map.values()))
  assert len(shards) > 1 and {f.name for f in files} >= {*shards, INDEX, "config.json"}
  from safetensors import safe_open
  total, seen = 0, []
  for shard in shards:
    with safe_open(str(tmp_path / "m" / shard), framework="numpy") as f:
      names = list(f.keys())  # a safe_open handle, not a dict
      sizes = [f.get_tensor(n).nbytes for n in names]
      seen += names
    assert sum(sizes) <= 10**6, shard
    total += sum(sizes)
  assert sorted(seen) == sorted(weight_map) and len(seen) == len(set(seen))
  assert "lm_head.weight" not in weight_map  # tied: HF writes no duplicate head
  assert index["metadata"]["total_size"] == total
  back = load(tmp_path / "m")
  np.testing.assert_array_equal(logits(back.params, back.config),
                                logits(model.params, model.config))


def test_tokenizer_round_trip(tmp_path):
  model = model_of("tiny")
  export(model, tmp_path / "m")
  tok, back = model.tokenizer, load(tmp_path / "m").tokenizer
  for text in TEXTS:
    ids = back.encode(text)  # BOS first (id 1 is an ordinary byte here)
    assert ids == tok.encode(text) and back.decode(ids[1:]) == text
  assert (back.bos_id, back.eos_id, back.eos_ids, back.pad_id, back.add_bos) == (
      tok.bos_id, tok.eos_id, tok.eos_ids, tok.pad_id, tok.add_bos)
  assert back.chat_template == tok.chat_template


def test_bad_input_is_named(tmp_path):
  model = model_of("tiny")
  with pytest.raises(ValueError, match="dtype 'float16'"):
    export(model, tmp_path / "a", dtype="float16")
  with pytest.raises(ValueError, match="shard_mb must be >= 1, got 0.5"):
    export(model, tmp_path / "a", shard_mb=0.5)
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="not empty.*overwrite=True"):
    export(model, tmp_path / "full")
  with pytest.raises(ValueError, match="needs a models.tokenizer.Tokenizer"):
    export(dataclasses.replace(model, tokenizer=object()), tmp_path / "b")


def test_overwrite_replaces_earlier_shards(tmp_path):
  big = model_of("tiny", d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512)
  export(big, tmp_path / "m", dtype="float32", shard_mb=1)
  small = model_of("tiny")
  export(small, tmp_path / "m", dtype="float32", overwrite=True)
  assert [p.name for p in (tmp_path / "m").glob("*.safetensors")] == [
      "model-00001-of-00001.safetensors"]
  assert load(tmp_path / "m").config == small.config


def test_cli_export_prints_files_and_sizes(tmp_path, capsys, monkeypatch):
  import speculax.models.load as load_module
  monkeypatch.setattr(load_module, "load", lambda name: model_of("tiny"))
  assert main(["export", "tiny", str(tmp_path / "m"), "--dtype", "float32"]) == 0
  out = capsys.readouterr().out
  assert "config.json" in out and "tokenizer.json" in out and " MB " in out
  assert main(["export", "tiny", str(tmp_path / "m")]) == 2  # not empty, no --overwrite


@pytest.mark.slow
def test_smollm2_bf16_export_in_60mb_shards(tmp_path, smollm2):
  files = export(smollm2, tmp_path / "m", dtype="bfloat16", shard_mb=60)
  shards = [f for f in files if f.suffix == ".safetensors"]
  assert len(shards) == 5 and all(f.stat().st_size < 60e6 + 1e5 for f in shards)
  back = load(tmp_path / "m")
  assert back.config.architecture() == smollm2.config.architecture()
  prompt = smollm2.tokenizer.encode("The capital of France is")
  assert back.tokenizer.encode("The capital of France is") == prompt
  tokens = jnp.asarray([prompt])
  positions = jnp.arange(len(prompt))[None]
  want = np.asarray(llama.forward(smollm2.params, smollm2.config, tokens, positions)[0])
  got = np.asarray(llama.forward(back.params, back.config, tokens, positions)[0])
  assert (got.argmax(-1) == want.argmax(-1)).all()
  np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())
