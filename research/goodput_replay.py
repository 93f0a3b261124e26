"""Goodput's choices without the timing's noise: a bench result's greedy goodput rows replayed
under the step costs each row calibrated, held fixed, beside every fixed k from 0 (plain
decoding) to the row's k under the same costs (a length forced by +inf on the others). Greedy
decoding makes every choice deterministic, so the modelled tokens/s (tokens / the summed cost of
the lengths taken) is the policy's worth on that machine's costs with neither a calibration's
nor a round's spread: a bench row that loses to fixed k here loses by its choices. The replay
decodes the bench config's own method (drafter, options, policy) on the first --prompts prompts
of the row's suite at its batch; --set FIELD=VALUE replaces policy fields (margin=0, ...);
--method NAME replays only that method's rows; --new-tokens N decodes N tokens a prompt instead
of the bench's (longer answers: what the policy does over a long call, as its probes thin out).
An accelerator suite's result replays its drafters section's goodput rows under the costs
calibrated on that device, on this machine (the choices are the device's where the greedy tokens
agree), with --new-tokens as the suite ran them.

  .venv/bin/python -m speculax.research.goodput_replay --bench results/bench_goodput_chain.json
      [--config goodput] [--prompts 8] [--set margin=0] [--method NAME] [--new-tokens N]
      [--out results]
"""
from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from speculax.bench import suites
from speculax.bench.config import load_config
from speculax.bench.methods import build_drafter
from speculax.bench.report import table
from speculax.bench.run import loader
from speculax.core import overrides
from speculax.decode.calibrate import calibrate
from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput, forcing, step_costs
from speculax.decode.speculative import speculative_generate


def replay(model, drafter, dparams, policy: Goodput, costs, groups: list[list[list[int]]],
           new_tokens: int) -> dict[str, dict]:
  """{run: tok_per_s, steps [k + 1], tokens} for the policy and each fixed k of finite cost (0:
  plain decoding) under costs [k + 1] (seconds of a step drafting 0..k), decoding each group of
  prompts greedily, EOS off; goodput from the estimate its calibration would leave
  (Goodput.start)."""
  costs = step_costs(costs, len(costs) - 1)
  # A fixed k's run is forced (+inf elsewhere) and, like goodput's, timed by `costs` below.
  runs = {"goodput": costs, **{f"k={k}": forcing(k, len(costs))
                               for k in range(len(costs)) if np.isfinite(costs[k])}}
  spec = SpecConfig(k=len(costs) - 1, max_new_tokens=new_tokens, eos_ids=(), goodput=policy)
  # The bench's goodput rows start where their calibration on the first group left them (its
  # times are not used: greedy, one round of runs leaves the same counts).
  estimate = calibrate(model.params, model.config, groups[0], drafter, spec, dparams,
                       repeats=1).estimate
  out = {}
  for name, run_costs in runs.items():
    steps, tokens = np.zeros(len(costs), np.int64), 0
    for prompts in groups:
      r = speculative_generate(model.params, model.config, prompts, drafter, spec, dparams,
                               step_costs=run_costs,
                               estimate=estimate if name == "goodput" else None)
      steps += np.asarray(r.k_steps)
      tokens += sum(len(t) for t in r.tokens)
    seconds = float(sum(n * c for n, c in zip(steps, costs) if n))
    out[name] = dict(tok_per_s=tokens / seconds, steps=steps.tolist(), tokens=tokens)
  return out


def greedy_goodput_rows(bench: dict, methods: list[str] | None = None) -> list[dict]:
  """The bench result's greedy rows that ran goodput (those with calibrated step costs), of
  `methods` only where given (each must have such a row)."""
  rows = [r for r in bench["rows"] if r.get("step_costs") and r["sampling"] == "greedy"]
  if not rows:
    raise ValueError(f"bench result {bench.get('name')!r} holds no greedy goodput row (none with "
                     f"step_costs) to replay; its methods: "
                     f"{sorted({r['method'] for r in bench['rows']})}")
  missing = sorted(set(methods or ()) - {r["method"] for r in rows})
  if missing:
    raise ValueError(f"bench result {bench.get('name')!r} has no greedy goodput row of "
                     f"{missing}; its goodput methods: {sorted({r['method'] for r in rows})}")
  return [r for r in rows if not methods or r["method"] in methods]


