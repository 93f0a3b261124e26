"""EAGLE + TTT with more chat: the shipped EAGLE + TTT (results/drafters/eagle-ttt-smollm2)
continues 300 updates of its 2-step training-time test (LK, VocabTrim 16384, lr 1e-3 with warmup and
cosine) on the recipe's answers plus the target's answers to 594 everyday chat prompts
(DataConfig.everyday_chat: the first 99 subjects outside the built-in split, training only), 2100
rows of which a fifth stdlib code; held out: the recipe's rows. The recipe's 1200 prompts hold 168
chat questions, and the bench's chat prompts are where its first draft was kept least. Output in
runs/eagle-chat-smollm2; its own teacher cache (runs/drafters/teacher-chat)."""
import dataclasses

from speculax.configs.eagle_ttt_smollm2 import EXPERIMENT as EAGLE_TTT
from speculax.configs.smollm2_recipe import optim

EXPERIMENT = dataclasses.replace(
    EAGLE_TTT, name="eagle-chat-smollm2", init_from="results/drafters/eagle-ttt-smollm2",
    teacher_dir="runs/drafters/teacher-chat",
    data=dataclasses.replace(EAGLE_TTT.data, rows=2100, everyday_chat=99),
    distill=dataclasses.replace(EAGLE_TTT.distill, optim=optim(steps=300, learning_rate=1e-3)))
