"""What goodput-driven draft length costs when it drafts nothing: the goodput loop forced to
k' = 0 on every step (a cost model where any draft is dear) against the autoregressive loop,
and a fixed one-draft step for scale, on the same prompts `--batch` at a time, interleaved,
compile apart. The drafter still sees every plain step (a draft model or EAGLE feeds the
verified token into its own cache), so its share shows here. Prints the median milliseconds of
a loop step (prefill apart) and writes JSON.

  .venv/bin/python -m speculax.research.goodput_overhead [--prompts 2] [--batch 1]
      [--repeats 3] [--heads results/drafters/eagle-ttt-smollm2]
"""
from __future__ import annotations

import argparse
import dataclasses
import json

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.decode.config import SpecConfig
from speculax.decode.generate import generate
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import speculative_generate
from speculax.drafters import registry
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models.load import load
from speculax.research.common import (add_loop_runs, add_target_and_out, median,
                                      parse_loop_runs, prompt_batches)


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_target_and_out(ap)
  add_loop_runs(ap, prompts=2, heads=True)
  args = parse_loop_runs(ap, argv)
  model = load(args.model)
  batches = prompt_batches(args, model.tokenizer)
  drafter, dparams = PromptLookup(), None
  if args.heads:
    loaded = registry.load(args.heads, model)
    drafter, dparams = loaded.drafter, loaded.params
  base = SpecConfig(k=args.k, max_new_tokens=args.new_tokens, eos_ids=())
  goodput = dataclasses.replace(base, goodput=Goodput())
  plain_only = [1.0] + [float("inf")] * args.k  # step costs that leave only k' = 0, no probe
  runs = {
      "autoregressive loop": lambda p: generate(model.params, model.config, p, base,
                                                warmup=True),
      "goodput loop, k' = 0 every step": lambda p: speculative_generate(
          model.params, model.config, p, drafter, goodput, dparams, warmup=True,
          step_costs=plain_only),
      f"{drafter.name}, k = 1": lambda p: speculative_generate(
          model.params, model.config, p, drafter, dataclasses.replace(base, k=1), dparams,
          warmup=True),
  }
  step_ms = {name: [] for name in runs}
  for _ in range(args.repeats):
    for p in batches:
      for name, run in runs.items():
        out = run(p)
        if out.k_steps is not None and out.k_steps[0] != out.k_steps.sum():
          raise RuntimeError(f"the forced loop drafted: k_steps {out.k_steps.tolist()}")
        step_ms[name].append(1e3 * out.step_s)
  ar = median(step_ms["autoregressive loop"])
  result = dict(machine=machine(), drafter=args.heads or "prompt lookup",
                prompts=args.prompts, batch=args.batch, repeats=args.repeats,
                new_tokens=args.new_tokens, step_ms=step_ms,
                median_ms={n: median(v) for n, v in step_ms.items()})
  print(table(["loop", "median ms a step", "x the autoregressive step"],
              [[n, m, m / ar] for n, m in result["median_ms"].items()]))
  args.out.mkdir(parents=True, exist_ok=True)
  name = ("goodput_overhead" + ("" if not args.heads else f"_{drafter.name}")
          + ("" if args.batch == 1 else f"_b{args.batch}"))
  (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
