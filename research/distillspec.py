"""DistillSpec-style comparison: one draft model distilled with each divergence, same data/budget.

For each divergence: held-out acceptance (1 - TV on held-out stdlib rows), then chain
speculative decoding with the trained draft (its run folder) on held-out HumanEval prompts,
greedy and at temperature 1, through speculax.bench (autoregressive decoding in the same run):
tau and speedup over autoregressive decoding. The untrained initialization is the baseline row.
Prints a Markdown table, writes <out>/distillspec.json (the bench rows beside the training
records) and a bar plot.

  .venv/bin/python -m speculax.research.distillspec [--steps 300] [--prompts 8] [--new-tokens 64]
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from speculax.bench import run as bench_run
from speculax.bench.config import BenchConfig, method
from speculax.bench.report import table
from speculax.configs.distill_smollm2 import EXPERIMENT
from speculax.models.derive import truncated
from speculax.models.load import load
from speculax.research.common import add_target_and_out
from speculax.train.experiment import run

DIVERGENCES = [("fkl", ()), ("rkl", ()), ("jsd", (("beta", 0.5),)), ("tvd", ()),
               ("tvd++", (("n_samples", 16),)), ("ce", ())]
UNTRAINED = "untrained"


def figures(bench: dict) -> dict[tuple[str, str], tuple[float, float]]:
  """(method, sampling) -> (tau, x AR) of a bench result's rows."""
  return {(r["method"], r["sampling"]): (r["tau"], r["speedup"]) for r in bench["rows"]}


def plot(rows, path):
  """Grouped bars per drafter: held-out 1 - TV, tau greedy, tau at t=1."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = [r[0] for r in rows]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  axes[0].bar(names, [r[1] for r in rows], color="tab:gray")
  axes[0].set(title="held-out acceptance 1 - TV", ylim=(0, 1))
  x = range(len(rows))
  axes[1].bar([i - 0.2 for i in x], [r[2] for r in rows], 0.4, label="greedy")
  axes[1].bar([i + 0.2 for i in x], [r[4] for r in rows], 0.4, label="temperature 1")
  axes[1].set(title="tau (tokens per target forward)", xticks=list(x), xticklabels=names)
  axes[1].legend()
  for ax in axes:
    ax.tick_params(axis="x", rotation=30)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--steps", type=int, default=EXPERIMENT.distill.optim.total_steps)
  ap.add_argument("--rows", type=int, default=EXPERIMENT.data.rows)
  ap.add_argument("--seq-len", type=int, default=EXPERIMENT.data.seq_len)
  ap.add_argument("--corpus", choices=("code", "self-distill", "mixed"),
                  default=EXPERIMENT.data.corpus, help="the training corpus (train/corpus.py)")
  ap.add_argument("--prompts", type=int, default=8, help="held-out HumanEval prompts to decode")
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("-k", type=int, default=4)
  ap.add_argument("--divergences", default=",".join(name for name, _ in DIVERGENCES),
                  help="comma-separated subset of the divergences to train")
  ap.add_argument("--out-dir", default="runs/distillspec", help="training runs")
  add_target_and_out(ap)
  args = ap.parse_args()

  model = load(args.model)
  base = dataclasses.replace(
      EXPERIMENT, target=args.model, out_dir=args.out_dir, teacher_dir=f"{args.out_dir}/teacher",
      data=dataclasses.replace(EXPERIMENT.data, rows=args.rows, seq_len=args.seq_len,
                               corpus=args.corpus),
      distill=dataclasses.replace(EXPERIMENT.distill,
                                  optim=EXPERIMENT.distill.optim.with_total_steps(args.steps)))
  chosen = args.divergences.split(",")
  unknown = sorted(set(chosen) - {name for name, _ in DIVERGENCES})
  if unknown:
    raise SystemExit(f"unknown divergences {unknown}; choose from {[n for n, _ in DIVERGENCES]}")
  records, heldout = [], {}
  for name, options in [d for d in DIVERGENCES if d[0] in chosen]:
    exp = dataclasses.replace(base, name=f"distill-{name}", distill=dataclasses.replace(
        base.distill, divergence=name, divergence_options=options))
    result = run(exp, model=model)
    heldout.setdefault(UNTRAINED, result["heldout_acceptance_before"])  # the same start for all
    heldout[name] = result["heldout_acceptance_after"]
    records.append({"divergence": name, "options": dict(options), "folder": result["drafter"],
                    "heldout_acceptance": heldout[name], "plot": result["plot"]})
  cut = truncated(model.params, model.config, base.draft_layers)  # (config, params): the start
  methods = (method(UNTRAINED, "draft-model", k=args.k, draft=cut),
             *(method(r["divergence"], "draft-model", k=args.k, draft=r["folder"])
               for r in records))
  bench = bench_run.run(
      BenchConfig(methods=methods, target=args.model, prompts=args.prompts,
                  temperatures=(0.0, 1.0), new_tokens=args.new_tokens, step_split=False),
      "distillspec", model=model)
  got = figures(bench)
  rows = [[name, acc, *got[name, "greedy"], *got[name, "t=1"]] for name, acc in heldout.items()]
  print(f"\nSmolLM2-135M target, {len(base.draft_layers)}-layer draft cut from its layers, "
        f"{args.steps} updates x batch {base.distill.batch_size} x {base.data.seq_len} tokens, "
        f"k={args.k}, {args.prompts} held-out HumanEval prompts x {args.new_tokens} tokens; "
        f"{bench['machine']}, {bench['date']}\n")
  print(table(["drafter", "held-out 1-TV", "tau greedy", "speedup greedy", "tau t=1",
               "speedup t=1"], rows))
  out = args.out
  out.mkdir(parents=True, exist_ok=True)
  (out / "distillspec.json").write_text(json.dumps(
      {"rows": rows, "runs": records, "bench": bench}, indent=1, default=str))
  plot(rows, out / "distillspec.png")
  print(f"\nwrote {out}/distillspec.json and {out}/distillspec.png; training curves: "
        f"{[r['plot'] for r in records]}")


if __name__ == "__main__":
  main()
