"""Every drafter of the framework on SmolLM2-135M, on held-out prompts of two kinds, against
autoregressive decoding in the same process.

Suites: "humaneval" (HumanEval prompts after the first 4, chat-wrapped) and "chat" (the
held-out split of train/prompts.chat_prompts: everyday questions on subjects no training prompt
has). Methods: autoregressive, prompt lookup, layer skip (the SWIFT-style searched set, plain,
with Kangaroo early exit, with VocabTrim; or a set given with --skip), and each trained drafter
found under --drafters-dir (<name>-smollm2: the distilled draft model, Medusa, Hydra++, EAGLE,
EAGLE with training-time test, EAGLE-3; train them with research/train_drafters.py) as trained
(VocabTrim as trained), with the full vocabulary, and
drafting a tree. Each runs greedy and at temperature 1, at batch 1 (prompts one at a time) and
batch 8, exactly N new tokens (EOS off), compile time apart.

Reported per row: tau, acceptance by position, draft tokens checked per step, tokens/s, x AR,
speedup/tau, greedy rows identical to AR's, and at batch 1 where a step's time goes, in units
of a one-token target forward timed alone: the verify forward (timed alone for that many tokens)
and the rest (drafting and the loop's own work; AR's rest is its loop's share, below 0 when the
loop runs a step faster than a lone jitted call). Writes results/bench_drafters.json and .png.

  .venv/bin/python -m speculax.research.bench_drafters [--prompts 3] [--new-tokens 48]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import jax

from speculax.core.sampling import SamplingConfig
from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.config import SpecConfig
from speculax.drafters import registry, vocab_trim
from speculax.models.assets import humaneval_prompts
from speculax.models.load import load
from speculax.research.common import (forward_seconds, machine, plot_tau_speedup, run_prompts,
                                      table)
from speculax.train import prompts as prompt_sources

RESULTS = pathlib.Path("results/bench_drafters.json")
TRAINED = {"draft-model": "distill-smollm2-fkl", "medusa": "medusa-smollm2",
           "hydra": "hydra-smollm2", "eagle": "eagle-smollm2", "eagle-ttt": "eagle-ttt-smollm2",
           "eagle3": "eagle3-smollm2"}
# The tree each kind (registry name) drafts in the "tree" rows: EAGLE-2's dynamic tree for the
# drafters that score a path as they grow it, Medusa's sparse static tree for the heads. Small
# trees: on this CPU a verify forward of 16 tokens costs ~2.6 one-token steps, of 8 ~2.
TREES = {"draft-model": DynamicTree(3, 3, 3), "eagle": DynamicTree(3, 3, 3),
         "medusa": StaticTree.full((3, 2, 1)), "hydra": StaticTree.full((3, 2, 1))}


def suites(model, n: int, batch: int) -> dict[str, list[list[int]]]:
  """suite -> chat-templated prompt ids: max(n, batch) prompts."""
  tok = model.tokenizer
  want = max(n, batch)
  texts = {"humaneval": humaneval_prompts(4 + want)[4:],
           "chat": prompt_sources.chat_prompts("heldout")[:want]}
  return {name: [tok.encode(tok.chat_prompt(t)) for t in ts] for name, ts in texts.items()}


def methods(model, args) -> dict:
  """name -> (drafter, params, k); None = autoregressive."""
  cfg, params = model.config, model.params
  out = {"autoregressive": (None, None, args.k),
         "prompt lookup": (*registry.make("prompt-lookup", params, cfg), args.k)}
  if args.skip:
    skip, _ = registry.make("layer-skip", params, cfg, skip=args.skip)
  else:  # the skip-set search, calibrated on the first 4 HumanEval prompts
    calibration = [model.tokenizer.encode(model.tokenizer.chat_prompt(p))
                   for p in humaneval_prompts(4)]
    skip, _ = registry.make("layer-skip", params, cfg, calibration=calibration, k=args.skip_k)
  name = f"layer skip (skips {cfg.n_layers - len(skip.keep)} of {cfg.n_layers})"
  out[name] = (skip, None, args.skip_k)
  out[f"{name} + exit {args.exit}"] = (dataclasses.replace(skip, exit_threshold=args.exit), None,
                                        args.skip_k)
  order = None
  for kind, folder in TRAINED.items():
    path = args.drafters_dir / folder
    if not path.is_dir():
      print(f"no {kind} at {path}: its rows are left out (research/train_drafters.py --ship)")
      continue
    drafter, dparams = registry.load(path, model)
    order = dparams.get(vocab_trim.IDS, order)
    trim = f", VocabTrim {drafter.vocab_trim}" if drafter.vocab_trim else ""
    ks = tuple(int(x) for x in args.eagle_k.split(",")) if drafter.name == "eagle" else (args.k,)
    for k in ks:
      out[f"{kind} k={k}{trim}"] = (drafter, dparams, k)
    if drafter.vocab_trim:
      out[f"{kind} k={ks[0]}, full vocabulary"] = (
          dataclasses.replace(drafter, vocab_trim=cfg.vocab_size), dparams, ks[0])
    tree = TREES.get(drafter.name)
    if tree is not None:
      out[f"{kind} tree ({tree.n_nodes} nodes){trim}"] = (
          dataclasses.replace(drafter, tree=tree), dparams, args.k)
  if order is not None:  # the recipe corpus's frequency order, shared by the trained drafters
    out[f"{name} + VocabTrim {args.trim}"] = (
        dataclasses.replace(skip, vocab_trim=args.trim), {vocab_trim.IDS: order}, args.skip_k)
  return out


def _checked(drafter, k: int) -> int:
  """Tokens one verify forward scores per sequence: the drafts and the pending token."""
  tree = getattr(drafter, "tree", None)
  return (tree.n_nodes if tree is not None else k) + 1


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--suites", default="humaneval,chat")
  ap.add_argument("--prompts", type=int, default=3, help="prompts per suite at batch 1")
  ap.add_argument("--new-tokens", type=int, default=48)
  ap.add_argument("--batch-sizes", default="1,8")
  ap.add_argument("--sampling", default="greedy,t=1")
  ap.add_argument("-k", type=int, default=4, help="chain length of the trained drafters")
  ap.add_argument("--eagle-k", default="1,2,4", help="chain lengths of the EAGLE drafters")
  ap.add_argument("--forward-tokens", default="1,2,3,4,5,6,8,10,12,16",
                  help="block sizes whose lone forward is timed first (the verify cost curve)")
  ap.add_argument("--skip", type=lambda t: tuple(int(x) for x in t.split(",")), default=(),
                  help="layer skip's set, e.g. 14 (default: search one, as bench_self_speculation)")
  ap.add_argument("--skip-k", type=int, default=5, help="chain length of layer skip")
  ap.add_argument("--exit", type=float, default=0.5, help="layer skip's early-exit threshold")
  ap.add_argument("--trim", type=int, default=16384, help="layer skip's VocabTrim size")
  ap.add_argument("--drafters-dir", type=pathlib.Path, default=pathlib.Path("results/drafters"))
  ap.add_argument("--only", default="", help="comma-separated name prefixes of methods to run")
  ap.add_argument("--results", default=str(RESULTS), help="JSON to write (and a .png beside it)")
  return ap


def bench(model, args, save=lambda rows, forwards: None) -> tuple[list[dict], dict]:
  """Every method of `methods` in every panel (suite x batch x sampling): (rows, lone-forward
  seconds by block size); save(rows, forwards) after each panel."""
  batch_sizes = tuple(int(x) for x in args.batch_sizes.split(","))
  prompt_sets = suites(model, args.prompts, max(batch_sizes))
  prompt_sets = {s: prompt_sets[s] for s in args.suites.split(",")}
  found = methods(model, args)
  if args.only:
    keep = tuple(args.only.split(","))
    found = {n: m for n, m in found.items() if n == "autoregressive" or n.startswith(keep)}
  samplings = {"greedy": SamplingConfig(), "t=1": SamplingConfig(temperature=1.0)}
  forwards = {t: forward_seconds(model, t) for t in  # tokens -> s of a lone forward
              sorted({1, *(int(x) for x in args.forward_tokens.split(","))})}
  print("verify cost, a lone forward of t tokens in one-token forwards: " + ", ".join(
      f"{t}: {f / forwards[1]:.2f}" for t, f in forwards.items()), flush=True)
  rows = []
  for suite, ids in prompt_sets.items():
    for batch in batch_sizes:
      chunk = ids[:args.prompts] if batch == 1 else ids[:batch]
      for temp in args.sampling.split(","):
        base = reference = None
        panel = []
        # AR runs first and again last, and x AR divides by the faster of the two: the machine's
        # speed drifts (AR alone moved 15% between two runs), which must not flatter a drafter.
        for name, (drafter, dparams, k) in [*found.items(),
                                            ("autoregressive, again", found["autoregressive"])]:
          spec = SpecConfig(k=k, max_new_tokens=args.new_tokens, sampling=samplings[temp])
          r = run_prompts(model, chunk, drafter, dparams, spec, batch)
          if drafter is None:
            base = max(base or 0.0, r.tokens_per_s)
          reference = reference or r.tokens
          row = dict(method=name, suite=suite, batch=batch, sampling=temp,
                     panel=f"{suite}, batch {batch}, {temp}", tau=r.tau,
                     acceptance=r.acceptance, drafts_per_step=r.drafts_per_step,
                     tokens_per_s=r.tokens_per_s, compile_s=r.compile_s,
                     same_as_ar=sum(a == b for a, b in zip(r.tokens, reference)),
                     sequences=len(r.tokens))
          if batch == 1:  # where a step goes, in one-token forwards timed alone (AR's row:
            # its step over that forward, the decode loop's own share)
            n = 1 if drafter is None else _checked(drafter, k)
            for m in {1, n} - forwards.keys():
              forwards[m] = forward_seconds(model, m)
            per_step = r.decode_s / r.steps / forwards[1]
            verify = forwards[n] / forwards[1]
            row |= dict(step_cost=per_step, verify_cost=verify, draft_cost=per_step - verify)
          panel.append(row)
          print(f"{suite} b{batch} {temp} {name}: tau {r.tau:.2f}, {r.tokens_per_s:.1f} tok/s, "
                f"x{r.tokens_per_s / base:.2f} (so far)" + (
                    f", same as AR {row['same_as_ar']}/{len(r.tokens)}" if temp == "greedy"
                    else ""), flush=True)
          jax.clear_caches()  # each row compiles its own loops (memory-map limit on long runs)
        for row in panel:
          row |= dict(speedup=row["tokens_per_s"] / base,
                      speedup_per_tau=row["tokens_per_s"] / base / row["tau"])
        rows += panel
        save(rows, forwards)
  return rows, forwards


def main():
  args = parser().parse_args()
  results = pathlib.Path(args.results)
  t0 = time.perf_counter()
  model = load("smollm2-135m")

  def save(rows, forwards):
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(dict(machine=machine(), args=vars(args) | {
        "drafters_dir": str(args.drafters_dir)}, forward_s=forwards, rows=rows), indent=1))

  rows, _ = bench(model, args, save)
  print(f"\nSmolLM2-135M fp32, {args.new_tokens} new tokens (EOS off); batch 1 = {args.prompts} "
        f"prompts one at a time, batch 8 = 8 at once; {machine()}; "
        f"{time.perf_counter() - t0:.0f} s\n")
  acc = lambda a: " ".join(f"{x:.2f}" for x in a[:6]) or "-"
  cost = lambda r: (f"{r['draft_cost']:.2f} + {r['verify_cost']:.2f}" if "step_cost" in r
                    else "-")
  print(table(["suite", "batch", "sampling", "method", "tau", "acceptance by position",
               "drafts/step", "tok/s", "x AR", "speedup/tau", "same as AR",
               "step = rest + verify (fwd)"],
              [[r["suite"], r["batch"], r["sampling"], r["method"], r["tau"],
                acc(r["acceptance"]), r["drafts_per_step"], r["tokens_per_s"], r["speedup"],
                r["speedup_per_tau"],
                f"{r['same_as_ar']}/{r['sequences']}" if r["sampling"] == "greedy" else "-",
                cost(r)] for r in rows]))
  plot_tau_speedup(rows, results.with_suffix(".png"), "SmolLM2-135M",
                   panels=tuple(dict.fromkeys(r["panel"] for r in rows)), key="panel")
  print(f"\nwrote {results} and {results.with_suffix('.png')}")


if __name__ == "__main__":
  main()
