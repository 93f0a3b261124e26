"""Optimizer settings and the optax chain built from them."""
from __future__ import annotations

import dataclasses
import math

import optax


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  learning_rate: float = 3e-4
  warmup_steps: int = 20
  total_steps: int = 200  # optimizer updates; the cosine decays to 0 over them
  weight_decay: float = 0.0
  grad_clip: float = 1.0  # global-norm clipping; 0 disables it
  accum_steps: int = 1  # micro-batches per update (gradient accumulation)
  decay: bool = True  # False: constant after warmup (online adaptation has no last step)

  def __post_init__(self):
    if not math.isfinite(self.learning_rate) or self.learning_rate <= 0:
      raise ValueError(f"learning_rate must be a positive number, got {self.learning_rate}")
    for name in ("total_steps", "accum_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if not 0 <= self.warmup_steps < self.total_steps:  # the cosine needs >= 1 decay step
      raise ValueError(f"warmup_steps must be in [0, total_steps={self.total_steps}), "
                       f"got {self.warmup_steps}")
    if self.weight_decay < 0 or self.grad_clip < 0:
      raise ValueError(f"weight_decay and grad_clip must be >= 0, got {self.weight_decay}, "
                       f"{self.grad_clip}")

  def with_total_steps(self, total_steps: int) -> OptimConfig:
    """The same settings over another budget (warmup shortened if it would not fit)."""
    return dataclasses.replace(self, total_steps=total_steps,
                               warmup_steps=min(self.warmup_steps, max(total_steps - 1, 0)))

  def schedule(self) -> optax.Schedule:
    if not self.decay:  # (optax's warmup_constant_schedule stays at 0 with no warmup)
      return optax.join_schedules([optax.linear_schedule(0.0, self.learning_rate,
                                                         self.warmup_steps),
                                   optax.constant_schedule(self.learning_rate)],
                                  [self.warmup_steps])
    return optax.warmup_cosine_decay_schedule(0.0, self.learning_rate, self.warmup_steps,
                                              self.total_steps)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  """clip -> AdamW on a warmup + cosine schedule, with MultiSteps for accumulation."""
  parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip else []
  tx = optax.chain(*parts, optax.adamw(cfg.schedule(), weight_decay=cfg.weight_decay))
  return optax.MultiSteps(tx, every_k_schedule=cfg.accum_steps) if cfg.accum_steps > 1 else tx
