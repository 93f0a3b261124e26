"""Tiny random Hugging Face Llamas: the independent reference for loader and parity tests."""
import torch
import transformers


def tiny_hf_model(tie: bool, rope_scaling: dict | None = None, seed: int = 0,
                  weight_scale: float = 1.0):
  """Random norms too (a swapped norm would show); weight_scale > 1 pushes logits away from
  uniform, so logit comparisons are not dominated by near-equal values."""
  cfg = transformers.LlamaConfig(
      vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tie, rope_scaling=rope_scaling)
  torch.manual_seed(seed)
  model = transformers.LlamaForCausalLM(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else weight_scale * p)
  return model
