"""Training a judge head (verifiers/judge.py, LOSSY) on the target's own features.

Labels come without annotation, from the target itself: a token the target wrote in its own
answer to a training prompt (greedy or sampled) is correct there; the same slot holding a token
the target ranks outside its `wrong_rank` most likely ones is incorrect. Each answer gives every
token it holds as a positive (the target's final feature at the token's own slot, after reading
it) and `negatives` corrupted copies, each with one answer token replaced by such a wrong token
(the feature at that slot; the prefix is the answer's own, so the copy's one forward gives it).
So the judge learns to tell a token the target would plausibly write from one it would not,
from the target's reaction to having read it; it has not seen which plausible tokens break a
program (that would need labels by execution).

The fit is a logistic regression on the features (classes weighted equally, L2), by Adam.

Dims: n examples, d model width, t row width.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from speculax.core.fields import Checked, field
from speculax.models import llama
from speculax.verifiers.judge import Judge, scores


@dataclasses.dataclass(frozen=True)
class JudgeTraining(Checked):
  negatives: int = field(4, ge=1)  # corrupted copies per answer
  wrong_rank: int = field(20, ge=1)  # a wrong token ranks at or below this in the target's law
  steps: int = field(500, ge=1)  # Adam steps over all examples at once
  learning_rate: float = field(1e-2, gt=0)
  l2: float = field(1e-4, ge=0)
  threshold: float = field(0.5, gt=0, lt=1)  # the trained judge's default bar
  seed: int = field(0, ge=0)


def examples(params, config, rows: list[list[int]], starts: list[int], cfg: JudgeTraining,
             width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(features [n, d] float32, labels [n] float32: 1 correct, 0 incorrect) from token rows
  (prompt + the target's answer) whose answers start at `starts`; rows are padded to `width`
  (default: the longest), so one compile serves them all."""
  if len(rows) != len(starts) or not rows:
    raise ValueError(f"rows and starts must be non-empty and of one length, got {len(rows)} "
                     f"rows and {len(starts)} starts")
  width = width or max(map(len, rows))
  if cfg.wrong_rank >= config.vocab_size:
    raise ValueError(f"wrong_rank={cfg.wrong_rank} must be below the vocabulary "
                     f"({config.vocab_size})")
  rng = np.random.default_rng(cfg.seed)
  positions = jnp.arange(width, dtype=jnp.int32)[None]
  # logits only where they are read (the law before each corrupted slot): the output layer
  # over every position of every row would be most of the work.
  run = lambda x, at: llama.forward_jit(params, config, jnp.asarray(x), jnp.broadcast_to(
      positions, x.shape), hidden_layers=(-1,), logits_at=jnp.asarray(at, jnp.int32))[:2]
  features, labels = [], []
  for row, start in zip(tqdm(rows, desc="judge examples", disable=None), starts):
    if not 1 <= start < len(row) <= width:
      raise ValueError(f"an answer must start inside its row (1 <= start < length <= width "
                       f"{width}), got start {start} for a row of {len(row)} tokens")
    padded = np.zeros((1, width), np.int32)
    padded[0, :len(row)] = row
    slots = rng.integers(start, len(row), cfg.negatives)  # [m] answer slots to corrupt
    logits, hidden = run(padded, (slots - 1)[None])  # [1, m, v], [1, 1, t, d]
    features.append(np.asarray(hidden[0, 0, start:len(row)]))
    labels.append(np.ones(len(row) - start, np.float32))
    order = np.argsort(-np.asarray(logits[0]), -1)  # [m, v] the law before each slot
    wrong = order[np.arange(cfg.negatives),
                  rng.integers(cfg.wrong_rank, config.vocab_size, cfg.negatives)]
    copies = np.repeat(padded, cfg.negatives, 0)
    copies[np.arange(cfg.negatives), slots] = wrong
    _, hidden = run(copies, slots[:, None])  # [1, m, t, d]
    features.append(np.asarray(hidden[0, np.arange(cfg.negatives), slots]))
    labels.append(np.zeros(cfg.negatives, np.float32))
  return np.concatenate(features), np.concatenate(labels)


def fit(features: np.ndarray, labels: np.ndarray, cfg: JudgeTraining) -> Judge:
  """The logistic regression of labels on features, both classes weighted equally."""
  if set(np.unique(labels)) != {0.0, 1.0}:
    raise ValueError(f"labels must hold both classes 0 and 1, got {sorted(set(labels))}")
  x, y = jnp.asarray(features, jnp.float32), jnp.asarray(labels, jnp.float32)
  weight = jnp.where(y > 0, 0.5 / y.mean(), 0.5 / (1 - y.mean()))  # [n] equal class mass

  def loss(p):
    z = x @ p["w"] + p["b"]
    return jnp.mean(weight * optax.sigmoid_binary_cross_entropy(z, y)) + cfg.l2 * jnp.sum(
        p["w"] ** 2)

  tx = optax.adam(cfg.learning_rate)
  p = {"w": jnp.zeros(x.shape[1]), "b": jnp.zeros(())}

  @jax.jit
  def step(p, state):
    grads = jax.grad(loss)(p)
    updates, state = tx.update(grads, state)
    return optax.apply_updates(p, updates), state

  state = tx.init(p)
  for _ in range(cfg.steps):
    p, state = step(p, state)
  return Judge(tuple(float(v) for v in np.asarray(p["w"])), float(p["b"]), cfg.threshold)


def accuracy(judge: Judge, features: np.ndarray, labels: np.ndarray) -> dict[str, float]:
  """Share of correct and of incorrect examples the judge labels right at its threshold."""
  said = np.asarray(scores(judge, jnp.asarray(features))) > judge.threshold
  yes = labels > 0
  return {"correct_kept": float(said[yes].mean()), "incorrect_refused": float((~said[~yes]).mean())}
