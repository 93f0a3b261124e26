"""Goodput-driven draft length (SmartSpec) against fixed k, batch 1 and 8, greedy: prompt lookup
(acceptance estimated per length of the n-gram match, the default, and pooled over all rows)
and the shipped EAGLE drafter, and a drafter that is rarely accepted (a one-layer cut of the
target as draft model), where goodput should settle on plain decoding; "no margin" rows take any
draft that promises more tokens per second than a plain step (Goodput.margin = 0), "margin 0.05"
rows half the default's 10%; the "every row" row weighs every running row's tokens alike where the
default weighs the rows that may end last (Goodput.lead = None: the objective before it); "from
the prior" rows start each call from the prior, where the default starts from the acceptance its
calibration saw (Goodput.start).
speculax bench --config goodput"""
from speculax.bench.config import BenchConfig, method
from speculax.decode.goodput import Goodput

EAGLE = "results/drafters/eagle-ttt-smollm2"
POOLED = Goodput(signal=False)
NO_MARGIN = Goodput(margin=0.0)
HALF_MARGIN = Goodput(margin=0.05)
EVERY_ROW = Goodput(lead=None)
FROM_PRIOR = Goodput(start="prior")

BENCH = BenchConfig(
    methods=(
        method("prompt lookup k=1", "prompt-lookup", k=1),
        method("prompt lookup k=4", "prompt-lookup", k=4),
        method("prompt lookup goodput k<=4", "prompt-lookup", k=4, goodput=True),
        method("prompt lookup goodput k<=4, pooled", "prompt-lookup", k=4, goodput=POOLED),
        method("prompt lookup goodput k<=4, no margin", "prompt-lookup", k=4, goodput=NO_MARGIN),
        method("prompt lookup goodput k<=4, margin 0.05", "prompt-lookup", k=4,
               goodput=HALF_MARGIN),
        method("prompt lookup goodput k<=4, every row", "prompt-lookup", k=4, goodput=EVERY_ROW),
        method("prompt lookup goodput k<=4, from the prior", "prompt-lookup", k=4,
               goodput=FROM_PRIOR),
        method("eagle-ttt k=1", "eagle", k=1, heads=EAGLE),
        method("eagle-ttt k=2", "eagle", k=2, heads=EAGLE),
        method("eagle-ttt goodput k<=4", "eagle", k=4, heads=EAGLE, goodput=True),
        method("eagle-ttt goodput k<=4, no margin", "eagle", k=4, heads=EAGLE, goodput=NO_MARGIN),
        method("eagle-ttt goodput k<=4, margin 0.05", "eagle", k=4, heads=EAGLE,
               goodput=HALF_MARGIN),
        method("eagle-ttt goodput k<=4, from the prior", "eagle", k=4, heads=EAGLE,
               goodput=FROM_PRIOR),
        method("1-layer cut k=2", "draft-model", k=2, draft_layers=1),
        method("1-layer cut goodput k<=2", "draft-model", k=2, draft_layers=1, goodput=True),
        method("1-layer cut goodput k<=2, from the prior", "draft-model", k=2, draft_layers=1,
               goodput=FROM_PRIOR),
    ),
    suites=("humaneval",), prompts=2, batch_sizes=(1, 8), temperatures=(0.0,), new_tokens=48,
    step_split=False)
