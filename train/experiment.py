"""A distillation experiment end to end: data, teacher cache, training, held-out evaluation.

An experiment is a frozen dataclass in a Python file under configs/ (`EXPERIMENT = ...`), run
with `speculax train --config configs/<experiment>.py`. Everything it writes goes to
`<out_dir>/<name>/`: teacher caches, checkpoints (a rerun resumes), metrics.csv, curves.png.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from configs.meshes import MeshConfig
from models.derive import truncated
from models.load import load
from train import data
from train.checkpoints import Checkpointer
from train.distill import DistillConfig, distill_loss
from train.loop import Target, fit, sharded_init
from train.metrics_log import MetricsLog
from train.teacher_cache import build_teacher_cache


@dataclasses.dataclass(frozen=True)
class DataConfig:
  files: int | None = 300  # stdlib source files to read (None: all)
  seq_len: int = 256
  rows: int = 512  # training rows of seq_len tokens
  heldout_rows: int = 32  # rows from held-out files, for the acceptance estimate
  heldout_fraction: float = 0.1
  top_k: int = 32  # teacher log-probs kept per position


@dataclasses.dataclass(frozen=True)
class DistillExperiment:
  name: str
  target: str = "smollm2-135m"
  draft_layers: tuple[int, ...] = (0, 6, 12, 18, 24, 29)  # target layers the draft starts from
  data: DataConfig = DataConfig()
  distill: DistillConfig = DistillConfig()
  out_dir: str = "runs"
  teacher_dir: str | None = None  # shared teacher caches (same target + data); default: own folder
  checkpoint_every: int = 50
  keep: int = 2
  log_every: int = 10
  eval_every: int = 50
  mesh: MeshConfig | None = None

  @property
  def folder(self) -> pathlib.Path:
    return pathlib.Path(self.out_dir) / self.name


@functools.partial(jax.jit, static_argnames=("config", "cfg"))
def _acceptance(params, config, cfg, batch):
  return distill_loss(params, config, cfg, batch, jax.random.key(0))[1]["acceptance"]


def heldout_acceptance(params, config, cfg: DistillConfig, cache, batch_size: int = 8) -> float:
  """Mean 1 - TV(p, q) over the held-out rows: the expected per-token acceptance."""
  scores = []
  for lo in range(0, cache.n - batch_size + 1, batch_size):
    b = cache.batch(np.arange(lo, lo + batch_size))
    b = {k: jnp.asarray(b[k]) for k in ("tokens", "ids", "logprobs")}
    b["mask"] = jnp.ones(b["tokens"].shape, jnp.float32)
    scores.append(float(_acceptance(params, config, cfg, b)))
  return float(np.mean(scores))


def run(exp: DistillExperiment, *, until: int | None = None) -> dict:
  """Runs (or resumes) the experiment; returns the held-out acceptance before and after."""
  model = load(exp.target)
  tok = model.tokenizer
  draft_cfg, draft = truncated(model.params, model.config, exp.draft_layers)
  train_files, held_files = data.split_files(data.stdlib_files(exp.data.files),
                                             exp.data.heldout_fraction)
  pack = lambda files, rows: data.pack_sequences(tok, data.read_texts(files), exp.data.seq_len,
                                                 max_rows=rows)
  train_tokens, held_tokens = pack(train_files, exp.data.rows), pack(held_files, exp.data.heldout_rows)
  folder = exp.folder
  caches = folder if exp.teacher_dir is None else pathlib.Path(exp.teacher_dir)
  teacher = build_teacher_cache(caches / "teacher_train", model.params, model.config, train_tokens,
                                top_k=exp.data.top_k)
  held = build_teacher_cache(caches / "teacher_heldout", model.params, model.config, held_tokens,
                             top_k=exp.data.top_k)
  state = sharded_init(draft, draft_cfg, exp.distill, exp.mesh)
  before = heldout_acceptance(state.params, draft_cfg, exp.distill, held)
  with Checkpointer(folder / "checkpoints", every=exp.checkpoint_every, keep=exp.keep) as ck:
    if ck.latest_step() is not None:
      state = ck.restore(like=state)
    log = MetricsLog(folder / "metrics.csv")
    target = Target(model.params, model.config, exp.data.top_k) if exp.distill.on_policy_fraction else None
    evaluate = lambda s: {"heldout_acceptance": heldout_acceptance(s.params, draft_cfg, exp.distill, held)}
    state = fit(state, draft_cfg, exp.distill, train_tokens, teacher.batch, target=target,
                checkpointer=ck, log=log, evaluate=evaluate, eval_every=exp.eval_every,
                log_every=exp.log_every, mesh=exp.mesh, until=until)
  return {"heldout_acceptance_before": before,
          "heldout_acceptance_after": heldout_acceptance(state.params, draft_cfg, exp.distill, held),
          "steps": int(state.step), "plot": str(log.plot(folder / "curves.png")),
          "state": state, "draft_config": draft_cfg}
