"""Training metrics: one CSV row per logged step, and a plot of the curves at the end."""
from __future__ import annotations

import csv
import pathlib


class MetricsLog:
  """Appends rows to `path` (CSV); resuming a run keeps appending to the same file."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)

  def write(self, step: int, metrics: dict[str, float]) -> None:
    """Long format (step, metric, value): steps may log different metrics (evals are rarer)."""
    new = not self.path.exists()
    with self.path.open("a", newline="") as f:
      w = csv.writer(f)
      if new:
        w.writerow(["step", "metric", "value"])
      w.writerows([step, k, float(v)] for k, v in metrics.items())

  def read(self) -> list[dict[str, float]]:
    """One dict per logged step: {"step": s, metric: value, ...}."""
    if not self.path.exists():
      return []
    rows: dict[int, dict[str, float]] = {}
    with self.path.open() as f:
      for r in csv.DictReader(f):
        step = int(r["step"])
        rows.setdefault(step, {"step": step})[r["metric"]] = float(r["value"])
    return [rows[s] for s in sorted(rows)]

  def plot(self, out: str | pathlib.Path) -> pathlib.Path:
    """One panel per metric against step; returns the PNG path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = self.read()
    names = sorted({k for r in rows for k in r} - {"step"})
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(4 * max(len(names), 1), 3))
    for ax, name in zip(list(getattr(axes, "flat", [axes])), names):
      pts = [(r["step"], r[name]) for r in rows if name in r]
      ax.plot([p[0] for p in pts], [p[1] for p in pts])
      ax.set_title(name)
      ax.set_xlabel("step")
    fig.tight_layout()
    out = pathlib.Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
