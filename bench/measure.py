"""How a benchmark measures: the machine, a lone forward's time, one method over a prompt set."""
from __future__ import annotations

import dataclasses
import os
import platform
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.sampling import argmax
from speculax.decode.calibrate import Calibration
from speculax.decode.config import SpecConfig
from speculax.decode.generate import generate
from speculax.decode.metrics import decode_rate
from speculax.decode.pearl import draft_device, pearl_generate
from speculax.decode.speculative import speculative_generate
from speculax.models import llama
from speculax.models.kvcache import KVCache


def machine() -> str:
  """The machine in words, the CPU's model name included where Linux gives it: the same
  2-core size has been an Intel CPU with AMX and an AMD EPYC, whose kernels' speeds differ."""
  dev = jax.devices()[0]
  cpu = platform.processor() or platform.machine()
  if name := cpu_model():
    cpu = f"{cpu} ({name})"
  return (f"{cpu}, {os.cpu_count()} cores, jax {jax.__version__} on {dev.platform} "
          f"({dev.device_kind})")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
  """cpuinfo's first "model name", or None where there is none (not Linux, or not given)."""
  try:
    lines = cpuinfo.read_text().splitlines()
  except OSError:
    return None
  return next((line.split(":", 1)[1].strip() for line in lines
               if line.startswith("model name") and ":" in line), None) or None


def chained_seconds(step: Callable, carry, *args, repeats: int = 10) -> float:
  """Seconds of one step(carry, *args) -> carry, timed as `repeats` steps chained in one jitted
  loop (each takes the last one's output, so XLA can neither hoist nor drop one, and a carried
  buffer is updated in place), median of 3 runs over `repeats`. A lone jitted call adds its host
  dispatch: on an H100 ~0.7 ms, most of a SmolLM2 forward, and ~100 us, an attention call's
  whole reading at 512 slots."""
  loop = chained(step, repeats)
  jax.block_until_ready(loop(carry, *args))
  times = []
  for _ in range(3):
    start = time.perf_counter()
    jax.block_until_ready(loop(carry, *args))
    times.append(time.perf_counter() - start)
  return float(np.median(times)) / repeats


def chained(step: Callable, repeats: int) -> Callable:
  """loop(carry, *args): `repeats` steps chained in one jitted loop (chained_seconds')."""
  return jax.jit(lambda carry, *args: jax.lax.fori_loop(
      0, repeats, lambda _, c: step(c, *args), carry))


def forward_seconds(model, t: int, repeats: int = 10, batch: int = 1) -> float:
  """Device time of one t-token forward of `batch` rows against a cache holding 256 of 512 slots:
  the verify forward of t - 1 drafts (t = 1: a one-token step), outside any decode loop, chained
  as a decode loop runs them (`chained_seconds`: each forward's tokens are the last one's argmax;
  the cache is carried, so its writes are in place, as the loop's are)."""
  step, carry, params = forward_step(model, t, batch)
  return chained_seconds(step, carry, params, repeats=repeats)


def forward_step(model, t: int, batch: int = 1) -> tuple[Callable, tuple, dict]:
  """forward_seconds' step(carry, params) -> carry, its first carry (tokens, cache) and params."""
  cfg, params = model.config, llama.unstack_layers(model.params)
  cache = KVCache.init(cfg, batch, 512, per_layer=True).with_lengths(jnp.full((batch,), 256))
  positions = jnp.broadcast_to(256 + jnp.arange(t, dtype=jnp.int32)[None], (batch, t))

  def step(carry, params):  # tokens [b, t], the cache
    tokens, cache = carry
    logits, _, cache = llama.forward(params, cfg, tokens, positions, cache)  # [b, t, v]
    tokens = jnp.broadcast_to(argmax(logits[:, -1])[:, None], tokens.shape)
    return tokens.astype(jnp.int32), cache.with_lengths(jnp.full((batch,), 256))

  return step, (jnp.ones((batch, t), jnp.int32), cache), params


