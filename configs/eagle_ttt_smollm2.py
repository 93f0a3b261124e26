"""EAGLE with training-time test, the recipe's second stage: the shipped EAGLE
(results/drafters/eagle-smollm2, 1200 updates on its own depth-1 entries) continues for 500
updates with 2-step rollouts on its own features, so depth 2, where it drafts from its own
predicted feature instead of the target's, trains as it serves (EAGLE-3's training-time test on
EAGLE-1's single feature). Output in runs/eagle-ttt-smollm2."""
import dataclasses

from speculax.configs.eagle_smollm2 import EXPERIMENT as EAGLE
from speculax.configs.smollm2_recipe import optim

EXPERIMENT = dataclasses.replace(
    EAGLE, name="eagle-ttt-smollm2", init_from="results/drafters/eagle-smollm2",
    distill=dataclasses.replace(EAGLE.distill,
                                drafter=dataclasses.replace(EAGLE.distill.drafter, ttt_steps=2),
                                optim=optim(steps=500, learning_rate=1e-3)))
