"""Layer-skip self-speculation made cheaper: deeper skip sets, Kangaroo's early exit, VocabTrim
and SWIFT-style switching among skip sets on the fly, on SmolLM2-135M, batch 1.

The skip-set search (drafters/layer_skip_search.py) runs on the first 4 HumanEval prompts; its
chosen set and `--adapt` more from its trace (spread up to 18 of 30 layers skipped) are the
fixed rows and the switching drafter's sets. VocabTrim's order is the target's tokens by
frequency in its own greedy answers to instructions built from standard-library functions
(never HumanEval) and in standard-library code (written beside the results; the shipped
results/drafters/smollm2-135m-vocab-order.npy came from this). Decoded through speculax.bench:
HumanEval prompts after the calibration ones, one at a time, N new tokens (EOS off), greedy,
against autoregressive decoding in the same run; compile time apart. Writes
<out>/bench_self_speculation.json, .md and .png.

  .venv/bin/python -m speculax.research.bench_self_speculation [--prompts 4] [--out runs/bench]
"""
from __future__ import annotations

import argparse
import pathlib

import numpy as np

from speculax.bench import methods as bench_methods
from speculax.bench.config import BenchConfig, method
from speculax.bench.report import markdown
from speculax.bench.run import run
from speculax.drafters import registry, vocab_trim
from speculax.models.load import load
from speculax.research.common import verify_cost
from speculax.train import data


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


def methods(model, order_file: pathlib.Path, cost: float, args) -> tuple:
  """Every searched set plain, then the first (least skipping) with each trim size and exit
  threshold, and the on-the-fly switching among all of them."""
  cfg = model.config
  found = bench_methods.searched(model, args.k)
  searched, _ = registry.make("layer-skip", model.params, cfg, searched=found, k=args.k,
                              adapt=args.adapt)
  skipped = lambda keep: tuple(sorted(set(range(cfg.n_layers)) - set(keep)))
  best = skipped(searched.keep)
  trim = dict(vocab_ids=str(order_file))
  rows = [method(f"skip {len(skipped(keep))}", "layer-skip", k=args.k, skip=skipped(keep))
          for keep in sorted(searched.keep_sets, key=lambda keep: len(skipped(keep)))]
  rows += [method(f"skip {len(best)} + trim {n}", "layer-skip", k=args.k, skip=best,
                  vocab_trim=n, **trim) for n in args.trims]
  rows += [method(f"skip {len(best)} + exit {p}", "layer-skip", k=args.k, skip=best,
                  exit_threshold=p) for p in args.exits]
  sets, cost = len(searched.keep_sets), round(cost, 2)
  switching = f"switching among {sets} sets"
  rows += [method(switching, "layer-skip", k=args.k, adapt=args.adapt),
           method(f"{switching}, verify cost {cost}", "layer-skip", k=args.k, adapt=args.adapt,
                  set={"verify_cost": cost}),
           method(f"{switching}, verify cost {cost} + trim {max(args.trims)}", "layer-skip",
                  k=args.k, adapt=args.adapt, vocab_trim=max(args.trims), **trim,
                  set={"verify_cost": cost})]
  return tuple(rows)


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
  ap.add_argument("--out", default="runs/bench", help="folder for the JSON, table and plot")
  args = ap.parse_args()
  model = load("smollm2-135m")
  order_file = pathlib.Path(args.out) / "smollm2-135m-vocab-order.npy"
  order_file.parent.mkdir(parents=True, exist_ok=True)
  np.save(order_file, token_order(model, args.order_prompts, 64, args.order_files))
  cost = verify_cost(model, args.k)
  print(f"a {args.k + 1}-token verify forward costs {cost:.2f} one-token forwards", flush=True)
  cfg = BenchConfig(methods=methods(model, order_file, cost, args), prompts=args.prompts,
                    new_tokens=args.new_tokens)
  result = run(cfg, "bench_self_speculation", model=model, out=args.out,
               command="python -m speculax.research.bench_self_speculation " + " ".join(
                   f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()))
  print(markdown(result))


if __name__ == "__main__":
  main()
