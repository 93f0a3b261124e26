"""One entry point for every checkpoint: a preset name, a .gguf file, or a Hugging Face folder.

    from speculax.models import load
    m = load.load("smollm2-135m")   # or load.load("model.gguf"), load.load("path/to/hf_folder")
    m.config, m.params, m.tokenizer
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from speculax.core.dtypes import floats_as
from speculax.models import assets
from speculax.models.config import (PRECISIONS, PRESETS, AttentionImpl, DType, LlamaConfig,
                                     Runtime, get_preset)

# Presets that name a real checkpoint shipped in a local package -> function returning its path.
CHECKPOINT_PRESETS = {"smollm2-135m": assets.smollm2_gguf_path}


@dataclasses.dataclass(frozen=True)
class LoadedModel:
  config: LlamaConfig
  params: dict  # Params pytree, see models/llama.py
  tokenizer: Any  # models.tokenizer.Tokenizer
  name: str = ""  # what it was loaded from: a preset name or a path


def load(name_or_path: str | pathlib.Path, *, dtype: DType = "float32",
         compute_dtype: DType = "float32", cache_dtype: DType | None = None,
         attention_impl: AttentionImpl = "xla") -> LoadedModel:
  """Loads config, params and tokenizer. `dtype`: the weights'; `compute_dtype`: the
  activations'; `cache_dtype`: the KV cache's (None: compute_dtype); logits and sampling are
  float32 whatever these are (config.PRECISIONS); `attention_impl`: "xla" or a Pallas kernel."""
  runtime = Runtime(dtype=compute_dtype, param_dtype=dtype, cache_dtype=cache_dtype,
                    attention_impl=attention_impl)  # checked before the load
  if isinstance(name_or_path, str) and name_or_path in CHECKPOINT_PRESETS:
    model = _load_preset(name_or_path, dtype)
  else:
    model = _load_file(pathlib.Path(name_or_path), dtype)
  return dataclasses.replace(model, name=str(name_or_path),
                             config=dataclasses.replace(model.config, runtime=runtime))


def _load_file(path: pathlib.Path, param_dtype: str) -> LoadedModel:
  if path.is_dir():
    return _load_hf(path, param_dtype)
  if path.suffix == ".gguf":
    return _load_gguf(path, param_dtype)  # raises FileNotFoundError if absent
  if not path.exists() and len(path.parts) > 1:
    raise FileNotFoundError(f"no such .gguf file or Hugging Face folder: {path}")
  known = sorted(CHECKPOINT_PRESETS)
  hint = (f" ({str(path)!r} is a config-only preset: use speculax.models.llama.init_params for "
          "random weights)") if str(path) in PRESETS else ""
  raise ValueError(f"cannot load {str(path)!r}: not a checkpoint preset {known}, a path to a "
                   f".gguf file, or an existing Hugging Face folder{hint}")


def _load_gguf(path: pathlib.Path, param_dtype: str) -> LoadedModel:
  from speculax.models import gguf_loader
  from speculax.models.tokenizer import Tokenizer
  reader = gguf_loader.open_gguf(path)  # parsed once, shared with the tokenizer
  config, params = gguf_loader.load_gguf(path, param_dtype=param_dtype, reader=reader)
  return LoadedModel(config, params, Tokenizer.from_gguf(path, reader=reader))


def _load_hf(folder: pathlib.Path, param_dtype: str) -> LoadedModel:
  from speculax.models import hf_loader
  from speculax.models.tokenizer import Tokenizer
  config, params = hf_loader.load_hf_folder(folder, param_dtype=param_dtype)
  return LoadedModel(config, params, Tokenizer.from_hf_folder(folder))


def _load_preset(name: str, param_dtype: str) -> LoadedModel:
  """Loads the preset's file and insists the file agrees with the preset's architecture."""
  model = _load_gguf(CHECKPOINT_PRESETS[name](), param_dtype)
  preset = get_preset(name)
  check_matches_preset(model.config, preset, name)
  return dataclasses.replace(model, config=preset)


def with_precision(model: LoadedModel, name: str) -> LoadedModel:
  """The model in one of config.PRECISIONS: weights cast, the runtime's dtypes set."""
  if name not in PRECISIONS:
    raise ValueError(f"unknown precision {name!r}; known: {sorted(PRECISIONS)}")
  dtypes = {"dtype": "float32", "param_dtype": "float32", "cache_dtype": None, **PRECISIONS[name]}
  return dataclasses.replace(model, params=floats_as(model.params, dtypes["param_dtype"]),
                             config=model.config.with_runtime(**dtypes))


def check_matches_preset(config: LlamaConfig, preset: LlamaConfig, name: str) -> None:
  """Raises naming every architecture field where the loaded file and the preset disagree."""
  ours, theirs = config.architecture(), preset.architecture()
  diffs = [f"{name}: file {ours[name]!r} != preset {theirs[name]!r}"
           for name in ours if ours[name] != theirs[name]]
  if diffs:
    raise ValueError(f"checkpoint for preset {name!r} disagrees with configs/models.py: "
                     + "; ".join(diffs))
