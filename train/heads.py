"""Training head drafters (Medusa, Hydra, EAGLE) on cached target features (self-distillation).

The target stays frozen: its params enter as `frozen` (the drafters share its embedding and
output head), its features and distributions come from the teacher cache
(train/teacher_cache.py with the drafter's hidden_layers). A head drafter says what it predicts
through `train_outputs(params, frozen, config, batch, key)`:

  logits [b, t, J, v]  depth j (1-based) at row position i: the drafter's law for the token whose
                       target distribution the cache holds at position i + j (Medusa head j,
                       EAGLE's j-th autoregressive step, ...)
  aux_loss []          optional, added to the loss (e.g. EAGLE's feature regression)
  accept_logits [b, t, J]  optional: an acceptance head's logit that depth j's draft is kept;
                       trained with binary cross-entropy against the expected acceptance 1 - TV
                       of that depth (SpecDec++), the label under stop_gradient
  metrics              optional, extra scalars to report

Reports, per depth, the divergence, the estimated acceptance 1 - TV and top-1 agreement.

Dims: b batch, t time, j depth, v vocab.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from speculax.core.fields import Checked, field
from speculax.drafters import vocab_trim
from speculax.drafters.base import Drafter
from speculax.train import teacher_law
from speculax.train.losses import Divergence
from speculax.train.optim import OptimConfig


@dataclasses.dataclass(frozen=True)
class HeadsConfig(Checked):
  drafter: Drafter | None = None  # a trained kind (Medusa, Hydra, Eagle)
  divergence: Divergence = "fkl"
  divergence_options: tuple[tuple[str, float], ...] = ()
  # Weight of the acceptance head's loss, when it has one.
  acceptance_weight: float = field(1.0, ge=0)
  # Depth j's losses weigh depth_decay ** (j - 1), normalised to sum 1 (1.0: the plain mean).
  # Below 1 it leans on the first draft, which every accepted run needs, while the later depths
  # of the training-time test still train (Medusa's and HASS's per-depth decay).
  depth_decay: float = field(1.0, gt=0, le=1)
  batch_size: int = field(8, ge=1)
  optim: OptimConfig = OptimConfig()
  seed: int = field(0, ge=0)

  def __post_init__(self):
    super().__post_init__()
    if self.drafter is None or not self.drafter.trained:
      raise ValueError(f"HeadsConfig.drafter must be a head drafter (Medusa, Hydra, Eagle), "
                       f"got {self.drafter!r}")
    teacher_law.get_divergence(self.divergence, **dict(self.divergence_options))  # names a bad one

  @property
  def steps(self) -> int:
    return self.optim.total_steps * self.optim.accum_steps

  def objective(self, params, config, batch, key, frozen):
    """(loss, metrics): the divergence averaged over depths (weights from depth_decay), plus
    the drafter's extra losses.

    batch: tokens/mask [b, t], hidden [l, b, t, d] (the drafter's hidden_layers),
    ids/logprobs [b, t, K] or the target's exact teacher_logits [b, t, v]; frozen: the
    target's params (for a trimmed drafter, with its kept output rows under vocab_trim.TRIM:
    the teacher and the metrics then live on those ids).
    """
    divergence = teacher_law.get_divergence(self.divergence, **dict(self.divergence_options))
    kept = frozen.get(vocab_trim.TRIM, {}).get("ids")  # a trimmed drafter's ids [n], or None
    teacher = teacher_law.teacher_law(batch, config.vocab_size, kept)  # [b, t, n] or its TopK
    out = self.drafter.train_outputs(params, frozen, config, batch, key)
    logits, accept = out["logits"], out.get("accept_logits")  # [b, t, J, n], [b, t, J]
    t, depth = batch["mask"].shape[1], logits.shape[2]
    if depth >= t:
      raise ValueError(f"training {depth} draft depths needs rows longer than {depth} tokens, "
                       f"got {t}")
    total, metrics, accs = 0.0, dict(out.get("metrics", {})), []
    decay = [self.depth_decay ** j for j in range(depth)]
    for j, w in enumerate([d / sum(decay) for d in decay], 1):  # depth j at i vs teacher at i + j
      # Every position, the teacher rolled back j: the last j, which have none, are masked (no
      # slice of the [b, t, n] logits is copied).
      student = logits[:, :, j - 1]  # [b, t, n]
      target = jax.tree.map(lambda x: jnp.roll(x, -j, axis=1), teacher)
      mask = batch["mask"] * jnp.pad(batch["mask"][:, j:], ((0, 0), (0, j)))  # [b, t]
      loss = divergence(target, student, mask, key=jax.random.fold_in(key, j))
      total += w * loss
      chance = teacher_law.acceptance(target, student, mask)  # [b, t] 1 - TV per position
      n = jnp.maximum(mask.sum(), 1)
      acc = chance.sum() / n
      # argmax(student) == the teacher's top, the argmax as the first id where the max sits (a
      # min, not argmax's slower variadic reduce)
      ids = jnp.arange(student.shape[-1])
      first = jnp.min(jnp.where(student == jnp.max(student, -1, keepdims=True), ids, ids.size), -1)
      agree = (first == teacher_law.top(target, ids.size)) * mask
      metrics |= {f"loss/depth{j}": loss, f"acceptance/depth{j}": acc,
                  f"top1/depth{j}": agree.sum() / n}
      accs.append(acc)
      if accept is not None:
        label = jax.lax.stop_gradient(chance)
        bce = optax.sigmoid_binary_cross_entropy(accept[:, :, j - 1], label)
        bce = (bce * mask).sum() / n
        total += w * self.acceptance_weight * bce
        metrics[f"acceptance_head_bce/depth{j}"] = bce
    if "aux_loss" in out:
      total += out["aux_loss"]
      metrics["aux_loss"] = out["aux_loss"]
    return total, metrics | {"loss": total, "acceptance": sum(accs) / depth}


def frozen_params(drafter: Drafter, params, target_params, config, order) -> dict:
  """What a head drafter's objective reads but never trains: the target's params, and with
  VocabTrim the output rows (vocab_trim.TRIM) of the first drafter.vocab_trim ids of `order`
  (the training tokens by frequency [v]), in the drafter's own weight dtype as decoding reads
  them (Drafter.prepare)."""
  if not drafter.vocab_trim:
    return target_params
  ids = vocab_trim.check_order(order, config.vocab_size, drafter.vocab_trim)
  return {**target_params,
          vocab_trim.TRIM: drafter.kept_rows(params, target_params, config,
                                             ids[:drafter.vocab_trim])}
