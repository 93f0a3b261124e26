"""Online adaptation of a draft model while it serves (Online Speculative Decoding, Liu et al. 2023).

The serving loop (decode/serve.py) hands every served request to `OnlineLearner.observe`: its
tokens and the target's top-k laws that verification recorded on them. Most requests go into a
bounded replay buffer; every `heldout_every`-th goes into a small held-out slice instead. Once
`update_every` requests have arrived since the last round and the buffer holds `min_positions`
recorded positions, `update` runs `steps` jitted distillation steps (the distillation trainer's
own `train_step`, with any divergence of train/losses.py) on rows sampled from the buffer. The
round is rolled back when it lowers the held-out slice's expected acceptance (mean 1 - TV) by
more than `rollback_tolerance`. Each round ends with a checkpoint of the drafter's params,
optimizer state, both buffers and the counters, so a restarted server resumes where it stopped.

The drafter only ever changes between decode calls, and verification keeps decoding lossless
with any drafter, so no output token depends on the updates.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.dtypes import floats_as
from speculax.core.fields import Checked, field
from speculax.models.checkpoints import Checkpointer
from speculax.models.config import LlamaConfig
from speculax.serve.replay import Policy, ReplayBuffer
from speculax.train.distill import DistillConfig, eval_metrics, init_state, train_step
from speculax.train.losses import Divergence
from speculax.train.optim import OptimConfig


@dataclasses.dataclass(frozen=True)
class OnlineConfig(Checked):
  divergence: Divergence | Literal["ce"] = "fkl"
  divergence_options: tuple[tuple[str, float], ...] = ()
  update_every: int = field(8, ge=1)  # served requests between update rounds
  min_positions: int = field(32, ge=1)  # recorded positions the buffer must hold before a round
  steps: int = field(4, ge=1)  # optimizer updates per round
  batch_size: int = field(4, ge=1)  # buffer rows per update
  learning_rate: float = field(1e-4, gt=0)  # constant: serving has no last step
  buffer_size: int = field(64, ge=1)  # rows (served requests) the replay buffer holds
  buffer_policy: Policy = "fifo"
  seq_len: int = field(256, ge=2)  # tokens kept per row (the latest)
  top_k: int = field(32, ge=1)  # target log-probs kept per recorded position
  all_positions: bool = False  # record every emitted token, not only where a draft was rejected
  heldout_every: int = field(8, ge=0)  # every n-th request to the held-out slice; 0: no rollback
  heldout_size: int = field(8, ge=1)  # rows in the held-out slice (FIFO: the latest traffic)
  rollback_tolerance: float = field(0.005, ge=0)  # roll back when held-out acceptance drops more
  seed: int = field(0, ge=0)

  def __post_init__(self):
    super().__post_init__()
    if self.heldout_every == 1:
      raise ValueError(f"OnlineConfig.heldout_every must be 0 (off) or >= 2, got "
                       f"{self.heldout_every}")
    self.distill()  # raises ValueError naming an unknown divergence option

  def distill(self) -> DistillConfig:
    optim = OptimConfig(learning_rate=self.learning_rate, warmup_steps=0, total_steps=1,
                        decay=False)
    return DistillConfig(divergence=self.divergence, divergence_options=self.divergence_options,
                         batch_size=self.batch_size, optim=optim, seed=self.seed)


def served_row(prompt, output, ids, logprobs, recorded) -> dict[str, np.ndarray]:
  """A served request in the trainer's alignment: history slot j's law goes to position j - 1.

  prompt, output: token lists; ids/logprobs [s, K], recorded [s]: the Recording buffers of the
  request's row (slot-indexed, s >= len(prompt) + len(output)).
  """
  tokens = np.asarray(list(prompt) + list(output), np.int32)
  n = len(tokens)
  shift = lambda a: np.concatenate([np.asarray(a[1:n]), np.zeros_like(a[:1])])
  return {"tokens": tokens, "ids": shift(ids), "logprobs": shift(logprobs),
          "mask": shift(recorded).astype(np.float32)}


class OnlineLearner:
  """The drafter's training state, replay buffer, held-out slice and update policy.

  folder: where rounds are checkpointed; an existing checkpoint there is restored (a restarted
  server resumes). None: nothing is saved.
  """

  def __init__(self, params, config: LlamaConfig, online: OnlineConfig = OnlineConfig(),
               folder: str | os.PathLike | None = None):
    self.config, self.online, self.cfg = config, online, online.distill()
    # Learns in the draft config's weight dtype: a draft model stored in bfloat16 decodes in it
    # beside a float32 target (drafters/heads_io.decode_dtype) but trains float32 weights here.
    self.state = init_state(floats_as(params, config.runtime.param_dtype), self.cfg)
    self.buffer = ReplayBuffer(online.buffer_size, online.seq_len, online.top_k,
                               online.buffer_policy, online.seed)
    self.heldout = ReplayBuffer(online.heldout_size, online.seq_len, online.top_k)
    self.requests = self.rounds = self.rollbacks = self.since_round = 0
    self.checkpointer = None if folder is None else Checkpointer(folder, every=1, keep=2,
                                                                 async_save=False)
    if self.checkpointer is not None and self.checkpointer.latest_step() is not None:
      self._load(self.checkpointer.restore(like=self._snapshot()))

  @property
  def params(self):
    return self.state.params

  def observe(self, row: dict[str, np.ndarray]) -> None:
    """One served request (see `served_row`)."""
    self.requests += 1
    every = self.online.heldout_every
    if every and self.requests % every == 0:
      self.heldout.add(**row)
    else:
      self.buffer.add(**row)
      self.since_round += 1

  def due(self) -> bool:
    return (self.since_round >= self.online.update_every
            and self.buffer.positions >= self.online.min_positions)

  def heldout_acceptance(self, params=None) -> float | None:
    """Mean expected acceptance (1 - TV) over the held-out slice's recorded positions."""
    if not self.online.heldout_every or self.heldout.positions == 0:
      return None
    # Every slot, filled or not (empty ones have mask 0): one shape, so one compile.
    batch = {k: jnp.asarray(v) for k, v in self.heldout.arrays.items()}
    metrics = eval_metrics(self.params if params is None else params, self.config, self.cfg,
                           batch)
    return float(metrics["acceptance"])

  def update(self) -> dict[str, float]:
    """One round: `steps` distillation updates, kept only if held-out acceptance holds up."""
    t0 = time.perf_counter()
    rng = np.random.default_rng((self.online.seed, self.rounds))
    before = self.heldout_acceptance()
    backup = jax.tree.map(jnp.copy, self.state)  # train_step donates the state it is given
    losses = []
    for _ in range(self.online.steps):
      batch = {k: jnp.asarray(v) for k, v in self.buffer.sample(self.online.batch_size,
                                                               rng).items()}
      self.state, metrics = train_step(self.state, batch, self.config, self.cfg)
      losses.append(float(metrics["loss"]))
    after = self.heldout_acceptance()
    rolled_back = (before is not None and after is not None
                   and after < before - self.online.rollback_tolerance)
    if rolled_back:
      self.state = backup
      self.rollbacks += 1
    self.rounds += 1
    self.since_round = 0
    self.save()
    return {"round": self.rounds, "loss": float(np.mean(losses)),
            "heldout_before": np.nan if before is None else before,
            "heldout_after": np.nan if after is None else after,
            "rolled_back": float(rolled_back), "buffer_rows": self.buffer.size,
            "buffer_positions": self.buffer.positions, "seconds": time.perf_counter() - t0}

  def save(self) -> None:
    if self.checkpointer is not None:
      self.checkpointer.save(self.rounds, self._snapshot(), force=True)

  def _snapshot(self) -> dict:
    counters = np.asarray([self.requests, self.rounds, self.rollbacks, self.since_round],
                          np.int64)
    return {"train": self.state, "buffer": self.buffer.state(),
            "heldout": self.heldout.state(), "counters": counters}

  def _load(self, snap: dict) -> None:
    self.state = snap["train"]
    self.buffer.load(snap["buffer"])
    self.heldout.load(snap["heldout"])
    self.requests, self.rounds, self.rollbacks, self.since_round = (
        int(x) for x in np.asarray(snap["counters"]))
