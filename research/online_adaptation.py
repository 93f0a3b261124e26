"""Online Speculative Decoding on a stream whose domain shifts: code, then chat, then code again.

The stream (written to <out>/online_stream.jsonl, which `speculax serve-bench` also serves):
  1. code: instructions about Python standard-library functions (write / explain / continue),
  2. chat: everyday questions on cooking, travel and gardening, answered by the target,
  3. code again, from other stdlib files.
Each method serves the same stream in the same batches with SmolLM2-135M as the target:
  (a) frozen: a draft model cut from the target's layers and warmed up offline (`--warm-steps`
      updates of the distillation trainer on raw stdlib code, as OSD starts from a distilled
      general draft), never updated while serving;
  (b) online: the same draft, distilled between batches on the target laws that verification
      recorded (replay buffer, held-out rollback check);
  (c) Token Recycling, hot: its adjacency matrix carried from batch to batch (train-free).
Autoregressive decoding of each phase's first batches gives the speedup baseline. Prints a
table per phase (acceptance over the phase and at its end, tau, tok/s, speedup) and writes
<out>/online_adaptation.json and .png (acceptance over the stream, phases shaded).

  .venv/bin/python -m speculax.research.online_adaptation [--phase-requests 24] [--new-tokens 48]
"""
from __future__ import annotations

import argparse
import itertools
import json
import pathlib

import jax
import numpy as np

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.bench.suites import read_prompts
from speculax.cli.serve_bench import stream_rows
from speculax.core.sampling import SamplingConfig
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models.derive import truncated
from speculax.models.load import load
from speculax.research.common import add_target_and_out
from speculax.serve.online import OnlineConfig, OnlineLearner
from speculax.train.data import function_prompts, split_files, stdlib_files
from speculax.train.distill import DistillConfig
from speculax.train.experiment import DataConfig, DistillExperiment, run
from speculax.train.optim import OptimConfig
from speculax.train.prompts import CHAT_ASKS, CHAT_SUBJECTS

# The stream's everyday questions: the first subjects and asks of the self-distillation chat set.
TOPICS, ASKS = CHAT_SUBJECTS[:12], CHAT_ASKS[:4]


def build_stream(n: int) -> list[dict]:
  """n code prompts, n chat questions, n code prompts from other files."""
  train_files, other_files = split_files(stdlib_files(), 0.5, seed=1)
  code = lambda files: [p for _, p in itertools.islice(function_prompts(files, max_chars=600), n)]
  chat = [a.format(t) for a, t in itertools.islice(
      ((a, t) for t in TOPICS for a in ASKS), n)]
  phases = [("code", code(train_files)), ("chat", chat), ("code again", code(other_files))]
  return [{"prompt": p, "chat": True, "phase": name} for name, ps in phases for p in ps]


