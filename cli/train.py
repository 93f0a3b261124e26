"""`speculax train --config configs/<experiment>.py`: run or resume a drafter experiment."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import pathlib

from speculax.cli.args import announce, count
from speculax.core import config_files, overrides


def add_parser(sub) -> None:
  p = sub.add_parser(
      "train", help="train a drafter from an experiment config",
      description="Run (or resume) the experiment defined as EXPERIMENT in a Python config file. "
                  "Outputs go to <out_dir>/<name>/: teacher caches, checkpoints, metrics.csv, "
                  "curves.png, and for head drafters drafter.json + drafter_params.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--config", required=True,
                 help="Python file defining EXPERIMENT, or the name of one shipped in "
                      f"speculax.configs ({', '.join(shipped_experiments())})")
  p.add_argument("--steps", type=count(1), default=None,
                 help="override the number of optimizer updates "
                      "(EXPERIMENT.distill.optim.total_steps)")
  p.add_argument("--out-dir", default=None, help="override the experiment's output folder")
  p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                 help="override any experiment field by its dotted path, e.g. --set "
                      "distill.optim.learning_rate=1e-3 --set data.rows=2048 (repeatable; applied "
                      "after --steps and --out-dir)")
  p.set_defaults(run=run)


def _configs_folder() -> pathlib.Path:
  return pathlib.Path(importlib.util.find_spec("speculax.configs").origin).parent


def shipped_experiments() -> list[str]:
  """Experiment files installed with speculax (speculax/configs), by name."""
  return config_files.shipped(_configs_folder(), "EXPERIMENT")


def load_experiment(path: str):
  """The DistillExperiment a config file (or a shipped one, by name) defines as EXPERIMENT."""
  from speculax.train.experiment import DistillExperiment
  return config_files.load(path, "EXPERIMENT", DistillExperiment, _configs_folder(),
                           "experiment config")


def overridden(exp, *, steps: int | None = None, out_dir: str | None = None):
  """The experiment with the command line's overrides (either trainer's config)."""
  if steps is not None:
    optim = exp.distill.optim.with_total_steps(steps)
    exp = dataclasses.replace(exp, distill=dataclasses.replace(exp.distill, optim=optim))
  if out_dir is not None:
    exp = dataclasses.replace(exp, out_dir=out_dir)
  return exp


def run(args) -> int:
  from speculax.train.experiment import run as run_experiment
  from speculax.train.heads import HeadsConfig
  exp = overridden(load_experiment(args.config), steps=args.steps, out_dir=args.out_dir)
  exp = overrides.apply(exp, args.set)
  announce(args)
  result = run_experiment(exp)
  print(f"{exp.name}: held-out acceptance (1 - TV) {result['heldout_acceptance_before']:.3f} -> "
        f"{result['heldout_acceptance_after']:.3f} after {result['steps']} micro-batches; "
        f"curves in {result['plot']}")
  if result["drafter"] is not None and isinstance(exp.distill, HeadsConfig):
    before, after = result["heldout_before"], result["heldout_after"]
    for name in ("acceptance", "top1"):
      print(f"  held-out {name} by depth: {_by_depth(before, name)} -> {_by_depth(after, name)}")
    print(f"  decode with: speculax generate --drafter {exp.distill.drafter.name} --heads "
          f"{result['drafter']} -k {_depths(after)}")
  elif result["drafter"] is not None:
    print(f"  decode with: speculax generate --drafter draft-model --draft-model "
          f"{result['drafter']}")
  return 0


def _depths(metrics: dict) -> int:
  """Draft depths with metrics (acceptance/depth1, acceptance/depth2, ...)."""
  j = 0
  while f"acceptance/depth{j + 1}" in metrics:
    j += 1
  return j


def _by_depth(metrics: dict, name: str) -> str:
  return " ".join(f"{metrics[f'{name}/depth{j}']:.3f}" for j in range(1, _depths(metrics) + 1))
