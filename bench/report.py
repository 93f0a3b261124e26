"""How a benchmark reports: Markdown tables and the tau/speedup plot."""
from __future__ import annotations


def table(header: list[str], rows: list[list]) -> str:
  """A Markdown table; floats get 3 significant-ish digits, None a dash."""
  fmt = lambda x: "-" if x is None else f"{x:.3g}" if isinstance(x, float) and abs(x) < 100 else (
      f"{x:.0f}" if isinstance(x, float) else str(x))
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
  return "\n".join(lines)


def plot_tau_speedup(rows, path, title: str, panels=("greedy", "t=1"), key="sampling"):
  """Speedup against tau, one panel per value of row[key], a labelled dot per method."""
  from matplotlib.figure import Figure  # not pyplot: a notebook's backend stays as it was
  cols = min(len(panels), 2)  # two panels a row: four side by side leave the labels unreadable
  n_rows = -(-len(panels) // cols)
  fig = Figure(figsize=(7 * cols, 5 * n_rows))
  axes = fig.subplots(n_rows, cols, sharey=True, squeeze=False)
  for ax in axes.flat[len(panels):]:
    ax.set_visible(False)
  for ax, panel in zip(axes.flat, panels):
    for r in (r for r in rows
              if r[key] == panel and not r["method"].startswith("autoregressive")):
      ax.scatter(r["tau"], r["speedup"])
      ax.annotate(r["method"], (r["tau"], r["speedup"]), fontsize=7)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set(title=f"{title}, {panel}", xlabel="tau (tokens per target forward)",
           ylabel="speedup over autoregressive")
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def markdown(result: dict) -> str:
  """The result of bench.run as a Markdown table, headed by what produced it."""
  acc = lambda a: " ".join(f"{x:.2f}" for x in a[:6]) or "-"
  split = lambda r: (f"{r['draft_cost']:.2f} + {r['verify_cost']:.2f}" if "step_cost" in r
                     else "-")
  same = lambda r: "-" if r["same_as_ar"] is None else f"{r['same_as_ar']}/{r['sequences']}"
  rounds = any(len(r.get("tokens_per_s_rounds", ())) > 1 for r in result["rows"])  # repeats > 1
  head = (f"`{result['command'] or result['name']}` on {result['machine']}, {result['date']}: "
          f"{result['target']} ({result['precision']}), {result['new_tokens']} new tokens per "
          "prompt (EOS off), compile time apart"
          + ("; batch b > 1 is continuous batching: a panel's prompts b rows at a time, a "
             "finished row refilled with the next" if result.get("continuous") else "")
          + ("; tok/s the median of each row's rounds, run round-robin." if rounds else "."))
  rows = [[r["suite"], r["batch"], r["sampling"], r["method"], r["tau"], acc(r["acceptance"]),
           r["drafts_per_step"], r["tokens_per_s"], r["speedup"], r["speedup_per_tau"], same(r),
           split(r), r["compile_s"], r["drafter_mb"]] for r in result["rows"]]
  header = ["suite", "batch", "sampling", "method", "tau", "acceptance by position",
            "drafts/step", "tok/s", "x AR", "speedup/tau", "same as AR",
            "step = rest + verify (fwd)", "compile s", "drafter MB"]
  if rounds:
    header.insert(header.index("tok/s") + 1, "tok/s rounds")
    for row, r in zip(rows, result["rows"]):
      row.insert(header.index("tok/s rounds"),
                 " ".join(f"{x:.3g}" for x in r.get("tokens_per_s_rounds", ())))
  if any(r.get("decode_speedup") for r in result["rows"]):  # results before 2026-12-03 lack it
    header.insert(header.index("x AR") + 1, "decode x AR")
    for row, r in zip(rows, result["rows"]):
      row.insert(header.index("decode x AR"), r.get("decode_speedup"))
  if any(r["batch"] > 1 for r in result["rows"]):  # finished rows ride along: see rows_active
    header.insert(header.index("drafts/step") + 1, "rows active")
    for row, r in zip(rows, result["rows"]):
      row.insert(header.index("rows active"), r.get("rows_active"))
  if any(r.get("k_steps") for r in result["rows"]):  # goodput-driven rows: choices and costs
    ints = lambda xs, f="{}": "/".join(f.format(x) for x in xs) if xs else "-"
    # 3 digits: a GPU step is ~1 ms, a CPU one 25-130
    header += ["steps drafting 0..k", "length changes", "calibrated step ms at 0..k"]
    for row, r in zip(rows, result["rows"]):
      changes = r.get("k_changes")  # not in results written before 2026-12-04 night
      row += [ints(r.get("k_steps")), "-" if changes is None else changes,
              ints([s * 1e3 for s in r.get("step_costs") or []], "{:.3g}")]
  return head + "\n\n" + table(header, rows)


def main(argv: list[str] | None = None) -> None:
  """python -m speculax.bench.report FILE.json: the Markdown table of a saved result (README
  tables are pasted from this)."""
  import argparse
  import json
  import pathlib
  ap = argparse.ArgumentParser(description=main.__doc__)
  ap.add_argument("result", type=pathlib.Path)
  print(markdown(json.loads(ap.parse_args(argv).result.read_text(encoding="utf-8"))))


if __name__ == "__main__":
  main()
