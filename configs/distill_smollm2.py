"""Distill a 6-layer draft (cut from SmolLM2-135M's layers) with forward KL, on the shared
recipe's data (configs/smollm2_recipe.py: the target's own answers plus stdlib code)."""
from speculax.configs import smollm2_recipe as recipe
from speculax.train.distill import DistillConfig
from speculax.train.experiment import DistillExperiment

EXPERIMENT = DistillExperiment(
    name="distill-smollm2-fkl",
    draft_layers=(0, 6, 12, 18, 24, 29),
    data=recipe.DATA, teacher_dir=recipe.TEACHER_DIR,
    distill=DistillConfig(divergence="fkl", batch_size=8,
                          optim=recipe.optim(300, learning_rate=3e-4)),
)
