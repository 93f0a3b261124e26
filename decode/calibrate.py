"""The cost model of goodput-driven draft length (decode/goodput.py), measured: seconds of one
loop step drafting k = 0..K, at the batch and on the prompts it will serve.

Each length is timed in the serving loop itself (the same static config and shapes, so one
compile serves calibration and decoding), forced to that length by a cost vector in which only
it is finite, over a short run (`new_tokens`, below the serving budget); every run starts from
a copy of one prefill of the prompts (engine.step_seconds), which is the same for every length.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from speculax.decode import engine
from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput, forcing
from speculax.decode.speculative import spec_program
from speculax.drafters.base import Drafter
from speculax.models.config import LlamaConfig
from speculax.models.sharding import MeshConfig


def calibrate(params, config: LlamaConfig, prompts, drafter: Drafter, spec: SpecConfig,
              drafter_params=None, new_tokens: int = 24, key: jax.Array | None = None,
              repeats: int = 3, mesh: MeshConfig | None = None) -> np.ndarray:
  """[spec.k + 1] seconds of one loop step drafting 0..spec.k, timed on `prompts` (a batch as
  it will be served) over min(new_tokens, spec.max_new_tokens) each, in spec's goodput loop
  (Goodput() when spec has none) on `mesh`: pass them as speculative_generate's step_costs.

  Each k is timed `repeats` times, the lengths interleaved (0..K, then again), and the median
  taken, so a drifting machine does not make one k look cheap; then a longer draft never costs
  less than a shorter one (it drafts more and verifies more: a cheaper reading is noise).
  """
  n = min(new_tokens, spec.max_new_tokens)
  if n < 2:
    raise ValueError(f"calibrate needs at least 2 new tokens to time a loop step, got "
                     f"new_tokens={new_tokens} with spec.max_new_tokens={spec.max_new_tokens}")
  if repeats < 1:
    raise ValueError(f"calibrate needs repeats >= 1, got {repeats}")
  spec = spec if spec.goodput is not None else dataclasses.replace(spec, goodput=Goodput())

  program = spec_program(params, config, drafter, spec, drafter_params,
                         forcing(0, spec.k + 1))  # warm_states forces each length in turn
  times = engine.step_seconds(params, config, prompts, spec, program, key, mesh, n, repeats)
  return np.maximum.accumulate(np.median(times, axis=0)).astype(np.float32)  # [K + 1]
