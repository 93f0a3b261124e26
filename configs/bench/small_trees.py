"""EAGLE + TTT's first draft widened instead of lengthened (issue 18's chat goal): the chain at k =
1 and 2 against EAGLE-2 trees of the top 2 or 3 first drafts, 2 x 2 nodes over two levels, and a
static 3-node tree (the top two first drafts, the first one's top child), on held-out HumanEval and
chat prompts, batch 1, greedy, two rounds. On chat, which repeats itself little, the first draft is
kept ~42% of the time; a sibling costs one more verify row and no drafting.

  speculax bench --config small_trees   (~12 min on 2 CPU cores)
"""
from speculax.bench.config import BenchConfig, method
from speculax.core.trees import DynamicTree, StaticTree

HEADS = {"heads": "results/drafters/eagle-ttt-smollm2"}

BENCH = BenchConfig(
    methods=(method("eagle-ttt k=1", "eagle", k=1, **HEADS),
             method("eagle-ttt top 2", "eagle", k=1, tree=DynamicTree(2, 1, 2), **HEADS),
             method("eagle-ttt top 3", "eagle", k=1, tree=DynamicTree(3, 1, 3), **HEADS),
             method("eagle-ttt 2 x 2", "eagle", k=2, tree=DynamicTree(2, 2, 2), **HEADS),
             method("eagle-ttt static 3", "eagle", k=2,
                    tree=StaticTree(((0,), (1,), (0, 0))), **HEADS),
             method("eagle-ttt k=2", "eagle", k=2, **HEADS)),
    suites=("humaneval", "chat"), prompts=3, batch_sizes=(1,), temperatures=(0.0,),
    new_tokens=48, repeats=2)
