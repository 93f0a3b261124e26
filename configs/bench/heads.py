"""The head drafters side by side (issue 18's ordering goal: EAGLE above Hydra++ above Medusa on
tokens/s at batch 1, greedy): each shipped head drafter at chain lengths 1, 2 and 4 and drafting
its tree, on held-out HumanEval and chat prompts.

  speculax bench --config heads --out runs/bench   (14 min on 2 CPU cores for Medusa, Hydra++,
  EAGLE, EAGLE + TTT and EAGLE-3)
"""
from speculax.bench.config import BenchConfig
from speculax.configs.bench.drafters import DRAFTERS, trained_rows

# TRAINED's head drafters, weakest expected first
HEADS = ("medusa", "hydra", "eagle", "eagle-ttt", "eagle3")


def methods(drafters=DRAFTERS, ks: tuple[int, ...] = (1, 2, 4)) -> tuple:
  """Rows for every head drafter shipped under `drafters` (others are skipped)."""
  return tuple(row for label in HEADS for row in trained_rows(label, drafters, ks,
                                                              full_vocabulary=False))


BENCH = BenchConfig(methods=methods(), suites=("humaneval", "chat"), prompts=3,
                    batch_sizes=(1,), temperatures=(0.0,), new_tokens=48)
