"""A minutes-long version of distill_smollm2.py, to check the whole pipeline end to end."""
from train.experiment import smoke

from configs.distill_smollm2 import EXPERIMENT as FULL

EXPERIMENT = smoke(FULL)
