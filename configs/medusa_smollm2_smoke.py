"""A minutes-long version of medusa_smollm2.py, to check the whole pipeline end to end."""
import dataclasses

from train.experiment import DataConfig

from configs.medusa_smollm2 import EXPERIMENT as FULL

EXPERIMENT = dataclasses.replace(
    FULL, name="medusa-smollm2-smoke",
    data=DataConfig(files=40, seq_len=128, rows=32, heldout_rows=8, top_k=32),
    distill=dataclasses.replace(FULL.distill, optim=dataclasses.replace(
        FULL.distill.optim, warmup_steps=2, total_steps=12)),
    checkpoint_every=6, log_every=2, eval_every=6)
