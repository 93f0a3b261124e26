"""How often bf16 decoding parts from float32, and whether speculative decoding stays exact in bf16.

SmolLM2-135M-Instruct, greedy, a fixed number of new tokens (EOS off), on held-out HumanEval and
chat prompts, in three settings:
  - float32: the reference;
  - bf16 storage (`load(..., dtype="bfloat16")`, `--dtype bfloat16`): weights and KV cache
    bf16, activations float32;
  - bf16 compute (`compute_dtype="bfloat16"` too): activations bf16 as well.
For each setting: how many prompts' greedy tokens equal float32's and where the first difference
falls; whether speculative decoding (prompt lookup k = 4, the shipped EAGLE + TTT k = 2) gives
exactly the same setting's autoregressive tokens; and the largest logit gap between a k-token
verify forward and k one-token steps over the same tokens (why bf16 activations are not exact).

  .venv/bin/python -m speculax.research.bf16_agreement [--prompts 16] [--new-tokens 64]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax.numpy as jnp
import numpy as np

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters import registry
from speculax.models import llama
from speculax.models.assets import humaneval_prompts
from speculax.models.config import PRECISIONS
from speculax.models.kvcache import KVCache
from speculax.models.load import load, with_precision
from speculax.research.common import OUT
from speculax.train import prompts as prompt_sources

RESULTS = OUT / "bf16_agreement.json"


def first_difference(a: list[int], b: list[int]) -> int | None:
  """Index of the first differing token (None: identical)."""
  return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
              None if len(a) == len(b) else min(len(a), len(b)))


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> dict:
  firsts = [first_difference(a, b) for a, b in zip(tokens, reference)]
  parted = [f for f in firsts if f is not None]
  return {"identical": len(firsts) - len(parted), "prompts": len(firsts),
          "first_difference": parted}


def verify_gap(model, prompt: list[int], block: list[int]) -> float:
  """max |logits| difference between one forward of `block` after `prompt` and the same tokens
  fed one at a time."""
  cfg, params = model.config, model.params
  p, t = len(prompt), len(block)
  cache = KVCache.init(cfg, 1, p + t)
  _, _, cache = llama.forward_jit(params, cfg, jnp.asarray([prompt]), jnp.arange(p)[None], cache)
  together = llama.forward_jit(params, cfg, jnp.asarray([block]), jnp.arange(p, p + t)[None],
                               cache)[0][0]
  alone = []
  for i, token in enumerate(block):
    logits, _, cache = llama.forward_jit(params, cfg, jnp.asarray([[token]]),
                                         jnp.asarray([[p + i]]), cache)
    alone.append(logits[0, 0])
  return float(jnp.abs(jnp.stack(alone) - together).max())


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--prompts", type=int, default=16, help="prompts per suite")
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("--batch", type=int, default=8, help="prompts decoded together")
  ap.add_argument("--eagle", type=pathlib.Path, default=pathlib.Path(
      "results/drafters/eagle-ttt-smollm2"))
  ap.add_argument("--results", type=pathlib.Path, default=RESULTS)
  args = ap.parse_args()
  t0 = time.perf_counter()
  base = load("smollm2-135m")
  tok = base.tokenizer
  texts = (humaneval_prompts(4 + args.prompts)[4:]
           + prompt_sources.chat_prompts("heldout")[:args.prompts])
  prompts = [tok.encode(tok.chat_prompt(x)) for x in texts]
  batches = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]
  gen = GenerateConfig(max_new_tokens=args.new_tokens)  # EOS off: every prompt runs to the end

  def decode(model, drafter=None, dparams=None, k=1):
    tokens, seconds = [], 0.0
    for chunk in batches:
      if drafter is None:
        out = generate(model.params, model.config, chunk, gen, warmup=True)
      else:
        out = speculative_generate(model.params, model.config, chunk, drafter,
                                   SpecConfig(k=k, max_new_tokens=args.new_tokens),
                                   drafter_params=dparams, warmup=True)
      tokens += out.tokens
      seconds += out.decode_s
    return tokens, len(prompts) * args.new_tokens / seconds

  rows, reference = [], None
  for name, runtime in PRECISIONS.items():
    model = with_precision(base, name)
    ar, tps = decode(model)
    reference = reference or ar
    eagle = registry.load(args.eagle, model)
    specs = {"prompt lookup k=4": (*registry.make("prompt-lookup", model.params, model.config), 4),
             "eagle-ttt k=2": (eagle.drafter, eagle.params, 2)}
    row = {"setting": name, "runtime": runtime, "ar_tokens_per_s": tps,
           "vs_float32": agreement(ar, reference),
           "verify_gap": verify_gap(model, prompts[0], ar[0][:8]), "speculative": {}}
    for method, (drafter, dparams, k) in specs.items():
      tokens, _ = decode(model, drafter, dparams, k)
      row["speculative"][method] = agreement(tokens, ar)
    rows.append(row)
    print(f"{name}: {json.dumps(row)}", flush=True)

  results = {"machine": machine(), "date": time.strftime("%Y-%m-%d"),
             "command": "python -m speculax.research.bf16_agreement "
                        f"--prompts {args.prompts} --new-tokens {args.new_tokens}",
             "prompts": len(prompts), "new_tokens": args.new_tokens, "batch": args.batch,
             "rows": rows,
             "seconds": time.perf_counter() - t0}
  args.results.parent.mkdir(parents=True, exist_ok=True)
  args.results.write_text(json.dumps(results, indent=1))
  print(markdown(results))


def markdown(results: dict) -> str:
  """The README table from the JSON."""
  def agree(a):
    firsts = a["first_difference"]
    where = f" (first difference at token {int(np.median(firsts))} median)" if firsts else ""
    return f"{a['identical']}/{a['prompts']}{where}"
  header = ["setting", "greedy = float32 greedy", "max logit gap, 8-token verify vs steps",
            *results["rows"][0]["speculative"], f"AR tok/s (batch {results['batch']})"]
  rows = [[r["setting"], agree(r["vs_float32"]), f"{r['verify_gap']:.2g}",
           *(agree(a) for a in r["speculative"].values()), r["ar_tokens_per_s"]]
          for r in results["rows"]]
  return (f"{results['prompts']} prompts x {results['new_tokens']} greedy tokens; speculative "
          f"columns: prompts whose speculative tokens equal the same setting's autoregressive "
          f"ones. {results['machine']}, {results['date']}, `{results['command']}`\n\n"
          + table(header, rows))


if __name__ == "__main__":
  main()
