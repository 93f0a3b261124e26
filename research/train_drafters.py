"""Train SmolLM2-135M's drafters by the shared recipe (configs/smollm2_recipe.py) and ship them.

Each drafter runs its experiment (configs/<name>_smollm2.py: the target's own answers plus
stdlib code, VocabTrim 16384, AdamW with warmup and cosine decay), resuming whatever is already
trained; reports held-out acceptance 1 - TV and top-1 agreement per draft depth, before and
after, with the wall-clock training time; writes --results (runs/results/train_drafters.json),
and with --ship a bfloat16 copy of each finished drafter to results/drafters/<name>-smollm2/
(what `speculax generate --drafter <kind> --heads results/drafters/<name>-smollm2` loads on a
fresh clone), or to the folder name --ship gives.

  .venv/bin/python -m speculax.research.train_drafters --drafters eagle --ship
  # the shipped EAGLE-3: the second stage on EAGLE, shipped in the EAGLE-3 folder
  .venv/bin/python -m speculax.research.train_drafters --drafters eagle3_warm --ship eagle3-smollm2
  # the objective against forward KL, a short budget each (its own run folders):
  .venv/bin/python -m speculax.research.train_drafters --drafters eagle --steps 100 \
      --divergence lk --tag lk100
  # loss and held-out metrics on the answers only (the prompts as context):
  .venv/bin/python -m speculax.research.train_drafters --drafters eagle_ttt --learn answers \
      --tag answers
  # the shipped EAGLE + TTT trained on: 600 more updates on twice the answers
  .venv/bin/python -m speculax.research.train_drafters --drafters eagle_ttt --prompts 2400 \
      --rows 2800 --init-from results/drafters/eagle-ttt-smollm2 --steps 600 --tag more2800
  # EAGLE from scratch in an hour of an Intel Xeon with AVX-512 (3443 s, held-out 0.604; 1000
  # updates of 8 rows fill the hour without AVX-512):
  .venv/bin/python -m speculax.research.train_drafters --drafters eagle_hour --steps 6600 \
      --batch 4 --tag u6600
  # EAGLE's draft layer started as the target's last layer instead of the identity:
  .venv/bin/python -m speculax.research.train_drafters --drafters eagle --steps 100 \
      --init-from target --tag target100
  # no training: answer 2400 training prompts (the recipe uses 1200), resumable
  .venv/bin/python -m speculax.research.train_drafters --prompts 2400 --corpus-only
  # no training: a drafter folder's held-out figures, here on the answers only
  .venv/bin/python -m speculax.research.train_drafters --drafters eagle_ttt --learn answers \
      --evaluate results/drafters/eagle-ttt-smollm2
  # no training: drafters' held-out figures against the cached top-32 law (the exact is default)
  .venv/bin/python -m speculax.research.train_drafters --drafters eagle_chat4 \
      --heldout-teacher top-k --evaluate results/drafters/eagle-ttt-smollm2 \
      results/drafters/eagle-chat4-smollm2
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import pathlib
import time

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.cli.train import load_experiment, shipped_experiments
from speculax.drafters import heads_io, registry, vocab_trim
from speculax.models.load import load
from speculax.research.common import OUT
from speculax.train import corpus
from speculax.train.experiment import run
from speculax.train.teacher_cache import params_fingerprint

RESULTS = OUT / "train_drafters.json"
SHIPPED = pathlib.Path("results/drafters")
# Every shipped experiment config <name>_smollm2.py (its smoke runs are named otherwise): a new
# config is a new --drafters name with no list to keep.
DRAFTERS = tuple(name.removesuffix("_smollm2") for name in shipped_experiments()
                 if name.endswith("_smollm2"))


def _experiment(name: str, args):
  exp = load_experiment(f"{name}_smollm2")
  distill = exp.distill
  if args.divergence:
    distill = dataclasses.replace(distill, divergence=args.divergence,
                                  divergence_options=tuple((k, ast.literal_eval(v))
                                                           for k, v in args.option))
  if args.steps:
    distill = dataclasses.replace(distill, optim=distill.optim.with_total_steps(args.steps))
  if args.init_from:
    exp = dataclasses.replace(exp, init_from=args.init_from)
  for data_field, value in (("learn", args.learn), ("prompts", args.prompts),
                            ("rows", args.rows), ("heldout_teacher", args.heldout_teacher)):
    if value:
      exp = dataclasses.replace(exp, data=dataclasses.replace(exp.data, **{data_field: value}))
  if args.lr:
    distill = dataclasses.replace(distill, optim=dataclasses.replace(distill.optim,
                                                                     learning_rate=args.lr))
  if args.batch:
    distill = dataclasses.replace(distill, batch_size=args.batch)
  name = exp.name + (f"-{args.tag}" if args.tag else "")
  every = distill.optim.total_steps // 4 or 1
  return dataclasses.replace(exp, name=name, distill=distill, eval_every=every,
                             checkpoint_every=min(exp.checkpoint_every, every))


def _depths(metrics: dict) -> list[str]:
  """'1 - TV (top-1)' per depth (a draft model reports one depth, without top-1)."""
  if "acceptance/depth1" not in metrics:
    return [f"{metrics['acceptance']:.3f}"] if "acceptance" in metrics else []
  depths = sorted(int(k.split("depth")[1]) for k in metrics if k.startswith("acceptance/depth"))
  return [f"{metrics[f'acceptance/depth{j}']:.3f} ({metrics[f'top1/depth{j}']:.2f})"
          for j in depths]


def _train(name: str, exp, model, ship: str | None) -> dict:
  """Runs (or resumes) one experiment; its results row, with the shipped copy's folder (ship:
  its name under results/drafters, "" for the experiment's own, None: not shipped)."""
  cost = exp.folder / "train_seconds.json"  # summed over resumed runs
  spent = json.loads(cost.read_text()) if cost.is_file() else {"seconds": 0.0, "steps": 0}
  t = time.perf_counter()
  result = run(exp, model=model)
  if result["steps"] != spent["steps"]:
    spent = {"seconds": spent["seconds"] + time.perf_counter() - t, "steps": result["steps"]}
    cost.parent.mkdir(parents=True, exist_ok=True)
    cost.write_text(json.dumps(spent))
  row = dict(drafter=name, divergence=exp.distill.divergence,
             options=dict(exp.distill.divergence_options), updates=result["steps"],
             train_s=spent["seconds"], rows=exp.data.rows, seq_len=exp.data.seq_len,
             batch=exp.distill.batch_size, lr=exp.distill.optim.learning_rate,
             learn=exp.data.learn, teacher=exp.data.heldout_teacher,
             vocab_trim=getattr(getattr(exp.distill, "drafter", None), "vocab_trim", 0),
             before=result["heldout_before"], after=result["heldout_after"])
  if ship is not None and result["drafter"]:
    drafter, params = registry.load(result["drafter"], model)
    order = params.pop(vocab_trim.IDS)
    row["shipped"] = str(heads_io.save_drafter(
        SHIPPED / (ship or exp.name), drafter, params, exp.target, model.config, result["steps"],
        vocab_ids=order, dtype="bfloat16").parent)
  print(f"{exp.name}: held-out 1 - TV {_depths(result['heldout_before'])[:1]} -> "
        f"{_depths(result['heldout_after'])} in {spent['seconds']:.0f} s ({result['steps']} "
        "updates)", flush=True)
  return row


