"""Where a speculative decoding step's time goes on the CPU, against a plain one: a drafter's
decode loop and autoregressive decoding on the same prompts, each prompt decoded once untraced
(compiling and warming both loops) and once traced with jax.profiler; XLA:CPU's thunk events of
the decode loop's own program (not the prefill's) summed by kind as research/forward_profile.py
sums a forward's (the rows kernel's products, YNNPACK's fusions, every other thunk), per loop
step, beside the step's wall ms (the decode loop's seconds over its steps) and tau. A third loop,
prompt lookup at the same k (whose drafts are copies: its drafting all but free), prices the verify
of k drafts alone, so a drafting step's extra over a plain one splits into the wider verify (with
its bookkeeping) and the drafter's passes; tau over the step's cost in plain steps is the loop's
speed-up. JSON, table and a stacked bar plot, named
by suite and batch (step_profile_chat.json, step_profile_humaneval_b8.json).

  python -m speculax.research.step_profile --drafter eagle --heads
      results/drafters/eagle-ttt-smollm2 --lookup 2 -k 3 [--suite chat] [--prompts 3]
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import tempfile

from speculax.research.forward_profile import per, plot, thunks
from speculax.research.trace_summary import find, read

LOOP = "loop"  # in the names of the decode loops' programs (decode_loop, spec_loop)


def in_loop(event: dict) -> bool:
  """Whether a trace event is a thunk of a decode loop's program (the prefill's, a warm-up's
  copy or a compile's are not)."""
  return LOOP in event.get("args", {}).get("hlo_module", "")


def profile(decode, prompts: list[list[list[int]]]) -> dict:
  """decode(batch, warmup) -> DecodeOutput over each batch of token ids, once warmed and once
  traced: per loop step, each kind's thunk ms and count, the wall ms and tau."""
  import jax
  ms, calls = collections.Counter(), collections.Counter()
  steps = row_steps = tokens = 0
  decode_s = 0.0
  for batch in prompts:
    decode(batch, True)
    with tempfile.TemporaryDirectory() as folder:
      with jax.profiler.trace(folder, create_perfetto_trace=True):
        out = decode(batch, False)
      got = thunks(read(find(pathlib.Path(folder))), in_loop)
    ms, calls = ms + got[0], calls + got[1]
    steps, decode_s = steps + out.forwards - 1, decode_s + out.decode_s
    row_steps, tokens = row_steps + out.row_steps, tokens + out.step_tokens  # 0: a plain loop
  return dict(steps=steps, wall_ms=1e3 * decode_s / steps,
              tau=tokens / row_steps if row_steps else 1.0, **per(ms, calls, steps))


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  from speculax.research.common import (add_loop_runs, add_target_and_out, drafter_label,
                                        loop_drafter, parse_loop_runs)
  add_target_and_out(ap)
  add_loop_runs(ap, prompts=3, drafter=True)
  ap.add_argument("--suite", default="humaneval", help="the bench's prompt suite")
  args = parse_loop_runs(ap, argv)

  import jax

  from speculax.bench import suites
  from speculax.bench.measure import machine
  from speculax.bench.report import table
  from speculax.decode.config import SpecConfig
  from speculax.decode.generate import generate
  from speculax.decode.speculative import speculative_generate
  from speculax.drafters.prompt_lookup import PromptLookup
  from speculax.models.load import load

  try:
    suites.check_name(args.suite)
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  model = load(args.model)
  drafter, dparams = loop_drafter(args, model)
  ids = suites.encode(model.tokenizer, suites.suite(args.suite, args.prompts))
  batches = [ids[i:i + args.batch] for i in range(0, len(ids), args.batch)]
  spec = SpecConfig(k=args.k, max_new_tokens=args.new_tokens)
  key = jax.random.key(0)
  plain = lambda batch, warm: generate(model.params, model.config, batch, spec, key, warmup=warm)
  drafting = lambda batch, warm: speculative_generate(
      model.params, model.config, batch, drafter, spec, dparams, key, warmup=warm)
  copying = lambda batch, warm: speculative_generate(
      model.params, model.config, batch, PromptLookup(), spec, None, key, warmup=warm)
  label = f"{drafter_label(args)} k={args.k}"
  loops = [("autoregressive", "plain", plain)]
  if not isinstance(drafter, PromptLookup):  # its verify of k drafts with drafting all but free
    loops.append((f"prompt-lookup k={args.k}", "verify alone", copying))
  loops.append((label, "drafting", drafting))
  rows = [dict(method=name, **profile(run, batches)) for name, _, run in loops]
  kinds = list(rows[0]["ms"])
  md = table(["method", "steps", "tau", "wall ms a step", *(f"{k} ms" for k in kinds),
              *(f"{k}: thunks" for k in kinds), "x AR in the loop"],
             [[r["method"], r["steps"], r["tau"], r["wall_ms"], *(r["ms"][k] for k in kinds),
               *(r["calls"][k] for k in kinds), r["tau"] * rows[0]["wall_ms"] / r["wall_ms"]]
              for r in rows])
  args.out.mkdir(parents=True, exist_ok=True)
  name = (f"step_profile_{pathlib.Path(args.suite).stem}"
          + ("" if args.batch == 1 else f"_b{args.batch}"))
  path = args.out / f"{name}.json"
  path.write_text(json.dumps(dict(machine=machine(), target=args.model, suite=args.suite,
                                  prompts=args.prompts, batch=args.batch,
                                  new_tokens=args.new_tokens, rows=rows), indent=1))
  (args.out / f"{name}.md").write_text(md + "\n")
  plot(rows, [short for _, short, _ in loops], f"decode loop ({label})",
       f"ms per loop step, batch {args.batch}, {args.suite}", args.out / f"{name}.png")
  print(md)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
