"""A bounded replay buffer of served sequences and the target's top-k laws recorded on them.

One row per served request: its tokens (prompt + output, the last `seq_len` kept) and, at the
positions verification recorded, the target's top-k log-probs, in the trainer's alignment:
position i carries the law of token i + 1 (train/distill.py), with mask 1 there. Memory is fixed
at construction: capacity x seq_len x (2 + 2K) x 4 bytes. When full, `policy` picks the row a new
one replaces: "fifo" the oldest (tracks the newest traffic), "reservoir" a uniformly random one
with probability capacity / rows seen (a uniform sample of all traffic so far, Vitter's
algorithm R).

Dims: c capacity, t seq_len, K top-k.
"""
from __future__ import annotations

from typing import Literal, get_args

import numpy as np

Policy = Literal["fifo", "reservoir"]
POLICIES = get_args(Policy)


class ReplayBuffer:
  def __init__(self, capacity: int, seq_len: int, top_k: int, policy: str = "fifo",
               seed: int = 0):
    if capacity < 1:
      raise ValueError(f"replay buffer capacity must be >= 1 row, got {capacity}")
    if seq_len < 2 or top_k < 1:
      raise ValueError(f"replay buffer needs seq_len >= 2 and top_k >= 1, got {seq_len}, {top_k}")
    if policy not in POLICIES:
      raise ValueError(f"replay buffer policy must be one of {POLICIES}, got {policy!r}")
    self.policy, self.seed = policy, seed
    self.arrays = {"tokens": np.zeros((capacity, seq_len), np.int32),  # [c, t]
                   "mask": np.zeros((capacity, seq_len), np.float32),  # [c, t]
                   "ids": np.zeros((capacity, seq_len, top_k), np.int32),  # [c, t, K]
                   "logprobs": np.zeros((capacity, seq_len, top_k), np.float32)}  # [c, t, K]
    self.seen = 0  # rows offered so far

  @property
  def capacity(self) -> int:
    return len(self.arrays["tokens"])

  @property
  def size(self) -> int:
    return min(self.seen, self.capacity)

  @property
  def positions(self) -> int:
    """Recorded positions held (mask entries), what one round of updates can learn from."""
    return int(self.arrays["mask"][:self.size].sum())

  def add(self, tokens, ids, logprobs, mask) -> None:
    """One row: tokens [n], ids/logprobs [n, K], mask [n] in the trainer's alignment."""
    slot = self._slot()
    self.seen += 1
    if slot is None:
      return
    width = self.arrays["tokens"].shape[1]
    for name, value in (("tokens", tokens), ("ids", ids), ("logprobs", logprobs), ("mask", mask)):
      value = np.asarray(value)[-width:]  # the latest positions when longer than a row
      row = self.arrays[name][slot]
      row[...] = 0
      row[:len(value)] = value

  def _slot(self) -> int | None:
    if self.seen < self.capacity:
      return self.seen
    if self.policy == "fifo":
      return self.seen % self.capacity
    j = int(np.random.default_rng((self.seed, self.seen)).integers(0, self.seen + 1))
    return j if j < self.capacity else None

  def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """n rows drawn uniformly (with replacement) from those held."""
    if self.size == 0:
      raise ValueError("cannot sample from an empty replay buffer")
    rows = rng.integers(0, self.size, n)
    return {name: a[rows] for name, a in self.arrays.items()}

  def rows(self) -> dict[str, np.ndarray]:
    """Every row held."""
    return {name: a[:self.size] for name, a in self.arrays.items()}

  def state(self) -> dict[str, np.ndarray]:
    """Everything a checkpoint needs to rebuild the buffer."""
    return {**self.arrays, "seen": np.asarray(self.seen, np.int64)}

  def load(self, state: dict) -> None:
    for name in self.arrays:
      self.arrays[name][...] = np.asarray(state[name])
    self.seen = int(state["seen"])
