"""Train an EAGLE drafter (one decoder layer on the final features) on SmolLM2-135M (frozen),
by the shared recipe (configs/smollm2_recipe.py: the target's own answers plus stdlib code,
VocabTrim 16384).

The LK objective (-log expected acceptance) on the next-next token plus EAGLE-1's feature
regression; the SpecDec++ acceptance
head trains alongside. Ends with drafter.json + drafter_params in runs/eagle-smollm2, for
`speculax generate --drafter eagle --heads runs/eagle-smollm2 [-k 6 | --tree dynamic:4,5,4]`.
"""
import dataclasses

from speculax.configs.medusa_smollm2 import EXPERIMENT as MEDUSA
from speculax.configs.smollm2_recipe import VOCAB_TRIM
from speculax.drafters.eagle import Eagle

EXPERIMENT = dataclasses.replace(
    MEDUSA, name="eagle-smollm2",
    distill=dataclasses.replace(MEDUSA.distill, drafter=Eagle(vocab_trim=VOCAB_TRIM)))
