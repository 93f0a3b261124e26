"""Trees against chains: layer skip and the untrained draft model (the target's first 4 layers) as
a chain, Token Recycling's static tree and a dynamic tree, plus Token Recycling (cold, and hot:
its matrix carried from prompt to prompt) and prompt lookup; SmolLM2-135M, batch 1, greedy and
t=1, held-out HumanEval prompts.

  speculax bench --config trees --out runs/bench   (~20 min on 2 CPU cores)
"""
from speculax.bench.config import BenchConfig, method
from speculax.core.trees import DynamicTree
from speculax.drafters.token_recycling import DEFAULT_TREE

K = 5
# Both trees reach depth k = 5 like the chains; the static one holds the rank-0 chain, so under
# greedy decoding it keeps at least what the chain keeps.
STATIC = DEFAULT_TREE  # 18 nodes, 4-6-4-3-1 per level (drafters/token_recycling.py)
DYNAMIC = DynamicTree(width=4, depth=5, children=4)  # 4 x 5 = 20 nodes
SHAPES = {"chain": None, f"static {STATIC.n_nodes}": STATIC, f"dynamic {DYNAMIC.n_nodes}": DYNAMIC}

BENCH = BenchConfig(
    methods=(
        method("prompt-lookup chain", "prompt-lookup", k=K),
        method(f"token-recycling static {STATIC.n_nodes} cold", "token-recycling", k=K),
        method(f"token-recycling static {STATIC.n_nodes} hot", "token-recycling", k=K, hot=True),
        *(method(f"layer-skip {name}", "layer-skip", k=K, skip=(14,), tree=tree)
          for name, tree in SHAPES.items()),
        *(method(f"draft-model {name}", "draft-model", k=K, draft_layers=4, tree=tree)
          for name, tree in SHAPES.items()),
    ),
    suites=("humaneval",), prompts=4, batch_sizes=(1,), temperatures=(0.0, 1.0), new_tokens=64)
