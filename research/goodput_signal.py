"""Goodput-driven draft length with its acceptance estimated per bin of the drafter's signal
(prompt lookup: the length of the n-gram match its draft continues) against one estimate pooled
over every row, and against every fixed k and the autoregressive loop, side by side on the same
prompts `--batch` at a time. Both goodput runs weigh the same step costs (calibrated once, on
the first batch), so they differ only in what they choose; every method runs on every batch,
interleaved, `--repeats` times, compile apart. Prints the median decode milliseconds per new
token (prefill apart, the same for every method here) and the goodput runs' choices, and writes
JSON.

  .venv/bin/python -m speculax.research.goodput_signal [--prompts 4] [--batch 1] [--repeats 3]
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
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import speculative_generate
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models.load import load
from speculax.research.common import (add_loop_runs, add_target_and_out, median,
                                      parse_loop_runs, prompt_batches)


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_target_and_out(ap)
  add_loop_runs(ap, prompts=4)
  args = parse_loop_runs(ap, argv)
  model = load(args.model)
  batches = prompt_batches(args, model.tokenizer)
  drafter = PromptLookup()
  base = SpecConfig(k=args.k, max_new_tokens=args.new_tokens, eos_ids=())
  policies = {"goodput, per match length": Goodput(), "goodput, pooled": Goodput(signal=False)}
  costs = calibrate(model.params, model.config, batches[0], drafter,
                    dataclasses.replace(base, goodput=Goodput())).step_costs  # both from the prior
  spec = lambda **kw: dataclasses.replace(base, **kw)
  runs = {"autoregressive": lambda p: generate(model.params, model.config, p, base, warmup=True)}
  for k in range(1, args.k + 1):
    runs[f"k = {k}"] = lambda p, k=k: speculative_generate(
        model.params, model.config, p, drafter, spec(k=k), warmup=True)
  for name, policy in policies.items():
    runs[name] = lambda p, policy=policy: speculative_generate(
        model.params, model.config, p, drafter, spec(goodput=policy), warmup=True,
        step_costs=costs)
  ms, tau, k_steps = ({n: [] for n in runs} for _ in range(3))
  for _ in range(args.repeats):
    for p in batches:
      for name, run in runs.items():
        out = run(p)
        ms[name].append(1e3 * out.decode_s / out.new_tokens)
        tau[name].append(out.tau)
        if out.k_steps is not None:
          k_steps[name].append(out.k_steps.tolist())
  result = dict(machine=machine(), drafter="prompt lookup", prompts=args.prompts,
                batch=args.batch, repeats=args.repeats, new_tokens=args.new_tokens, k=args.k,
                step_costs_ms=(1e3 * costs).tolist(), ms_per_token=ms, tau=tau,
                k_steps={n: np.sum(v, 0).tolist() for n, v in k_steps.items() if v},
                median_ms={n: median(v) for n, v in ms.items()})
  ar = result["median_ms"]["autoregressive"]
  print(table(["method", "median decode ms / token", "x AR (speed)", "tau", "steps drafting 0..k"],
              [[n, m, ar / m, float(np.mean(tau[n])),
                "/".join(map(str, result["k_steps"].get(n, []))) or "-"]
               for n, m in result["median_ms"].items()]))
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / f"goodput_signal_b{args.batch}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
