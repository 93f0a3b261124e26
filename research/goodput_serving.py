"""Goodput-driven draft length while serving a stream: what carrying the acceptance estimate
from batch to batch buys (serve/loop.py) over starting every batch from the optimistic prior
(as a lone call does), against fixed k = 1, fixed k and autoregressive decoding, on the same
stream `--batch` at a time. Both goodput runs weigh the same step costs (calibrated once on the
stream's first batch). With `--answer-bins 16,64` both goodput runs come again with the
estimate split by how far into its answer a row is (Goodput.answer_bins). Every method serves
the whole stream once per round, round-robin; tokens/s is the stream's new tokens over its
batches' seconds (prefill and decode, compile apart), the median of the rounds. Prints a table
and writes JSON. With `--continuous` every method serves the stream with continuous batching
(`serve(continuous=True)`, `generate(rows=)` for AR): one goodput run per policy, its estimate
carried from request to request in the one loop state.

  .venv/bin/python -m speculax.research.goodput_serving [--suite humaneval] [--prompts 32]
      [--batch 8] [--repeats 2] [-k 4] [--heads results/drafters/eagle-ttt-smollm2]
      [--margin 0.1] [--loop switch] [--answer-bins 16,64] [--continuous] [--drafter KIND ...]
      (any drafter, as `speculax generate` takes it; default prompt lookup, or the kind a --heads
      folder holds)
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np

from speculax.bench import suites
from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.cli.args import ints
from speculax.decode.calibrate import calibrate
from speculax.decode.config import SpecConfig
from speculax.decode.generate import generate
from speculax.decode.goodput import Goodput
from speculax.decode.inputs import compiled_shape
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models.load import load
from speculax.research.common import (add_loop_runs, add_target_and_out, drafter_label,
                                      loop_drafter, median, parse_loop_runs)
from speculax.serve.loop import serve


def stream_runs(model, stream, drafter, dparams, k: int, batch: int, new_tokens: int,
                costs, policies: tuple[Goodput, ...], continuous: bool = False) -> dict:
  """The methods compared, by name: each a call that serves the stream once and returns
  (new tokens, seconds, [k + 1] steps drafting 0..k summed over batches or None)."""
  params, config = model.params, model.config
  fixed = SpecConfig(k=k, max_new_tokens=new_tokens, eos_ids=model.tokenizer.eos_ids)
  warm = set()

  def served(spec, **options):
    def run():
      reports = list(serve(params, config, stream, drafter, spec, dparams, batch,
                           continuous=continuous, **options))
      steps = [r.k_steps for r in reports if r.k_steps is not None]
      return (sum(r.new_tokens for r in reports), sum(r.seconds for r in reports),
              np.sum(steps, 0) if steps else None)
    return run

  def autoregressive():  # warmed per compiled shape (rows, prompt buckets), as serve does
    if continuous:
      out = generate(params, config, stream, fixed, rows=batch, warmup=True)
      return out.new_tokens, out.wall_s, None
    outs = []
    for i in range(0, len(stream), batch):
      chunk = stream[i:i + batch]
      shape = compiled_shape(chunk, fixed.prompt_bucket)
      outs.append(generate(params, config, chunk, fixed, warmup=shape not in warm))
      warm.add(shape)
    return sum(o.new_tokens for o in outs), sum(o.wall_s for o in outs), None

  runs = {"autoregressive": autoregressive,
          "k=1": served(dataclasses.replace(fixed, k=1)), f"k={k}": served(fixed)}
  for policy in policies:
    good = dataclasses.replace(fixed, goodput=policy)
    bins = "/".join(map(str, policy.answer_bins))
    name = f"goodput k<={k}" + (f", answer bins {bins}" if bins else "")
    if continuous:
      runs[name] = served(good, step_costs=costs)
      continue
    runs[f"{name}, each batch from the prior"] = served(good, step_costs=costs)
    runs[f"{name}, estimate carried"] = served(good, step_costs=costs, carry_estimate=True)
  return runs


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_target_and_out(ap)
  add_loop_runs(ap, prompts=32, drafter=True)
  ap.add_argument("--suite", default="humaneval", choices=("humaneval", "chat"))
  ap.add_argument("--continuous", action="store_true",
                  help="serve with continuous batching (a finished row refilled with the next)")
  ap.add_argument("--margin", type=float, default=Goodput().margin,
                  help="Goodput.margin of every goodput run")
  ap.add_argument("--loop", default=Goodput().loop, choices=("chain", "switch"),
                  help="Goodput.loop of every goodput run: a chain of per-length loops, or one "
                  "loop with a switch per step")
  ap.add_argument("--answer-bins", type=lambda v: ints(v, "--answer-bins"),
                  default=(), help="Goodput.answer_bins of a second pair of goodput runs, "
                  "e.g. 16,64 (tokens into the answer)")
  args = parse_loop_runs(ap, argv)
  model = load(args.model)
  stream = suites.encode(model.tokenizer, suites.suite(args.suite, args.prompts))
  drafter, dparams = loop_drafter(args, model)
  policy = Goodput(margin=args.margin, loop=args.loop)
  policies = (policy,) + ((dataclasses.replace(policy, answer_bins=args.answer_bins),)
                          if args.answer_bins else ())
  spec = SpecConfig(k=args.k, max_new_tokens=args.new_tokens, eos_ids=model.tokenizer.eos_ids,
                    goodput=policy)
  costs = calibrate(model.params, model.config, stream[:args.batch], drafter, spec,
                    dparams).step_costs  # runs start from the prior or a carried estimate
  runs = stream_runs(model, stream, drafter, dparams, args.k, args.batch, args.new_tokens, costs,
                     policies, args.continuous)
  rate, k_steps = {name: [] for name in runs}, {}
  for _ in range(args.repeats):
    for name, run in runs.items():
      tokens, seconds, steps = run()
      rate[name].append(tokens / seconds)
      if steps is not None:
        k_steps[name] = steps.tolist()  # the last round's
  ar = median(rate["autoregressive"])
  result = dict(machine=machine(), drafter=drafter_label(args), suite=args.suite,
                prompts=args.prompts, batch=args.batch, repeats=args.repeats, k=args.k,
                margin=args.margin, loop=args.loop, answer_bins=args.answer_bins,
                continuous=args.continuous, new_tokens=args.new_tokens, step_costs=costs.tolist(),
                tokens_per_s=rate,
                median_tokens_per_s={n: median(v) for n, v in rate.items()}, k_steps=k_steps)
  print(table(["method", "tok/s (median)", "rounds", "x AR", "steps drafting 0..k"],
              [[n, median(v), " ".join(f"{x:.1f}" for x in v), median(v) / ar,
                "/".join(map(str, k_steps.get(n, []))) or "-"] for n, v in rate.items()]))
  args.out.mkdir(parents=True, exist_ok=True)
  name = (f"goodput_serving_{args.suite}"
          + ("" if isinstance(drafter, PromptLookup) else f"_{drafter.name}")
          + (f"_lookup{args.lookup}" if args.lookup else "")
          + f"_b{args.batch}" + ("" if args.new_tokens == ap.get_default("new_tokens")
                                            else f"_n{args.new_tokens}")
          + ("" if args.margin == Goodput().margin else f"_m{args.margin:g}")
          + ("" if args.loop == Goodput().loop else f"_{args.loop}")
          + ("_bins" + "-".join(map(str, args.answer_bins)) if args.answer_bins else "")
          + ("_continuous" if args.continuous else ""))
  (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
