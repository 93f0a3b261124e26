"""Every drafter of the framework on SmolLM2-135M: train-free, a separate draft model, Medusa,
Hydra (and Hydra++), EAGLE (chain, EAGLE-2 dynamic tree), EAGLE-3, with and without SpecDec++
adaptive draft length.

The head drafters first train here (self-distillation on cached target features of stdlib code,
the same small budget each: `--train-steps` updates of `--batch` rows of `--seq-len` tokens;
`runs/bench_drafters/<name>` keeps them, so a rerun only decodes). Then every method decodes
held-out HumanEval prompts (those after the first 4, which calibrate nothing here but keep the
prompts apart from the other benches' calibration), greedy and at temperature 1, at batch 1 and
batch 8, exactly N new tokens (EOS off). Reports tau, acceptance by position, draft tokens the
target checked per step (adaptive length drafts fewer than k), tokens/s, speedup
over our autoregressive decoding at the same batch and temperature, speedup/tau, the drafter's
parameter count and its training cost. Writes results/bench_drafters.json and .png.

  .venv/bin/python -m speculax.research.bench_drafters [--train-steps 60] [--prompts 8] [--new-tokens 48]
  # a subset, e.g. adaptive length against fixed k across stop thresholds:
  .venv/bin/python -m speculax.research.bench_drafters --drafters eagle3 --eagle3-k 1,2,4 \
      --stop-thresholds 0.3,0.5,0.7 --results results/bench_adaptive.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import jax

from speculax.core.sampling import SamplingConfig
from speculax.core.trees import DynamicTree
from speculax.decode.config import SpecConfig
from speculax.drafters import registry
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.medusa import Medusa
from speculax.models.assets import humaneval_prompts
from speculax.models.load import load
from speculax.research.common import machine, plot_tau_speedup, run_prompts, table
from speculax.train.experiment import DataConfig, DistillExperiment, run
from speculax.train.heads import HeadsConfig
from speculax.train.optim import OptimConfig

RESULTS = pathlib.Path("results/bench_drafters.json")
DRAFTERS = ("prompt-lookup", "token-recycling", "layer-skip", "draft-model", "medusa", "hydra",
            "hydra++", "eagle", "eagle3")  # --drafters picks among these (eagle: EAGLE and EAGLE-2)
TREE = DynamicTree(width=4, depth=5, children=4)  # EAGLE-2's tree: 20 nodes


def _heads(n_layers: int) -> dict:
  """name -> the head drafter trained under that name."""
  return {"medusa": Medusa(4), "hydra": Hydra(4), "hydra++": Hydra(4, prefix_attention=True),
          "eagle": Eagle(), "eagle3": Eagle.eagle3(n_layers)}


def _train(model, args) -> dict:
  """name -> (folder, training seconds, updates, held-out metrics after training): trains what
  is not trained yet."""
  data = DataConfig(files=args.files, seq_len=args.seq_len, rows=args.rows, heldout_rows=16,
                    top_k=32)
  optim = OptimConfig(learning_rate=args.lr, warmup_steps=max(args.train_steps // 10, 1),
                      total_steps=args.train_steps)
  out = {}
  for name, drafter in _heads(model.config.n_layers).items():
    if name not in args.drafters:
      continue
    exp = DistillExperiment(name=name, data=data, out_dir=args.out_dir,
                            teacher_dir=f"{args.out_dir}/teacher",
                            distill=HeadsConfig(drafter, batch_size=args.batch, optim=optim),
                            checkpoint_every=args.train_steps, log_every=10,
                            eval_every=args.train_steps)
    # A rerun with more --train-steps resumes the checkpoint: the cost adds up across runs.
    cost = exp.folder / "train_seconds.json"
    spent = json.loads(cost.read_text()) if cost.exists() else {"seconds": 0.0}
    t = time.perf_counter()
    result = run(exp, model=model)
    if result["steps"] != spent.get("steps"):  # it trained: add to earlier runs' time
      spent = {"seconds": spent["seconds"] + time.perf_counter() - t, "steps": result["steps"]}
      cost.write_text(json.dumps(spent))
    seconds = spent["seconds"]
    print(f"trained {name}: held-out acceptance {result['heldout_acceptance_before']:.3f} -> "
          f"{result['heldout_acceptance_after']:.3f} in {seconds:.0f} s", flush=True)
    out[name] = (result["drafter"], seconds, result["steps"], result["heldout_after"])
  return out


def _heldout(trained) -> dict:
  """name -> training cost and held-out metrics; prints held-out 1 - TV (top-1 agreement) per
  draft depth."""
  heldout = {name: dict(train_s=t[1], train_updates=t[2], **t[3]) for name, t in trained.items()}
  depths = max((int(k.split("depth")[1]) for m in heldout.values() for k in m if "depth" in k),
               default=0)
  print(table(["drafter", "training s (updates)"] + [f"depth {j}" for j in range(1, depths + 1)],
              [[name, f"{m['train_s']:.0f} ({m['train_updates']})"]
               + [f"{m[f'acceptance/depth{j}']:.3f} ({m[f'top1/depth{j}']:.2f})"
                  if f"acceptance/depth{j}" in m else "-" for j in range(1, depths + 1)]
               for name, m in heldout.items()]))
  return heldout


def _methods(model, trained, args):
  """name -> (drafter, params, k, training s, updates); None drafter = autoregressive."""
  cfg, params = model.config, model.params
  n_params = lambda p: sum(x.size for x in jax.tree.leaves(p)) if p is not None else 0
  want = args.drafters
  methods = {"autoregressive": (None, None, args.k, 0, 0)}
  for name in ("prompt-lookup", "token-recycling"):
    if name in want:
      methods[name] = (*registry.make(name, params, cfg), args.k, 0, 0)
  if "layer-skip" in want:
    methods["layer-skip"] = (registry.make("layer-skip", params, cfg, skip=(14,))[0], None,
                             args.k, 0, 0)
  if "draft-model" in want:
    dm, dp = registry.make("draft-model", params, cfg, draft_layers=4)
    methods["draft-model (4-layer cut, untrained)"] = (dm, dp, args.k, 0, 0)
  for name, (folder, seconds, updates, _) in trained.items():
    d, p = registry.load(folder, cfg)  # one load serves every k and threshold
    for k in args.eagle3_k if name == "eagle3" else (args.k,):
      methods[f"{name} k={k}"] = (d, p, k, seconds, updates)
    if name == "eagle":
      methods["eagle-2 dynamic tree"] = (*registry.load(folder, cfg, TREE), args.k, seconds,
                                         updates)
    if name.startswith("eagle"):
      for t in args.stop_thresholds:
        methods[f"{name} adaptive (p>{t}, k<={args.max_k})"] = (
            dataclasses.replace(d, stop_threshold=t), p, args.max_k, seconds, updates)
  return {name: (*m[:3], n_params(m[1]), *m[3:]) for name, m in methods.items()}


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--prompts", type=int, default=8, help="HumanEval prompts after the first 4")
  ap.add_argument("--batch1-prompts", type=int, default=2,
                  help="how many of them run one at a time (batch 1)")
  ap.add_argument("--new-tokens", type=int, default=48)
  ap.add_argument("--batch-sizes", default="1,8", help="1: prompts one at a time; 8: 8 at once")
  ap.add_argument("-k", type=int, default=4, help="chain length (Medusa/Hydra have 4 heads)")
  ap.add_argument("--eagle3-k", default="2,4,6", help="fixed chain lengths for EAGLE-3")
  ap.add_argument("--max-k", type=int, default=8, help="adaptive length: most drafts per step")
  ap.add_argument("--stop-thresholds", default="0.5",
                  help="adaptive length: stop once P(some draft rejected) passes this (a row each)")
  ap.add_argument("--drafters", default=",".join(DRAFTERS),
                  help=f"which to run, from {','.join(DRAFTERS)} (autoregressive always runs)")
  ap.add_argument("--results", default=str(RESULTS), help="JSON to write (and a .png beside it)")
  ap.add_argument("--train-steps", type=int, default=60)
  ap.add_argument("--batch", type=int, default=4, help="training rows per update")
  ap.add_argument("--seq-len", type=int, default=128)
  ap.add_argument("--rows", type=int, default=256)
  ap.add_argument("--files", type=int, default=80)
  ap.add_argument("--lr", type=float, default=1e-3)
  ap.add_argument("--out-dir", default="runs/bench_drafters")
  args = ap.parse_args()
  args.eagle3_k = tuple(int(x) for x in args.eagle3_k.split(","))
  args.batch_sizes = tuple(int(x) for x in args.batch_sizes.split(","))
  args.stop_thresholds = tuple(float(x) for x in args.stop_thresholds.split(","))
  args.drafters = tuple(args.drafters.split(","))
  if unknown := set(args.drafters) - set(DRAFTERS):
    ap.error(f"unknown --drafters {sorted(unknown)}; known: {', '.join(DRAFTERS)}")
  results = pathlib.Path(args.results)

  model = load("smollm2-135m")
  tok = model.tokenizer
  prompts = [tok.encode(tok.chat_prompt(p)) for p in humaneval_prompts(4 + args.prompts)[4:]]
  trained = _train(model, args)
  methods = _methods(model, trained, args)
  heldout = _heldout(trained)
  rows = []
  for batch in args.batch_sizes:
    chunk = prompts[:args.batch1_prompts] if batch == 1 else prompts[:batch]
    for temp, sampling in (("greedy", SamplingConfig()), ("t=1", SamplingConfig(temperature=1.0))):
      base = None
      for name, (drafter, dparams, k, size, seconds, updates) in methods.items():
        spec = SpecConfig(k=k, max_new_tokens=args.new_tokens, sampling=sampling)
        tok_s, tau, acceptance, drafts, compile_s = run_prompts(
            model, chunk, drafter, dparams, spec, batch, hot=name == "token-recycling")
        base = base or tok_s
        rows.append(dict(method=name, batch=batch, sampling=temp, panel=f"batch {batch}, {temp}",
                         tau=tau, acceptance=acceptance, drafts_per_step=drafts,
                         tokens_per_s=tok_s, speedup=tok_s / base,
                         speedup_per_tau=tok_s / base / tau, params_m=size / 1e6,
                         train_s=seconds, train_updates=updates, compile_s=compile_s))
        print(f"batch {batch} {temp} {name}: tau {tau:.2f}, {tok_s:.1f} tok/s, "
              f"x{tok_s / base:.2f}", flush=True)
        # Each row compiles its own loops; dropping them keeps a long run under the kernel's
        # memory-map limit (an XLA:CPU executable holds ~3 maps; the last run died there).
        jax.clear_caches()
        # Written after every row: a run cut short keeps what it measured.
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps(dict(machine=machine(), args=vars(args), heldout=heldout,
                                           rows=rows), indent=1))
  print(f"\nSmolLM2-135M fp32, {args.new_tokens} new tokens (EOS off), HumanEval prompts 5.. "
        f"(chat): batch 1 = the first {args.batch1_prompts} one at a time, batch 8 = 8 at once "
        f"(batch sizes run: {args.batch_sizes}); "
        f"chains k={args.k}; heads trained {args.train_steps} updates x {args.batch} rows x "
        f"{args.seq_len} tokens (fkl, lr {args.lr}); adaptive stop thresholds "
        f"{args.stop_thresholds}; {machine()}\n")
  acc = lambda a: " ".join(f"{x:.2f}" for x in a) or "-"
  print(table(["batch", "sampling", "method", "tau", "acceptance by position", "drafts/step",
               "tok/s", "x AR", "speedup/tau", "params (M)", "training s (updates)"],
              [[r["batch"], r["sampling"], r["method"], r["tau"], acc(r["acceptance"]),
                r["drafts_per_step"], r["tokens_per_s"], r["speedup"], r["speedup_per_tau"],
                r["params_m"], f"{r['train_s']:.0f} ({r['train_updates']})"] for r in rows]))
  plot_tau_speedup(rows, results.with_suffix(".png"), "SmolLM2-135M",
                   panels=tuple(dict.fromkeys(r["panel"] for r in rows)), key="panel")
  print(f"\nwrote {results} and {results.with_suffix('.png')}")


if __name__ == "__main__":
  main()
