"""What the CPU rows kernel (models/kernels/rows_cpu.py) changes in a forward: the target's t-token
forward against a cache holding 256 of 512 slots (a verify of t - 1 drafts; t = 1 a decode step),
at batch 1 and 8, with the kernel (at up to its MAX_ROWS rows whatever `rows_cpu.max_rows()` chose
for this CPU: SPECULAX_ROWS_LIMIT) and with XLA's dots (SPECULAX_ROWS_KERNEL=0), and with bf16
weights on a CPU with AMX also the kernel's vector path (SPECULAX_ROWS_AMX=0), the paths
interleaved in rounds so that the machine's drift falls on all alike. Prints and writes (JSON,
Markdown, PNG) the median milliseconds and each t over the same path's one-token forward.

  .venv/bin/python -m speculax.research.rows_kernel [--tokens 1 2 3 4 5 8 9 16] [--rounds 3]
      [--dtype bfloat16] [--batch8 1 2 4]
"""
from __future__ import annotations

import argparse
import json
import os

LABELS = {"kernel": "kernel", "vector": "kernel without AMX", "xla": "XLA"}


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  from speculax.research.common import add_target_and_out
  add_target_and_out(ap)
  ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 9, 16],
                  help="forward widths t at batch 1 (batch 8 takes the first two)")
  ap.add_argument("--batch8", type=int, nargs="+", default=None,
                  help="forward widths t at batch 8 (default: the first two of --tokens)")
  ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                  help="the target's weights")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--repeats", type=int, default=10, help="chained forwards per timing")
  args = ap.parse_args(argv)
  batch8 = args.batch8 or args.tokens[:2]
  if 1 not in args.tokens or 1 not in batch8:
    ap.error(f"--tokens and --batch8 must include 1 (each width is read over it), got "
             f"{args.tokens} and {batch8}")

  from speculax.bench.measure import forward_seconds, machine
  from speculax.bench.report import table
  from speculax.models.kernels import rows_cpu
  from speculax.models.load import load
  from speculax.research.common import median

  model = load(args.model, dtype=args.dtype)
  # Each path's switches, read when a forward is traced.
  every = {rows_cpu.LIMIT: str(rows_cpu.MAX_ROWS)}
  paths = {"kernel": {rows_cpu.SWITCH: "1", rows_cpu.AMX_SWITCH: "1", **every},
           "xla": {rows_cpu.SWITCH: "0", rows_cpu.AMX_SWITCH: "1", **every}}
  if args.dtype == "bfloat16" and rows_cpu.amx():
    paths["vector"] = {rows_cpu.SWITCH: "1", rows_cpu.AMX_SWITCH: "0", **every}
  cells = [(1, t) for t in args.tokens] + [(8, t) for t in batch8]
  times = {(path, b, t): [] for path in paths for b, t in cells}
  before = {name: os.environ.get(name) for name in paths["kernel"]}
  try:
    for r in range(args.rounds):
      for path, switches in paths.items():
        os.environ.update(switches)
        for b, t in cells:
          times[path, b, t].append(1e3 * forward_seconds(model, t, args.repeats, batch=b))
      print(f"round {r + 1}/{args.rounds}: " + ", ".join(
          f"b{b} t={t} {times['kernel', b, t][-1]:.1f}/{times['xla', b, t][-1]:.1f} ms"
          for b, t in cells), flush=True)
  finally:  # the switches as they were
    for name, value in before.items():
      os.environ.pop(name)
      if value is not None:
        os.environ[name] = value

  rows = []
  for b, t in cells:
    ms = {path: median(times[path, b, t]) for path in paths}
    one = {path: median(times[path, b, 1]) for path in paths}
    rows.append(dict(batch=b, t=t, **{f"{p}_ms": ms[p] for p in paths},
                     **{f"{p}_over_one_token": ms[p] / one[p] for p in paths},
                     kernel_over_xla=ms["kernel"] / ms["xla"],
                     rounds={p: times[p, b, t] for p in paths}))
  result = dict(machine=machine(), target=args.model, dtype=args.dtype, amx=rows_cpu.amx(),
                rounds=args.rounds, rows=rows)
  args.out.mkdir(parents=True, exist_ok=True)
  name = "rows_kernel" if args.dtype == "float32" else f"rows_kernel_{args.dtype}"
  path = args.out / f"{name}.json"
  path.write_text(json.dumps(result, indent=1))
  md = table(["batch", "t", *(f"{LABELS[p]} ms" for p in paths), "kernel / XLA",
              *(f"{LABELS[p]}: t / 1" for p in paths)],
             [[r["batch"], r["t"], *(r[f"{p}_ms"] for p in paths), r["kernel_over_xla"],
               *(r[f"{p}_over_one_token"] for p in paths)] for r in rows])
  (args.out / f"{name}.md").write_text(md + "\n")
  plot(rows, list(paths), args.out / f"{name}.png")
  print(md)
  print(f"wrote {path}")


def plot(rows: list[dict], paths: list[str], path) -> None:
  """Milliseconds per forward against t at batch 1, each path."""
  from matplotlib.figure import Figure
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  ones = [r for r in rows if r["batch"] == 1]
  for p in paths:
    label = LABELS[p]
    ax.plot([r["t"] for r in ones], [r[f"{p}_ms"] for r in ones], "o-", label=label)
  ax.set_xlabel("tokens in the forward (t)")
  ax.set_ylabel("ms per forward, batch 1")
  ax.set_ylim(bottom=0)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


if __name__ == "__main__":
  main()
