"""EAGLE + TTT with a fourth round of everyday chat: the shipped eagle-chat3-smollm2 continues 600
updates of the same training-time test (LK, VocabTrim 16384, depth 2 weighed half, lr 1e-3 with
warmup and cosine) on the recipe's answers plus the target's answers to 2394 everyday chat prompts
(DataConfig.everyday_chat: the first 399 subjects of train/prompts.EVERYDAY_SUBJECTS, 100 more than
eagle-chat3's; training only), 4400 rows of which a fifth stdlib code; held out: the recipe's rows.
Output in runs/eagle-chat4-smollm2; its own teacher cache (runs/drafters/teacher-chat4)."""
import dataclasses

from speculax.configs.eagle_chat3_smollm2 import EXPERIMENT as EAGLE_CHAT3

EXPERIMENT = dataclasses.replace(
    EAGLE_CHAT3, name="eagle-chat4-smollm2",
    init_from="results/drafters/eagle-chat3-smollm2",
    teacher_dir="runs/drafters/teacher-chat4",
    data=dataclasses.replace(EAGLE_CHAT3.data, rows=4400, everyday_chat=399))
