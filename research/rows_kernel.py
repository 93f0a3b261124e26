"""What the CPU rows kernel (models/kernels/rows_cpu.py) changes in a forward: the target's
t-token forward against a cache holding 256 of 512 slots (a verify of t - 1 drafts; t = 1 a
decode step), at batch 1 and 8, with the kernel and with XLA's dots (SPECULAX_ROWS_KERNEL=0),
the two interleaved in rounds so that the machine's drift falls on both alike. Prints and
writes (JSON, Markdown, PNG) the median milliseconds and each t over the same path's one-token
forward.

  .venv/bin/python -m speculax.research.rows_kernel [--tokens 1 2 3 4 5 8 9 16] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os

PATHS = {"kernel": "1", "xla": "0"}  # SPECULAX_ROWS_KERNEL, read when a forward is traced


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  from speculax.research.common import add_target_and_out
  add_target_and_out(ap)
  ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 9, 16],
                  help="forward widths t at batch 1 (batch 8 takes the first two)")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--repeats", type=int, default=10, help="chained forwards per timing")
  args = ap.parse_args(argv)
  if 1 not in args.tokens:
    ap.error(f"--tokens must include 1 (each width is read over it), got {args.tokens}")

  from speculax.bench.measure import forward_seconds, machine
  from speculax.bench.report import table
  from speculax.models.kernels import rows_cpu
  from speculax.models.load import load
  from speculax.research.common import median

  model = load(args.model)
  cells = [(1, t) for t in args.tokens] + [(8, t) for t in args.tokens[:2]]
  times = {(path, b, t): [] for path in PATHS for b, t in cells}
  before = os.environ.get(rows_cpu.SWITCH)
  try:
    for r in range(args.rounds):
      for path, switch in PATHS.items():
        os.environ[rows_cpu.SWITCH] = switch
        for b, t in cells:
          times[path, b, t].append(1e3 * forward_seconds(model, t, args.repeats, batch=b))
      print(f"round {r + 1}/{args.rounds}: " + ", ".join(
          f"b{b} t={t} {times['kernel', b, t][-1]:.1f}/{times['xla', b, t][-1]:.1f} ms"
          for b, t in cells), flush=True)
  finally:  # the switch as it was
    os.environ.pop(rows_cpu.SWITCH)
    if before is not None:
      os.environ[rows_cpu.SWITCH] = before

  rows = []
  for b, t in cells:
    ms = {path: median(times[path, b, t]) for path in PATHS}
    one = {path: median(times[path, b, 1]) for path in PATHS}
    rows.append(dict(batch=b, t=t, **{f"{p}_ms": ms[p] for p in PATHS},
                     **{f"{p}_over_one_token": ms[p] / one[p] for p in PATHS},
                     kernel_over_xla=ms["kernel"] / ms["xla"],
                     rounds={p: times[p, b, t] for p in PATHS}))
  result = dict(machine=machine(), target=args.model, rounds=args.rounds, rows=rows)
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / "rows_kernel.json"
  path.write_text(json.dumps(result, indent=1))
  md = table(["batch", "t", "kernel ms", "XLA ms", "kernel / XLA", "kernel t / 1",
              "XLA t / 1"],
             [[r["batch"], r["t"], r["kernel_ms"], r["xla_ms"], r["kernel_over_xla"],
               r["kernel_over_one_token"], r["xla_over_one_token"]] for r in rows])
  (args.out / "rows_kernel.md").write_text(md + "\n")
  plot(rows, args.out / "rows_kernel.png")
  print(md)
  print(f"wrote {path}")


def plot(rows: list[dict], path) -> None:
  """Milliseconds per forward against t at batch 1, both paths."""
  from matplotlib.figure import Figure
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  ones = [r for r in rows if r["batch"] == 1]
  for p, label in (("kernel", "rows kernel"), ("xla", "XLA's dots")):
    ax.plot([r["t"] for r in ones], [r[f"{p}_ms"] for r in ones], "o-", label=label)
  ax.set_xlabel("tokens in the forward (t)")
  ax.set_ylabel("ms per forward, batch 1")
  ax.set_ylim(bottom=0)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


if __name__ == "__main__":
  main()
