"""What skipping buys: whole layers against attention or MLP sublayers (SWIFT, Draft & Verify).

Layer skip drafts through the target with some of its layers left out (drafters/layer_skip.py,
whole layers). SWIFT and Draft & Verify skip attention and MLP sublayers apart, so a draft can
drop the MLPs (three quarters of a Llama layer's weights) where attention matters, or the other
way round. This script asks whether that finer grain gives a better trade on a target: for each
granularity, the teacher-forced top-1 agreement with the full model on the target's own greedy
answers (what a greedy loop's first draft is kept on) against the draft's cost, the share of
the target's weights a one-token draft reads (a decode step is bound by them; the output layer
trimmed to --vocab-trim rows as the shipped layer skip is).

A sublayer is skipped by zeroing its output projection (attention's o, the MLP's down): it then
adds nothing to the residual stream, which is what skipping it does, while the cost model counts
its weights as not read. The skip sets grow by ranked elimination (as layer_skip_search does):
every candidate scored alone on the calibration answers, then round r skips the r best, ranked
by agreement lost per share of weights saved. Each round is also scored on held-out answers
(the bench's HumanEval and chat prompts) and gets the k = 1 speedup the cost model estimates
(layer_skip_search.estimated_speedup with the measured cost of a 2-token verify) - an estimate
to rank sets, not a measurement.

  .venv/bin/python -m speculax.research.skip_frontier [--rounds 8] [--new-tokens 96]
"""
from __future__ import annotations

import argparse
import json
import time

import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from speculax.bench import suites
from speculax.bench.measure import machine
from speculax.bench.methods import calibration_prompts
from speculax.bench.report import table
from speculax.decode.config import GenerateConfig
from speculax.decode.generate import generate
from speculax.drafters.layer_skip_search import estimated_speedup, pack_rows, top1
from speculax.models.config import LlamaConfig
from speculax.models.load import load
from speculax.research.common import OUT, add_target_and_out

UNITS = ("attention", "mlp")  # a layer is both
ZEROED = {"attention": "o", "mlp": "down"}  # the projection that writes each unit's output


def unit_weights(config: LlamaConfig) -> dict[str, int]:
  """Weights one token reads in each unit of a layer."""
  d, h, kh, q, f = (config.d_model, config.n_heads, config.n_kv_heads, config.head_dim,
                    config.d_ff)
  return {"attention": 2 * d * h * q + 2 * d * kh * q, "mlp": 3 * d * f}


def draft_cost(config: LlamaConfig, skipped: list[tuple[str, int]], vocab_trim: int) -> float:
  """The share of the target's per-token weights a draft skipping `skipped` (unit, layer) reads,
  its output layer trimmed to `vocab_trim` rows."""
  w = unit_weights(config)
  layers = config.n_layers * (w["attention"] + w["mlp"])
  full = layers + config.vocab_size * config.d_model
  return (layers - sum(w[unit] for unit, _ in skipped) + vocab_trim * config.d_model) / full


def zeroed(params, skipped: list[tuple[str, int]]):
  """Stacked params whose skipped units write nothing to the residual stream."""
  layers = dict(params["layers"])
  for unit in UNITS:
    rows = [i for u, i in skipped if u == unit]
    if rows:
      name = ZEROED[unit]
      layers[name] = layers[name].at[np.asarray(rows)].set(0)
  return {**params, "layers": layers}


class Scorer:
  """Teacher-forced top-1 agreement of a skip set with the full model on answer positions."""

  def __init__(self, params, config: LlamaConfig, prompts: list[list[int]],
               answers: list[list[int]]):
    self.params, self.config = params, config
    tokens, _ = pack_rows([np.asarray(p + a) for p, a in zip(prompts, answers)])
    # Position i predicts token i + 1: the last prompt position predicts the first answer token.
    self.counted = np.zeros(tokens.shape, bool)  # [b, t]
    for row, (p, a) in enumerate(zip(prompts, answers)):
      self.counted[row, len(p) - 1:len(p) + len(a) - 1] = True
    self.tokens = jnp.asarray(tokens)
    self.keep = jnp.ones(config.n_layers, bool)
    self.reference = self._argmax(params)

  def _argmax(self, params) -> np.ndarray:  # [b, t]
    return np.asarray(top1(params, self.config, self.tokens, self.keep))

  def __call__(self, skipped: list[tuple[str, int]]) -> float:
    pred = self._argmax(zeroed(self.params, skipped))
    return float(((pred == self.reference) & self.counted).sum() / self.counted.sum())


