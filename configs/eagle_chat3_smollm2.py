"""EAGLE + TTT with a third round of everyday chat: the shipped eagle-chat2-decay-smollm2 continues
600 updates of the same training-time test (LK, VocabTrim 16384, depth 2 weighed half, lr 1e-3 with
warmup and cosine) on the recipe's answers plus the target's answers to 1794 everyday chat prompts
(DataConfig.everyday_chat: the first 299 subjects of train/prompts.EVERYDAY_SUBJECTS, 100 more than
eagle-chat2's; training only), 3600 rows of which a fifth stdlib code; held out: the recipe's rows.
Output in runs/eagle-chat3-smollm2; its own teacher cache (runs/drafters/teacher-chat3)."""
import dataclasses

from speculax.configs.eagle_chat2_decay_smollm2 import EXPERIMENT as EAGLE_CHAT2_DECAY

EXPERIMENT = dataclasses.replace(
    EAGLE_CHAT2_DECAY, name="eagle-chat3-smollm2",
    init_from="results/drafters/eagle-chat2-decay-smollm2",
    teacher_dir="runs/drafters/teacher-chat3",
    data=dataclasses.replace(EAGLE_CHAT2_DECAY.data, rows=3600, everyday_chat=299))
