"""Shared pieces of the benchmark scripts: machine description, bandwidth probe, tables."""
from __future__ import annotations

import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp


def machine() -> str:
  dev = jax.devices()[0]
  return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"jax {jax.__version__} on {dev.platform} ({dev.device_kind})")


def read_bandwidth(n_bytes: int = 512 << 20, repeats: int = 5) -> float:
  """Bytes per second that a jitted XLA reduction streams from memory (all cores).

  Decoding one token reads every weight once, so weight bytes / this rate is the time floor
  of a decode step.
  """
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    total(x).block_until_ready()
    times.append(time.perf_counter() - t)
  return n_bytes / min(times)


def median(xs) -> float:
  return statistics.median(xs)


def table(header: list[str], rows: list[list]) -> str:
  """A Markdown table; floats get 3 significant-ish digits."""
  fmt = lambda x: f"{x:.3g}" if isinstance(x, float) and abs(x) < 100 else (
      f"{x:.0f}" if isinstance(x, float) else str(x))
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
  return "\n".join(lines)


def hf_model():
  """SmolLM2-135M-Instruct in transformers (torch, fp32, CPU) from the same GGUF: the peer."""
  import torch
  import transformers

  from models.assets import smollm2_gguf_path
  path = smollm2_gguf_path()
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path.parent, gguf_file=path.name, dtype=torch.float32)
  return model.eval()
