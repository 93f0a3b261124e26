"""A drafter-training experiment end to end: data, teacher cache, training, held-out evaluation.

One runner for both trainers, chosen by the experiment's `distill` config:
  DistillConfig  a draft model cut from the target's `draft_layers`, distilled from the target
  HeadsConfig    a head drafter (Medusa, ...) on the frozen target's cached features
A finished run also writes drafter.json + drafter_params + vocab_ids.npy (drafters/heads_io.py),
which `speculax generate --drafter <kind> --heads <folder>` (or `--drafter draft-model
--draft-model <folder>`) and `speculax.drafters.load(folder)` load.

An experiment is a frozen dataclass in a Python file under configs/ (`EXPERIMENT = ...`), run
with `speculax train --config configs/<experiment>.py`. Everything it writes goes to
`<out_dir>/<name>/`: teacher caches, checkpoints (a rerun resumes), metrics.csv, curves.png.
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.fields import Checked, field
from speculax.drafters import vocab_trim
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.heads_io import load_drafter, save_drafter
from speculax.models.checkpoints import Checkpointer
from speculax.models.config import LlamaConfig
from speculax.models.derive import truncated
from speculax.models.distributed import primary_first
from speculax.models.load import LoadedModel, load
from speculax.models.sharding import MeshConfig, make_mesh
from speculax.train import corpus
from speculax.train import prompts as prompt_sources
from speculax.train.distill import DistillConfig, TrainState, eval_metrics, teacher_logits
from speculax.train.heads import HeadsConfig, frozen_params
from speculax.train.loop import Target, fit, place_frozen, replicate_rest, sharded_init
from speculax.train.metrics_log import MetricsLog
from speculax.train.teacher_cache import TeacherCache, build_teacher_cache, params_fingerprint


@dataclasses.dataclass(frozen=True)
class DataConfig(Checked):
  """The corpus (train/corpus.py): stdlib code, the target's own answers, or a mixture."""
  corpus: Literal["code", "self-distill", "mixed"] = "code"
  files: int | None = field(300, ge=1)  # stdlib source files to read (None: all)
  seq_len: int = field(256, ge=2)
  rows: int = field(512, ge=1)  # training rows of seq_len tokens
  heldout_rows: int = field(32, ge=1)  # held-out rows, for the acceptance estimate
  # Held out: this share of stdlib files (by path hash) and of a prompts file's last lines; the
  # built-in prompts split by subject (train/prompts.py).
  heldout_fraction: float = field(0.1, gt=0, lt=1)
  top_k: int = field(32, ge=1)  # teacher log-probs kept per position
  # The law the held-out metrics score against: "exact", the target's own logits on the
  # held-out rows (a forward of them per evaluation), or "top-k", the cache's top_k with the
  # rest spread evenly, which the training loss reads: it hides the overlap on the target's
  # tail (at top_k 32 it read EAGLE's held-out 1 - TV 0.032 under the exact law).
  heldout_teacher: Literal["exact", "top-k"] = "exact"
  # Self-distillation (corpus "self-distill" or "mixed"):
  prompts: int | None = field(None, ge=1)  # training prompts answered (None: all)
  prompts_file: str | None = None  # .jsonl of your own; default: train/prompts.mixture
  # Also answer every chat ask about the first this many subjects of train/prompts
  # EVERYDAY_SUBJECTS (6 prompts each, subjects outside the built-in split; training only): more
  # chat for drafters that serve it.
  everyday_chat: int = field(0, ge=0, le=len(prompt_sources.EVERYDAY_SUBJECTS))
  answer_tokens: int = field(192, ge=1)  # new tokens per answer at most
  temperatures: tuple[float, ...] = field((0.0, 1.0), ge=0)  # prompt i: temperatures[i % len]
  generate_batch: int = field(32, ge=1)
  code_fraction: float = field(0.25, ge=0, le=1)  # "mixed": share of training rows from code
  # Positions the loss and held-out metrics weigh: "all", or "answers": every one but those
  # whose next token is in a chat-templated prompt (serving drafts answers only; code and text
  # lines stay whole).
  learn: Literal["all", "answers"] = "all"
  # Where the answers are cached (default: the teacher caches' folder). A committed folder ships
  # the corpus: a fresh clone then generates only the answers it lacks.
  answers_dir: str | None = None


