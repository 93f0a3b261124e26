"""The accelerator suite's outputs (research/accelerator_suite.py): its JSON, one plot with a
panel per section measured, and the README's tables, from the JSON alone.

  python -m speculax.research.accelerator_report results/accelerator/accelerator_suite.json
"""
from __future__ import annotations

import argparse
import json
import pathlib

from speculax.bench.report import table


def write_json(results: dict, path: pathlib.Path) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(results, indent=1, default=str))


def save(results: dict, path: pathlib.Path) -> None:
  write_json(results, path)
  plot(results, path.with_suffix(".png"))


def plot(results: dict, path: pathlib.Path) -> None:
  """One panel per section measured (of those with a picture): step time against batch (with
  both floors), the verify cost curve, kernel over XLA, the decode loops' ms per step."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  sec = results["sections"]
  drawn = [name for name in PANELS if sec.get(name)]
  n = max(len(drawn), 1)
  fig, axes = plt.subplots(1, n, figsize=(6 * n, 5), squeeze=False)
  for ax, name in zip(axes[0], drawn):
    values = PANELS[name](ax, sec[name])
    if values is not None:  # the measured values, written plainly, on the log axes
      ax.set_xticks(values, [str(v) for v in values])
      ax.minorticks_off()
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  fig.suptitle(f"{results['machine']}, {results['date']}")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _autoregressive_panel(ax, rows):
  for name in dict.fromkeys(r["model"] for r in rows):
    mine = [r for r in rows if r["model"] == name]
    line, = ax.plot([r["batch"] for r in mine], [r["step_ms"] for r in mine], "o-", label=name)
    ax.plot([r["batch"] for r in mine],
            [max(r["bandwidth_floor_ms"], r["launch_floor_ms"]) for r in mine], ":",
            color=line.get_color())
  ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="ms per decode step",
         title="autoregressive step (dotted: max of the bandwidth and launch floors)")
  return sorted({r["batch"] for r in rows})


def _verify_panel(ax, verify):
  cost = verify["cost"]
  ax.plot([int(t) for t in cost], list(cost.values()), "o-")
  ax.axhline(1.0, color="gray", lw=0.8, ls="--")
  ax.set(xscale="log", xlabel="tokens in one forward", ylabel="time / one-token forward",
         title="verify cost")
  return [int(t) for t in cost]


def _attention_panel(ax, rows):
  for t in dict.fromkeys(r["tree"] for r in rows):
    mine = [r for r in rows if r["tree"] == t]
    ax.plot([r["cache"] for r in mine], [r["speedup"] for r in mine], "o-", label=f"{t} nodes")
  ax.axhline(1.0, color="gray", lw=0.8, ls="--")
  ax.set(xscale="log", xlabel="cache length", ylabel="XLA time / kernel time",
         title="tree-attention kernel vs XLA")
  return sorted({r["cache"] for r in rows})


def _loops_panel(ax, rows):
  names = list(dict.fromkeys(f"{r['attention']} {r['loop']}" for r in rows))
  batches = list(dict.fromkeys(r["batch"] for r in rows))
  height = 1 / (len(batches) + 1)
  for i, batch in enumerate(batches):
    ms = {f"{r['attention']} {r['loop']}": r["step_ms"] for r in rows if r["batch"] == batch}
    ax.barh([j + i * height for j in range(len(names))], [ms.get(n, 0.0) for n in names],
            height=height, label=f"batch {batch}")
  ax.set_yticks(range(len(names)), names, fontsize=7)
  ax.set(xlabel="ms per loop step (median of rounds)", title="decode loops")


PANELS = {"autoregressive": _autoregressive_panel, "verify": _verify_panel,
          "attention": _attention_panel, "loops": _loops_panel}


def markdown(results: dict) -> str:
  """The README's tables, from the JSON."""
  sec, parts = results["sections"], [f"{results['machine']}, {results['date']}, "
                                     f"`{results['command']}`"]
  if "autoregressive" in sec:
    parts.append(table(["model", "batch", "ms/step", "tok/s", "bandwidth floor ms",
                        "launch floor ms", "x floor"],
                       [[r["model"], r["batch"], r["step_ms"], r["tokens_per_s"],
                         r["bandwidth_floor_ms"], r["launch_floor_ms"], r["over_floor"]]
                        for r in sec["autoregressive"]]))
  if "verify" in sec:
    parts.append("verify cost (t-token forward / one-token): " + ", ".join(
        f"{t}: {c:.2f}" for t, c in sec["verify"]["cost"].items()))
  if "attention" in sec:
    parts.append(table(["cache", "tree nodes", "kernel us", "XLA us", "XLA / kernel",
                        "max abs error", "one KV range us"],
                       [[r["cache"], r["tree"], r["kernel_us"], r["xla_us"], r["speedup"],
                         f"{r['max_abs_error']:.2g}", r.get("one_range_us") or "-"]
                        for r in sec["attention"]]))
  if "loops" in sec:
    parts.append(table(["batch", "attention", "loop", "ms/step", "ms rounds", "tau",
                        "steps drafting 0..k", "length changes", "same as AR"],
                       [[r["batch"], r["attention"], r["loop"], r["step_ms"],
                         " / ".join(f"{m:.3f}" for m in r["rounds_ms"]), r["tau"],
                         "/".join(map(str, r["k_steps"])) if r.get("k_steps") else "-",
                         "-" if r.get("k_changes") is None else r["k_changes"],
                         f"{r['same_as_ar']}/{r['sequences']}"] for r in sec["loops"]]))
    traced = [r for r in sec["loops"] if r.get("trace")]
    if traced:
      parts.append(table(["batch", "loop (traced once)", "wall ms/step", "device busy ms/step",
                          "host launches/step"],
                         [[r["batch"], r["loop"], r["trace"]["wall_ms"] / r["trace"]["steps"],
                           r["trace"]["device_busy_ms"] / r["trace"]["steps"],
                           sum(r["trace"]["host_launches"].values()) / r["trace"]["steps"]]
                          for r in traced]))
  if "training" in sec:
    r = sec["training"]
    parts.append(f"EAGLE training: {r['tokens_per_s']:.0f} tokens/s (batch {r['batch']} x "
                 f"{r['seq_len']}, {r['steps']} steps)")
  if "drafters" in sec:
    parts.append(table(["batch", "sampling", "method", "tau", "tok/s", "x AR", "same as AR"],
                       [[r["batch"], r["sampling"], r["method"], r["tau"], r["tokens_per_s"],
                         r["speedup"], "-" if r["same_as_ar"] is None else
                         f"{r['same_as_ar']}/{r['sequences']}"] for r in sec["drafters"]]))
  parts += [f"{name}: {error}" for name, error in results["errors"].items()]
  return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description="Print a saved accelerator-suite result's tables.")
  ap.add_argument("results", type=pathlib.Path, help="the JSON the suite wrote")
  print(markdown(json.loads(ap.parse_args(argv).results.read_text())))


if __name__ == "__main__":
  main()
