"""`speculax train --config configs/<experiment>.py`: run or resume a drafter experiment."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import pathlib
import runpy

from speculax.cli.args import count


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
  p.set_defaults(run=run)


def _configs_folder() -> pathlib.Path:
  return pathlib.Path(importlib.util.find_spec("speculax.configs").origin).parent


def shipped_experiments() -> list[str]:
  """Experiment files installed with speculax (speculax/configs), by name."""
  return sorted(f.stem for f in _configs_folder().glob("*.py")
                if f.stem != "__init__" and "EXPERIMENT =" in f.read_text(encoding="utf-8"))


def load_experiment(path: str):
  """The DistillExperiment a config file defines as EXPERIMENT. A file that does not parse, fails
  while it runs (a config value out of range, a field that does not exist, a missing import) or
  holds something else raises ValueError naming the file and the problem."""
  from speculax.train.experiment import DistillExperiment
  file = pathlib.Path(path)
  if not file.is_file() and path in shipped_experiments():
    file = _configs_folder() / f"{path}.py"
  if not file.is_file():
    raise FileNotFoundError(f"experiment config {path!r} does not exist (shipped ones: "
                            f"{', '.join(shipped_experiments())})")
  try:
    names = runpy.run_path(str(file))
  except SyntaxError as e:
    raise ValueError(f"{path}:{e.lineno}: not valid Python: {e.msg}") from None
  except Exception as e:  # the file's own code failed: report it as the file's problem
    raise ValueError(f"{path}: {type(e).__name__}: {e}") from None
  exp = names.get("EXPERIMENT")
  if not isinstance(exp, DistillExperiment):
    got = "nothing" if exp is None else f"a {type(exp).__name__} ({exp!r:.60})"
    raise ValueError(f"{path} must define EXPERIMENT = DistillExperiment(...); it defines {got}")
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
  from speculax.train.experiment import run as run_experiment
  from speculax.train.heads import HeadsConfig
  exp = overridden(load_experiment(args.config), steps=args.steps, out_dir=args.out_dir)
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
