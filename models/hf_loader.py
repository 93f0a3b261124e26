"""Hugging Face Llama / Qwen2 / Qwen3 folders (config.json + safetensors, single file or
sharded) -> Params. Qwen2 is Llama plus q/k/v biases, Qwen3 Llama plus a q/k RMSNorm (HF_FAMILIES).

Torch Linear weights are [out, in]; `layer_param` maps one such weight to our layout with a
shape assert before every reshape. The GGUF loader dequantizes to the same torch layout and
reuses it, so there is one key map for both formats.

Tensors stream shard by shard into preallocated layer stacks (float32 on the host), then move
to JAX once in `param_dtype`. numpy has no bfloat16, and safetensors' numpy backend refuses
BF16 tensors, so those few go through its flax backend pinned to the CPU (ml_dtypes bf16).

Dims: L layers, d model, h heads, k kv heads, q head dim, f ffw, v vocab.
"""
from __future__ import annotations

import contextlib
import dataclasses
import pathlib
from typing import Any, Iterator

import numpy as np

from speculax.core.jsonfile import read_json_object
from speculax.models.config import LlamaConfig, RopeScaling, Runtime

Params = dict

# HF per-layer key suffix -> our key under params["layers"].
HF_LAYER_KEYS: dict[str, str] = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
}
# Per-layer keys only some architectures have (LlamaConfig.qkv_bias, LlamaConfig.qk_norm).
HF_BIAS_KEYS: dict[str, str] = {
    "self_attn.q_proj.bias": "q_bias", "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
}
HF_QK_NORM_KEYS: dict[str, str] = {
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
}
# config.json key -> LlamaConfig field, read by `config_from_hf` and written by `config_to_hf`.
HF_CONFIG_SIZES: dict[str, str] = {
    "vocab_size": "vocab_size", "hidden_size": "d_model", "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
    "head_dim": "head_dim", "intermediate_size": "d_ff",
}
# config.json key -> (field, type, transformers' default when the key is absent).
HF_CONFIG_SCALARS: dict[str, tuple[str, type, Any]] = {
    "rms_norm_eps": ("norm_eps", float, 1e-6),
    "tie_word_embeddings": ("tie_embeddings", bool, False),
    "max_position_embeddings": ("max_seq_len", int, 2048),
}
# llama3 rope_scaling key -> (RopeScaling field, type).
HF_ROPE_KEYS: dict[str, tuple[str, type]] = {
    "factor": ("factor", float), "low_freq_factor": ("low_freq_factor", float),
    "high_freq_factor": ("high_freq_factor", float),
    "original_max_position_embeddings": ("original_max_position", int),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # non-persistent buffers some old saves contain


@dataclasses.dataclass(frozen=True)
class HfFamily:
  """One supported config.json `model_type`: its model class, the transformers defaults that
  differ from Llama's, the config values we require, and what it adds to a Llama layer."""
  architecture: str  # the *ForCausalLM class `architectures` must list
  defaults: dict  # config.json key -> transformers' default for this model type
  required: dict  # config.json key -> the only value we run (when the key is present)
  qkv_bias: bool = False
  qk_norm: bool = False


_QWEN_REQUIRED = {"hidden_act": "silu", "use_sliding_window": False}
HF_FAMILIES: dict[str, HfFamily] = {
    "llama": HfFamily("LlamaForCausalLM", {},
                      {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}),
    # Qwen2's q/k/v always have biases (o has none); attention_bias is not a Qwen2 key.
    "qwen2": HfFamily("Qwen2ForCausalLM", {"max_position_embeddings": 32768}, _QWEN_REQUIRED,
                      qkv_bias=True),
    # Qwen3's attention_bias would put a bias on o as well, which no checkpoint we know uses.
    "qwen3": HfFamily("Qwen3ForCausalLM", {"max_position_embeddings": 32768, "head_dim": 128},
                      {**_QWEN_REQUIRED, "attention_bias": False}, qk_norm=True),
}


def hf_layer_keys(c: LlamaConfig) -> dict[str, str]:
  """HF per-layer key suffix -> our key, for the layers `c` describes."""
  return {**HF_LAYER_KEYS, **(HF_BIAS_KEYS if c.qkv_bias else {}),
          **(HF_QK_NORM_KEYS if c.qk_norm else {})}


def torch_layout_shape(key: str, c: LlamaConfig) -> tuple[int, ...]:
  """Expected torch-layout shape ([out, in] for Linear) of one layer weight."""
  d, h, k, q, f = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff
  return {"attn_norm": (d,), "mlp_norm": (d,), "q": (h * q, d), "k": (k * q, d),
          "v": (k * q, d), "o": (d, h * q), "gate": (f, d), "up": (f, d), "down": (d, f),
          "q_bias": (h * q,), "k_bias": (k * q,), "v_bias": (k * q,), "q_norm": (q,),
          "k_norm": (q,)}[key]


def layer_param(key: str, w: np.ndarray, c: LlamaConfig) -> np.ndarray:
  """One layer's torch-layout weight (HF row order) -> our layout."""
  d, h, k, q = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
  assert w.shape == torch_layout_shape(key, c), (key, w.shape, torch_layout_shape(key, c))
  if key == "q":
    return w.T.reshape(d, h, q)  # [d, h, q]
  if key in ("k", "v"):
    return w.T.reshape(d, k, q)  # [d, k, q]
  if key == "q_bias":
    return w.reshape(h, q)  # [h, q]
  if key in ("k_bias", "v_bias"):
    return w.reshape(k, q)  # [k, q]
  if key == "o":
    return w.T.reshape(h, q, d)  # [h, q, d]
  if key in ("gate", "up", "down"):
    return w.T  # gate/up [d, f], down [f, d]
  return w  # norms [d] or, q/k norms, [q]


def torch_layout(key: str, w: np.ndarray, c: LlamaConfig) -> np.ndarray:
  """Inverse of `layer_param`: one layer's weight in our layout -> torch layout ([out, in])."""
  ours = layer_param(key, np.empty(torch_layout_shape(key, c), np.int8), c).shape
  assert w.shape == ours, (key, w.shape, ours)
  if key in ("q", "k", "v"):
    return w.reshape(c.d_model, -1).T  # [h*q or k*q, d]
  if key == "o":
    return w.reshape(-1, c.d_model).T  # [d, h*q]
  if key in ("gate", "up", "down"):
    return w.T  # gate/up [f, d], down [d, f]
  if key in HF_BIAS_KEYS.values():
    return w.reshape(-1)  # [h*q or k*q]
  return w  # norms [d] or, q/k norms, [q]


def to_jax(params: dict, param_dtype: str) -> Params:
  """Host numpy pytree -> jnp arrays of param_dtype (one transfer per leaf)."""
  import jax
  import jax.numpy as jnp
  dtype = jnp.dtype(param_dtype)
  return jax.tree.map(lambda x: jnp.asarray(x, dtype=dtype), params)


def load_hf_folder(folder: str | pathlib.Path, *, param_dtype: str = "float32"
                   ) -> tuple[LlamaConfig, Params]:
  """Reads a Llama / Qwen2 / Qwen3 *ForCausalLM folder saved by `save_pretrained`
  (safetensors only)."""
  folder = pathlib.Path(folder)
  if not folder.exists():
    raise FileNotFoundError(f"Hugging Face model folder not found: {folder}")
  if not folder.is_dir():
    raise ValueError(f"Hugging Face model path is not a folder: {folder}")
  config_path = folder / "config.json"
  config = config_from_hf(read_json_object(config_path), config_path, param_dtype=param_dtype)
  with _open_weights(folder) as source:
    params = _convert(source, config, folder)
  return config, to_jax(params, param_dtype)


def hf_model_type(c: LlamaConfig) -> str:
  """The config.json model_type whose layers are those of `c`."""
  types = [t for t, f in HF_FAMILIES.items() if (f.qkv_bias, f.qk_norm) == (c.qkv_bias, c.qk_norm)]
  if not types:
    raise ValueError(f"no Hugging Face model type has qkv_bias={c.qkv_bias} and "
                     f"qk_norm={c.qk_norm} together (known: {sorted(HF_FAMILIES)})")
  return types[0]


def config_to_hf(c: LlamaConfig, torch_dtype: str) -> dict:
  """The transformers config.json dict (Llama, Qwen2 or Qwen3) that `config_from_hf` reads back
  to `c`."""
  model_type = hf_model_type(c)
  family = HF_FAMILIES[model_type]
  cfg = {"architectures": [family.architecture], "model_type": model_type, **family.required,
         "torch_dtype": torch_dtype, "rope_theta": c.rope_theta}
  cfg |= {hf: getattr(c, ours) for hf, ours in HF_CONFIG_SIZES.items()}
  cfg |= {hf: getattr(c, ours) for hf, (ours, _, _) in HF_CONFIG_SCALARS.items()}
  cfg["rope_scaling"] = None if c.rope_scaling is None else {
      "rope_type": "llama3",
      **{hf: getattr(c.rope_scaling, ours) for hf, (ours, _) in HF_ROPE_KEYS.items()}}
  return cfg


def config_from_hf(cfg: dict, path: pathlib.Path, *, param_dtype: str = "float32"
                   ) -> LlamaConfig:
  """LlamaConfig from a transformers config.json dict (v4 `rope_scaling` or v5 `rope_parameters`)
  of a model_type in HF_FAMILIES.

  Defaults are transformers' defaults for that model type, so a terse config.json means what it
  means to transformers (e.g. rms_norm_eps 1e-6, untied embeddings, Qwen3's head_dim 128).
  """
  model_type = cfg.get("model_type")
  if model_type not in HF_FAMILIES:
    raise ValueError(f"{path}: model_type={model_type!r} is not supported; supported: "
                     f"{sorted(HF_FAMILIES)}")
  family = HF_FAMILIES[model_type]
  archs = cfg.get("architectures") or [family.architecture]
  if family.architecture not in archs:
    raise ValueError(f"{path}: architectures={archs}; model_type {model_type!r} is supported "
                     f"only as {family.architecture}")
  for key, ok in family.required.items():
    if cfg.get(key, ok) != ok:
      raise ValueError(f"{path}: {key}={cfg[key]!r} is not supported (need {ok!r})")
  windowed = [t for t in cfg.get("layer_types") or () if t != "full_attention"]
  if windowed:
    raise ValueError(f"{path}: layer_types lists {windowed[0]!r}; only 'full_attention' layers "
                     "are supported")
  cfg = {**family.defaults, **cfg}
  try:
    h, d = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    optional = {"num_key_value_heads": h, "head_dim": d // max(h, 1)}  # transformers' defaults
    sizes = {ours: int(cfg.get(hf) or optional[hf]) if hf in optional else int(cfg[hf])
             for hf, ours in HF_CONFIG_SIZES.items()}
  except KeyError as e:
    raise ValueError(f"{path} lacks required key {e.args[0]!r}") from e
  except (TypeError, ValueError) as e:  # e.g. "hidden_size": null
    raise ValueError(f"{path}: a model size is not an integer: {e}") from e
  rope = cfg.get("rope_parameters") or {}
  scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default"
                                        else None)
  try:
    scalars = {ours: kind(cfg.get(hf, default))
               for hf, (ours, kind, default) in HF_CONFIG_SCALARS.items()}
    return LlamaConfig(
        **sizes, **scalars,
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        rope_scaling=_rope_scaling(scaling, path), qkv_bias=family.qkv_bias,
        qk_norm=family.qk_norm, runtime=Runtime(param_dtype=param_dtype))
  except (TypeError, ValueError) as e:  # LlamaConfig's own checks do not know the file
    if str(path) in str(e):
      raise
    raise ValueError(f"{path}: {e}") from e


def _rope_scaling(scaling: dict | None, path: pathlib.Path) -> RopeScaling | None:
  if not scaling:
    return None
  rope_type = scaling.get("rope_type") or scaling.get("type")  # v4 configs used "type"
  if rope_type in (None, "default"):
    return None
  if rope_type != "llama3":
    raise ValueError(f"{path}: rope_type {rope_type!r} is not supported (only 'llama3')")
  try:
    return RopeScaling(**{ours: kind(scaling[hf]) for hf, (ours, kind) in HF_ROPE_KEYS.items()})
  except KeyError as e:
    raise ValueError(f"{path}: llama3 rope scaling lacks {e.args[0]!r}") from e


class _Source:
  """Tensor name -> shard file, plus numpy reads (BF16 via the flax backend, on the CPU)."""

  def __init__(self, files: dict[str, pathlib.Path], stack: contextlib.ExitStack):
    self.files = files  # tensor name -> shard path
    self._stack = stack
    self._handles: dict[tuple[pathlib.Path, str], Any] = {}

  def _handle(self, path: pathlib.Path, framework: str):
    from safetensors import safe_open
    if (path, framework) not in self._handles:
      try:
        self._handles[path, framework] = self._stack.enter_context(
            safe_open(str(path), framework=framework))
      except Exception as e:  # SafetensorError on bad header / truncated file
        raise ValueError(f"safetensors file {path} is truncated or corrupt: {e}") from e
    return self._handles[path, framework]

  def keys_in(self, path: pathlib.Path) -> list[str]:
    return list(self._handle(path, "numpy").keys())

  def get(self, name: str) -> np.ndarray:  # float32, torch layout
    path = self.files[name]
    f = self._handle(path, "numpy")
    try:
      if f.get_slice(name).get_dtype() != "BF16":
        return np.asarray(f.get_tensor(name), np.float32)
      import jax
      with jax.default_device(jax.devices("cpu")[0]):
        return np.asarray(self._handle(path, "flax").get_tensor(name)).astype(np.float32)
    except ValueError:
      raise
    except Exception as e:
      raise ValueError(f"safetensors file {path}: cannot read tensor {name!r}: {e}") from e


@contextlib.contextmanager
def _open_weights(folder: pathlib.Path) -> Iterator[_Source]:
  """Finds model.safetensors or the shards of model.safetensors.index.json; checks duplicates."""
  single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
  with contextlib.ExitStack() as stack:
    if single.is_file():
      source = _Source({}, stack)
      source.files = {name: single for name in source.keys_in(single)}
    elif index.is_file():
      weight_map = read_json_object(index).get("weight_map")
      if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index} has no 'weight_map'")
      source = _Source({}, stack)
      for shard in sorted(set(weight_map.values())):
        path = folder / shard
        if not path.is_file():
          raise FileNotFoundError(f"missing shard {path} (listed in {index})")
        for name in source.keys_in(path):
          if name in source.files:
            raise ValueError(f"duplicate tensor {name!r} in {source.files[name]} and {path}")
          source.files[name] = path
      listed_missing = sorted(n for n, s in weight_map.items() if source.files.get(n) != folder / s)
      if listed_missing:
        raise ValueError(f"{index} lists tensors not found in their shard: {listed_missing[:10]}")
    else:
      raise FileNotFoundError(f"no weights in {folder}: expected {single.name} or {index.name} "
                              "(only safetensors are supported)")
    yield source