def warm_draft(model, layers, steps: int, folder: pathlib.Path):
  """The draft cut from `layers`, after `steps` offline fkl updates on raw stdlib code (cached
  under `folder`, so a rerun reuses it): (config, params, held-out 1 - TV)."""
  if steps == 0:
    return (*truncated(model.params, model.config, layers), float("nan"))
  exp = DistillExperiment(
      name=f"warm-{'-'.join(map(str, layers))}", draft_layers=layers,
      out_dir=str(folder),
      data=DataConfig(files=60, seq_len=128, rows=160, heldout_rows=16, top_k=32),
      distill=DistillConfig(batch_size=4, optim=OptimConfig(
          learning_rate=1e-3, warmup_steps=steps // 10, total_steps=steps)),
      checkpoint_every=steps, eval_every=steps)
  result = run(exp, model=model)
  return result["draft_config"], result["state"].params, result["heldout_acceptance_after"]


def ar_speed(model, items, spec: SpecConfig, batch: int, batches: int) -> dict[str, float]:
  """phase -> autoregressive tokens/s over the phase's first `batches` batches."""
  tok = model.tokenizer
  gen = GenerateConfig(max_new_tokens=spec.max_new_tokens, sampling=spec.sampling,
                       prompt_bucket=spec.prompt_bucket)
  out = {}
  for phase in dict.fromkeys(x["phase"] for x in items):
    prompts = [tok.encode(tok.chat_prompt(x["prompt"])) for x in items if x["phase"] == phase]
    tokens = seconds = 0.0
    for i in range(0, batch * batches, batch):
      r = generate(model.params, model.config, prompts[i:i + batch], gen, jax.random.key(i),
                   warmup=True)
      tokens, seconds = tokens + r.new_tokens, seconds + r.wall_s
    out[phase] = tokens / seconds
  return out


def summarize(rows, ar, tail: int) -> list[dict]:
  """Per method and phase: mean acceptance, acceptance of the phase's last `tail` batches, tau,
  tokens/s, speedup over autoregressive."""
  out = []
  for method, batches in rows.items():
    for phase in dict.fromkeys(r["phase"] for r in batches):
      part = [r for r in batches if r["phase"] == phase]
      speed = float(np.mean([r["tokens_per_s"] for r in part]))
      out.append(dict(method=method, phase=phase,
                      acceptance=float(np.mean([r["acceptance"] for r in part])),
                      end_acceptance=float(np.mean([r["acceptance"] for r in part[-tail:]])),
                      tau=float(np.mean([r["tau"] for r in part])), tokens_per_s=speed,
                      speedup=speed / ar[phase]))
  return out


def plot(rows, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(9, 4))
  first = next(iter(rows.values()))
  x = [r["requests"][-1] + 1 for r in first]
  for lo, hi, phase in _spans(first):
    ax.axvspan(lo, hi, alpha=0.08 if phase.startswith("code") else 0.2, color="gray")
    ax.text((lo + hi) / 2, 1.01, phase, ha="center", va="bottom",
            transform=ax.get_xaxis_transform(), fontsize=9)
  for method, batches in rows.items():
    ax.plot(x, [r["acceptance"] for r in batches], marker="o", ms=3, label=method)
    for r, xi in zip(batches, x):
      if r["update"] is not None and r["update"]["rolled_back"]:
        ax.plot(xi, r["acceptance"], "kx")
  ax.set(xlabel="requests served", ylabel="acceptance per batch ((tau - 1) / depth)", ylim=(0, None))
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _spans(batches):
  """(first request, last request + 1, phase) per phase."""
  spans = []
  for r in batches:
    lo, hi = r["requests"][0], r["requests"][-1] + 1
    if spans and spans[-1][2] == r["phase"]:
      spans[-1] = (spans[-1][0], hi, r["phase"])
    else:
      spans.append((lo, hi, r["phase"]))
  return spans


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--phase-requests", type=int, default=24, help="requests per phase")
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--new-tokens", type=int, default=48)
  ap.add_argument("-k", type=int, default=4)
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--draft-layers", default="0,10,20,29", help="target layers the draft keeps")
  ap.add_argument("--warm-steps", type=int, default=40,
                  help="offline distillation updates before serving (0: the raw cut)")
  ap.add_argument("--update-every", type=int, default=8)
  ap.add_argument("--steps", type=int, default=8, help="updates per round")
  ap.add_argument("--lr", type=float, default=1e-3)
  ap.add_argument("--divergence", default="fkl")
  ap.add_argument("--seq-len", type=int, default=128)
  ap.add_argument("--all-positions", action="store_true")
  ap.add_argument("--ar-batches", type=int, default=1, help="AR baseline batches per phase")
  add_target_and_out(ap)
  args = ap.parse_args(argv)
  results, stream = args.out / "online_adaptation.json", args.out / "online_stream.jsonl"

  model = load(args.model)
  stream.parent.mkdir(parents=True, exist_ok=True)
  stream.write_text("".join(json.dumps(x) + "\n" for x in build_stream(args.phase_requests)))
  items = read_prompts(stream)
  spec = SpecConfig(k=args.k, max_new_tokens=args.new_tokens, prompt_bucket=128,
                    sampling=SamplingConfig(args.temperature))
  layers = tuple(int(x) for x in args.draft_layers.split(","))
  dcfg, dparams, warm_acc = warm_draft(model, layers, args.warm_steps, args.out / "warm")
  online = OnlineConfig(divergence=args.divergence, update_every=args.update_every,
                        steps=args.steps, learning_rate=args.lr, seq_len=args.seq_len,
                        all_positions=args.all_positions)
  methods = {"frozen draft": (DraftModel(dcfg), dparams, None),
             "online draft": (DraftModel(dcfg), None, OnlineLearner(dparams, dcfg, online)),
             "token recycling (hot)": (TokenRecycling(), None, None)}
  rows = {}
  for name, (drafter, params, learner) in methods.items():
    rows[name] = stream_rows(model, items, drafter, params, spec, args.batch, learner,
                             label=f"[{name}] ")
  ar = ar_speed(model, items, spec, args.batch, args.ar_batches)
  tail = max(1, args.update_every // args.batch)
  summary = summarize(rows, ar, tail)
  learner = methods["online draft"][2]
  print(f"\n{args.model} target, draft = layers {layers} of it, warmed {args.warm_steps} "
        f"updates offline (held-out 1 - TV {warm_acc:.3f}); {len(items)} requests in "
        f"batches of {args.batch}, {args.new_tokens} new tokens, k={args.k}, temperature "
        f"{args.temperature}; online: {args.divergence}, {args.steps} updates (lr {args.lr}) "
        f"every {args.update_every} requests, {learner.rounds} rounds, {learner.rollbacks} "
        f"rolled back; {machine()}\n")
  print(table(["method", "phase", "acceptance", f"at phase end (last {tail} batches)", "tau",
               "tok/s", "x AR"],
              [[r["method"], r["phase"], r["acceptance"], r["end_acceptance"], r["tau"],
                r["tokens_per_s"], r["speedup"]] for r in summary]))
  results.write_text(json.dumps(dict(machine=machine(), args=vars(args), ar_tokens_per_s=ar,
                                     warm_heldout_acceptance=warm_acc,
                                     summary=summary, batches=rows), indent=1, default=str))
  plot(rows, results.with_suffix(".png"))
  print(f"\nwrote {results}, {results.with_suffix('.png')} and {stream}")


if __name__ == "__main__":
  main()
