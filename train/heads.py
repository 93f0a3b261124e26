"""Training Medusa heads on cached target features and distributions (self-distillation).

Head j reads the target's final-normed feature h_i and learns the target's distribution of
token i + 1 + j, which the teacher cache holds at position i + j. The target stays frozen: its
output head enters as `frozen`, the feature and distributions come from the cache
(train/teacher_cache.py with hidden_layers=(-1,)). Reports, per head, the divergence, the
estimated acceptance 1 - TV and the top-1 agreement with the target.

Dims: b batch, t time, d model, j heads, v vocab.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from drafters.medusa import heads_logits
from train import losses
from train.optim import OptimConfig


@dataclasses.dataclass(frozen=True)
class HeadsConfig:
  n_heads: int = 4
  divergence: str = "fkl"  # one of losses.DIVERGENCES
  divergence_options: tuple[tuple[str, float], ...] = ()
  batch_size: int = 8
  optim: OptimConfig = OptimConfig()
  seed: int = 0

  def __post_init__(self):
    if self.n_heads < 1:
      raise ValueError(f"n_heads must be >= 1, got {self.n_heads}")
    if self.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
    losses.get_divergence(self.divergence, **dict(self.divergence_options))  # names a bad one

  def objective(self, params, config, batch, key, frozen):
    """(loss, metrics): the mean over heads of the divergence; per-head acceptance and top-1.

    batch: hidden [1, b, t, d] (the final features), ids/logprobs [b, t, K], mask [b, t];
    frozen: the target's params (its output head is read).
    """
    divergence = losses.get_divergence(self.divergence, **dict(self.divergence_options))
    teacher = losses.teacher_logprobs_from_topk(batch["ids"], batch["logprobs"],
                                                config.vocab_size)  # [b, t, v]
    logits = heads_logits(params, frozen, config, batch["hidden"][0])  # [b, t, j, v]
    t = teacher.shape[1]
    if self.n_heads >= t:
      raise ValueError(f"{self.n_heads} heads need rows longer than {self.n_heads} tokens, got {t}")
    total, metrics = 0.0, {}
    for j in range(1, self.n_heads + 1):  # head j at position i vs the teacher at i + j
      student, target = logits[:, :t - j, j - 1], teacher[:, j:]
      mask = batch["mask"][:, j:] * batch["mask"][:, :t - j]
      loss = divergence(target, student, mask, key=jax.random.fold_in(key, j))
      total += loss / self.n_heads
      agree = (jnp.argmax(student, -1) == jnp.argmax(target, -1)) * mask
      metrics |= {f"loss/head{j}": loss,
                  f"acceptance/head{j}": losses.token_acceptance(target, student, mask),
                  f"top1/head{j}": agree.sum() / jnp.maximum(mask.sum(), 1)}
    return total, metrics | {"loss": total}
