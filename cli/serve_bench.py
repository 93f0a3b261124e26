"""`speculax serve-bench`: serve a stream of prompts from a file in batches, printing the
acceptance curve as it goes; `--online` adapts the draft model to the traffic while serving.

The file: JSON lines {"prompt": text, "chat": true, "phase": name} ("chat" and "phase" optional:
chat prompts are wrapped in the model's chat template; a phase labels a part of the stream), or
any other text file, one chat prompt per non-empty line.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np

from speculax.bench.suites import read_prompts
from speculax.cli.args import (
  add_drafter,
  add_runtime,
  announce,
  build_drafter,
  check_drafter_options,
  count,
  drafter_options,
  ints,
  runtime_loader,
)
from speculax.core.sampling import SamplingConfig
from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput
from speculax.serve.loop import BatchReport, serve
from speculax.serve.online import OnlineConfig, OnlineLearner
from speculax.serve.replay import POLICIES
from speculax.train.losses import DIVERGENCES

BARS = "▁▂▃▄▅▆▇█"


def add_parser(sub) -> None:
  p = sub.add_parser(
      "serve-bench", help="serve a stream of prompts, print the acceptance curve",
      description="Serve the prompts of a file in arrival order, batch by batch, with speculative "
                  "decoding, printing each batch's acceptance and a running curve. --online keeps "
                  "distilling the draft model on the target laws verification computed "
                  "(Online Speculative Decoding; draft-model only: token-recycling adapts by "
                  "carrying its matrix from batch to batch); outputs stay exactly the target's.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("prompts", help="a .jsonl stream ({\"prompt\", \"chat\", \"phase\"} per line) "
                                 "or a text file with one chat prompt per line")
  p.add_argument("--model", default="smollm2-135m", help="target: preset, .gguf or HF folder")
  add_drafter(p, default="draft-model", allow_none=False, k=4)
  add_runtime(p)
  p.add_argument("--batch-size", type=count(1), default=4, help="requests decoded together")
  p.add_argument("--max-new-tokens", type=count(1), default=64)
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--seed", type=count(0), default=0)
  p.add_argument("--limit", type=count(0), default=0,
                 help="serve only the first N prompts (0 = all)")
  p.add_argument("--goodput", action="store_true",
                 help="goodput-driven draft length (SmartSpec): each step drafts the 0..k that "
                      "promises the most tokens/s, from step costs calibrated on the first "
                      "batch of each size")
  p.add_argument("--carry-estimate", action="store_true",
                 help="goodput: each batch starts from the acceptance estimate the last ended "
                      "with, not from the prior")
  p.add_argument("--answer-bins", default="",
                 help="goodput: tokens into an answer where its acceptance estimate moves to the "
                      "next stretch, e.g. 16,32 (Goodput.answer_bins; default: one estimate)")
  p.add_argument("--continuous", action="store_true",
                 help="continuous batching: each finished request's row is refilled with the "
                      "next, and a line reports each --batch-size finished requests")
  p.add_argument("--online", action="store_true", help="adapt the draft model while serving")
  p.add_argument("--update-every", type=count(1), default=8, help="online: requests between rounds")
  p.add_argument("--min-positions", type=count(1), default=32,
                 help="online: recorded positions the buffer needs before a round")
  p.add_argument("--steps", type=count(1), default=8, help="online: optimizer updates per round")
  p.add_argument("--train-batch", type=count(1), default=4, help="online: buffer rows per update")
  p.add_argument("--lr", type=float, default=1e-3, help="online: constant learning rate")
  p.add_argument("--divergence", default="fkl", choices=(*DIVERGENCES, "ce"),
                 help="online: distillation divergence")
  p.add_argument("--buffer-size", type=count(1), default=64, help="online: replay rows kept")
  p.add_argument("--buffer-policy", default="fifo", choices=POLICIES)
  p.add_argument("--seq-len", type=count(2), default=128, help="online: tokens kept per replay row")
  p.add_argument("--all-positions", action="store_true",
                 help="online: record every emitted token, not only rejected drafts")
  p.add_argument("--heldout-every", type=count(0), default=8,
                 help="online: every n-th request goes to the rollback check's held-out slice "
                      "(0: no rollback)")
  p.add_argument("--json", action="store_true",
                 help="print the per-batch rows and the totals as one JSON object at the end")
  p.add_argument("--checkpoint", default=None, metavar="DIR",
                 help="online: checkpoint each round here; an existing one is resumed")
  p.set_defaults(run=run)


def curve(values, width: int = 40) -> str:
  """A one-line bar chart of the latest `width` values >= 0, the tallest bar at their max."""
  values = np.asarray(values[-width:], float)
  top = max(values.max(initial=0.0), 1e-9)
  return "".join(BARS[int(np.clip(v / top, 0, 1) * (len(BARS) - 1) + 0.5)] for v in values)


def stream_rows(model, items, drafter, dparams, spec: SpecConfig, batch_size: int,
                learner: OnlineLearner | None = None, label: str = "", echo=print,
                carry_estimate: bool = False, continuous: bool = False) -> list[dict]:
  """Serves items (from bench.suites.read_prompts) and returns one row per batch; echo prints a line per batch
  with the running acceptance curve (None: silent)."""
  tok = model.tokenizer
  requests = [tok.encode(tok.chat_prompt(x["prompt"]) if x["chat"] else x["prompt"])
              for x in items]
  rows, t0 = [], time.perf_counter()
  for n, report in enumerate(serve(model.params, model.config, requests, drafter, spec, dparams,
                                   batch_size, learner, carry_estimate=carry_estimate,
                                   continuous=continuous)):
    first = min(s.index for s in report.served)
    rows.append(_row(n, report, items[first]["phase"]))
    if echo is not None:
      echo(_line(label, rows, report, time.perf_counter() - t0))
  return rows


def _row(n: int, report: BatchReport, phase: str) -> dict:
  return dict(batch=n, phase=phase, requests=[s.index for s in report.served],
              errors=[s.error for s in report.served if s.error], acceptance=report.acceptance,
              tau=report.tau, tokens_per_s=report.tokens_per_s if report.new_tokens else 0.0,
              accepted_at=np.asarray(report.accepted_at).tolist(), update=report.update,
              k_steps=None if report.k_steps is None else report.k_steps.tolist())


def _line(label: str, rows, report: BatchReport, elapsed: float) -> str:
  acc = [r["acceptance"] for r in rows if np.isfinite(r["acceptance"])]
  text = (f"{label}batch {rows[-1]['batch']:3d} {rows[-1]['phase'][:8]:8s} acceptance "
          f"{report.acceptance:.3f} tau {report.tau:.2f} {rows[-1]['tokens_per_s']:6.1f} tok/s "
          f"|{curve(acc)}| (top {max(acc, default=0.0):.3f}) {elapsed:.0f}s"
          + ("" if report.k_steps is None else
             f" k'=0..{len(report.k_steps) - 1}: {'/'.join(map(str, report.k_steps))} steps"))
  if report.update is not None:
    u = report.update
    text += (f"\n  round {u['round']}: loss {u['loss']:.3f}, held-out acceptance "
             f"{u['heldout_before']:.3f} -> {u['heldout_after']:.3f} ({u['seconds']:.1f} s)"
             + (" ROLLED BACK" if u["rolled_back"] else ""))
  for error in rows[-1]["errors"]:
    text += f"\n  {error}"
  return text


def run(args) -> int:
  items = read_prompts(args.prompts)[:args.limit or None]
  if args.online and args.drafter != "draft-model":
    raise ValueError(f"--online trains a draft model (--drafter draft-model), not {args.drafter}")
  online = None
  if args.online:  # checked before the model load
    online = OnlineConfig(divergence=args.divergence, update_every=args.update_every,
                          min_positions=args.min_positions,
                          steps=args.steps, batch_size=args.train_batch, learning_rate=args.lr,
                          buffer_size=args.buffer_size, buffer_policy=args.buffer_policy,
                          seq_len=args.seq_len, all_positions=args.all_positions,
                          heldout_every=args.heldout_every, seed=args.seed)
  if args.continuous and args.carry_estimate:
    raise ValueError("--carry-estimate is for fixed batches: with --continuous one loop state "
                     "serves the stream, and its goodput estimate carries already")
  bins = ints(args.answer_bins, "--answer-bins")
  if bins and not args.goodput:
    raise ValueError(f"--answer-bins {args.answer_bins} splits goodput's estimate; add --goodput")
  spec = SpecConfig(k=args.k, max_new_tokens=args.max_new_tokens,
                    sampling=SamplingConfig(args.temperature), prompt_bucket=128,
                    goodput=Goodput(answer_bins=bins) if args.goodput else None)
  options, fields = drafter_options(args)
  check_drafter_options(args.drafter, options, fields)
  load = runtime_loader(args)
  model = load(args.model)
  announce(args)
  drafter, dparams = build_drafter(args.drafter, model, load, options, args.k, fields)
  learner = None if online is None else OnlineLearner(dparams, drafter.config, online,
                                                      args.checkpoint)
  if learner is not None and learner.rounds:
    print(f"resumed from {args.checkpoint}: {learner.rounds} rounds, {learner.requests} "
          f"requests seen", file=sys.stderr)
  print(f"serving {len(items)} prompts, batch {args.batch_size}, drafter {args.drafter}"
        f"{' (online)' if learner else ''} on {jax.devices()[0].platform}", file=sys.stderr)
  # With --json the batch lines go to stderr and stdout holds the one JSON object.
  rows = stream_rows(model, items, drafter, dparams, spec, args.batch_size, learner,
                     echo=lambda s: print(s, flush=True, file=sys.stderr if args.json else None),
                     carry_estimate=args.carry_estimate, continuous=args.continuous)
  acc = [r["acceptance"] for r in rows if np.isfinite(r["acceptance"])] or [np.nan]
  totals = dict(prompts=len(items), batches=len(rows), mean_acceptance=float(np.mean(acc)),
                first_acceptance=acc[0], last_acceptance=acc[-1],
                rounds=learner.rounds if learner else 0,
                rolled_back=learner.rollbacks if learner else 0)
  if args.json:
    print(json.dumps(dict(drafter=args.drafter, rows=rows, **totals), default=_jsonable))
    return 0
  print(f"--- {len(items)} prompts in {len(rows)} batches: mean acceptance {np.mean(acc):.3f} "
        f"(first batch {acc[0]:.3f}, last {acc[-1]:.3f})"
        + (f"; {learner.rounds} update rounds, {learner.rollbacks} rolled back" if learner
           else ""))
  return 0


def _jsonable(x):
  """numpy scalars in the rows as Python numbers (NaN stays NaN: JSON's own extension)."""
  return x.item() if hasattr(x, "item") else str(x)
