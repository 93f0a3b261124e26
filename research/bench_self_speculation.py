"""Layer-skip self-speculation made cheaper: deeper skip sets, Kangaroo's early exit, VocabTrim
and SWIFT-style switching among skip sets on the fly, on SmolLM2-135M, batch 1.

The skip-set search (drafters/layer_skip_search.py) runs on the first 4 HumanEval prompts; its
chosen set and `--adapt` more from its trace (spread up to 18 of 30 layers skipped) are the
fixed rows and the switching drafter's sets. VocabTrim's order is the target's tokens by
frequency in its own greedy answers to instructions built from standard-library functions
(never HumanEval) and in standard-library code (written to
results/drafters/smollm2-135m-vocab-order.npy). Decoded: HumanEval
prompts after the calibration ones, one at a time, N new tokens (EOS off), greedy; compile time
apart. Writes results/bench_self_speculation.json.

  .venv/bin/python -m speculax.research.bench_self_speculation [--prompts 4] [--new-tokens 64]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import numpy as np

from speculax.decode.config import SpecConfig
from speculax.drafters import registry, vocab_trim
from speculax.drafters.layer_skip import LayerSkip
from speculax.models.assets import humaneval_prompts
from speculax.models.load import load
from speculax.research.common import machine, run_prompts, table, verify_cost
from speculax.train import data

RESULTS = pathlib.Path("results/bench_self_speculation.json")
ORDER = pathlib.Path("results/drafters/smollm2-135m-vocab-order.npy")


def token_order(model, n_prompts: int, new_tokens: int, code_files: int) -> np.ndarray:
  """The target's tokens by frequency in its own greedy answers to stdlib instructions and in
  standard-library code (the training split's first files): the corpus a drafter trains on."""
  tok = model.tokenizer
  ids = [tok.encode(tok.chat_prompt(p)) for p in data.prompt_sets(limit=n_prompts).train]
  answers = data.generate_batched(model.params, model.config, ids, max_new_tokens=new_tokens,
                                  batch_size=8, eos_ids=tok.eos_ids)
  files = data.split_files(data.stdlib_files(), 0.1)[0][:code_files]
  code = [tok.encode(text) for text in data.read_texts(files)]
  print(f"vocab order from {sum(map(len, answers))} generated and {sum(map(len, code))} code "
        f"tokens", flush=True)
  return vocab_trim.frequency_order(answers + code, model.config.vocab_size)


def _methods(model, calibration, order, cost, args):
  """name -> (drafter, params): every searched set plain, then the first (least skipping) with
  each trim size and exit threshold, and the on-the-fly switching among all of them."""
  cfg, params = model.config, model.params
  searched, _ = registry.make("layer-skip", params, cfg, calibration=calibration, k=args.k,
                              adapt=args.adapt)
  skipped = lambda keep: cfg.n_layers - len(keep)
  ids = {vocab_trim.IDS: order}
  methods = {"autoregressive": (None, None)}
  for keep in sorted(searched.keep_sets, key=skipped):
    methods[f"skip {skipped(keep)}"] = (LayerSkip(keep), None)
  best = LayerSkip(searched.keep)
  for n in args.trims:
    methods[f"skip {skipped(best.keep)} + trim {n}"] = (
        dataclasses.replace(best, vocab_trim=n), ids)
  for p in args.exits:
    methods[f"skip {skipped(best.keep)} + exit {p}"] = (
        dataclasses.replace(best, exit_threshold=p), None)
  sets = len(searched.keep_sets)
  methods[f"switching among {sets} sets"] = (searched, None)
  measured = dataclasses.replace(searched, verify_cost=round(cost, 2))
  methods[f"switching among {sets} sets, verify cost {measured.verify_cost}"] = (measured, None)
  methods[f"switching among {sets} sets, verify cost {measured.verify_cost} + trim "
          f"{max(args.trims)}"] = (dataclasses.replace(measured, vocab_trim=max(args.trims)), ids)
  return methods


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--prompts", type=int, default=4, help="HumanEval prompts after the first 4")
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("-k", type=int, default=5)
  ap.add_argument("--exits", type=lambda t: [float(x) for x in t.split(",")], default=[0.2, 0.5],
                  help="early-exit thresholds")
  ap.add_argument("--trims", type=lambda t: [int(x) for x in t.split(",")],
                  default=[4096, 8192, 16384], help="VocabTrim sizes")
  ap.add_argument("--adapt", type=int, default=3, help="extra skip sets (switching, fixed rows)")
  ap.add_argument("--order-prompts", type=int, default=64, help="instructions for the order")
  ap.add_argument("--order-files", type=int, default=300, help="stdlib files for the order")
  args = ap.parse_args()
  t0 = time.perf_counter()
  model = load("smollm2-135m")
  tok = model.tokenizer
  encode = lambda texts: [tok.encode(tok.chat_prompt(p)) for p in texts]
  prompts = encode(humaneval_prompts(4 + args.prompts)[4:])
  order = token_order(model, args.order_prompts, 64, args.order_files)
  ORDER.parent.mkdir(parents=True, exist_ok=True)
  np.save(ORDER, order)
  cost = verify_cost(model, args.k)
  print(f"a {args.k + 1}-token verify forward costs {cost:.2f} one-token forwards", flush=True)
  methods = _methods(model, encode(humaneval_prompts(4)), order, cost, args)
  spec = SpecConfig(k=args.k, max_new_tokens=args.new_tokens)
  rows, base = [], None
  for name, (drafter, dparams) in methods.items():
    r = run_prompts(model, prompts, drafter, dparams, spec)
    tok_s, tau, acc, checked, compile_s = (r.tokens_per_s, r.tau, r.acceptance, r.drafts_per_step,
                                           r.compile_s)
    base = base or tok_s
    rows.append(dict(method=name, tau=tau, acceptance=acc, drafts_per_step=checked,
                     tokens_per_s=tok_s, speedup=tok_s / base, compile_s=compile_s,
                     drafter=str(drafter)))
    print(f"{name}: tau {tau:.2f}, {checked:.2f} drafts/step, {tok_s:.1f} tok/s, "
          f"x{tok_s / base:.2f}", flush=True)
  settings = (f"SmolLM2-135M fp32, batch 1, greedy, {args.new_tokens} new tokens (EOS off), "
              f"k={args.k}, HumanEval prompts 5..{4 + args.prompts} (chat); {machine()}")
  print(f"\n{settings}\n")
  print(table(["method", "tau", "acceptance by position", "drafts/step", "tok/s", "x AR",
               "compile s"],
              [[r["method"], r["tau"], " ".join(f"{a:.2f}" for a in r["acceptance"]) or "-",
                r["drafts_per_step"], r["tokens_per_s"], r["speedup"], r["compile_s"]]
               for r in rows]))
  RESULTS.write_text(json.dumps(dict(settings=settings, machine=machine(), args=vars(args),
                                     verify_cost=cost, rows=rows), indent=1))
  print(f"\nwrote {RESULTS}; total run time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
  main()