def _convert(source: _Source, c: LlamaConfig, folder: pathlib.Path) -> dict:
  """Explicit key map; missing and unexpected keys are named before any tensor is read."""
  names = {n for n in source.files if not n.endswith(_IGNORED_SUFFIXES)}
  expected = {"model.embed_tokens.weight", "model.norm.weight"}
  layer_keys = hf_layer_keys(c)
  expected |= {f"model.layers.{i}.{s}" for i in range(c.n_layers) for s in layer_keys}
  if not c.tie_embeddings:
    expected.add("lm_head.weight")
  missing = sorted(expected - names)
  unexpected = sorted(names - expected - {"lm_head.weight"})
  if missing or unexpected:
    raise ValueError(f"weights in {folder}: missing keys {missing[:10]}"
                     f"{' ...' if len(missing) > 10 else ''}; unexpected keys {unexpected[:10]}"
                     f"{' ...' if len(unexpected) > 10 else ''}")

  def read(name: str, shape: tuple[int, ...]) -> np.ndarray:
    w = source.get(name)
    if w.shape != shape:
      raise ValueError(f"tensor {name!r} in {source.files[name]} has shape {w.shape}, "
                       f"expected {shape}")
    return w

  layers: dict[str, np.ndarray] = {}
  for i in range(c.n_layers):
    for suffix, key in layer_keys.items():
      w = layer_param(key, read(f"model.layers.{i}.{suffix}", torch_layout_shape(key, c)), c)
      if key not in layers:
        layers[key] = np.empty((c.n_layers, *w.shape), np.float32)
      layers[key][i] = w
  embed = read("model.embed_tokens.weight", (c.vocab_size, c.d_model))  # [v, d]
  params = {"embed": embed, "layers": layers,
            "final_norm": read("model.norm.weight", (c.d_model,))}
  if "lm_head.weight" in names:
    head = read("lm_head.weight", (c.vocab_size, c.d_model))  # [v, d]
    if not c.tie_embeddings:
      params["lm_head"] = np.ascontiguousarray(head.T)  # [d, v]
    elif not np.array_equal(head, embed):
      raise ValueError(f"{folder}: tie_word_embeddings is true but lm_head.weight differs from "
                       "model.embed_tokens.weight")
  return params
