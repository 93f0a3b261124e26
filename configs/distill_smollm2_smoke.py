"""A minutes-long version of distill_smollm2.py, to check the whole pipeline end to end."""
from speculax.configs.distill_smollm2 import EXPERIMENT as FULL
from speculax.train.experiment import smoke

EXPERIMENT = smoke(FULL)
