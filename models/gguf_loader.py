"""GGUF checkpoints (llama.cpp format) -> (LlamaConfig, Params), dequantized to float.

GGUF lists a tensor's dims innermost first; `gguf.GGUFReader` reverses them, so `tensor.data`
and `gguf.quants.dequantize` come out in torch Linear layout [out, in] (quantized tensors come
as raw bytes [out, in_bytes] and dequantize to [out, in]). We check the declared shape before
dequantizing and the dequantized shape before every reshape.

llama.cpp's converter permuted the rows of attn_q / attn_k (per head, it interleaved the two
rotary halves for its GPT-J style RoPE). Our model uses Hugging Face's rotate-half RoPE, so
`_unpermute` restores HF row order. Llama-3 RoPE scaling is not in the metadata: the converter
stores per-frequency divisors as a `rope_freqs.weight` tensor, which we match back to a
`RopeScaling`.

Dims: L layers, d model, h heads, k kv heads, q head dim, f ffw, v vocab.
"""
from __future__ import annotations

import functools
import inspect
import math
import pathlib
from typing import Any

import gguf
import numpy as np

from speculax.models.config import LlamaConfig, RopeScaling, Runtime
from speculax.models.hf_loader import layer_param, to_jax, torch_layout_shape

Params = dict

_MISSING = object()

# Per-layer GGUF tensor name -> our key under params["layers"].
GGUF_LAYER_KEYS: dict[str, str] = {
    "attn_norm": "attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
    "ffn_norm": "mlp_norm", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down",
}


def load_gguf(path: str | pathlib.Path, *, param_dtype: str = "float32", reader: Any = None
              ) -> tuple[LlamaConfig, Params]:
  """Reads a Llama-architecture GGUF file; every tensor is dequantized, then cast to param_dtype.

  `reader`: an `open_gguf(path)` result to share with the tokenizer (parsing takes seconds).
  """
  path = pathlib.Path(path)
  reader = open_gguf(path) if reader is None else reader
  arch = _meta(reader, path, "general.architecture")
  if arch != "llama":
    raise ValueError(f"GGUF file {path} has architecture {arch!r}; only 'llama' is supported")
  tensors = _tensor_table(reader, path)
  config = config_from_gguf(reader, tensors, path, param_dtype=param_dtype)
  _check_names(tensors, config, path)
  return config, to_jax(_convert(tensors, config, path), param_dtype)


def open_gguf(path: str | pathlib.Path) -> gguf.GGUFReader:
  """GGUFReader over `path`; any failure to parse becomes a ValueError naming the file."""
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"GGUF file not found: {path}")
  if not path.is_file():
    raise ValueError(f"GGUF path is not a file: {path}")
  try:
    return _reader_class()(path)
  except Exception as e:  # the reader raises ValueError/KeyError/IndexError... on bad bytes
    raise ValueError(f"GGUF file {path} is truncated or corrupt ({type(e).__name__}: {e})") from e


