"""The target drafting for itself from a lower-precision copy of its float32 weights (layer skip's
`draft_dtype`, every layer kept): bfloat16 (VocabTrim 16384 or the whole vocabulary, alone and
behind prompt lookup's copies, `lookup=2`) and int8 (each table row scaled to 127, the whole
vocabulary, long chains, and long chains cut by Kangaroo's early exit where a draft's top
probability falls below a threshold), beside prompt lookup and the shipped EAGLE + TTT behind
lookup (the fastest trained drafter; k = 1-2 for batch 8, whose verify is bound by multiply-adds,
and k = 4-8 for the longer copies of code), on held-out HumanEval and chat prompts, greedy and t =
1, batch 1 and 8. A bfloat16 draft reads half the bytes of a target step, an int8 one a quarter,
and each parts from the target's own choice only where rounding tips a near tie, so nearly all are
kept at either temperature; the verify reads the float32 weights, so output stays the float32
target's.

  speculax bench --config self_draft   (~45 min on 2 CPU cores; --method to pick rows)
"""
from speculax.bench.config import BenchConfig, method
from speculax.configs.bench.layer_skip import BF16, TRIM

EAGLE = dict(heads="results/drafters/eagle-ttt-smollm2")
SELF = dict(skip=())  # every layer kept: the model itself drafts, from its copy
INT8 = dict(draft_dtype="int8", **SELF)

BENCH = BenchConfig(
    methods=(method("prompt lookup", "prompt-lookup", k=4),
             *(method(f"eagle-ttt + lookup k={k}", "eagle", k=k, lookup=2, **EAGLE)
               for k in (1, 2, 3, 4, 5, 6, 8)),
             method("bf16 self k=2", "layer-skip", k=2, **SELF, **BF16),
             *(method(f"bf16 self k={k}, full vocabulary", "layer-skip", k=k,
                      draft_dtype="bfloat16", **SELF) for k in (2, 4, 6)),
             *(method(f"bf16 self + lookup k={k}", "layer-skip", k=k, lookup=2, **SELF, **BF16)
               for k in (2, 3)),
             *(method(f"int8 self k={k}", "layer-skip", k=k, **INT8) for k in (4, 6, 8)),
             method("int8 self k=6, VocabTrim 16384", "layer-skip", k=6, **INT8, **TRIM),
             method("int8 self goodput k<=8", "layer-skip", k=8, goodput=True, **INT8),
             method("int8 self + lookup k=6", "layer-skip", k=6, lookup=2, **INT8),
             *(method(f"int8 self k={k}, exit {p}", "layer-skip", k=k, exit_threshold=p, **INT8)
               for k, p in ((6, 0.5), (8, 0.4), (8, 0.6)))),
    suites=("humaneval", "chat"), prompts=3, batch_sizes=(1, 8), temperatures=(0.0, 1.0),
    new_tokens=48)