TARGET_START = "target"  # DistillExperiment.init_from: start from the target's own weights


@dataclasses.dataclass(frozen=True)
class DistillExperiment(Checked):
  name: str
  target: str = "smollm2-135m"
  # Target layers the draft model starts from (DistillConfig only).
  draft_layers: tuple[int, ...] = field((0, 6, 12, 18, 24, 29), ge=0)
  data: DataConfig = DataConfig()
  distill: DistillConfig | HeadsConfig = DistillConfig()
  out_dir: str = "runs"
  teacher_dir: str | None = None  # shared teacher caches (same target + data); default: own folder
  # A finished run folder of the same drafter kind whose params start this one (a second stage:
  # e.g. training-time test on top of a trained EAGLE), or "target": the target's own weights
  # where the drafter has a form for that (Drafter.target_start); default: the drafter's init.
  init_from: str | None = None
  checkpoint_every: int = field(50, ge=1)
  keep: int = field(2, ge=1)
  log_every: int = field(10, ge=1)
  eval_every: int = field(50, ge=1)
  mesh: MeshConfig | None = None

  @property
  def folder(self) -> pathlib.Path:
    return pathlib.Path(self.out_dir) / self.name


def smoke(exp: DistillExperiment) -> DistillExperiment:
  """A minutes-long version of an experiment (same trainer, drafter and corpus kind), to check
  the whole pipeline end to end: 32 rows of 128 tokens (self-distilled from 16 prompts of 32 new
  tokens), 12 updates, frequent checkpoints and evals, in its own folders."""
  optim = dataclasses.replace(exp.distill.optim, warmup_steps=2, total_steps=12)
  return dataclasses.replace(
      exp, name=f"{exp.name}-smoke", teacher_dir=None,
      data=dataclasses.replace(exp.data, files=40, seq_len=128, rows=32, heldout_rows=8,
                               prompts=16, answer_tokens=32),
      distill=dataclasses.replace(exp.distill, optim=optim),
      checkpoint_every=6, log_every=2, eval_every=6)


@dataclasses.dataclass(frozen=True)
class Student:
  """What an experiment trains and how its objective sees it."""
  config: LlamaConfig  # the config train_step gets: the draft model's, or the target's for heads
  params: dict  # initial trainable params
  frozen: dict | None = None  # params the objective reads but never trains (the target's)
  hidden_layers: tuple[int, ...] = ()  # target features the teacher cache must hold


def student(exp: DistillExperiment, model: LoadedModel, order: np.ndarray,
            tokens: np.ndarray) -> Student:
  """Head drafters start from their own init on the target; draft models from its layers.

  order: the frequency order of the training tokens [v]; a head drafter with vocab_trim N
  trains on the N first (their output rows ride in frozen[vocab_trim.TRIM]).
  tokens: a training row or a few [b, t], for a start taken from the target's weights.
  """
  cfg = exp.distill
  if isinstance(cfg, HeadsConfig):
    drafter = cfg.drafter
    params = drafter.init_params(model.config, jax.random.key(cfg.seed))
    if exp.init_from == TARGET_START:
      params = drafter.target_start(params, model.params, model.config, jnp.asarray(tokens))
    elif exp.init_from is not None:
      params = warm_start(exp.init_from, type(drafter), params, model.config, drafter)
    return Student(model.config, params,
                   frozen_params(drafter, params, model.params, model.config, order),
                   tuple(drafter.hidden_layers))
  config, params = truncated(model.params, model.config, exp.draft_layers)
  if exp.init_from not in (None, TARGET_START):  # a draft model starts from the target's layers
    params = warm_start(exp.init_from, DraftModel, params, model.config)
  return Student(config, params)


