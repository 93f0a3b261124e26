"""A minutes-long version of medusa_smollm2.py, to check the whole pipeline end to end."""
from speculax.configs.medusa_smollm2 import EXPERIMENT as FULL
from speculax.train.experiment import smoke

EXPERIMENT = smoke(FULL)
