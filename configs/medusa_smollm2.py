"""Train 4 Medusa heads on SmolLM2-135M (frozen) with forward KL, on stdlib code.

The heads read the target's final-normed features from the teacher cache, so training never
runs the target; the run ends with drafter.json + drafter_params in runs/medusa-smollm2, for
`speculax generate --drafter medusa --heads runs/medusa-smollm2 -k 4 [--tree full:3,2,1]`.
"""
from speculax.drafters.medusa import Medusa
from speculax.train.experiment import DataConfig, DistillExperiment
from speculax.train.heads import HeadsConfig
from speculax.train.optim import OptimConfig

EXPERIMENT = DistillExperiment(
    name="medusa-smollm2",
    data=DataConfig(files=300, seq_len=256, rows=512, heldout_rows=32, top_k=32),
    distill=HeadsConfig(Medusa(4), divergence="fkl", batch_size=8,
                        optim=OptimConfig(learning_rate=1e-3, warmup_steps=20, total_steps=300)),
)
