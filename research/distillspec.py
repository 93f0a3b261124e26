"""DistillSpec-style comparison: one draft model distilled with each divergence, same data/budget.

For each divergence: held-out acceptance (1 - TV on held-out stdlib rows), then chain
speculative decoding with the trained draft on held-out HumanEval prompts, greedy and at
temperature 1: tau and speedup over autoregressive decoding. The untrained initialization is
the baseline row. Prints a Markdown table, writes <out>/distillspec.json and a bar plot.

  .venv/bin/python -m speculax.research.distillspec [--steps 300] [--prompts 8] [--new-tokens 64]
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import jax

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.configs.distill_smollm2 import EXPERIMENT
from speculax.core.sampling import SamplingConfig
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters.draft_model import DraftModel
from speculax.models.assets import humaneval_prompts
from speculax.models.derive import truncated
from speculax.models.load import load
from speculax.research.common import add_target_and_out
from speculax.train.experiment import run

DIVERGENCES = [("fkl", ()), ("rkl", ()), ("jsd", (("beta", 0.5),)), ("tvd", ()),
               ("tvd++", (("n_samples", 16),)), ("ce", ())]


def autoregressive_speed(model, prompts, new_tokens, temperature) -> float:
  """Tokens/s of our autoregressive loop on the prompts: the speedup baseline."""
  gen = GenerateConfig(max_new_tokens=new_tokens, sampling=SamplingConfig(temperature=temperature))
  return generate(model.params, model.config, prompts, gen, jax.random.key(0),
                  warmup=True).tokens_per_s


def decode_figures(model, draft_cfg, draft_params, prompts, new_tokens, k, temperature, ar_speed):
  """tau and speedup of chain speculative decoding with the draft over autoregressive."""
  sampling = SamplingConfig(temperature=temperature)
  sd = speculative_generate(model.params, model.config, prompts, DraftModel(draft_cfg),
                            SpecConfig(k=k, max_new_tokens=new_tokens, sampling=sampling),
                            drafter_params=draft_params, key=jax.random.key(0), warmup=True)
  return sd.tau, sd.tokens_per_s / ar_speed


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
  ap.add_argument("--prompts", type=int, default=8, help="held-out HumanEval prompts to decode")
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("-k", type=int, default=4)
  ap.add_argument("--divergences", default=",".join(name for name, _ in DIVERGENCES),
                  help="comma-separated subset of the divergences to train")
  ap.add_argument("--out-dir", default="runs/distillspec", help="training runs")
  add_target_and_out(ap)
  args = ap.parse_args()

  model = load(args.model)
  tok = model.tokenizer
  prompts = [tok.encode(tok.chat_prompt(p)) for p in humaneval_prompts(args.prompts)]
  base = dataclasses.replace(
      EXPERIMENT, out_dir=args.out_dir, teacher_dir=f"{args.out_dir}/teacher",
      data=dataclasses.replace(EXPERIMENT.data, rows=args.rows, seq_len=args.seq_len),
      distill=dataclasses.replace(EXPERIMENT.distill,
                                  optim=EXPERIMENT.distill.optim.with_total_steps(args.steps)))
  ar_speed = {t: autoregressive_speed(model, prompts, args.new_tokens, t) for t in (0.0, 1.0)}
  rows, records = [], []
  chosen = args.divergences.split(",")
  unknown = sorted(set(chosen) - {name for name, _ in DIVERGENCES})
  if unknown:
    raise SystemExit(f"unknown divergences {unknown}; choose from {[n for n, _ in DIVERGENCES]}")
  for name, options in [d for d in DIVERGENCES if d[0] in chosen]:
    exp = dataclasses.replace(base, name=f"distill-{name}", distill=dataclasses.replace(
        base.distill, divergence=name, divergence_options=options))
    result = run(exp)
    params = result["state"].params
    figures = {}
    for temperature in (0.0, 1.0):
      figures[temperature] = decode_figures(model, result["draft_config"], params, prompts,
                                            args.new_tokens, args.k, temperature,
                                            ar_speed[temperature])
    if not rows:  # the untrained cut: the same start for every divergence
      cut_cfg, cut = truncated(model.params, model.config, base.draft_layers)
      untrained = {t: decode_figures(model, cut_cfg, cut, prompts, args.new_tokens, args.k, t,
                                     ar_speed[t]) for t in (0.0, 1.0)}
      rows.append(["untrained", result["heldout_acceptance_before"], *untrained[0.0],
                   *untrained[1.0]])
    rows.append([name, result["heldout_acceptance_after"], *figures[0.0], *figures[1.0]])
    records.append({"divergence": name, "options": dict(options),
                    "heldout_acceptance": result["heldout_acceptance_after"],
                    "greedy": figures[0.0], "t1": figures[1.0], "plot": result["plot"]})
  print(f"\nSmolLM2-135M target, {len(base.draft_layers)}-layer draft cut from its layers, "
        f"{args.steps} updates x batch {base.distill.batch_size} x {base.data.seq_len} tokens, "
        f"k={args.k}, {args.prompts} HumanEval prompts x {args.new_tokens} tokens; {machine()}\n")
  print(table(["drafter", "held-out 1-TV", "tau greedy", "speedup greedy", "tau t=1",
               "speedup t=1"], rows))
  out = args.out
  out.mkdir(parents=True, exist_ok=True)
  (out / "distillspec.json").write_text(json.dumps({"rows": rows, "runs": records}, indent=1))
  plot(rows, out / "distillspec.png")
  print(f"\nwrote {out}/distillspec.json and {out}/distillspec.png; training curves: "
        f"{[r['plot'] for r in records]}")


if __name__ == "__main__":
  main()