def frontier(score: Scorer, config: LlamaConfig, rounds: int, vocab_trim: int) -> dict:
  """Ranked elimination at both granularities: {"layers" | "sublayers": {"alone": [...],
  "rounds": [...]}}, each entry {"skipped": [(unit, layer)], "agreement", "cost"}: every
  candidate skipped alone, then the rounds (round 0 skips nothing)."""
  if rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {rounds}")
  if not 1 <= vocab_trim <= config.vocab_size:
    raise ValueError(f"vocab_trim must be in 1..{config.vocab_size}, got {vocab_trim}")
  w = unit_weights(config)
  candidates = range(1, config.n_layers - 1)  # the first and last layers never (see the search)
  entry = lambda skipped, agreement: {"skipped": skipped, "agreement": agreement,
                                      "cost": draft_cost(config, skipped, vocab_trim)}
  out = {}
  for name, units in (("layers", [[(u, i) for u in UNITS] for i in candidates]),
                      ("sublayers", [[(u, i)] for i in candidates for u in UNITS])):
    n = min(rounds, len(units))
    with tqdm(total=len(units) + n, disable=None, desc=f"skip frontier, {name}",
              unit="fwd") as bar:
      alone = []
      for unit in units:
        alone.append(entry(unit, score(unit)))
        bar.update()
      lost = [(1 - a["agreement"]) / sum(w[u] for u, _ in unit)  # per share of weights saved
              for a, unit in zip(alone, units)]
      order = [units[j] for j in np.argsort(lost, kind="stable")]
      trace = [entry([], 1.0)]
      for r in range(1, n + 1):
        skipped = [u for unit in order[:r] for u in unit]
        trace.append(entry(skipped, score(skipped)))
        bar.update()
        bar.set_postfix(agreement=f"{trace[-1]['agreement']:.3f}")
    out[name] = {"alone": alone, "rounds": trace}
  return out


def answers(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
  """The target's greedy answers (EOS off: every prompt runs to the end)."""
  gen = GenerateConfig(max_new_tokens=new_tokens)
  return [list(map(int, t)) for t in generate(model.params, model.config, prompts, gen,
                                              warmup=False).tokens]


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  add_target_and_out(ap)
  ap.add_argument("--rounds", type=int, default=8, help="skip sets per granularity")
  ap.add_argument("--new-tokens", type=int, default=96, help="greedy answer tokens per prompt")
  ap.add_argument("--heldout", type=int, default=3, help="held-out prompts per suite")
  ap.add_argument("--vocab-trim", type=int, default=16384, help="output rows a draft reads")
  ap.add_argument("--verify-cost", type=float, default=1.05,
                  help="a 2-token verify in one-token forwards (this CPU's rows kernel: 1.05)")
  args = ap.parse_args()
  t0 = time.perf_counter()
  model = load(args.model)
  calibration = calibration_prompts(model.tokenizer)
  heldout = suites.encode(model.tokenizer, suites.suite("humaneval", args.heldout)
                          + suites.suite("chat", args.heldout))
  scorers = {name: Scorer(model.params, model.config, prompts,
                          answers(model, prompts, args.new_tokens))
             for name, prompts in (("calibration", calibration), ("heldout", heldout))}
  result = frontier(scorers["calibration"], model.config, args.rounds, args.vocab_trim)
  for grain in result.values():
    for r in grain["rounds"]:
      r["heldout_agreement"] = scorers["heldout"](r["skipped"])
      r["estimated_speedup_k1"] = float(estimated_speedup(r["heldout_agreement"], 1, r["cost"],
                                                          verify_cost=args.verify_cost))
  result = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "model": args.model,
            "command": "python -m speculax.research.skip_frontier "
                       f"--rounds {args.rounds} --new-tokens {args.new_tokens} "
                       f"--heldout {args.heldout} --vocab-trim {args.vocab_trim}",
            "verify_cost": args.verify_cost, "frontier": result,
            "seconds": time.perf_counter() - t0}
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "skip_frontier.json").write_text(json.dumps(result, indent=1) + "\n")
  plot(result, args.out / "skip_frontier.png")
  print(markdown(result))


def markdown(result: dict) -> str:
  """The README table from the JSON."""
  def name(skipped):
    layers = sorted({i for _, i in skipped})
    parts = []
    for i in layers:
      units = [u for u, j in skipped if j == i]
      parts.append(f"{i}" if len(units) == len(UNITS) else f"{i}{units[0][0]}")
    return " ".join(parts) or "-"
  rows = [[g, name(r["skipped"]), f"{r['cost']:.3f}",
           f"{r['agreement']:.3f}", f"{r['heldout_agreement']:.3f}",
           f"{r['estimated_speedup_k1']:.3f}"]
          for g, grain in result["frontier"].items() for r in grain["rounds"][1:]]
  return (f"{result['model']}, {result['machine']}, {result['date']}, `{result['command']}` "
          f"(skipped: layer numbers, a = its attention only, m = its MLP only)\n\n"
          + table(["granularity", "skipped", "draft cost (weights read)", "agreement",
                   "held-out agreement", "x AR at k = 1, estimated"], rows))


def plot(result: dict, path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for g, grain in result["frontier"].items():
    trace = grain["rounds"]
    cost = [r["cost"] for r in trace]
    line, = ax.plot(cost, [r["agreement"] for r in trace], "o-", label=f"{g}, calibration")
    ax.plot(cost, [r["heldout_agreement"] for r in trace], "x--", color=line.get_color(),
            label=f"{g}, held out")
  ax.set_xlabel("draft cost (share of the target's weights read a token)")
  ax.set_ylabel("teacher-forced top-1 agreement")
  ax.invert_xaxis()
  ax.grid(alpha=0.3)
  ax.legend()
  ax.set_title("skip sets by granularity")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


if __name__ == "__main__":
  main()
