"""Train 4 Medusa heads on SmolLM2-135M (frozen) by the shared recipe (configs/smollm2_recipe.py:
the target's own answers plus stdlib code, VocabTrim 16384, the LK acceptance objective).

The heads read the target's final-normed features from the teacher cache, so training never
runs the target; the run ends with drafter.json + drafter_params in runs/medusa-smollm2, for
`speculax generate --drafter medusa --heads runs/medusa-smollm2 -k 4 [--tree full:3,2,1]`.
"""
from speculax.configs import smollm2_recipe as recipe
from speculax.drafters.medusa import Medusa
from speculax.train.experiment import DistillExperiment
from speculax.train.heads import HeadsConfig

EXPERIMENT = DistillExperiment(
    name="medusa-smollm2", data=recipe.DATA, teacher_dir=recipe.TEACHER_DIR,
    distill=HeadsConfig(Medusa(4, vocab_trim=recipe.VOCAB_TRIM), divergence=recipe.DIVERGENCE,
                        batch_size=8, optim=recipe.optim()),
    checkpoint_every=50, eval_every=100)