@functools.cache
def _reader_class():
  """GGUFReader, sped up ~3x on big tokenizer metadata when its private `_get` is as we know it.

  The stock reader slices its np.memmap once per metadata value (150k times for a 49k-token
  vocabulary); memmap's __getitem__/__array_finalize__ overhead dominates the load. Slicing a
  plain ndarray view of the same mapping returns the same bytes.
  """
  expected = ["self", "offset", "dtype", "count", "override_order"]
  if list(inspect.signature(gguf.GGUFReader._get).parameters) != expected:
    return gguf.GGUFReader

  class _Reader(gguf.GGUFReader):
    def _get(self, offset, dtype, count=1, override_order=None):
      plain = self.__dict__.get("_plain")
      if plain is None:
        plain = self.__dict__["_plain"] = self.data.view(np.ndarray)
      count = int(count)
      arr = plain[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
      order = self.byte_order if override_order is None else override_order
      return arr.view(arr.dtype.newbyteorder(order))

  return _Reader


def _meta(reader, path: pathlib.Path, key: str, default: Any = _MISSING) -> Any:
  field = reader.get_field(key)
  if field is None:
    if default is _MISSING:
      raise ValueError(f"GGUF file {path} lacks metadata key {key!r}")
    return default
  return field.contents()


def _f32(x: float) -> float:
  """Shortest decimal of a float32 metadata value (1e-5 stored as f32 reads 9.99999974e-06)."""
  return float(str(np.float32(x)))


def _tensor_table(reader, path: pathlib.Path) -> dict[str, Any]:
  table: dict[str, Any] = {}
  for t in reader.tensors:
    if t.name in table:
      raise ValueError(f"GGUF file {path} has duplicate tensor {t.name!r}")
    table[t.name] = t
  return table


def _declared_shape(t) -> tuple[int, ...]:
  """Shape in numpy/torch order (GGUF stores dims reversed)."""
  return tuple(int(n) for n in reversed(t.shape.tolist()))


def config_from_gguf(reader, tensors: dict[str, Any], path: pathlib.Path,
                     *, param_dtype: str = "float32") -> LlamaConfig:
  """LlamaConfig from `llama.*` metadata; vocab and tying from the tensors themselves."""
  if "token_embd.weight" not in tensors:
    raise ValueError(f"GGUF file {path} is missing tensor 'token_embd.weight'")
  m = lambda key, default=_MISSING: _meta(reader, path, key, default)  # noqa: E731
  d, h = int(m("llama.embedding_length")), int(m("llama.attention.head_count"))
  kh = int(m("llama.attention.head_count_kv", h))
  head_dim = int(m("llama.attention.key_length", 0)) or int(m("llama.rope.dimension_count", 0))
  head_dim = head_dim or d // max(h, 1)
  for key in ("llama.attention.value_length", "llama.rope.dimension_count"):
    if int(m(key, head_dim)) != head_dim:
      raise ValueError(f"GGUF file {path}: {key}={m(key)} differs from head_dim={head_dim}; "
                       "partial rotary / unequal key and value dims are not supported")
  vocab = _declared_shape(tensors["token_embd.weight"])[0]
  declared_vocab = m("llama.vocab_size", None)
  if declared_vocab is not None and int(declared_vocab) != vocab:
    raise ValueError(f"GGUF file {path}: llama.vocab_size={declared_vocab} but token_embd.weight "
                     f"has {vocab} rows")
  tokens_field = reader.get_field("tokenizer.ggml.tokens")
  n_tokens = len(tokens_field.data) if tokens_field is not None else 0
  if n_tokens > vocab:
    raise ValueError(f"GGUF file {path}: tokenizer has {n_tokens} tokens but token_embd.weight "
                     f"has only {vocab} rows")
  theta = _f32(m("llama.rope.freq_base", 10000.0))
  scaling_type = m("llama.rope.scaling.type", "none")
  if scaling_type not in ("none", ""):
    raise ValueError(f"GGUF file {path}: rope scaling type {scaling_type!r} is not supported "
                     "(only Llama-3 scaling, stored as rope_freqs.weight)")
  scaling = None
  if "rope_freqs.weight" in tensors:
    factors = _dequantize(tensors["rope_freqs.weight"], (head_dim // 2,), path)
    scaling = rope_scaling_from_factors(factors, theta, head_dim, path)
  n_layers, d_ff = int(m("llama.block_count")), int(m("llama.feed_forward_length"))
  norm_eps = _f32(m("llama.attention.layer_norm_rms_epsilon", 1e-5))
  max_seq_len = int(m("llama.context_length", 2048))
  try:
    return LlamaConfig(
        vocab_size=vocab, d_model=d, n_layers=n_layers, n_heads=h, n_kv_heads=kh,
        head_dim=head_dim, d_ff=d_ff, rope_theta=theta, rope_scaling=scaling, norm_eps=norm_eps,
        tie_embeddings="output.weight" not in tensors, max_seq_len=max_seq_len,
        runtime=Runtime(param_dtype=param_dtype))
  except ValueError as e:  # LlamaConfig's own checks do not know the file
    raise ValueError(f"GGUF file {path}: {e}") from e


def llama3_rope_factors(scaling: RopeScaling, theta: float, head_dim: int) -> np.ndarray:
  """Per-frequency divisors as llama.cpp's converter writes them (rope_freqs.weight)."""  # [q/2]
  inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
  wavelen = 2 * math.pi / inv
  low_wl = scaling.original_max_position / scaling.low_freq_factor
  high_wl = scaling.original_max_position / scaling.high_freq_factor
  smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
      scaling.high_freq_factor - scaling.low_freq_factor)
  mid = 1 / ((1 - smooth) / scaling.factor + smooth)
  return np.where(wavelen < high_wl, 1.0, np.where(wavelen > low_wl, scaling.factor, mid)
                  ).astype(np.float32)


def rope_scaling_from_factors(factors: np.ndarray, theta: float, head_dim: int,
                              path: pathlib.Path) -> RopeScaling | None:
  """Finds a RopeScaling that reproduces `factors` (the metadata does not carry its params).

  Any match is exact for the model: RoPE only sees the resulting frequencies. We search the
  usual Llama-3 settings (low 1, high 4) and a few others over power-of-two context lengths.
  """
  factors = np.asarray(factors, np.float32)
  if np.allclose(factors, 1.0):
    return None
  factor = float(str(factors.max()))
  for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0), (0.5, 4.0), (2.0, 8.0)):
    for log2_ctx in range(4, 22):
      cand = RopeScaling(factor=factor, low_freq_factor=low, high_freq_factor=high,
                         original_max_position=2 ** log2_ctx)
      if np.allclose(llama3_rope_factors(cand, theta, head_dim), factors, rtol=1e-5, atol=0):
        return cand
  raise ValueError(f"GGUF file {path}: rope_freqs.weight {factors.tolist()} does not match any "
                   "Llama-3 RoPE scaling this loader recognizes")


