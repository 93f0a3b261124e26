"""EAGLE reading each token as the target's own residual after its first 2 layers (RMS-normed)
instead of its embedding (`Eagle.shallow_layers`, Kangaroo's shallow sub-network): the target's
layers 0-1 run on the pending token and each draft against the target's cache when drafting.
Started from the shipped EAGLE + TTT (results/drafters/eagle-ttt-smollm2; fc's token half at
zero, so it starts drafting from the target feature alone), its depth-1 entries trained as the
recipe's first stage (LK, VocabTrim 16384, lr 1e-3 with warmup and cosine). Output in
runs/eagle-shallow-smollm2."""
import dataclasses

from speculax.configs.eagle_smollm2 import EXPERIMENT as EAGLE
from speculax.configs.smollm2_recipe import optim

EXPERIMENT = dataclasses.replace(
    EAGLE, name="eagle-shallow-smollm2", init_from="results/drafters/eagle-ttt-smollm2",
    distill=dataclasses.replace(EAGLE.distill,
                                drafter=dataclasses.replace(EAGLE.distill.drafter,
                                                            shallow_layers=2),
                                optim=optim(steps=600, learning_rate=1e-3)))
