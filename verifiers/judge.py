"""A judge head (Judge Decoding, Bachmann et al. 2025), a LOSSY rule: off by default, and named
lossy wherever it appears (SpecConfig.lossy, the summary, the CLI flag).

The target's last-layer feature at a draft token's own slot (after reading it) goes through a
linear head; draft x is kept where the target's rule keeps it (x is the target's most likely
token there) or the judge calls it correct, sigmoid(w . h + b) > threshold, in order, and the
step then takes the target's token from p at the first position not kept (p itself, not the
residual). A judge that never fires leaves greedy output the target's own; one that fires keeps
drafts the target would have replaced, which buys longer accepted runs at the price of the
output (what that costs on HumanEval: research/lossy_quality.py). Training: train/judge.py.

The head is a tuple of floats, so a Judge is a static jit argument like every rule.

Dims: b batch, k draft length, v vocab, d model width.
"""
from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.fields import Checked, field
from speculax.core.sampling import argmax


@dataclasses.dataclass(frozen=True)
class Judge(Checked):
  # [d] the linear head on the target's final-normed feature (left out of repr: d numbers)
  weights: tuple[float, ...] = field(repr=False)
  bias: float = 0.0
  threshold: float = field(0.5, gt=0, lt=1)  # keep a draft the judge scores above this

  def check(self, d_model: int) -> None:
    if len(self.weights) != d_model:
      raise ValueError(f"the judge head has {len(self.weights)} weights; this target's features "
                       f"have d_model={d_model}")

  def save(self, path: str | pathlib.Path) -> pathlib.Path:
    """An .npz of the head (weights, bias, threshold)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, weights=np.asarray(self.weights, np.float32), bias=self.bias,
             threshold=self.threshold)
    return path

  @classmethod
  def load(cls, path: str | pathlib.Path, threshold: float | None = None) -> "Judge":
    """The judge saved at `path`, with its own threshold unless one is given."""
    try:
      f = np.load(path)
    except (OSError, ValueError) as e:
      raise ValueError(f"{path} is not a judge head (an .npz of Judge.save): {e}") from None
    names = set(getattr(f, "files", ()))
    if names != {"weights", "bias", "threshold"}:
      raise ValueError(f"{path} is not a judge head (an .npz of Judge.save): it holds "
                       f"{sorted(names) or type(f).__name__}")
    with f:
      return cls(tuple(float(x) for x in f["weights"]), float(f["bias"]),
                 float(f["threshold"]) if threshold is None else threshold)

  def kept(self, p: jax.Array, draft_tokens: jax.Array, hidden: jax.Array | None) -> jax.Array:
    """p [b, k, v] the target's law at each draft's slot, draft_tokens [b, k], hidden [b, k, d]
    the target's feature at each draft's own slot -> [b, k] bool: the target's argmax there,
    or judged correct."""
    if hidden is None:
      raise ValueError("a judge head reads the target's features at the drafts' slots; "
                       "verify_chain got no draft_hidden")
    best = draft_tokens == argmax(p)
    return best | (scores(self, hidden) > self.threshold)

  def __str__(self) -> str:
    return f"judge head (threshold {self.threshold})"


def scores(judge: Judge, hidden: jax.Array) -> jax.Array:
  """hidden [..., d] -> [...] the judge's probability that each token is correct."""
  w = jnp.asarray(judge.weights, jnp.float32)
  return jax.nn.sigmoid(hidden.astype(jnp.float32) @ w + judge.bias)
