"""The recipe's distilled draft model decoding, beside the heads set's panels (batch 1 greedy,
held-out HumanEval and chat prompts): chains of 1, 2 and 4 and its tree, from its run folder (a
6-layer cut of 176 MB: trained, not shipped).

  python -m speculax.research.train_drafters --drafters distill   (36 min on 2 CPU cores)
  speculax bench --config draft_model --out runs/bench
"""
import dataclasses

from speculax.configs.bench.drafters import trained_rows
from speculax.configs.bench.heads import BENCH as HEADS

ROWS = tuple(trained_rows("draft-model", "runs", (1, 2, 4), full_vocabulary=False))
if not ROWS:  # else the bench would time autoregressive decoding alone
  raise FileNotFoundError("no trained draft model in runs/distill-smollm2-fkl: train it first "
                          "(python -m speculax.research.train_drafters --drafters distill)")
BENCH = dataclasses.replace(HEADS, methods=ROWS)
