"""EAGLE + TTT with twice the everyday chat: the shipped eagle-chat-smollm2 continues 300 updates
of the same training-time test (LK, VocabTrim 16384, lr 1e-3 with warmup and cosine) on the
recipe's answers plus the target's answers to 1194 everyday chat prompts (DataConfig.everyday_chat:
the first 199 subjects of train/prompts.EVERYDAY_SUBJECTS, the 99 of eagle-chat-smollm2 and 100
more; training only), 2800 rows of which a fifth stdlib code; held out: the recipe's rows. Output in
runs/eagle-chat2-smollm2; its own teacher cache (runs/drafters/teacher-chat2)."""
import dataclasses

from speculax.configs.eagle_chat_smollm2 import EXPERIMENT as EAGLE_CHAT

EXPERIMENT = dataclasses.replace(
    EAGLE_CHAT, name="eagle-chat2-smollm2", init_from="results/drafters/eagle-chat-smollm2",
    teacher_dir="runs/drafters/teacher-chat2",
    data=dataclasses.replace(EAGLE_CHAT.data, rows=2800, everyday_chat=199))
