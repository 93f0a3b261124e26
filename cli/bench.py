"""`speculax bench --config NAME|FILE`: a method set (configs/bench/*.py) on its prompt suites,
autoregressive decoding in the same process; writes JSON, a Markdown table and a plot."""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

from speculax.bench.config import load_config, shipped
from speculax.cli.args import announce
from speculax.core import overrides

DEFAULT_OUT = "runs/bench"


def add_parser(sub) -> None:
  p = sub.add_parser(
      "bench", help="benchmark a set of methods against autoregressive decoding",
      description="Run every method of a bench config (BENCH = BenchConfig(...) in a Python "
                  "file, or a shipped set by name) on its prompt suites at each batch size and "
                  "temperature, with autoregressive decoding first and last in every panel. "
                  "Writes <out>/<name>.json (one row per method and panel: tau, acceptance by "
                  "position, tokens/s, speedup, speedup/tau, draft cost, memory, greedy "
                  "equality, compile time apart), <name>.md and <name>.png.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--config", default="quick",
                 help=f"a bench config file, or a shipped set: {', '.join(shipped())}")
  p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                 help="override a BenchConfig field, e.g. --set prompts=2 --set "
                      "'suites=(\"chat\",)' --set batch_sizes=1,8 (repeatable)")
  p.add_argument("--method", action="append", default=[], metavar="NAME",
                 help="run only this method of the config (repeatable; default: all of them)")
  p.add_argument("--model", default=None, help="the target (default: the config's)")
  p.add_argument("--prompts", default=None, metavar="FILE",
                 help="run on this prompts file (.jsonl or one prompt per line) instead of the "
                      "config's suites")
  p.add_argument("--out", default=DEFAULT_OUT,
                 help="folder for the JSON, table and plot (results/ only when you say so)")
  p.add_argument("--name", default=None, help="file stem of the outputs (default: the config's)")
  p.add_argument("--json", action="store_true", help="print the result JSON on stdout at the end")
  p.set_defaults(run=run)


def run(args) -> int:
  from speculax.bench import report
  from speculax.bench.run import run as run_bench
  cfg = overrides.apply(load_config(args.config), args.set).only(args.method)
  if args.model is not None:
    cfg = dataclasses.replace(cfg, target=args.model)
  if args.prompts is not None:
    cfg = dataclasses.replace(cfg, suites=(args.prompts,))
  name = args.name or pathlib.Path(args.config).stem
  announce(args)
  command = " ".join(["speculax bench", *sys.argv[2:]]) if sys.argv[1:2] == ["bench"] else ""
  result = run_bench(cfg, name, out=args.out, command=command or f"speculax bench --config "
                     f"{args.config}", echo=lambda s: print(s, file=sys.stderr, flush=True))
  out = pathlib.Path(args.out) / name
  print(json.dumps(result, default=str) if args.json else report.markdown(result))
  print(f"wrote {out}.json, {out}.md and {out}.png", file=sys.stderr)
  return 0
