"""The cost model of goodput-driven draft length (decode/goodput.py), measured: seconds of one
loop step drafting k = 0..K, at the batch and on the prompts it will serve; and what its drafting
runs saw kept, for the loop to start from.

Each length is timed in the serving loop itself (the same static config and shapes, so one
compile serves calibration and decoding), forced to that length by a cost vector in which only
it is finite, over a short run (`new_tokens`, below the serving budget); every run starts from
a copy of one prefill of the prompts (engine.step_seconds), which is the same for every length.
The run of the longest length checks every draft position, so its acceptance counts are an
estimate of the drafter on these prompts that costs nothing more: a call that starts from it does
not draft its longest on the optimistic prior where drafting does not pay (`Goodput.start`).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from speculax.decode import engine
from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput, forcing
from speculax.decode.speculative import spec_program
from speculax.drafters.base import Drafter
from speculax.models.config import LlamaConfig
from speculax.models.sharding import MeshConfig


class Calibration(NamedTuple):
  step_costs: np.ndarray  # [K + 1] float32 seconds of one loop step drafting 0..K
  # (kept, reached) [bins, K] float32 counts of the longest length's last run, for a call to
  # start from (speculative_generate's estimate); None where the policy starts from the prior.
  estimate: tuple[np.ndarray, np.ndarray] | None


def calibrate(params, config: LlamaConfig, prompts, drafter: Drafter, spec: SpecConfig,
              drafter_params=None, new_tokens: int = 24, key: jax.Array | None = None,
              repeats: int = 3, mesh: MeshConfig | None = None) -> Calibration:
  """The step costs: [spec.k + 1] seconds of one loop step drafting 0..spec.k, timed on
  `prompts` (a batch as it will be served) over min(new_tokens, spec.max_new_tokens) each, in
  spec's goodput loop (Goodput() when spec has none) on `mesh`; and the estimate its longest
  drafting run ended with (None under Goodput(start="prior")): pass them as
  speculative_generate's step_costs and estimate.

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
  times, last = engine.step_seconds(params, config, prompts, spec, program, key, mesh, n,
                                    repeats)
  costs = np.maximum.accumulate(np.median(times, axis=0)).astype(np.float32)  # [K + 1]
  estimate = None if spec.goodput.start == "prior" else (
      np.asarray(last.goodput.kept), np.asarray(last.goodput.reached))
  return Calibration(costs, estimate)
