"""Training metrics: one CSV row per logged step, and a plot of the curves at the end.

In a multi-process run only process 0 writes (the file and the plot); every process may read.
"""
from __future__ import annotations

import csv
import math
import pathlib
import re
from collections.abc import Iterable

from speculax.models.distributed import is_primary

MAX_COLUMNS = 4  # panels per row of the plot
_DEPTH = re.compile(r"(.+)/depth(\d+)")  # a per-depth metric: <group>/depth<j>


def panel_groups(names: Iterable[str]) -> dict[str, list[str]]:
  """Panel title -> the metrics it draws: `<group>/depth<j>` metrics share the panel
  "<group>/depth*" (one line per depth, by depth), any other metric has its own."""
  groups: dict[str, list[str]] = {}
  for name in sorted(names, key=_panel):
    groups.setdefault(_panel(name)[0], []).append(name)
  return groups


def _panel(name: str) -> tuple[str, int]:
  """(panel title, depth; -1 for a metric without one)."""
  m = _DEPTH.fullmatch(name)
  return (f"{m.group(1)}/depth*", int(m.group(2))) if m else (name, -1)


class MetricsLog:
  """Appends rows to `path` (CSV); resuming a run keeps appending to the same file."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)

  def write(self, step: int, metrics: dict[str, float]) -> None:
    """Long format (step, metric, value): steps may log different metrics (evals are rarer)."""
    if not is_primary():
      return
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
    """A grid of panels against step (see panel_groups), at most MAX_COLUMNS wide; returns the
    PNG path (drawn by process 0 only)."""
    out = pathlib.Path(out)
    if not is_primary():
      return out
    # A Figure of its own, not pyplot: the caller's matplotlib backend (a notebook's inline one)
    # stays as it was.
    from matplotlib.figure import Figure
    rows = self.read()
    groups = panel_groups({k for r in rows for k in r} - {"step"})
    n = max(len(groups), 1)
    cols = min(n, MAX_COLUMNS)
    fig = Figure(figsize=(4 * cols, 3 * math.ceil(n / cols)))
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False)
    for ax, (title, names) in zip(axes.flat, groups.items()):
      for name in names:
        pts = [(r["step"], r[name]) for r in rows if name in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name.rsplit("/", 1)[-1])
      if len(names) > 1:
        ax.legend(fontsize="small")
      ax.set_title(title)
      ax.set_xlabel("step")
    for ax in list(axes.flat)[len(groups):]:
      ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return out