def warm_start(folder: str, cls: type, like: dict, target: LlamaConfig, drafter=None) -> dict:
  """The params of the `cls` drafter saved in `folder` (a finished run or a shipped drafter), as
  this run's `drafter` grows them (Drafter.warm_params), checked leaf by leaf against `like`, the
  params this run would start from."""
  saved_drafter, params = load_drafter(folder, cls, target)
  params = {k: v for k, v in params.items() if k != vocab_trim.IDS}
  if drafter is not None:
    params = drafter.warm_params(saved_drafter, params, like, target)
  saved, wanted = (jax.tree_util.tree_flatten_with_path(t)[0] for t in (params, like))
  shapes = lambda leaves: {jax.tree_util.keystr(p): np.shape(x) for p, x in leaves}
  if shapes(saved) != shapes(wanted):
    diff = sorted(set(shapes(saved).items()) ^ set(shapes(wanted).items()))
    raise ValueError(f"init_from={folder!r}: its {cls.name} params do not fit this run's "
                     f"(differing leaves, saved or wanted: {diff[:6]})")
  return jax.tree.map(lambda x, y: jnp.asarray(x, y.dtype), params, like)


def heldout_metrics(params, config: LlamaConfig, cfg, cache, frozen=None,
                    batch_size: int = 8, mesh: MeshConfig | None = None,
                    mask: np.ndarray | None = None,
                    teacher: Callable[[jax.Array], jax.Array] | None = None) -> dict[str, float]:
  """Every objective metric, averaged over the held-out rows' batches. "acceptance" is the mean
  1 - TV(p, q), the expected per-token acceptance; head drafters add per-depth metrics. mask
  [n, t]: the positions weighed (default all). teacher: tokens [b, t] -> the target's logits
  [b, t, v], the exact law scored against (default: the cache's top-k). With a mesh every
  process reads each batch whole, and it is replicated over the mesh."""
  batch_size = min(batch_size, cache.n)
  m = None if mesh is None else make_mesh(mesh)
  place = jnp.asarray if m is None else (lambda v: replicate_rest(v, m))
  parts = []
  for lo in range(0, cache.n - batch_size + 1, batch_size):
    rows = np.arange(lo, lo + batch_size)
    b = cache.batch(rows)
    b["mask"] = np.ones(b["tokens"].shape, np.float32) if mask is None else mask[rows]
    topk = () if teacher is None else ("ids", "logprobs")  # the exact law replaces the top-k
    b = {k: place(v) for k, v in b.items() if k not in topk}
    if teacher is not None:  # teacher_law.teacher_law reads it
      b["teacher_logits"] = teacher(b["tokens"])
    parts.append(eval_metrics(params, config, cfg, b, frozen))
  return {k: float(np.mean([m[k] for m in parts])) for k in parts[0]}


def cache_name(split: str, hidden_layers: tuple[int, ...]) -> str:
  """Teacher cache folder: caches with and without target features never share a folder."""
  return f"teacher_{split}" + "".join(f"_h{i}" for i in hidden_layers)


@dataclasses.dataclass(frozen=True)
class Prepared:
  """An experiment ready to train: its target, rows, teacher caches and starting state."""
  model: LoadedModel
  student: Student
  train_rows: corpus.Rows
  held_rows: corpus.Rows
  order: np.ndarray  # [v] the training tokens by frequency (VocabTrim's ids)
  teacher: TeacherCache  # of the training rows
  held: TeacherCache  # of the held-out rows
  state: TrainState
  frozen: dict | None  # placed on the experiment's mesh


