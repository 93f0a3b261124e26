"""EAGLE from scratch in one hour of this CPU on the fourth chat round's data: the recipe's EAGLE
(one draft layer started as the identity, LK plus feature regression, VocabTrim 16384, lr 3e-3
with warmup and cosine, 8 rows an update) on eagle-chat4's 4400 rows (the recipe's answers, the
target's answers to 2394 everyday chat prompts, a fifth stdlib code) and its teacher cache
(runs/drafters/teacher-chat4), where the recipe's EAGLE read 1400 rows for 40 minutes. What one
stage buys when its data is the lineage's last; held out: the recipe's rows. Output in
runs/eagle-hour-smollm2. The hour's 1000 updates of 8 rows are a CPU without AVX-512's; on an
Intel Xeon with AVX-512, `train_drafters --drafters eagle_hour --steps 6600 --batch 4` fills it
(3443 s, held-out 1 - TV 0.604 at depth 1)."""
import dataclasses

from speculax.configs.eagle_chat4_smollm2 import EXPERIMENT as EAGLE_CHAT4
from speculax.configs.eagle_smollm2 import EXPERIMENT as EAGLE
from speculax.configs.smollm2_recipe import optim

EXPERIMENT = dataclasses.replace(
    EAGLE, name="eagle-hour-smollm2", teacher_dir=EAGLE_CHAT4.teacher_dir, data=EAGLE_CHAT4.data,
    distill=dataclasses.replace(EAGLE.distill, optim=optim(steps=1000)))
