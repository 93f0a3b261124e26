"""Where a training update's time goes on the CPU: an experiment's train_step on its own batches
(train/experiment.prepare, train/loop.make_batch), per batch size: the seconds a batch takes to
read from the teacher cache, the wall seconds of an update (`updates` of them back to back after
two that compile and warm), and the thunks of one more such run traced with jax.profiler, summed
in ms per update by what they compute, from the compiled program's shapes: the products that
read the vocabulary-wide arrays (a head drafter's scoring against its n output rows, forward and
back), the other passes over [positions, n] (softmax, the loss, the metrics), the drafter's own
products, and the rest (norms, attention's reductions, the optimizer, transposes); XLA runs thunks
on every core at once, so the groups can sum past the wall. JSON, table and a stacked bar plot.

  python -m speculax.research.update_profile [--experiment eagle_hour_smollm2] [--batch 4 8]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pathlib
import re
import tempfile
import time

from speculax.research.common import OUT
from speculax.research.forward_profile import plot
from speculax.research.trace_summary import busy_us, find, read

SCORING, WIDE, PRODUCTS, REST = ("scoring products", "passes over [positions, n]",
                                 "drafter's products", "the rest")
GROUPS = (SCORING, WIDE, PRODUCTS, REST)
# An instruction of the compiled program: its name, output type and operands, and the op it came
# from (metadata op_name).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = (?P<type>\S+) \w[\w\-]*\("
                          r"(?P<operands>[^)]*)\)(?P<rest>.*)$")
_DIMS = re.compile(r"\[([\d,]*)\]")


def groups(hlo: str, width: int) -> dict[str, str]:
  """The GROUP of each instruction of a compiled program's text: a dot whose output or operands
  have a dim of `width` (the scoring product), another instruction that does (WIDE), another dot
  (PRODUCTS), else REST."""
  dims, parsed = {}, []
  for line in hlo.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      dims[match["name"]] = {int(d) for group in _DIMS.findall(match["type"])
                             for d in group.split(",") if d}
      parsed.append(match)
  out = {}
  for m in parsed:
    operands = re.findall(r"%([\w.\-]+)", m["operands"])
    wide = width in dims[m["name"]].union(*(dims.get(o, set()) for o in operands))
    dot = "dot_general" in m["rest"] or m["name"].startswith("dot")
    out[m["name"]] = (SCORING if dot else WIDE) if wide else (PRODUCTS if dot else REST)
  return out


def thunk_groups(events: list[dict], names: dict[str, str], updates: int) -> dict:
  """{"wall_ms": the ms the executions cover, "ms": {group: ms of its thunks}}, per update
  (`names`: instruction -> group; thunks of instructions not in it, such as the loops that hold
  others, are left out)."""
  ms = collections.Counter()
  for e in events:
    group = names.get(e.get("name", ""))
    if e.get("ph") == "X" and group:
      ms[group] += e["dur"] / 1e3
  wall = busy_us([(e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and e["name"] == "ThunkExecutor::Execute"])
  return {"wall_ms": wall / 1e3 / updates, "ms": {g: ms[g] / updates for g in GROUPS}}


def profile(exp, prepared, updates: int) -> dict:
  """Batch-read seconds, update seconds and thunk ms per group of `exp` at its batch size."""
  import jax
  import jax.numpy as jnp

  from speculax.train.distill import train_step
  from speculax.train.loop import make_batch

  p, cfg = prepared, exp.distill
  read_s, batches = [], []
  for step in range(updates + 2):
    start = time.perf_counter()
    batch = make_batch(p.state, p.student.config, cfg, p.train_rows.tokens, p.teacher.batch,
                       None, step, mask=p.train_rows.mask)
    read_s.append(time.perf_counter() - start)
    batches.append({k: jnp.asarray(v) for k, v in batch.items()})
  state = jax.tree.map(jnp.copy, p.state)  # train_step donates it
  step = lambda state, batch: train_step(state, batch, p.student.config, cfg, p.frozen)

  def chained(state, some):
    for batch in some:
      state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    return state

  state = chained(state, batches[:2])  # compiles and warms
  start = time.perf_counter()
  state = chained(state, batches[2:])
  seconds = (time.perf_counter() - start) / updates
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      state = chained(state, batches[2:])
    events = read(find(pathlib.Path(folder)))
  hlo = train_step.lower(state, batches[0], p.student.config, cfg, p.frozen).compile().as_text()
  # the student's logits: a trimmed head drafter's kept ids, else the vocabulary
  width = getattr(getattr(cfg, "drafter", None), "vocab_trim", 0) or p.student.config.vocab_size
  return dict(batch=cfg.batch_size, positions=cfg.batch_size * p.train_rows.tokens.shape[1],
              width=width, read_s=sum(read_s) / len(read_s), update_s=seconds,
              **thunk_groups(events, groups(hlo, width), updates))


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--experiment", default="eagle_hour_smollm2",
                  help="a configs/ experiment (its target, data and teacher cache)")
  ap.add_argument("--batch", type=int, nargs="+", default=[4], help="rows an update")
  ap.add_argument("--updates", type=int, default=4, help="updates timed and traced")
  ap.add_argument("--out", type=pathlib.Path, default=OUT, help="folder for the JSON and plot")
  args = ap.parse_args(argv)
  if min(args.batch) < 1 or args.updates < 1:
    ap.error(f"--batch and --updates take positive counts, got {args.batch} and {args.updates}")

  from speculax.bench.measure import machine
  from speculax.bench.report import table
  from speculax.cli.train import load_experiment
  from speculax.train.experiment import prepare

  exp = load_experiment(args.experiment)
  prepared = prepare(exp)
  rows = []
  for b in args.batch:
    sized = dataclasses.replace(exp, distill=dataclasses.replace(exp.distill, batch_size=b))
    rows.append(profile(sized, prepared, args.updates))
    print(f"batch {b}: {rows[-1]['update_s']:.3f} s an update, {rows[-1]['read_s']:.3f} s its "
          f"batch's read", flush=True)
  md = table(["rows", "positions", "read s", "update s", "traced wall ms",
              *(f"{g} ms" for g in GROUPS)],
             [[r["batch"], r["positions"], r["read_s"], r["update_s"], r["wall_ms"],
               *(r["ms"][g] for g in GROUPS)] for r in rows])
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / "update_profile.json"
  path.write_text(json.dumps(dict(machine=machine(), experiment=args.experiment,
                                  updates=args.updates, rows=rows), indent=1))
  (args.out / "update_profile.md").write_text(md + "\n")
  plot(rows, [str(r["batch"]) for r in rows], "rows an update", "ms per update",
       args.out / "update_profile.png")
  print(md)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
