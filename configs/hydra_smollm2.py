"""Hydra++ on SmolLM2-135M (frozen): 4 sequentially dependent heads of 4 residual blocks each,
with the prefix attention layer over the context's features, distilled from the target's top-32
log-probs (the teacher-distillation objective). Output in runs/hydra-smollm2, for
`speculax generate --drafter hydra --heads runs/hydra-smollm2 -k 4 [--tree full:3,2,1]`.
"""
import dataclasses

from speculax.configs.medusa_smollm2 import EXPERIMENT as MEDUSA
from speculax.configs.smollm2_recipe import VOCAB_TRIM
from speculax.drafters.hydra import Hydra

EXPERIMENT = dataclasses.replace(
    MEDUSA, name="hydra-smollm2",
    distill=dataclasses.replace(MEDUSA.distill,
                                drafter=Hydra(4, prefix_attention=True, mlp_layers=4,
                                              vocab_trim=VOCAB_TRIM)))
