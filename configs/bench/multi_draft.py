"""Multi-draft verification (issue 21) at equal draft budgets: a draft model cut from the target's
first 24 of 30 layers (untrained: a cut of 4 accepts almost nothing, which leaves the rules
nothing to tell apart; this one is for comparing tau, not for speed) as one chain of 6, as 3
chains of 2 verified by each rule, and as a 6-node static tree (recursive rejection), at t=1
and greedy, batch 1 and 8.

  speculax bench --config multi_draft --out runs/bench
"""
from speculax.bench.config import BenchConfig, method
from speculax.core.multi_draft import RULES
from speculax.core.trees import StaticTree

CUT = dict(draft_layers=24)

BENCH = BenchConfig(
    methods=(
        method("draft model chain k=6", "draft-model", k=6, **CUT),
        method("draft model tree 3x2", "draft-model", k=2, tree=StaticTree.full((3, 1)), **CUT),
        *(method(f"3 drafts x 2, {rule}", "multi-draft-model", k=2, set={"n": 3, "rule": rule},
                 **CUT) for rule in RULES),
    ),
    suites=("humaneval",), prompts=3, batch_sizes=(1, 8), temperatures=(1.0, 0.0), new_tokens=48)
