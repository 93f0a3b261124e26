"""Optimizer settings and the optax chain built from them."""
from __future__ import annotations

import dataclasses

import optax

from speculax.core.fields import Checked, field


@dataclasses.dataclass(frozen=True)
class OptimConfig(Checked):
  learning_rate: float = field(3e-4, gt=0)
  warmup_steps: int = field(20, ge=0)
  total_steps: int = field(200, ge=1)  # optimizer updates; the cosine decays to 0 over them
  weight_decay: float = field(0.0, ge=0)
  grad_clip: float = field(1.0, ge=0)  # global-norm clipping; 0 disables it
  accum_steps: int = field(1, ge=1)  # micro-batches per update (gradient accumulation)
  decay: bool = True  # False: constant after warmup (online adaptation has no last step)

  def __post_init__(self):
    super().__post_init__()
    if self.warmup_steps >= self.total_steps:  # the cosine needs >= 1 decay step
      raise ValueError(f"OptimConfig.warmup_steps must be in [0, total_steps={self.total_steps}), "
                       f"got {self.warmup_steps}")

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
