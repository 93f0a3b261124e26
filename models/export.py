"""A loaded model -> a Hugging Face-style folder, to carry weights to a machine with no network.

The folder holds what `load()` (through hf_loader and Tokenizer.from_hf_folder) reads back:
config.json, tokenizer.json + tokenizer_config.json + generation_config.json, and safetensors
shards with model.safetensors.index.json. Key names and layouts come from hf_loader's maps, so
there is one key map for reading and writing. Tied embeddings write no lm_head, as HF does.

Dims: L layers, d model, v vocab.
"""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from speculax.models import hf_loader
from speculax.models.config import LlamaConfig
from speculax.models.load import LoadedModel

DTYPES = {"bfloat16": jnp.bfloat16, "float32": np.float32}  # jnp.bfloat16: numpy-usable
INDEX = "model.safetensors.index.json"


def export(model: LoadedModel, folder: str | pathlib.Path, *, dtype: str = "bfloat16",
           shard_mb: float = 60, overwrite: bool = False) -> list[pathlib.Path]:
  """Writes `model` under `folder` with weights in `dtype`; returns the files written.

  A shard holds at most shard_mb * 10**6 bytes of tensors (HF counts MB in powers of ten); a
  single tensor larger than that gets a shard of its own.
  """
  if dtype not in DTYPES:
    raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
  if not shard_mb >= 1:
    raise ValueError(f"shard_mb must be >= 1, got {shard_mb!r}")
  if not hasattr(model.tokenizer, "backend"):
    raise ValueError(f"export needs a models.tokenizer.Tokenizer (it writes tokenizer.json); "
                     f"got {type(model.tokenizer).__name__}")
  folder = pathlib.Path(folder)
  if folder.exists() and not folder.is_dir():
    raise ValueError(f"export folder {folder} exists and is not a folder")
  if folder.is_dir() and any(folder.iterdir()):
    if not overwrite:
      raise ValueError(f"export folder {folder} is not empty (pass overwrite=True to replace it)")
    for stale in folder.glob("model*.safetensors*"):  # a leftover model.safetensors would win
      stale.unlink()
  folder.mkdir(parents=True, exist_ok=True)

  tensors = {name: np.ascontiguousarray(w, DTYPES[dtype])
             for name, w in hf_tensors(model.params, model.config).items()}
  written = _write_shards(tensors, folder, int(shard_mb * 10**6))
  config = hf_loader.config_to_hf(model.config, torch_dtype=dtype)
  written.append(_write_json(folder / "config.json", config))
  return written + _write_tokenizer(model.tokenizer, folder)


def hf_tensors(params: dict, c: LlamaConfig) -> dict[str, np.ndarray]:
  """Our params -> HF tensor name -> float32 array in torch layout."""
  host = jax.tree.map(lambda x: np.asarray(x, np.float32), params)  # bf16 widens exactly
  out = {"model.embed_tokens.weight": host["embed"]}  # [v, d]
  for i in range(c.n_layers):
    for suffix, key in hf_loader.hf_layer_keys(c).items():
      out[f"model.layers.{i}.{suffix}"] = hf_loader.torch_layout(key, host["layers"][key][i], c)
  out["model.norm.weight"] = host["final_norm"]  # [d]
  if not c.tie_embeddings:
    out["lm_head.weight"] = host["lm_head"].T  # [v, d]
  return out


def _write_shards(tensors: dict[str, np.ndarray], folder: pathlib.Path,
                  limit: int) -> list[pathlib.Path]:
  """Greedy in key order (so a layer's tensors stay together), plus the index HF writes."""
  from safetensors.numpy import save_file
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, w in tensors.items():
    if shards[-1] and size + w.nbytes > limit:
      shards.append({})
      size = 0
    shards[-1][name] = w
    size += w.nbytes
  weight_map, written = {}, []
  for j, shard in enumerate(shards, 1):
    path = folder / f"model-{j:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, str(path), metadata={"format": "pt"})  # transformers wants "pt"
    weight_map |= {name: path.name for name in shard}
    written.append(path)
  total = sum(w.nbytes for w in tensors.values())
  index = {"metadata": {"total_size": total}, "weight_map": weight_map}
  return [*written, _write_json(folder / INDEX, index)]


def _write_tokenizer(tok, folder: pathlib.Path) -> list[pathlib.Path]:
  """tokenizer.json plus the BOS / EOS / pad, add_bos and chat template Tokenizer reads back."""
  path = folder / "tokenizer.json"
  tok.backend.save(str(path))
  names = {k: None if i is None else tok.backend.id_to_token(i)
           for k, i in (("bos_token", tok.bos_id), ("eos_token", tok.eos_id),
                        ("pad_token", tok.pad_id))}
  config = {**names, "add_bos_token": tok.add_bos, "chat_template": tok.chat_template}
  generation = {"bos_token_id": tok.bos_id, "eos_token_id": list(tok.eos_ids),
                "pad_token_id": tok.pad_id}
  return [path, _write_json(folder / "tokenizer_config.json", config),
          _write_json(folder / "generation_config.json", generation)]


def _write_json(path: pathlib.Path, obj: dict) -> pathlib.Path:
  path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
  return path
