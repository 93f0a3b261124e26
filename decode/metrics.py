"""What every decode run reports: tokens, target forwards, tau, per-position acceptance, speed."""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


def decode_rate(new_tokens: int, prompts: int, decode_s: float) -> float:
  """Tokens the decode loops emitted (each prompt's first comes from its prefill) per second of
  them: what a drafter and a draft-length policy change, the prefill being the same work for
  every method (at batch 8 on a 2-core CPU about half of a 48-token call)."""
  return (new_tokens - prompts) / max(decode_s, 1e-9)


@dataclasses.dataclass
class DecodeOutput:
  tokens: list[list[int]]  # new tokens per prompt, EOS included when hit
  prefill_s: float
  decode_s: float
  forwards: int  # target forward passes, prefill included
  # Warm-up compile time, measured apart from the timed run; None: no warm-up ran, so the
  # timings include compiling (decode calls with warmup=False).
  compile_s: float | None = None
  # Speculative runs only (autoregressive decoding is k = 0):
  row_steps: int = 0  # verify steps summed over the sequences still active in them
  # Tokens those steps emitted: accepted drafts + one target token each, fewer where the token
  # budget or an EOS cut a step's block (only what is emitted counts).
  step_tokens: int = 0
  # [k] steps whose draft i was accepted and emitted, summed over sequences.
  accepted_at: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
  drafted: int = 0  # draft tokens the target checked (k per step, fewer with adaptive length)
  # Goodput-driven draft length only: [k + 1] loop steps that drafted 0..k (None: always k).
  k_steps: np.ndarray | None = None
  # Goodput-driven only: loop steps after which the next drafted another length.
  k_changes: int | None = None
  # Goodput-driven only: [k + 1] the step costs it weighed (seconds of a step drafting 0..k),
  # to pass again (sx.speculate(goodput=out.step_costs)) instead of recalibrating.
  step_costs: np.ndarray | None = None
  # Goodput-driven only: the acceptance counts the loop ended with (kept, reached [signal bins,
  # k]), to start the next call from (speculative_generate(estimate=...); serve carries them).
  goodput_estimate: tuple[np.ndarray, np.ndarray] | None = None
  # PEARL only (decode/pearl.py): of row_steps, those in post-verify (drafts ready from the
  # step before, drafted while the target verified).
  post_steps: int | None = None
  # The lossy acceptance rule the run used (None: lossless, the output law is the target's).
  lossy: str | None = None
  drafter_state: Any = None  # the drafter's final state (e.g. a Token Recycling matrix to reuse)
  texts: list[str] | None = None  # the new tokens decoded, when the caller had a tokenizer
  # Rows decoded at once (None: every prompt, one batch); continuous batching (rows=) decodes
  # the prompts this many at a time, a finished row refilled with the next prompt.
  batch: int | None = None

  @property
  def new_tokens(self) -> int:
    return sum(len(t) for t in self.tokens)

  @property
  def wall_s(self) -> float:
    return self.prefill_s + self.decode_s

  @property
  def tokens_per_s(self) -> float:
    return self.new_tokens / self.wall_s

  @property
  def decode_tokens_per_s(self) -> float:
    return decode_rate(self.new_tokens, len(self.tokens), self.decode_s)

  @property
  def step_s(self) -> float:
    """Seconds of one loop step: the decode loop's wall time per target forward after the
    prefill (which is timed apart)."""
    return self.decode_s / max(self.forwards - 1, 1)

  @property
  def tau(self) -> float:
    """Mean tokens emitted per verify step per sequence (1.0 for autoregressive decoding); the
    first new token, which the prefill gives, is not counted."""
    return self.step_tokens / self.row_steps if self.row_steps else 1.0

  @property
  def acceptance(self) -> np.ndarray:
    """[k] fraction of verify steps whose draft at position i was accepted and emitted."""
    return self.accepted_at / max(self.row_steps, 1)

  @property
  def rows_active(self) -> float | None:
    """Share of the loop's row-steps spent on a sequence still generating (None: no speculative
    steps). At batch > 1 a finished row rides along in every later step until the last row
    finishes, so a batch's speedup over AR is about tau x this share / a step's cost in AR steps
    (1.0 at batch 1)."""
    steps = (self.forwards - 1) * (self.batch or len(self.tokens))
    return self.row_steps / steps if self.row_steps and steps else None

  @property
  def draft_length(self) -> float:
    """Mean draft tokens the target checked per step per sequence (tree nodes for a tree)."""
    return self.drafted / self.row_steps if self.row_steps else 0.0

  @property
  def mean_k(self) -> float | None:
    """Goodput-driven runs: the mean draft length the loop chose per step (None otherwise)."""
    if self.k_steps is None:
      return None
    return float(np.arange(len(self.k_steps)) @ self.k_steps / max(self.k_steps.sum(), 1))

  def metrics(self) -> dict:
    """What summary() says, JSON-ready (tokens per prompt included)."""
    return dict(tokens=self.tokens, new_tokens=self.new_tokens, tokens_per_s=self.tokens_per_s,
                decode_tokens_per_s=self.decode_tokens_per_s,
                prefill_s=self.prefill_s, decode_s=self.decode_s, compile_s=self.compile_s,
                forwards=self.forwards, tau=self.tau, acceptance=self.acceptance.tolist(),
                drafts_per_step=self.draft_length, rows_active=self.rows_active,
                k_steps=None if self.k_steps is None else self.k_steps.tolist(),
                k_changes=self.k_changes,
                step_costs=None if self.step_costs is None else self.step_costs.tolist(),
                post_steps=self.post_steps, lossy=self.lossy)

  def summary(self) -> str:
    acc = " ".join(f"{a:.2f}" for a in self.acceptance)
    compiled = ("timings include compiling: no warm-up ran" if self.compile_s is None else
                f"compile {self.compile_s:.1f} s not counted")
    return (f"{self.new_tokens} new tokens in {self.wall_s:.2f} s: {self.tokens_per_s:.1f} tokens/s "
            f"(prefill {self.prefill_s:.2f} s, decode {self.decode_s:.2f} s; {compiled}); "
            f"{self.forwards} target forwards, "
            f"tau {self.tau:.2f}" + (f", acceptance by position [{acc}], {self.draft_length:.2f} "
                                     "drafts checked per step" if acc else "")
            + ("" if len(self.tokens) < 2 or self.rows_active is None else
               f"; {self.rows_active:.0%} of the batch's row-steps on unfinished rows")
            + ("" if self.batch is None else
               f"; continuous batching, {self.batch} row{'s' * (self.batch > 1)} at a time")
            + ("" if self.k_steps is None else
               f"; goodput chose k = 0..{len(self.k_steps) - 1} in "
               f"{'/'.join(str(int(n)) for n in self.k_steps)} steps"
               + ("" if self.k_changes is None else f", changing length {self.k_changes} times"))
            + ("" if self.post_steps is None else
               f"; PEARL: {self.post_steps} of {self.row_steps} steps post-verify")
            + ("" if self.lossy is None else f"; LOSSY: {self.lossy}"))