def _evaluate(exp, folder: str, model) -> dict:
  """Held-out metrics of the drafter in `folder`, no update (its run folder: runs/<name>-eval)."""
  exp = dataclasses.replace(exp, name=f"{exp.name}-eval", init_from=folder)
  metrics = run(exp, model=model, until=0)["heldout_before"]
  print(f"{folder} on {exp.data.learn} positions, {exp.data.heldout_teacher} law: "
        f"{_depths(metrics)}", flush=True)
  return dict(drafter=exp.name, evaluated=folder, learn=exp.data.learn,
              teacher=exp.data.heldout_teacher, divergence="-", options={}, updates=0,
              train_s=0.0, before={}, after=metrics)


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--drafters", default="eagle", help=f"from {','.join(DRAFTERS)}")
  ap.add_argument("--steps", type=int, default=0, help="updates (0: the experiment's own)")
  ap.add_argument("--lr", type=float, default=0, help="peak learning rate (0: the experiment's)")
  ap.add_argument("--batch", type=int, default=0, help="rows an update (0: the experiment's)")
  ap.add_argument("--divergence", default=None, help="override the objective (fkl, lk, tvd, ...)")
  ap.add_argument("--option", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                  help="a divergence option, e.g. --option kl_weight 0.1")
  ap.add_argument("--learn", choices=("all", "answers"), default=None,
                  help="positions the loss and held-out metrics weigh (default: the experiment's)")
  ap.add_argument("--prompts", type=int, default=0,
                  help="training prompts answered (0: the experiment's)")
  ap.add_argument("--rows", type=int, default=0,
                  help="training rows of the corpus (0: the experiment's); more prompts give more")
  ap.add_argument("--corpus-only", action="store_true",
                  help="train nothing: generate the target's missing answers (resumable) and stop")
  ap.add_argument("--evaluate", nargs="+", default=None, metavar="FOLDER",
                  help="train nothing: the held-out figures of these drafters (finished runs or "
                       "shipped drafters of the --drafters kind) under the experiment's data")
  ap.add_argument("--heldout-teacher", choices=("exact", "top-k"), default=None,
                  help="the law held-out figures score against: the target's own (exact, the "
                       "default) or the teacher cache's top-k, which the loss reads")
  ap.add_argument("--init-from", default=None, metavar="FOLDER",
                  help="start from this finished run or shipped drafter of the same kind, or "
                       "'target': EAGLE's draft layers from the target's last ones (default: "
                       "the experiment's own start)")
  ap.add_argument("--tag", default="", help="suffix of the run folders (runs/<name>-<tag>)")
  ap.add_argument("--ship", nargs="?", const="", default=None, metavar="NAME",
                  help=f"copy finished drafters to {SHIPPED}/<name>-smollm2 in bfloat16 (or to "
                       f"{SHIPPED}/NAME, one drafter only)")
  ap.add_argument("--results", default=str(RESULTS),
                  help="JSON of the runs, extended run by run (results/train_drafters.json holds "
                       "the README's)")
  ap.add_argument("--report", action="store_true", help="print --results' table and stop")
  args = ap.parse_args()
  names = args.drafters.split(",")
  if args.ship and len(names) > 1:
    ap.error(f"--ship {args.ship} names one folder; got {len(names)} --drafters {args.drafters}")
  if unknown := set(names) - set(DRAFTERS):
    ap.error(f"unknown --drafters {sorted(unknown)}; known: {', '.join(DRAFTERS)}")
  results = pathlib.Path(args.results)
  found = json.loads(results.read_text()) if results.is_file() else {"runs": {}}
  if args.report:
    if not found["runs"]:
      ap.error(f"no runs in --results {results}")
    return report(found)
  model = load("smollm2-135m")
  for name in names:
    exp = _experiment(name, args)
    if args.corpus_only:
      folder = exp.teacher_dir or exp.folder
      corpus.token_rows(exp.data, model, folder, params_fingerprint(model.params))
      print(f"{exp.data.prompts} prompts answered in {exp.data.answers_dir or folder}", flush=True)
      return
    for folder in args.evaluate or []:
      _record(found, results, f"{folder} ({exp.data.learn}, {exp.data.heldout_teacher})",
              _evaluate(exp, folder, model))
    if not args.evaluate:
      _record(found, results, exp.name, _train(name, exp, model, args.ship))
  report(found)


def _record(found: dict, results: pathlib.Path, key: str, row: dict) -> None:
  """Adds one run's row to the results and writes them (a later failure keeps it)."""
  found["runs"][key] = row
  found["machine"] = machine()
  results.parent.mkdir(parents=True, exist_ok=True)
  results.write_text(json.dumps(found, indent=1))


def report(found: dict) -> None:
  """The results file's table: held-out figures per depth, each run's positions and objective."""
  runs = found["runs"]
  depth = max(len(_depths(r["after"])) for r in runs.values())
  print(f"\nHeld-out 1 - TV (top-1 agreement) per draft depth; {found['machine']}\n")
  print(table(["run", "positions, law", "objective", "updates (s)", "before: depth 1"]
              + [f"depth {j}" for j in range(1, depth + 1)],
              [[n, f"{r.get('learn', 'all')}, {r.get('teacher', 'top-k')} law",
                r["divergence"] + "".join(f" {k}={v}" for k, v in r["options"].items()),
                f"{r['updates']} ({r['train_s']:.0f})", (_depths(r["before"]) or ["-"])[0]]
               + _depths(r["after"]) + ["-"] * (depth - len(_depths(r["after"])))
               for n, r in runs.items()]))

if __name__ == "__main__":
  main()
