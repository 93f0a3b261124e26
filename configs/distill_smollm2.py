"""Distill a 6-layer draft (cut from SmolLM2-135M's layers) with forward KL on stdlib code."""
from speculax.train.distill import DistillConfig
from speculax.train.experiment import DataConfig, DistillExperiment
from speculax.train.optim import OptimConfig

EXPERIMENT = DistillExperiment(
    name="distill-smollm2-fkl",
    draft_layers=(0, 6, 12, 18, 24, 29),
    data=DataConfig(files=300, seq_len=256, rows=512, heldout_rows=32, top_k=32),
    distill=DistillConfig(divergence="fkl", batch_size=8,
                          optim=OptimConfig(learning_rate=3e-4, warmup_steps=20, total_steps=300)),
)
