"""The cost model of goodput-driven draft length (decode/goodput.py), measured: seconds of one
loop step drafting k = 0..K, at the batch and on the prompts it will serve (k = 0 timed as
plain decoding; each k its own compiled loop, compiling not timed; the median of a few
interleaved runs)."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from speculax.decode.config import SpecConfig
from speculax.decode.generate import generate
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import speculative_generate
from speculax.drafters.base import Drafter
from speculax.models.config import LlamaConfig


def calibrate(params, config: LlamaConfig, prompts, drafter: Drafter, spec: SpecConfig,
              drafter_params=None, new_tokens: int = 24, key: jax.Array | None = None,
              repeats: int = 3, **settings) -> Goodput:
  """Goodput(step_s) for steps of up to spec.k drafts, timed on `prompts` (a batch as it will be
  served) over `new_tokens` each; settings: Goodput's other fields (decay, prior, ...).

  Each k is timed `repeats` times, the lengths interleaved (0..K, then again), and the median
  taken, so a drifting machine does not make one k look cheap; then a longer draft never costs
  less than a shorter one (it drafts more and verifies more: a cheaper reading is noise).
  """
  if new_tokens < 2:
    raise ValueError(f"calibrate needs new_tokens >= 2 to time a loop step, got {new_tokens}")
  if repeats < 1:
    raise ValueError(f"calibrate needs repeats >= 1, got {repeats}")
  base = dataclasses.replace(spec, max_new_tokens=new_tokens, eos_ids=(), goodput=None)

  def per_step(k):  # seconds of one loop step drafting k
    if k == 0:
      return generate(params, config, prompts, base, key, warmup=True).step_s
    return speculative_generate(params, config, prompts, drafter, dataclasses.replace(base, k=k),
                                drafter_params, key, warmup=True).step_s

  times = np.array([[per_step(k) for k in range(spec.k + 1)] for _ in range(repeats)])
  step_s = np.maximum.accumulate(np.median(times, axis=0))  # [K + 1]
  return Goodput(tuple(float(s) for s in step_s), **settings)
