"""A minutes-long version of medusa_smollm2.py, to check the whole pipeline end to end."""
from train.experiment import smoke

from configs.medusa_smollm2 import EXPERIMENT as FULL

EXPERIMENT = smoke(FULL)