def _check_names(tensors: dict[str, Any], config: LlamaConfig, path: pathlib.Path) -> None:
  expected = {"token_embd.weight", "output_norm.weight"}
  expected |= {f"blk.{i}.{n}.weight" for i in range(config.n_layers) for n in GGUF_LAYER_KEYS}
  optional = {"output.weight", "rope_freqs.weight"}
  missing = sorted(expected - set(tensors))
  unexpected = sorted(set(tensors) - expected - optional)
  if missing or unexpected:
    raise ValueError(f"GGUF file {path}: missing tensors {missing[:10]}"
                     f"{' ...' if len(missing) > 10 else ''}; unexpected tensors {unexpected[:10]}"
                     f"{' ...' if len(unexpected) > 10 else ''}")


def _dequantize(t, expected: tuple[int, ...], path: pathlib.Path) -> np.ndarray:
  """float32 array of tensor `t` in [out, in] layout, after checking its shape twice."""
  declared = _declared_shape(t)
  if declared != tuple(expected):
    raise ValueError(f"GGUF file {path}: tensor {t.name!r} has shape {declared}, "
                     f"expected {tuple(expected)}")
  try:
    arr = gguf.quants.dequantize(t.data, t.tensor_type)
  except NotImplementedError as e:
    raise ValueError(f"GGUF file {path}: tensor {t.name!r} has quant type "
                     f"{t.tensor_type.name}, which gguf cannot dequantize") from e
  if arr.shape != tuple(expected):
    raise ValueError(f"GGUF file {path}: tensor {t.name!r} dequantized to shape {arr.shape}, "
                     f"expected {tuple(expected)}")
  return np.asarray(arr, np.float32)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:  # [rows, cols] -> [rows, cols]
  """Inverse of llama.cpp's `w.reshape(n_head, 2, r//n_head//2, c).swapaxes(1, 2)`."""
  rows, cols = w.shape
  assert rows % (2 * n_head) == 0, (rows, n_head)
  return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _convert(tensors: dict[str, Any], c: LlamaConfig, path: pathlib.Path) -> dict:
  """Numpy float32 Params; layers filled into preallocated stacks to bound peak memory."""
  layers: dict[str, np.ndarray] = {}
  for i in range(c.n_layers):
    for gguf_name, key in GGUF_LAYER_KEYS.items():
      w = _dequantize(tensors[f"blk.{i}.{gguf_name}.weight"], torch_layout_shape(key, c), path)
      if key == "q":
        w = _unpermute(w, c.n_heads)
      elif key == "k":
        w = _unpermute(w, c.n_kv_heads)
      w = layer_param(key, w, c)
      if key not in layers:
        layers[key] = np.empty((c.n_layers, *w.shape), np.float32)
      layers[key][i] = w
  params = {
      "embed": _dequantize(tensors["token_embd.weight"], (c.vocab_size, c.d_model), path),
      "layers": layers,
      "final_norm": _dequantize(tensors["output_norm.weight"], (c.d_model,), path),
  }
  if not c.tie_embeddings:
    head = _dequantize(tensors["output.weight"], (c.vocab_size, c.d_model), path)  # [v, d]
    params["lm_head"] = np.ascontiguousarray(head.T)  # [d, v]
  return params