def prepare(exp: DistillExperiment, model: LoadedModel | None = None,
            rows: tuple[np.ndarray, np.ndarray] | None = None) -> Prepared:
  """Everything `run` trains from (model, rows: as `run` takes them), building what is missing:
  the corpus and both teacher caches."""
  model = load(exp.target) if model is None else model
  caches = exp.folder if exp.teacher_dir is None else pathlib.Path(exp.teacher_dir)
  # In a multi-process run process 0 writes the corpus and teacher caches, the others then
  # open what it wrote; each reads only its own rows of every batch (train/loop.py).
  if rows is None:
    rows = primary_first(
        lambda: corpus.token_rows(exp.data, model, caches, params_fingerprint(model.params)),
        "corpus")
  train_rows, held_rows = map(corpus.as_rows, rows)
  order = vocab_trim.frequency_order(train_rows.tokens, model.config.vocab_size)
  s = student(exp, model, order, train_rows.tokens[:1])

  def teacher_cache(split: str, tokens: np.ndarray):  # or a finished one of the split's others
    return primary_first(lambda: build_teacher_cache(
        caches / cache_name(split, s.hidden_layers), model.params, model.config, tokens,
        top_k=exp.data.top_k, hidden_layers=s.hidden_layers,
        reuse=sorted(caches.glob(cache_name(split, ()) + "*"))), f"teacher cache {split}")

  teacher = teacher_cache("train", train_rows.tokens)
  held = teacher_cache("heldout", held_rows.tokens)
  return Prepared(model, s, train_rows, held_rows, order, teacher, held,
                  sharded_init(s.params, s.config, exp.distill, exp.mesh),
                  None if s.frozen is None else place_frozen(s.frozen, model.config, exp.mesh))


def run(exp: DistillExperiment, *, until: int | None = None,
        model: LoadedModel | None = None,
        rows: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
  """Runs (or resumes) the experiment; returns held-out metrics before and after training,
  and for a finished head-drafter run the folder it saved the drafter in ("heads").

  model: the loaded target (default: load(exp.target)).
  rows: (train, held-out) token rows [n, seq_len] of a corpus of your own, as arrays (every
  position learned) or corpus.Rows with a loss mask (default: the rows exp.data describes,
  train/corpus.py).
  """
  heads = isinstance(exp.distill, HeadsConfig)
  p = prepare(exp, model, rows)
  model, s, train_rows, held_rows, teacher, held, state, frozen = (
      p.model, p.student, p.train_rows, p.held_rows, p.teacher, p.held, p.state, p.frozen)
  folder = exp.folder
  exact = exp.data.heldout_teacher == "exact"
  evaluated = {}  # step -> held-out metrics: the last in-loop evaluation is also `after`'s

  def evaluate(st):
    step = int(st.step)
    if step not in evaluated:
      evaluated[step] = heldout_metrics(
          st.params, s.config, exp.distill, held, frozen, mesh=exp.mesh, mask=held_rows.mask,
          teacher=functools.partial(teacher_logits, model.params, model.config) if exact else None)
    return evaluated[step]

  before = evaluate(state)
  with Checkpointer(folder / "checkpoints", every=exp.checkpoint_every, keep=exp.keep) as ck:
    if ck.latest_step() is not None:
      state = ck.restore(like=state)
    log = MetricsLog(folder / "metrics.csv")
    on_policy = not heads and exp.distill.on_policy_fraction
    target = Target(model.params, model.config, exp.data.top_k) if on_policy else None
    state = fit(state, s.config, exp.distill, train_rows.tokens, teacher.batch,
                mask=train_rows.mask, frozen=frozen, target=target, checkpointer=ck, log=log,
                evaluate=lambda st: {f"heldout/{k}": v for k, v in evaluate(st).items()},
                eval_every=exp.eval_every, log_every=exp.log_every, mesh=exp.mesh, until=until)
  after = evaluate(state)
  saved = int(state.step) >= exp.distill.steps  # a finished run's drafter only
  if saved:
    drafter = exp.distill.drafter if heads else DraftModel(s.config)
    save_drafter(folder, drafter, state.params, exp.target, model.config, int(state.step),
                 vocab_ids=p.order)
  return {"heldout_acceptance_before": before["acceptance"],
          "heldout_acceptance_after": after["acceptance"],
          "heldout_before": before, "heldout_after": after,
          "steps": int(state.step), "plot": str(log.plot(folder / "curves.png")),
          "state": state, "draft_config": s.config, "drafter": str(folder) if saved else None}
