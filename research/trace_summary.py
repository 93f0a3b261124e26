"""Where a traced run's time went, from a perfetto trace (`jax.profiler.trace(dir,
create_perfetto_trace=True)`): for each execution of a jitted program on the device, its wall
time, the time the device was busy inside it (the union of its kernels' and copies' spans), how
many it ran, and what the host launched one by one meanwhile (a GPU runs a while loop's
condition and each step's thunks from the host; a step's body captured as a CUDA graph is one
`cuGraphLaunch`). A step whose wall time far exceeds its busy time waits on the host.

  python -m speculax.research.trace_summary TRACE.json.gz [--module spec_loop] [--min-ms 5]

Only device platforms write the per-program events this reads (on XLA:CPU it finds none).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import re

MODULE = re.compile(r"^(?P<name>.+):XLA \w+ module$")  # a program's execution, on a host thread


def busy_us(spans: list[tuple[float, float]]) -> float:
  """Microseconds covered by the union of (start, end) spans."""
  total, reach = 0.0, float("-inf")
  for start, end in sorted(spans):
    if end > reach:
      total += end - max(start, reach)
      reach = end
  return total


def executions(events: list[dict], module: str | None = None, min_ms: float = 0.0) -> list[dict]:
  """One dict per program execution (module: only programs whose name contains it; min_ms: only
  executions at least this long), in trace order: wall and device-busy milliseconds, device
  events, and the host's launches inside it by name (a trailing number dropped), most frequent
  first."""
  threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  spans = [e for e in events if e.get("ph") == "X"]
  device = [e for e in spans if "Stream" in threads.get((e["pid"], e["tid"]), "")]
  out = []
  for e in spans:
    match = MODULE.match(e.get("name", ""))
    if not match or (module and module not in match["name"]) or e["dur"] < min_ms * 1e3:
      continue
    start, end = e["ts"], e["ts"] + e["dur"]
    inside = [d for d in device if start <= d["ts"] <= end]
    host = collections.Counter(
        re.sub(r"[._]?\d+(?=\W*$)", "", h["name"]) for h in spans
        if (h["pid"], h["tid"]) == (e["pid"], e["tid"]) and start < h["ts"] < end
        and h is not e)
    out.append(dict(module=match["name"], wall_ms=e["dur"] / 1e3,
                    device_busy_ms=busy_us([(d["ts"], d["ts"] + d["dur"]) for d in inside]) / 1e3,
                    device_events=len(inside), host_launches=dict(host.most_common())))
  return out


def read(path: pathlib.Path) -> list[dict]:
  """The trace's events (a .json.gz or .json perfetto / Chrome trace)."""
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt") as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


def find(folder: pathlib.Path) -> pathlib.Path:
  """The perfetto trace jax.profiler wrote under folder (the newest, if several)."""
  found = sorted(folder.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
  if not found:
    raise FileNotFoundError(f"no perfetto_trace.json.gz under {folder}")
  return found[-1]


def main(argv=None) -> list[dict]:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("trace", type=pathlib.Path, help="a perfetto trace, or a folder holding one")
  ap.add_argument("--module", default=None, help="only programs whose name contains this")
  ap.add_argument("--min-ms", type=float, default=1.0, help="only executions this long or longer")
  ap.add_argument("--top", type=int, default=8, help="host launch names shown per execution")
  args = ap.parse_args(argv)
  path = find(args.trace) if args.trace.is_dir() else args.trace
  rows = executions(read(path), args.module, args.min_ms)
  for r in rows:
    top = ", ".join(f"{n} x{c}" for n, c in list(r["host_launches"].items())[:args.top])
    print(f"{r['module']}: wall {r['wall_ms']:.2f} ms, device busy {r['device_busy_ms']:.2f} ms "
          f"({r['device_events']} events); host launched: {top}")
  return rows


if __name__ == "__main__":
  main()
