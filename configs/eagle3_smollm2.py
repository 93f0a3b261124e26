"""EAGLE-3 on SmolLM2-135M: low/middle/high features (layers 2, 15, 27) fused, and 3-step
training-time-test rollouts on the drafter's own features. Output in runs/eagle3-smollm2."""
import dataclasses

from speculax.configs.eagle_smollm2 import EXPERIMENT as EAGLE
from speculax.configs.smollm2_recipe import VOCAB_TRIM
from speculax.drafters.eagle import Eagle

EXPERIMENT = dataclasses.replace(
    EAGLE, name="eagle3-smollm2",
    distill=dataclasses.replace(EAGLE.distill, drafter=Eagle.eagle3(30, vocab_trim=VOCAB_TRIM)))