@dataclasses.dataclass
class Run:
  """Totals of one method over a prompt set."""
  tokens_per_s: float
  tau: float  # tokens per sequence per verify step
  acceptance: list[float]  # share of verify steps whose draft i was kept, by position
  drafts_per_step: float  # draft tokens the target checked per step (per sequence)
  compile_s: float
  steps: int  # verify steps (loop iterations; prefill not counted)
  decode_s: float  # wall time of the decode loops (prefill apart)
  tokens: list[list[int]]  # new tokens per prompt, in order
  k_steps: list[int] | None = None  # goodput-driven runs: loop steps that drafted 0..k
  rows_active: float | None = None  # share of row-steps on unfinished rows, every batch
  decode_tokens_per_s: float = 0.0  # decode/metrics.decode_rate over every batch
  k_changes: int | None = None  # goodput-driven runs: steps after which the next drafted another k


def run_prompts(model, prompts, drafter, dparams, spec: SpecConfig, batch: int = 1,
                hot: bool = False, calibration: Calibration | None = None,
                pearl_form: str | None = None, continuous: bool = False) -> Run:
  """One method over the prompts decoded `batch` at a time (drafter None = autoregressive).
  Every batch compiles apart first (warmup; a no-op when its shapes were compiled already):
  batches in another prompt-length bucket recompile.

  hot: each batch starts from the drafter state the previous one ended with (as params).
  calibration: goodput-driven runs' step costs and the estimate every call starts from
  (decode/calibrate.py).
  pearl_form: PEARL's form (decode/pearl.FORMS) instead of draft-then-verify.
  continuous: one stream of every prompt, `batch` rows at a time, a finished row refilled with
  the next prompt (decode/continuous.py), instead of batches of `batch` prompts.
  """
  if continuous and pearl_form:
    raise ValueError(f"PEARL ({pearl_form}) decodes fixed batches; continuous batching is for "
                     "autoregressive and draft-then-verify decoding")
  rows = batch if continuous else None
  step_costs, estimate = calibration or (None, None)
  starts = [0] if continuous else range(0, len(prompts) - batch + 1, batch)
  wall = n_tokens = row_steps = step_tokens = compile_s = accepted = drafted = steps = decode = 0
  tokens, k_steps, k_changes = [], None, None
  for i in starts:
    key, chunk = jax.random.key(i), prompts[i:] if continuous else prompts[i:i + batch]
    if drafter is None:
      out = generate(model.params, model.config, chunk, spec, key, warmup=True, rows=rows)
    else:
      out = (pearl_generate(model.params, model.config, chunk, drafter, spec, dparams, key,
                            draft_device(pearl_form), warmup=True) if pearl_form else
             speculative_generate(model.params, model.config, chunk, drafter, spec,
                                  drafter_params=dparams, key=key, warmup=True,
                                  step_costs=step_costs, estimate=estimate, rows=rows))
      if hot:
        dparams = out.drafter_state
      row_steps, step_tokens = row_steps + out.row_steps, step_tokens + out.step_tokens
      accepted, drafted = accepted + out.accepted_at, drafted + out.drafted
      if out.k_steps is not None:
        k_steps = out.k_steps + (0 if k_steps is None else k_steps)
        k_changes = out.k_changes + (k_changes or 0)
    wall, n_tokens, compile_s = wall + out.wall_s, n_tokens + out.new_tokens, compile_s + out.compile_s
    steps, decode = steps + out.forwards - 1, decode + out.decode_s
    tokens += out.tokens
  tau = step_tokens / row_steps if row_steps else 1.0
  acceptance = (np.asarray(accepted) / max(row_steps, 1)).tolist() if row_steps else []
  return Run(n_tokens / wall, tau, acceptance, drafted / max(row_steps, 1), compile_s, steps,
             decode, tokens, None if k_steps is None else k_steps.tolist(),
             row_steps / (steps * batch) if row_steps else None,  # every step holds `batch` rows
             decode_rate(n_tokens, len(tokens), decode), k_changes)
