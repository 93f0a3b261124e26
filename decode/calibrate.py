"""The cost model of goodput-driven draft length (decode/goodput.py), measured: seconds of one
loop step drafting k = 0..K, at the batch and on the prompts it will serve (k = 0 timed as
plain decoding; each k its own compiled loop, compiling not timed)."""
from __future__ import annotations

import dataclasses

import jax

from speculax.decode.config import SpecConfig
from speculax.decode.generate import generate
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import speculative_generate
from speculax.drafters.base import Drafter
from speculax.models.config import LlamaConfig


def calibrate(params, config: LlamaConfig, prompts, drafter: Drafter, spec: SpecConfig,
              drafter_params=None, new_tokens: int = 24, key: jax.Array | None = None,
              **settings) -> Goodput:
  """Goodput(step_s) for steps of up to spec.k drafts, timed on `prompts` (a batch as it will be
  served) over `new_tokens` each; settings: Goodput's other fields (decay, prior, ...)."""
  if new_tokens < 2:
    raise ValueError(f"calibrate needs new_tokens >= 2 to time a loop step, got {new_tokens}")
  base = dataclasses.replace(spec, max_new_tokens=new_tokens, eos_ids=(), goodput=None)

  def per_step(out):  # the loop's seconds per target forward (the prefill is timed apart)
    return out.decode_s / max(out.forwards - 1, 1)

  step_s = [per_step(generate(params, config, prompts, base, key, warmup=True))]
  for k in range(1, spec.k + 1):
    step_s.append(per_step(speculative_generate(
        params, config, prompts, drafter, dataclasses.replace(base, k=k), drafter_params, key,
        warmup=True)))
  return Goodput(tuple(step_s), **settings)
