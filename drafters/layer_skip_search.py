"""A simple search for a good layer-skip set (SWIFT / Draft & Verify style self-speculation).

Proxy for acceptance: teacher-forced top-1 agreement. The calibration sequences run once
through the full model (argmax at every position), then through the model with a per-layer
keep mask (`llama.forward(..., layer_mask=)`, one compile for every skip set); the agreement is
the fraction of valid positions, pooled over all sequences, where the two argmaxes match.

Search: ranked elimination. Score each candidate layer once by the agreement left when it alone
is skipped; round r skips the r best-scoring layers (ties: the lowest index), until
`max_skip_fraction` of the layers are skipped. That is about L + rounds forwards of the
calibration batch; a greedy re-scoring every round costs ~L^2 / 2 (measured ~27 min for SmolLM2
on a busy 2-core CPU, against a few minutes here). The first and last layers are never
candidates: LayerSkip, SWIFT and Draft & Verify all find them the most damaging to drop (the
first turns embeddings into features every later layer reads, the last shapes the features the
LM head reads).

Choice among the rounds: the highest `estimated_speedup` (see there), an estimate from a cost
model, not a measurement. Benchmark the chosen drafter before quoting a speedup.

Caveat: the real drafter's kept layers read the target's own K/V for the verified prefix,
whereas the proxy runs the sub-model on its own K/V at every position, so the proxy tends to
understate acceptance (SmolLM2-135M, 4 HumanEval prompts, greedy: skipping layer 14, proxy 0.82
vs first-draft acceptance 0.87 in the decode loop; skipping 14, 19, 25, 26: 0.60 vs 0.64). It
ranks skip sets; measure the acceptance of the chosen one with the decode loop.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from speculax.core.sampling import argmax
from speculax.core.tau import expected_tokens
from speculax.models import llama
from speculax.models.config import LlamaConfig


@dataclasses.dataclass(frozen=True)
class SkipRound:
  """One round of the search: the best skip set of that size and its figures."""
  skip: tuple[int, ...]  # skipped layer indices, ascending
  agreement: float  # teacher-forced top-1 agreement with the full model, in [0, 1]
  estimated_speedup: float  # see `estimated_speedup`


@dataclasses.dataclass(frozen=True)
class SkipSearchResult:
  skip: tuple[int, ...]  # skipped layer indices of the chosen round, ascending
  agreement: float
  estimated_speedup: float
  trace: tuple[SkipRound, ...]  # round r skips r layers; round 0 is the full model


def estimated_speedup(acceptance, k: int, cost, cost_floor: float = 0.0,
                      verify_cost: float = 1.0):
  """Speedup of chain speculative decoding over one target forward per token: an estimate
  (a float or an array of them, traced too: the layer-skip drafter's on-the-fly choice uses it
  inside the loop).

  Model: one step = one target forward of k + 1 tokens, costing `verify_cost` one-token forwards
  (1 where decoding is memory-bound; measure it where a block costs compute, as on a CPU), plus
  k drafter forwards, each costing `cost` (kept / total layers) + `cost_floor` (per-forward costs
  that do not shrink with the layers: embedding, LM head, dispatch) in units of a target
  forward. It ignores the proxy-vs-real acceptance gap, so measure before quoting a speedup.
  """
  a = jnp.asarray(acceptance, jnp.float32)[..., None]  # i.i.d.: every position kept alike
  tau = expected_tokens(jnp.broadcast_to(a, a.shape[:-1] + (k,)))[..., k]
  return tau / (verify_cost + k * (cost + cost_floor))


def _check_inputs(params, config: LlamaConfig, calibration, k: int, max_skip_fraction: float,
                  cost_floor: float) -> list[np.ndarray]:
  """Host-side validation (jax clamps bad token ids silently); returns the prompts as arrays."""
  if k < 1:
    raise ValueError(f"k (draft tokens per step) must be >= 1, got {k}")
  if not 0.0 < max_skip_fraction < 1.0:
    raise ValueError(f"max_skip_fraction must be in (0, 1), got {max_skip_fraction}")
  if not (math.isfinite(cost_floor) and cost_floor >= 0.0):
    raise ValueError(f"cost_floor must be a finite number >= 0, got {cost_floor}")
  if isinstance(params["layers"], tuple):
    raise ValueError("search_skip_set takes stacked params (as loaded), not unstacked ones")
  if calibration is None or len(calibration) == 0:
    raise ValueError(f"calibration must hold at least one prompt, got {calibration!r}")
  seqs = []
  for i, prompt in enumerate(calibration):
    seq = np.asarray(prompt)
    if seq.ndim != 1 or seq.size == 0:
      raise ValueError(f"calibration prompt {i} must be a non-empty list of token ids, "
                       f"got {prompt!r}")
    if not np.issubdtype(seq.dtype, np.integer):
      raise ValueError(f"calibration prompt {i} holds non-integer values (dtype {seq.dtype})")
    bad = seq[(seq < 0) | (seq >= config.vocab_size)]
    if bad.size:
      raise ValueError(f"calibration prompt {i} has token id {int(bad[0])} outside the "
                       f"vocabulary 0..{config.vocab_size - 1}")
    if seq.size > config.max_seq_len:
      raise ValueError(f"calibration prompt {i} has {seq.size} tokens, more than "
                       f"max_seq_len={config.max_seq_len}")
    seqs.append(seq)
  return seqs


def pack_rows(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads to one length: tokens [b, t] int32 and valid [b, t] bool. Causal attention
  keeps the padding out of every valid position."""
  t = max(s.size for s in seqs)
  tokens = np.zeros((len(seqs), t), np.int32)
  valid = np.zeros((len(seqs), t), bool)
  for i, s in enumerate(seqs):
    tokens[i, :s.size] = s
    valid[i, :s.size] = True
  return tokens, valid


