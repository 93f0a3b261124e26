"""The target drafting for itself from a bfloat16 copy of its float32 weights (layer skip's
`draft_dtype`, every layer kept, VocabTrim 16384 or the whole vocabulary), alone and behind
prompt lookup's copies (`lookup=2`), beside prompt lookup and the shipped EAGLE + TTT behind
lookup (the fastest trained drafter), on held-out HumanEval and chat prompts, greedy and t = 1,
batch 1 and 8. The drafts read half the bytes of a target step and part from the target's own
choice only where rounding tips a near tie, so nearly all are kept at either temperature; the
verify reads the float32 weights, so output stays the float32 target's.

  speculax bench --config bf16_draft   (~30 min on 2 CPU cores)
"""
from speculax.bench.config import BenchConfig, method
from speculax.configs.bench.layer_skip import BF16

EAGLE = dict(heads="results/drafters/eagle-ttt-smollm2")

BENCH = BenchConfig(
    methods=(method("prompt lookup", "prompt-lookup", k=4),
             method("eagle-ttt + lookup k=3", "eagle", k=3, lookup=2, **EAGLE),
             method("bf16 self k=2", "layer-skip", k=2, skip=(), **BF16),
             *(method(f"bf16 self k={k}, full vocabulary", "layer-skip", k=k, skip=(),
                      draft_dtype="bfloat16") for k in (2, 4, 6)),
             *(method(f"bf16 self + lookup k={k}", "layer-skip", k=k, skip=(), lookup=2, **BF16)
               for k in (2, 3))),
    suites=("humaneval", "chat"), prompts=3, batch_sizes=(1, 8), temperatures=(0.0, 1.0),
    new_tokens=48)
