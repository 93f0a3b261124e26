"""PEARL (decode/pearl.py) against draft-then-verify with the same draft model and k, on one
device and with the draft model on a second device (async dispatch overlaps drafting and the
target's forward), batch 1 and 8, greedy. The draft models are untrained cuts of the target's
first layers: an 8-layer cut (cheap, rarely right) and a 24-layer cut (dearer, right more often).
The "int8 copy" rows draft with the target itself read from its int8 copy (every layer, right
nearly always, ~0.4 of a target step a draft), beside layer skip drafting from the same copy
through the target's own cache.
SPECULAX_CPU_DEVICES=2 speculax bench --config pearl  (two CPU devices for the two-device rows)"""
from speculax.bench.config import BenchConfig, method

INT8_COPY = dict(draft_layers=30, draft_dtype="int8")  # SmolLM2's 30 layers: the whole target

BENCH = BenchConfig(
    methods=(
        *(row for layers in (8, 24) for row in (
            method(f"{layers}-layer cut k=3", "draft-model", k=3, draft_layers=layers),
            method(f"{layers}-layer cut PEARL one-device k=3", "draft-model", k=3,
                   draft_layers=layers, pearl="one-device"),
            method(f"{layers}-layer cut PEARL two-device k=3", "draft-model", k=3,
                   draft_layers=layers, pearl="two-device"))),
        method("int8 self (layer skip) k=4", "layer-skip", k=4, skip=(), draft_dtype="int8"),
        *(row for k in (4, 6) for row in (
            method(f"int8 copy k={k}", "draft-model", k=k, **INT8_COPY),
            method(f"int8 copy PEARL one-device k={k}", "draft-model", k=k, pearl="one-device",
                   **INT8_COPY),
            method(f"int8 copy PEARL two-device k={k}", "draft-model", k=k, pearl="two-device",
                   **INT8_COPY)))),
    suites=("humaneval",), prompts=2, batch_sizes=(1, 8), temperatures=(0.0,), new_tokens=48)