def as_bench(data: dict, path: pathlib.Path, new_tokens: int | None) -> dict:
  """A bench result as the replay reads it: a bench's own JSON, or the accelerator suite's (its
  drafters section's rows, named by the file; the suite records no bench settings, so its
  tokens per prompt must be given: --new-tokens)."""
  if "sections" not in data:
    return data
  if new_tokens is None:
    raise ValueError(f"{path} is an accelerator suite result, which does not record its "
                     f"drafters' tokens per prompt: give --new-tokens")
  return dict(name=path.stem, rows=data["sections"].get("drafters", []), new_tokens=new_tokens)


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--bench", type=pathlib.Path, required=True,
                  help="a bench result's JSON, or an accelerator suite's (with --new-tokens)")
  ap.add_argument("--config", default="goodput", help="the bench config its methods come from")
  ap.add_argument("--prompts", type=int, default=8, help="prompts of the row's suite replayed")
  ap.add_argument("--set", action="append", default=[], dest="settings", metavar="FIELD=VALUE",
                  help="a Goodput field replaced in every row's policy (core/overrides)")
  ap.add_argument("--method", action="append", default=[], dest="methods", metavar="NAME",
                  help="replay only this method's rows (repeatable; default: every goodput row)")
  ap.add_argument("--new-tokens", type=int, default=None,
                  help="tokens decoded per prompt (default: the bench's)")
  ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results"))
  args = ap.parse_args(argv)
  overrides.apply(Goodput(), args.settings)  # a bad field fails here, before any model loads
  bench = as_bench(json.loads(args.bench.read_text()), args.bench, args.new_tokens)
  rows = greedy_goodput_rows(bench, args.methods)
  new_tokens = bench["new_tokens"] if args.new_tokens is None else args.new_tokens
  if new_tokens < 1:
    ap.error(f"--new-tokens must be at least 1, got {new_tokens}")
  cfg = load_config(args.config)
  methods = {m.name: m for m in cfg.methods}
  load = loader(cfg)
  model = load(bench.get("target", cfg.target))  # a suite's: the config's target
  result = dict(bench=str(args.bench), config=args.config, prompts=args.prompts,
                new_tokens=new_tokens, settings=args.settings, rows=[])
  for row in rows:
    if row["method"] not in methods:
      raise ValueError(f"bench row {row['method']!r} is not a method of bench config "
                       f"{args.config!r} (its methods: {sorted(methods)})")
    m = methods[row["method"]]
    drafter, dparams = build_drafter(m.drafter, model, load, m.options, m.k, m.fields)
    policy = overrides.apply(m.policy, args.settings)
    ids = suites.encode(model.tokenizer, suites.suite(row["suite"], max(args.prompts,
                                                                         row["batch"])))
    b = row["batch"]
    groups = [ids[i:i + b] for i in range(0, max(args.prompts // b, 1) * b, b)]
    runs = replay(model, drafter, dparams, policy, row["step_costs"], groups, new_tokens)
    result["rows"].append(dict(method=row["method"], batch=b, step_costs=row["step_costs"],
                               runs=runs))
    best = max((r for n, r in runs.items() if n != "goodput"), key=lambda r: r["tok_per_s"])
    print(table(["method", "batch", "run", "modelled tok/s", "x best fixed k", "steps 0..k"],
                [[row["method"], b, n, r["tok_per_s"], r["tok_per_s"] / best["tok_per_s"],
                  "/".join(map(str, r["steps"]))] for n, r in runs.items()]))
  args.out.mkdir(parents=True, exist_ok=True)
  suffix = "".join("_" + t.replace("=", "") for t in args.settings)  # e.g. _margin0
  suffix += "" if args.new_tokens is None else f"_n{new_tokens}"
  path = args.out / f"goodput_replay_{bench['name']}{suffix}.json"
  path.write_text(json.dumps(result, indent=1) + "\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
