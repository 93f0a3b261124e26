"""Layer-skip self-speculation at every chain length (issue 18's train-free goal): the searched
skip set with VocabTrim's 16384 most frequent tokens at k = 1, 2, 3, 5 and goodput-driven k <= 5,
the set untrimmed at k = 2, and drafting from a bfloat16 copy of the float32 target's weights
(`draft_dtype`): the searched set at k = 1 and 2, and every layer kept (the model itself, rounded)
at k = 2 and 3; against autoregressive SmolLM2 on held-out HumanEval and chat prompts, batch 1,
greedy, two rounds. A short chain is where layer skip comes closest: its drafts run 29 of 30
layers, so each costs most of a target step, and a bfloat16 copy reads half the bytes.

  speculax bench --config layer_skip   (~25 min on 2 CPU cores)
"""
from speculax.bench.config import BenchConfig, method

TRIM = dict(vocab_trim=16384, vocab_ids="results/drafters/smollm2-135m-vocab-order.npy")
BF16 = dict(draft_dtype="bfloat16", **TRIM)

BENCH = BenchConfig(
    methods=(*(method(f"skip+trim k={k}", "layer-skip", k=k, **TRIM) for k in (1, 2, 3, 5)),
             method("skip k=2", "layer-skip", k=2),
             method("skip+trim goodput k<=5", "layer-skip", k=5, goodput=True, **TRIM),
             *(method(f"skip+trim bf16 k={k}", "layer-skip", k=k, **BF16) for k in (1, 2)),
             *(method(f"all layers+trim bf16 k={k}", "layer-skip", k=k, skip=(), **BF16)
               for k in (2, 3))),
    suites=("humaneval", "chat"), prompts=3, batch_sizes=(1,), temperatures=(0.0,),
    new_tokens=48, repeats=2)
