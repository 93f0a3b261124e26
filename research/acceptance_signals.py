"""What tells, before a drafter's next first draft is drafted, whether it will be kept: the
signals goodput could bin its acceptance estimate on (decode/goodput.py), and the most a perfect
per-bin estimate could buy.

Teacher-forced on the recipe's held-out answers (greedy and t = 1 apart; acceptance_gap's
first_draft), at each answer position m: the first draft of token m + 1 is kept with
probability a_m (greedy: 1 if its argmax is the target's, else 0; t = 1: 1 - TV, what sampled
verification keeps on average). Signals, each read before that draft exists:

  drafter confidence   the draft's own top probability: an output-layer pass (on a plain step
                       too, where nothing else needs it)
  target confidence    the target's top probability at m - 1 (the law of the token the last
                       step emitted): free, the verify computed it
  previous kept        whether the first draft at m - 1 agreed with the target: free

The bound: chains of at most one draft, a one-draft step costing c plain steps. Fixed k = 1
emits 1 + mean(a) tokens per c; goodput's rule with a signal drafts where its rows' summed bin
estimates pay (1 + mean a_bin > c, the mean over the batch's rows) and takes a plain step
elsewhere. Batch 1 decides per position; a batch of b, per b positions drawn at random (rows
independent), so its mean over b bins varies less than one row's. The gain is over the better
of fixed k = 1 and plain decoding, before the signal's own cost.

  .venv/bin/python -m speculax.research.acceptance_signals [--heads FOLDER] [--costs 1.2 1.45]
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib

import numpy as np

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.drafters import registry
from speculax.models.load import load
from speculax.research.acceptance_gap import first_draft_signals, heldout_answers
from speculax.research.common import add_target_and_out

EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0 + 1e-6)  # confidence bins


def pairs(kept: list[np.ndarray], p_top: list[np.ndarray], q_top: list[np.ndarray],
          agree: list[np.ndarray]) -> dict[str, np.ndarray]:
  """Per drafted position m of every answer (arrays over the answer's drafted positions, in
  order): the acceptance a_m and the three signals' values there (from position m - 1 for the
  free ones; an answer's first position has none and is dropped)."""
  cat = lambda xs, sl: np.concatenate([x[sl] for x in xs])
  return {"kept": cat(kept, np.s_[1:]), "drafter confidence": cat(q_top, np.s_[1:]),
          "target confidence": cat(p_top, np.s_[:-1]),
          "previous kept": cat(agree, np.s_[:-1]).astype(np.float64)}


def bins(values: np.ndarray, signal: str) -> np.ndarray:
  """[n] int bin of each value: previous kept 0 / 1, confidences by EDGES."""
  if signal == "previous kept":
    return values.astype(int)
  return np.digitize(values, EDGES[1:-1])


def bin_table(kept: np.ndarray, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(share, acceptance) [c] per bin present (empty bins dropped)."""
  present = np.unique(which)
  share = np.array([(which == j).mean() for j in present])
  return share, np.array([kept[which == j].mean() for j in present])


def bound(share: np.ndarray, accept: np.ndarray, cost: float, batch: int,
          draws: int = 200_000, seed: int = 0) -> dict[str, float]:
  """Tokens per plain-step time: fixed k = 1, the better of it and plain decoding (what pooled
  goodput reaches at best), and goodput's per-step rule on perfect bin estimates for a batch of
  `batch` rows drawn independently from the bins."""
  mean = float(share @ accept)
  fixed = (1 + mean) / cost
  if batch == 1:  # every bin, weighed by its share
    m, weight = accept, share  # [c]
  else:  # the mean row estimate of `draws` steps of `batch` rows drawn at random
    rng = np.random.default_rng(seed)
    m = accept[rng.choice(len(share), size=(draws, batch), p=share / share.sum())].mean(1)
    weight = np.full(draws, 1.0 / draws)
  draft = 1 + m > cost
  tokens = weight @ np.where(draft, 1 + m, 1.0)
  time = weight @ np.where(draft, cost, 1.0)
  return {"fixed k=1": fixed, "pooled best": max(fixed, 1.0), "per bin": float(tokens / time),
          "drafting share": float(weight @ draft)}


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  add_target_and_out(ap)
  ap.add_argument("--heads", type=pathlib.Path,
                  default=pathlib.Path("results/drafters/eagle-ttt-smollm2"))
  ap.add_argument("--heldout", type=int, default=40, help="held-out prompts (half greedy)")
  ap.add_argument("--costs", type=float, nargs="+", default=[1.2, 1.3, 1.45],
                  help="a one-draft step over a plain one (this CPU: 1.2-1.3 at batch 1, "
                       "1.43-1.52 at batch 8)")
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
  args = ap.parse_args(argv)
  model = load(args.model)
  drafter, params = registry.load(args.heads, model)
  result = {"machine": machine(), "date": datetime.date.today().isoformat(),
            "command": "python -m speculax.research.acceptance_signals", "heads": str(args.heads),
            "heldout": args.heldout, "sets": {}}
  for name, (docs, starts) in heldout_answers(model, args.heldout).items():
    got = first_draft_signals(drafter, params, model, docs, starts)
    kept = got["top1"] if "greedy" in name else got["accept"]
    per = pairs(kept, got["p_top"], got["q_top"], got["top1"])
    entry = result["sets"][name] = {"positions": int(per["kept"].size),
                                    "acceptance": float(per["kept"].mean()), "signals": {}}
    for signal in ("drafter confidence", "target confidence", "previous kept"):
      share, accept = bin_table(per["kept"], bins(per[signal], signal))
      entry["signals"][signal] = {
          "share": share.tolist(), "acceptance": accept.tolist(),
          "bound": {f"c={c} b={b}": bound(share, accept, c, b)
                    for c in args.costs for b in args.batches}}
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / "acceptance_signals.json"
  path.write_text(json.dumps(result, indent=1))
  print(report(result))
  print(f"wrote {path}")


def report(result: dict) -> str:
  """Per position set: each signal's bins (share, acceptance) and the bound's gain of goodput
  per bin over the better of fixed k = 1 and plain decoding, at each cost and batch."""
  out = [f"`{result['command']} --heads {result['heads']}` on {result['machine']}, "
         f"{result['date']}"]
  for name, entry in result["sets"].items():
    signals = entry["signals"]
    keys = list(next(iter(signals.values()))["bound"])
    out += [f"\n{name}: {entry['positions']} positions, first draft kept "
            f"{entry['acceptance']:.3f}\n",
            table(["signal", "bins: share / kept"] + [f"gain {k}" for k in keys],
                  [[s, " ".join(f"{a:.2f}/{p:.2f}" for a, p in zip(v["share"], v["acceptance"]))]
                   + [f"{v['bound'][k]['per bin'] / v['bound'][k]['pooled best'] - 1:+.1%}"
                      for k in keys] for s, v in signals.items()])]
  return "\n".join(out)


if __name__ == "__main__":
  main()
