"""PEARL (decode/pearl.py) against draft-then-verify with the same draft model and k, on one
device and with the draft model on a second device (async dispatch overlaps drafting and the
target's forward), batch 1 and 8, greedy. The draft models are untrained cuts of the target's
first layers: an 8-layer cut (cheap, rarely right) and a 24-layer cut (dearer, right more often).
SPECULAX_CPU_DEVICES=2 speculax bench --config pearl  (two CPU devices for the two-device rows)"""
from speculax.bench.config import BenchConfig, method

BENCH = BenchConfig(
    methods=tuple(
        row for layers in (8, 24) for row in (
            method(f"{layers}-layer cut k=3", "draft-model", k=3, draft_layers=layers),
            method(f"{layers}-layer cut PEARL one-device k=3", "draft-model", k=3,
                   draft_layers=layers, pearl="one-device"),
            method(f"{layers}-layer cut PEARL two-device k=3", "draft-model", k=3,
                   draft_layers=layers, pearl="two-device"))),
    suites=("humaneval",), prompts=2, batch_sizes=(1, 8), temperatures=(0.0,), new_tokens=48)