@functools.partial(jax.jit, static_argnames=("config",))
def top1(params, config: LlamaConfig, tokens, keep):  # -> [b, t] int32
  """Argmax next token at every position of the model that runs only the `keep` [l] layers."""
  positions = llama.row_positions(*tokens.shape)
  logits, _, _ = llama.forward(params, config, tokens, positions, layer_mask=keep)
  return argmax(logits)


def _keep_mask(n_layers: int, skip) -> np.ndarray:  # [l] bool
  keep = np.ones(n_layers, bool)
  keep[list(skip)] = False
  return keep


def search_skip_set(params, config: LlamaConfig, calibration: list[list[int]], *, k: int = 5,
                    max_skip_fraction: float = 0.6, cost_floor: float = 0.0) -> SkipSearchResult:
  """Ranked elimination of layers on calibration prompts (token-id lists).

  Returns the round (skipping at least one layer: a layer-skip drafter that skips nothing is
  the target itself) with the highest estimated speedup for k-draft chain decoding, and the
  trace of every round. Costs one compile and about (candidates + rounds) forwards of the
  calibration batch. A model with no candidate layer (n_layers <= 2) or too small a fraction
  to skip one layer gets round 0: the full model. When the chosen round is not estimated to
  beat autoregressive decoding (speedup <= 1), it warns.
  """
  seqs = _check_inputs(params, config, calibration, k, max_skip_fraction, cost_floor)
  tokens, valid = pack_rows(seqs)
  n = config.n_layers
  n_valid = int(valid.sum())
  tokens_dev = jnp.asarray(tokens)
  reference = np.asarray(top1(params, config, tokens_dev, jnp.ones(n, bool)))

  def agreement(skip) -> float:
    pred = np.asarray(top1(params, config, tokens_dev, jnp.asarray(_keep_mask(n, skip))))
    return float(((pred == reference) & valid).sum()) / n_valid

  def record(skip, agree) -> SkipRound:
    return SkipRound(tuple(sorted(skip)), agree,
                     float(estimated_speedup(agree, k, (n - len(skip)) / n, cost_floor)))

  candidates = list(range(1, n - 1))
  rounds = min(int(max_skip_fraction * n + 1e-9), len(candidates))  # 0.29 * 100 -> 29
  trace = [record((), 1.0)]
  with tqdm(total=len(candidates) + rounds, disable=None, desc="layer-skip search",
            unit="fwd") as bar:
    alone = []
    for layer in candidates:
      alone.append(agreement((layer,)))
      bar.update()
    order = [candidates[i] for i in np.argsort(-np.asarray(alone), kind="stable")]
    for r in range(1, rounds + 1):
      skip = tuple(order[:r])
      trace.append(record(skip, agreement(skip)))
      bar.update()
      bar.set_postfix(skipped=r, agreement=f"{trace[-1].agreement:.3f}")
  # First maximum: the fewest skipped layers among equals.
  chosen = max(trace[1:] or trace, key=lambda r: r.estimated_speedup)
  if chosen.estimated_speedup <= 1.0:
    warnings.warn(f"no layer-skip set of {n} layers is estimated to beat autoregressive decoding "
                  f"with k={k} (best estimate {chosen.estimated_speedup:.3f}, skipping "
                  f"{chosen.skip}): layer-skip drafting would likely slow decoding down",
                  stacklevel=2)
  return SkipSearchResult(skip=chosen.skip, agreement=chosen.agreement,
                          estimated_speedup=chosen.estimated_speedup, trace=tuple(trace))
