"""The head drafters side by side (issue 18's ordering goal: EAGLE above Hydra++ above Medusa on
tokens/s at batch 1, greedy): each shipped head drafter at chain lengths 1, 2 and 4 and drafting
its tree, on held-out HumanEval and chat prompts.

  speculax bench --config heads --out runs/bench   (12 min on 2 CPU cores for Medusa, EAGLE and
  EAGLE + TTT)
"""
import pathlib

from speculax.bench.config import BenchConfig, method
from speculax.configs.bench.drafters import DRAFTERS, TRAINED, TREES

HEADS = ("medusa", "hydra", "eagle", "eagle-ttt")  # TRAINED's head drafters, weakest expected first


def methods(drafters=DRAFTERS, ks: tuple[int, ...] = (1, 2, 4)) -> tuple:
  """Rows for every head drafter shipped under `drafters` (others are skipped)."""
  rows = []
  for label in HEADS:
    kind, folder, _ = TRAINED[label]
    path = pathlib.Path(drafters) / folder
    if path.is_dir():
      rows += [method(f"{label} k={k}", kind, k=k, heads=str(path)) for k in ks]
      rows.append(method(f"{label} tree ({TREES[kind].n_nodes} nodes)", kind, k=4,
                         heads=str(path), tree=TREES[kind]))
  return tuple(rows)


BENCH = BenchConfig(methods=methods(), suites=("humaneval", "chat"), prompts=3,
                    batch_sizes=(1,), temperatures=(0.0,), new_tokens=48)
