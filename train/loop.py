"""The host-side training loop: batches by step, on-policy rows, checkpoints, metrics.

One loop for every drafter trainer: `cfg` is a train.distill.DistillConfig (draft models) or a
train.heads.HeadsConfig (head drafters, which read the frozen target's params).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from speculax.core.sampling import SamplingConfig
from speculax.decode.config import GenerateConfig
from speculax.decode.generate import generate
from speculax.models import distributed, llama, sharding
from speculax.models.config import LlamaConfig
from speculax.models.sharding import MeshConfig, make_mesh
from speculax.train.data import batch_rows
from speculax.train.distill import DistillConfig, TrainState, init_state, teacher_topk, train_step
from speculax.train.teacher_cache import ROW_AXIS

Teacher = Callable[[np.ndarray], dict]  # rows [b] -> {"ids", "logprobs"} [b, t, K]


@dataclasses.dataclass(frozen=True)
class Target:
  """The frozen target, for scoring on-policy rows on the fly."""
  params: dict
  config: LlamaConfig
  top_k: int = 32


def sharded_init(params, config: LlamaConfig, cfg: DistillConfig,
                 mesh: MeshConfig | None) -> TrainState:
  """A fresh state on the mesh: data parallel over the batch, the drafter's params sharded by
  the rules table (fsdp over `embed` when the mesh has an fsdp axis); the optimizer moments are
  built from the placed params and so inherit their shardings. The step, key and optimizer
  counts are replicated over the mesh, so that every leaf spans the same devices: in a
  multi-process run a checkpoint then restores onto `like=` this state in every process."""
  if mesh is None:
    return init_state(params, cfg)
  m = make_mesh(mesh)
  # A head drafter's params are not the target's tree (and are small): replicated below.
  placed = sharding.shard_params(params, config, m, mesh.rules) if isinstance(
      cfg, DistillConfig) else params
  return replicate_rest(init_state(placed, cfg), m)


def place_frozen(frozen: dict, config: LlamaConfig, mesh: MeshConfig | None) -> dict:
  """A head drafter's frozen target params on the mesh: the target's own leaves sharded by the
  rules table, extra entries (a trimmed head's rows) replicated; as they are without a mesh."""
  if mesh is None:
    return frozen
  m = make_mesh(mesh)
  own = {name: frozen[name] for name in llama.param_axes(config)}
  return replicate_rest({**frozen, **sharding.shard_params(own, config, m, mesh.rules)}, m)


def replicate_rest(tree, m: jax.sharding.Mesh):
  """Every leaf not yet on mesh m, replicated over it (each process fills its own shards)."""
  on_mesh = lambda x: isinstance(x, jax.Array) and isinstance(
      x.sharding, NamedSharding) and x.sharding.mesh == m
  replicated = NamedSharding(m, P())
  return jax.tree.map(lambda x: x if on_mesh(x) else distributed.put_global(x, replicated), tree)


def on_policy_rows(state: TrainState, config: LlamaConfig, cfg: DistillConfig, target: Target,
                   tokens: np.ndarray, key: jax.Array) -> dict:
  """Rows whose continuation the current drafter samples (temperature 1) after a data prefix,
  scored by the target: DistillSpec's on-policy data."""
  prefix, width = cfg.on_policy_prefix, tokens.shape[1]
  out = generate(state.params, config, [r[:prefix] for r in tokens],
                 GenerateConfig(max_new_tokens=width - prefix, prompt_bucket=prefix,
                                sampling=SamplingConfig(temperature=1.0)), key)
  rows = np.concatenate([tokens[:, :prefix], np.array(out.tokens, np.int32)], 1)
  ids, logprobs = teacher_topk(target.params, target.config, jnp.asarray(rows), target.top_k)
  return {"tokens": rows, "ids": np.asarray(ids), "logprobs": np.asarray(logprobs)}


def make_batch(state, config, cfg: DistillConfig, tokens: np.ndarray, teacher: Teacher,
               target: Target | None, step: int, part: slice = slice(None),
               mask: np.ndarray | None = None) -> dict:
  """The rows `part` of step's batch (all of them by default; one process's share in a
  multi-process run, which reads only those rows of the data and the teacher cache). mask
  [n, t]: the positions the loss weighs (default all; on-policy rows are learned whole)."""
  rows = batch_rows(len(tokens), cfg.batch_size, step, seed=cfg.seed)[part]
  batch = {"tokens": tokens[rows], **teacher(rows),
           "mask": np.ones((len(rows), tokens.shape[1]), np.float32) if mask is None
           else np.array(mask[rows], np.float32)}
  # Head drafters train off-policy only: their HeadsConfig has no on_policy_fraction.
  n_on = int(round(getattr(cfg, "on_policy_fraction", 0.0) * cfg.batch_size))
  if n_on:
    if target is None:
      raise ValueError("on_policy_fraction > 0 needs the target to score sampled rows")
    key = jax.random.fold_in(jax.random.key(cfg.seed + 1), step)
    fresh = on_policy_rows(state, config, cfg, target, batch["tokens"][:n_on], key)
    for name, value in fresh.items():
      k = batch[name].shape[-1] if name != "tokens" else None
      batch[name][:n_on] = value if k is None else value[..., :k]
    batch["mask"][:n_on] = 1.0  # the drafter's own continuation: all of it is learned
  return batch


def check_processes(cfg, mesh: MeshConfig | None) -> None:
  """A multi-process run trains one model on a mesh over all processes, off-policy: on-policy
  rows are sampled by a decode of the whole batch, which no process holds."""
  if jax.process_count() == 1:
    return
  if mesh is None:
    raise ValueError(f"training in {jax.process_count()} processes needs a mesh over all of them "
                     f"(mesh=MeshConfig(...)); without one each process would train alone")
  if getattr(cfg, "on_policy_fraction", 0.0):
    raise ValueError(f"on_policy_fraction={cfg.on_policy_fraction}: on-policy rows are not "
                     f"supported across {jax.process_count()} processes; train off-policy (0.0)")


def fit(state: TrainState, config: LlamaConfig, cfg, tokens: np.ndarray, teacher: Teacher, *,
        mask: np.ndarray | None = None, frozen=None, target: Target | None = None,
        checkpointer=None, log=None,
        evaluate: Callable[[TrainState], dict] | None = None, eval_every: int = 0,
        log_every: int = 10, mesh: MeshConfig | None = None,
        until: int | None = None) -> TrainState:
  """Trains from state.step up to cfg.steps micro-batches (or stops at `until`, as an
  interrupted run would); the batch of a step depends only on the step, so a resumed run
  continues exactly where the saved one was.

  cfg: DistillConfig or HeadsConfig; mask [n, t]: the positions of `tokens` the loss weighs
  (default all); frozen: what the objective reads but never trains (a head drafter's target
  params), passed to train_step as is.
  """
  check_processes(cfg, mesh)
  if mesh is not None:
    mesh.check_batch(cfg.batch_size, f"{type(cfg).__name__}.batch_size")
  m = None if mesh is None else make_mesh(mesh)
  # Each process reads only the rows its devices hold and the global batch is assembled from
  # every process's rows (in one process: all rows, placed on the mesh).
  part = slice(None) if m is None else distributed.process_rows(
      sharding.batch_sharding(m, mesh.rules, 1), cfg.batch_size)
  place = (lambda name, v: jnp.asarray(v)) if m is None else (
      lambda name, v: distributed.from_process_rows(
          sharding.batch_sharding(m, mesh.rules, np.ndim(v), ROW_AXIS.get(name, 0)), v,
          cfg.batch_size, ROW_AXIS.get(name, 0)))
  start = int(state.step)
  stop = cfg.steps if until is None else min(until, cfg.steps)
  bar = tqdm(range(start, stop), initial=start, total=cfg.steps,
             disable=None if distributed.is_primary() else True, desc=f"distill {cfg.divergence}")
  t0 = time.perf_counter()
  for step in bar:
    batch = make_batch(state, config, cfg, tokens, teacher, target, step, part, mask)
    batch = {k: place(k, v) for k, v in batch.items()}
    state, metrics = train_step(state, batch, config, cfg, frozen)
    done = step + 1
    # an evaluation is logged at its own steps, whether or not they fall on log_every's
    evaluating = evaluate is not None and eval_every and (done % eval_every == 0
                                                          or done == cfg.steps)
    if log is not None and (done % log_every == 0 or done == cfg.steps or evaluating):
      row = {k: float(v) for k, v in metrics.items()}
      row["steps_per_s"] = (done - start) / (time.perf_counter() - t0)
      if evaluating:
        row |= evaluate(state)
      log.write(done, row)
      bar.set_postfix(loss=f"{row['loss']:.3f}", acc=f"{row['acceptance']:.3f}")
    if checkpointer is not None:
      checkpointer.save(done, state, force=(done == cfg.steps))
  if checkpointer is not None:
    checkpointer.wait()
  return state
