"""A minutes-long version of medusa_smollm2.py, to check the whole pipeline end to end."""
from speculax.train.experiment import smoke

from speculax.configs.medusa_smollm2 import EXPERIMENT as FULL

EXPERIMENT = smoke(FULL)
