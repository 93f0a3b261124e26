"""What goodput-driven draft length costs: the goodput loop forced to k' = 0 on every step (a cost
model where any draft is dear) against the autoregressive loop, forced to k' = 1 against the
fixed k = 1 loop (the same tokens: the gap is goodput's bookkeeping), and choosing freely under
fixed step costs as a chain of per-length loops against a switch per step (the same steps: the
gap is the loop form's), on the same prompts `--batch` at a time, interleaved, compile apart. A
drafter with its own forward to keep current (a draft model, EAGLE) feeds plain steps' tokens in
blocks of `max_lag` before its next draft; for one, the loop forced to k' = 0 also runs with
max_lag = 0 (its forward on every plain step: "fed each step"), so what the blocks save shows
here. Prints the median milliseconds of a loop step (prefill apart) and writes JSON. The
accelerator suite's `loops` section runs the same set on a GPU.

--calibrations N: then N calibrations (decode/calibrate.py, as `speculax generate --goodput`
runs it) on the first batch, each one's step costs in its own plain steps beside the forced
loops' (how far one calibration on this machine strays from the loop's own step costs).

  .venv/bin/python -m speculax.research.goodput_overhead [--prompts 2] [--batch 1]
      [--repeats 3] [--heads results/drafters/eagle-ttt-smollm2] [--calibrations 0]
      [--drafter draft-model --draft-layers 1]  (any drafter, as `speculax generate` takes it;
      default prompt lookup, or the kind a --heads folder holds)
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.decode.calibrate import calibrate
from speculax.decode.config import SpecConfig
from speculax.decode.generate import generate
from speculax.decode.goodput import Goodput, forcing
from speculax.decode.speculative import speculative_generate
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models.load import load
from speculax.research.common import (add_loop_runs, add_target_and_out, drafter_label,
                                      loop_drafter, median, parse_loop_runs, prompt_batches)


def overhead_runs(params, config, prompts, drafter, dparams, k: int, new_tokens: int,
                  label: str) -> dict:
  """The loops compared, by name, each a call that decodes prompts once (compiled apart):
  autoregressive, the goodput loop (k' <= k) forced to k' = 0 and to k' = 1 on every step (a
  forced loop that drafted another length raises), fixed k = 1 ("<label> k=1"), the goodput
  loop choosing freely under one fixed set of step costs as a chain of per-length loops and as a
  switch per step (the same costs and outcomes, so the same steps: the gap between the two rows
  is the loop form's, what a GPU pays for conditions evaluated from the host), and for a drafter
  with max_lag the loop forced to k' = 0 feeding it every plain step."""
  base = SpecConfig(k=k, max_new_tokens=new_tokens, eos_ids=())
  good = dataclasses.replace(base, goodput=Goodput())
  # Relative costs under which several lengths win in turn as the estimate moves (a plain step
  # 1, each draft 0.15 more); not calibrated, so both forms weigh the same numbers.
  free_costs = (1 + 0.15 * np.arange(k + 1)).astype(np.float32)

  def free(loop):
    spec = dataclasses.replace(base, goodput=Goodput(loop=loop))
    return lambda: speculative_generate(params, config, prompts, drafter, spec, dparams,
                                        warmup=True, step_costs=free_costs)

  def forced(n, drafter=drafter):
    def run():
      out = speculative_generate(params, config, prompts, drafter, good, dparams, warmup=True,
                                 step_costs=forcing(n, k + 1))
      if out.k_steps[n] != out.k_steps.sum():
        raise RuntimeError(f"the loop forced to k' = {n} drafted: k_steps {out.k_steps.tolist()}")
      return out
    return run

  runs = {"autoregressive": lambda: generate(params, config, prompts, base, warmup=True),
          "goodput forced k'=0": forced(0), "goodput forced k'=1": forced(1),
          f"{label} k=1": lambda: speculative_generate(
              params, config, prompts, drafter, dataclasses.replace(base, k=1), dparams,
              warmup=True),
          "goodput free, chain": free("chain"), "goodput free, switch": free("switch")}
  if drafter.max_lag:
    runs["goodput forced k'=0, fed each step"] = forced(0, dataclasses.replace(drafter,
                                                                               max_lag=0))
  return runs


def interleaved(runs: dict, rounds: int) -> tuple[dict, dict]:
  """Every run `rounds` times, round-robin: ({name: [ms per loop step, a round each]}, {name:
  its last output})."""
  step_ms, outs = {name: [] for name in runs}, {}
  for _ in range(rounds):
    for name, run in runs.items():
      outs[name] = run()
      step_ms[name].append(1e3 * outs[name].step_s)
  return step_ms, outs


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_target_and_out(ap)
  add_loop_runs(ap, prompts=2, drafter=True)
  ap.add_argument("--calibrations", type=int, default=0,
                  help="then calibrate this many times on the first batch")
  args = parse_loop_runs(ap, argv)
  model = load(args.model)
  batches = prompt_batches(args, model.tokenizer)
  drafter, dparams = loop_drafter(args, model)
  step_ms, changes = {}, {}
  for p in batches:  # each batch's loops interleaved, the rounds pooled over batches
    runs = overhead_runs(model.params, model.config, p, drafter, dparams, args.k,
                         args.new_tokens, drafter.name)
    ms, outs = interleaved(runs, args.repeats)
    for name in runs:
      step_ms.setdefault(name, []).extend(ms[name])
      if outs[name].k_changes is not None:  # steps and changes of length, summed over batches
        steps, n = changes.get(name, (0, 0))
        changes[name] = (steps + int(outs[name].k_steps.sum()), n + outs[name].k_changes)
  ar = median(step_ms["autoregressive"])
  result = dict(machine=machine(), drafter=drafter_label(args),
                prompts=args.prompts, batch=args.batch, repeats=args.repeats,
                new_tokens=args.new_tokens, step_ms=step_ms,
                median_ms={n: median(v) for n, v in step_ms.items()},
                steps_and_length_changes=changes)
  print(table(["loop", "median ms a step", "x the autoregressive step",
               "steps / length changes"],
              [[n, m, m / ar, "/".join(map(str, changes[n])) if n in changes else "-"]
               for n, m in result["median_ms"].items()]))
  if args.calibrations > 0:
    spec = SpecConfig(k=args.k, max_new_tokens=args.new_tokens, eos_ids=(), goodput=Goodput())
    costs = [calibrate(model.params, model.config, batches[0], drafter, spec,
                       dparams).step_costs.tolist()
             for _ in range(args.calibrations)]
    forced = [result["median_ms"][f"goodput forced k'={k}"] for k in (0, 1)]
    result.update(calibrated_ms=[[1e3 * c for c in row] for row in costs],
                  forced_one_draft_in_plain_steps=forced[1] / forced[0])
    print(table(["calibration", "ms a step drafting 0..k", "in its plain steps"],
                [[i, " ".join(f"{1e3 * c:.1f}" for c in row),
                  " ".join(f"{c / row[0]:.2f}" for c in row)] for i, row in enumerate(costs)]))
    print(f"the forced loops: a one-draft step is {forced[1] / forced[0]:.2f} plain steps")
  args.out.mkdir(parents=True, exist_ok=True)
  name = ("goodput_overhead" + ("" if isinstance(drafter, PromptLookup) else f"_{drafter.name}")
          + ("" if args.batch == 1 else f"_b{args.batch}"))
  (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
