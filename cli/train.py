"""`speculax train --config configs/<experiment>.py`: run or resume a drafter experiment."""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import runpy


def add_parser(sub) -> None:
  p = sub.add_parser(
      "train", help="train a drafter from an experiment config",
      description="Run (or resume) the experiment defined as EXPERIMENT in a Python config file. "
                  "Outputs go to <out_dir>/<name>/: teacher caches, checkpoints, metrics.csv, "
                  "curves.png.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--config", required=True, help="Python file defining EXPERIMENT")
  p.add_argument("--steps", type=int, default=None,
                 help="override the number of optimizer updates (distill.optim.total_steps)")
  p.add_argument("--out-dir", default=None, help="override the experiment's output folder")
  p.set_defaults(run=run)


def load_experiment(path: str):
  file = pathlib.Path(path)
  if not file.is_file():
    raise FileNotFoundError(f"experiment config {path!r} does not exist")
  exp = runpy.run_path(str(file)).get("EXPERIMENT")
  if exp is None:
    raise ValueError(f"{path} defines no EXPERIMENT")
  return exp


def run(args) -> int:
  from train.experiment import run as run_experiment
  exp = load_experiment(args.config)
  if args.steps is not None:
    optim = exp.distill.optim.with_total_steps(args.steps)
    exp = dataclasses.replace(exp, distill=dataclasses.replace(exp.distill, optim=optim))
  if args.out_dir is not None:
    exp = dataclasses.replace(exp, out_dir=args.out_dir)
  result = run_experiment(exp)
  print(f"{exp.name}: held-out acceptance (1 - TV) {result['heldout_acceptance_before']:.3f} -> "
        f"{result['heldout_acceptance_after']:.3f} after {result['steps']} micro-batches; "
        f"curves in {result['plot']}")
  return 0
