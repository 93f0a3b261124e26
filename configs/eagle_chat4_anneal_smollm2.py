"""EAGLE + TTT annealed on the fourth round's data: the shipped eagle-chat4-smollm2 continues 700
updates at a lower peak rate (4e-4 with warmup and cosine, against the rounds' 1e-3, whose restart
first cost up to 0.014 of held-out 1 - TV) on the same 4400 rows and teacher cache
(runs/drafters/teacher-chat4), in another row order (seed 1); the same training-time test (LK,
VocabTrim 16384, depth 2 weighed half). Output in runs/eagle-chat4-anneal-smollm2. Stopped at
update 450 (2026-12-06): held-out 1 - TV at depth 1 under the exact law 0.613 from 0.610, not
shipped (README, "Held-out 1 - TV against the target's exact law")."""
import dataclasses

from speculax.configs.eagle_chat4_smollm2 import EXPERIMENT as EAGLE_CHAT4
from speculax.configs.smollm2_recipe import optim

EXPERIMENT = dataclasses.replace(
    EAGLE_CHAT4, name="eagle-chat4-anneal-smollm2", init_from="results/drafters/eagle-chat4-smollm2",
    distill=dataclasses.replace(EAGLE_CHAT4.distill, seed=1,
                                optim=optim(steps=700, learning_rate=4e-4)))
