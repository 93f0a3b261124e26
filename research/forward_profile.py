"""Where a decoding forward's time goes on the CPU: the target's t-token forward (the verify of
t - 1 drafts; t = 1 a decode step) against a cache holding 256 of 512 slots, `repeats` of them
chained in one jitted loop as `bench.measure.forward_seconds` times them, traced with
`jax.profiler`. XLA:CPU writes an event per thunk it runs; they are summed by kind, in ms per
forward: the few-row products (FFI custom calls: the rows kernel), YNNPACK's fusions (with the
kernel on, attention's dots and reductions), and every other thunk (norms, RoPE, transposes,
the mask's selects, the cache writes), beside the loop's wall time per forward; JSON, table and a
stacked bar plot.

  python -m speculax.research.forward_profile [--tokens 1 8] [--batch 1] [--repeats 10]
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import tempfile

from speculax.research.trace_summary import busy_us, find, read

KINDS = {"ffi_call": "products (rows kernel)", "ynn_fusion": "YNNPACK fusions"}
OTHER = "other thunks"
# The HLO ops that hold computations, whose events span their thunks' (`thunks` skips them):
# lax.cond's is named "cond", and a cloned computation's "<op>.<n>.clone" ("cond.5.clone").
CONTAINERS = ("while", "conditional", "cond", "call")


def thunks(events: list[dict], keep=lambda event: True
           ) -> tuple[collections.Counter, collections.Counter]:
  """(ms, count) of the thunks of each kind (KINDS, else OTHER) among the events `keep` takes:
  every event a thunk's own work, not the host's Python frames, runtime bookkeeping or the
  thunks that hold others."""
  python = {(e["pid"], e["tid"]) for e in events  # the host's Python thread: frames, no thunks
            if e.get("ph") == "M" and e.get("name") == "thread_name"
            and e["args"].get("name") == "python"}
  ms, calls = collections.Counter(), collections.Counter()
  for e in events:
    name = e.get("name", "")
    if (e.get("ph") != "X" or (e.get("pid"), e.get("tid")) in python or "::" in name
        or name.startswith(("end: ", "$")) or not keep(e)):
      continue
    base = re.sub(r"[.\d]+$", "", re.sub(r"\.clone[.\d]*$", "", name))
    if base in CONTAINERS:
      continue
    kind = KINDS.get(base, OTHER)
    ms[kind] += e["dur"] / 1e3
    calls[kind] += 1
  return ms, calls


def thunk_ms(events: list[dict], forwards: int) -> dict:
  """Per forward: ms of the thunks of each kind (KINDS, else OTHER), the number of thunks of
  each kind, and `wall_ms`, the ms "ThunkExecutor::Execute" events cover (the loop)."""
  wall = busy_us([(e["ts"], e["ts"] + e["dur"]) for e in events  # executions may nest
                  if e.get("ph") == "X" and e["name"] == "ThunkExecutor::Execute"])
  ms, calls = thunks(events)
  return dict(wall_ms=wall / 1e3 / forwards, **per(ms, calls, forwards))


def per(ms: collections.Counter, calls: collections.Counter, n: int) -> dict:
  """{"ms": .., "calls": ..} of every kind, divided by n (forwards, loop steps)."""
  kinds = [*KINDS.values(), OTHER]
  return dict(ms={k: ms[k] / n for k in kinds}, calls={k: calls[k] / n for k in kinds})


def profile(model, t: int, batch: int = 1, repeats: int = 10) -> dict:
  """thunk_ms of `repeats` chained t-token forwards of `batch` rows (one traced run after a
  warm-up run)."""
  import jax

  from speculax.bench.measure import chained, forward_step
  step, carry, params = forward_step(model, t, batch)
  loop = chained(step, repeats)
  jax.block_until_ready(loop(carry, params))
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      jax.block_until_ready(loop(carry, params))
    events = read(find(pathlib.Path(folder)))
  return thunk_ms(events, repeats)


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  from speculax.research.common import add_target_and_out
  add_target_and_out(ap)
  ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8], help="forward widths t")
  ap.add_argument("--batch", type=int, default=1, help="rows per forward")
  ap.add_argument("--repeats", type=int, default=10, help="chained forwards traced")
  args = ap.parse_args(argv)
  if min(args.tokens) < 1 or args.batch < 1 or args.repeats < 1:
    ap.error(f"--tokens, --batch and --repeats take positive counts, got {args.tokens}, "
             f"{args.batch} and {args.repeats}")

  from speculax.bench.measure import machine
  from speculax.bench.report import table
  from speculax.models.load import load

  model = load(args.model)
  rows = []
  for t in args.tokens:
    rows.append(dict(t=t, **profile(model, t, args.batch, args.repeats)))
    print(f"t={t}: {rows[-1]['wall_ms']:.1f} ms a forward", flush=True)
  kinds = list(rows[0]["ms"])
  md = table(["t", "wall ms", *(f"{k} ms" for k in kinds), *(f"{k}: thunks" for k in kinds)],
             [[r["t"], r["wall_ms"], *(r["ms"][k] for k in kinds),
               *(r["calls"][k] for k in kinds)] for r in rows])
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / "forward_profile.json"
  path.write_text(json.dumps(dict(machine=machine(), target=args.model, batch=args.batch,
                                  repeats=args.repeats, rows=rows), indent=1))
  (args.out / "forward_profile.md").write_text(md + "\n")
  plot(rows, [str(r["t"]) for r in rows], "tokens in the forward (t)",
       f"ms per forward, batch {args.batch}", args.out / "forward_profile.png")
  print(md)
  print(f"wrote {path}")


def plot(rows: list[dict], labels: list[str], xlabel: str, ylabel: str, path) -> None:
  """A stacked bar per row (labelled by `labels`): each kind's ms, the wall time marked above."""
  from matplotlib.figure import Figure
  fig = Figure(figsize=(max(6, 1.6 * len(rows)), 4))
  ax = fig.subplots()
  bottom = [0.0] * len(rows)
  for kind in rows[0]["ms"]:
    ms = [r["ms"][kind] for r in rows]
    ax.bar(labels, ms, bottom=bottom, label=kind)
    bottom = [b + m for b, m in zip(bottom, ms)]
  ax.plot(labels, [r["wall_ms"] for r in rows], "k_", markersize=30, label="wall")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


if __name__ == "__main__":
  main()
