"""EAGLE + TTT leaning on its first draft: the shipped eagle-chat2-smollm2 continues 600 updates
of its 2-step training-time test on the same data and teacher cache (configs/eagle_chat2_smollm2.py:
LK, VocabTrim 16384, lr 1e-3 with warmup and cosine), with depth 2's losses weighed half of depth
1's (HeadsConfig.depth_decay 0.5; the plain mean weighs them alike). Depth 1 alone for 300 updates
raised held-out depth 1 from 0.554 to 0.561 (a one-off probe); the decay keeps training depth 2,
which every draft past the first needs. Measured since: the same 600 updates at the plain mean do
as well (README, "Leaning on the first draft"). Output in runs/eagle-chat2-decay-smollm2."""
import dataclasses

from speculax.configs.eagle_chat2_smollm2 import EXPERIMENT as EAGLE_CHAT2
from speculax.configs.smollm2_recipe import optim

EXPERIMENT = dataclasses.replace(
    EAGLE_CHAT2, name="eagle-chat2-decay-smollm2", init_from="results/drafters/eagle-chat2-smollm2",
    distill=dataclasses.replace(EAGLE_CHAT2.distill, depth_decay=0.5,
                                optim=optim(steps=600, learning_rate=1e-3)))
