"""Trees vs chains: each tree-capable drafter as a chain, a static tree and a dynamic tree, plus
Token Recycling and prompt lookup, on SmolLM2-135M, greedy and at temperature 1.

Prompts are HumanEval prompts after the first 4 (those calibrate the layer-skip search), decoded
one at a time (batch 1), exactly N new tokens (EOS off); compile time is measured apart. Reports
tau, acceptance by depth, tokens/s, speedup over our autoregressive decoding at the same
temperature, speedup/tau and the drafter's extra memory (its own params and state). Writes
results/bench_trees.json and results/bench_trees.png (tau against speedup).

  .venv/bin/python -m speculax.research.bench_trees [--prompts 8] [--new-tokens 64] [-k 5]
"""
from __future__ import annotations

import argparse
import json
import pathlib

import jax

from speculax.core.sampling import SamplingConfig
from speculax.core.trees import DynamicTree
from speculax.decode.config import SpecConfig
from speculax.drafters import registry
from speculax.drafters.token_recycling import DEFAULT_TREE
from speculax.models.assets import humaneval_prompts
from speculax.models.load import load
from speculax.research.common import machine, plot_tau_speedup, run_prompts, table

RESULTS = pathlib.Path("results/bench_trees.json")
# Both trees reach depth k = 5 like the chains; the static one holds the rank-0 chain, so under
# greedy decoding it keeps at least what the chain keeps.
STATIC = DEFAULT_TREE  # 18 nodes, 4-6-4-3-1 per level (drafters/token_recycling.py)
DYNAMIC = DynamicTree(width=4, depth=5, children=4)  # 4 x 5 = 20 nodes


def _nbytes(tree) -> int:
  return sum(x.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "nbytes"))


def _methods(model, args):
  """name -> (drafter, params, extra memory bytes); None drafter = autoregressive."""
  cfg, params = model.config, model.params
  skip = tuple(int(x) for x in args.skip_layers.split(","))
  methods = {"autoregressive": (None, None, 0),
             "prompt-lookup chain": (*registry.make("prompt-lookup", params, cfg), 0)}
  tr = registry.make("token-recycling", params, cfg)[0]
  for start in ("cold", "hot"):  # hot: the matrix carries over from prompt to prompt (the paper)
    methods[f"token-recycling static {tr.tree.n_nodes} {start}"] = (
        tr, None, cfg.vocab_size * tr.tree.max_children * 4)
  for tree_name, tree in [("chain", None), (f"static {STATIC.n_nodes}", STATIC),
                          (f"dynamic {DYNAMIC.n_nodes}", DYNAMIC)]:
    d, _ = registry.make("layer-skip", params, cfg, k=args.k, skip=skip, tree=tree)
    methods[f"layer-skip {tree_name}"] = (d, None, 0)
    d, dp = registry.make("draft-model", params, cfg, draft_layers=args.draft_layers, tree=tree)
    methods[f"draft-model {tree_name}"] = (d, dp, _nbytes(dp))
  return methods


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--prompts", type=int, default=8, help="HumanEval prompts after the first 4")
  ap.add_argument("--new-tokens", type=int, default=64)
  ap.add_argument("-k", type=int, default=5, help="chain drafters' draft length")
  ap.add_argument("--skip-layers", default="14", help="layer-skip drafter's skipped layers")
  ap.add_argument("--draft-layers", type=int, default=4,
                  help="draft model: the target's first layers (an untrained cut)")
  args = ap.parse_args()

  model = load("smollm2-135m")
  tok = model.tokenizer
  prompts = [tok.encode(tok.chat_prompt(p)) for p in humaneval_prompts(4 + args.prompts)[4:]]
  methods = _methods(model, args)
  rows = []
  for temp, sampling in (("greedy", SamplingConfig()), ("t=1", SamplingConfig(temperature=1.0))):
    base = None
    for name, (drafter, dparams, memory) in methods.items():
      r = run_prompts(model, prompts, drafter, dparams, SpecConfig(
          k=args.k, max_new_tokens=args.new_tokens, sampling=sampling), hot=name.endswith(" hot"))
      tok_s, tau, acceptance, compile_s = r.tokens_per_s, r.tau, r.acceptance, r.compile_s
      base = base or tok_s
      rows.append(dict(method=name, sampling=temp, tau=tau, acceptance=acceptance,
                       tokens_per_s=tok_s, speedup=tok_s / base, speedup_per_tau=tok_s / base / tau,
                       memory_mb=memory / 2 ** 20, compile_s=compile_s))
      print(f"{temp} {name}: tau {tau:.2f}, {tok_s:.1f} tok/s, x{tok_s / base:.2f}", flush=True)
  print(f"\nSmolLM2-135M fp32, batch 1, {args.new_tokens} new tokens (EOS off), HumanEval prompts "
        f"5..{4 + args.prompts} (chat); chains k={args.k}; layer-skip skips {args.skip_layers}; "
        f"draft model = the target's first {args.draft_layers} layers, untrained; static tree "
        f"{STATIC.levels} per level, dynamic tree {DYNAMIC}; token recycling template "
        f"{DEFAULT_TREE.levels} per level; {machine()}\n")
  acc = lambda a: " ".join(f"{x:.2f}" for x in a) or "-"
  print(table(["sampling", "method", "tau", "acceptance by depth", "tok/s", "x AR", "speedup/tau",
               "drafter MB", "compile s"],
              [[r["sampling"], r["method"], r["tau"], acc(r["acceptance"]), r["tokens_per_s"],
                r["speedup"], r["speedup_per_tau"], r["memory_mb"], r["compile_s"]] for r in rows]))
  RESULTS.parent.mkdir(parents=True, exist_ok=True)
  RESULTS.write_text(json.dumps(dict(machine=machine(), args=vars(args), rows=rows), indent=1))
  plot_tau_speedup(rows, RESULTS.with_suffix(".png"), "SmolLM2-135M")
  print(f"\nwrote {RESULTS} and {RESULTS.with_suffix('.png')}")


if __name__ == "__main__":
  main()
