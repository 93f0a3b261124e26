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
                  "curves.png, and for head drafters drafter.json + drafter_params.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--config", required=True, help="Python file defining EXPERIMENT")
  p.add_argument("--steps", type=int, default=None,
                 help="override the number of optimizer updates "
                      "(EXPERIMENT.distill.optim.total_steps)")
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


def overridden(exp, *, steps: int | None = None, out_dir: str | None = None):
  """The experiment with the command line's overrides (either trainer's config)."""
  if steps is not None:
    optim = exp.distill.optim.with_total_steps(steps)
    exp = dataclasses.replace(exp, distill=dataclasses.replace(exp.distill, optim=optim))
  if out_dir is not None:
    exp = dataclasses.replace(exp, out_dir=out_dir)
  return exp


def run(args) -> int:
  from drafters.heads_io import kind_of
  from train.experiment import run as run_experiment
  exp = overridden(load_experiment(args.config), steps=args.steps, out_dir=args.out_dir)
  result = run_experiment(exp)
  print(f"{exp.name}: held-out acceptance (1 - TV) {result['heldout_acceptance_before']:.3f} -> "
        f"{result['heldout_acceptance_after']:.3f} after {result['steps']} micro-batches; "
        f"curves in {result['plot']}")
  if result["heads"] is not None:
    before, after = result["heldout_before"], result["heldout_after"]
    for name in ("acceptance", "top1"):
      print(f"  held-out {name} by depth: {_by_depth(before, name)} -> {_by_depth(after, name)}")
    print(f"  decode with: speculax generate --drafter {kind_of(exp.distill.drafter)} --heads "
          f"{result['heads']} -k {_depths(after)}")
  return 0


def _depths(metrics: dict) -> int:
  """Draft depths with metrics (acceptance/depth1, acceptance/depth2, ...)."""
  j = 0
  while f"acceptance/depth{j + 1}" in metrics:
    j += 1
  return j


def _by_depth(metrics: dict, name: str) -> str:
  return " ".join(f"{metrics[f'{name}/depth{j}']:.3f}" for j in range(1, _depths(metrics) + 1))
