"""A few minutes on a 2-core CPU: the train-free prompt lookup, the shipped EAGLE drafter
(training-time test, VocabTrim) alone and behind prompt lookup's copies, against autoregressive
SmolLM2 on held-out HumanEval prompts, batch 1, greedy.  speculax bench --config quick"""
from speculax.bench.config import BenchConfig, method

EAGLE = "results/drafters/eagle-ttt-smollm2"

BENCH = BenchConfig(
    methods=(
        method("prompt lookup k=4", "prompt-lookup", k=4),
        method("eagle-ttt k=1", "eagle", k=1, heads=EAGLE),
        method("eagle-ttt k=2", "eagle", k=2, heads=EAGLE),
        method("eagle-ttt + lookup k=3", "eagle", k=3, heads=EAGLE, lookup=2),
    ),
    suites=("humaneval",), prompts=2, batch_sizes=(1,), temperatures=(0.0,), new_tokens=48)
