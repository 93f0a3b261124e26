"""EAGLE + TTT (shipped) against EAGLE reading each token through the target's first 2 layers
(Eagle.shallow_layers; trained by `python -m speculax.research.train_drafters --drafters
eagle_shallow --tag warm600`, not shipped: same tau, dearer passes), alone and behind prompt
lookup, batch 1 greedy.  speculax bench --config eagle_shallow (run as runs/shallow_bench.py on
2026-12-05: results/bench_eagle_shallow.*)"""
from speculax.bench.config import BenchConfig, method

TTT = dict(heads="results/drafters/eagle-ttt-smollm2")
SH = dict(heads="runs/eagle-shallow-smollm2-warm600")

BENCH = BenchConfig(
    methods=(method("eagle-ttt k=1", "eagle", k=1, **TTT),
             method("eagle-shallow k=1", "eagle", k=1, **SH),
             method("eagle-ttt k=2", "eagle", k=2, **TTT),
             method("eagle-shallow k=2", "eagle", k=2, **SH),
             method("eagle-ttt + lookup k=3", "eagle", k=3, lookup=2, **TTT),
             method("eagle-shallow + lookup k=3", "eagle", k=3, lookup=2, **SH)),
    suites=("humaneval", "chat"), prompts=3, batch_sizes=(1,), temperatures=(0.0,), new_tokens=48,
    repeats=2)
