"""Every drafter of the framework on SmolLM2-135M (issue 18's table): prompt lookup, layer skip
(the searched set, with Kangaroo early exit, with VocabTrim) and each trained drafter shipped in
results/drafters (chain at several k, on the full vocabulary, and drafting a tree), EAGLE + TTT
after prompt lookup's copies (`lookup`, fixed and goodput-driven length), on held-out HumanEval
and chat prompts, greedy and t=1, batch 1 and 8.

  speculax bench --config drafters --out runs/bench   (~1 h on 2 CPU cores; --set to shrink)
"""
import pathlib

from speculax.bench.config import BenchConfig, method
from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.goodput import Goodput

DRAFTERS = pathlib.Path("results/drafters")
VOCAB_ORDER = DRAFTERS / "smollm2-135m-vocab-order.npy"  # the recipe corpus's token frequencies
VOCAB = 49152
# The tree each kind drafts in its tree row: EAGLE-2's dynamic tree for drafters that score a
# path as they grow it, Medusa's sparse static tree for the heads. Small trees: on this CPU a
# verify forward of 16 tokens costs ~2.6 one-token steps, of 8 ~2.
TREES = {"draft-model": DynamicTree(3, 3, 3), "eagle": DynamicTree(3, 3, 3),
         "medusa": StaticTree.full((3, 2, 1)), "hydra": StaticTree.full((3, 2, 1))}
# Trained drafters by row label: (registry kind, run folder name, chain lengths).
TRAINED = {"draft-model": ("draft-model", "distill-smollm2-fkl", (4,)),
           "medusa": ("medusa", "medusa-smollm2", (4,)),
           "hydra": ("hydra", "hydra-smollm2", (4,)),
           "eagle": ("eagle", "eagle-smollm2", (1, 2, 4)),
           "eagle-ttt": ("eagle", "eagle-ttt-smollm2", (1, 2, 4)),
           "eagle3": ("eagle", "eagle3-smollm2", (1, 2, 4))}


def methods(drafters=DRAFTERS, skip_k: int = 5, exit_threshold: float = 0.5,
            trim: int = 16384) -> tuple:
  """The rows: train-free first, then each trained drafter found under `drafters`."""
  rows = [method("prompt lookup", "prompt-lookup", k=4),
          method("layer skip", "layer-skip", k=skip_k),
          method(f"layer skip + exit {exit_threshold}", "layer-skip", k=skip_k,
                 exit_threshold=exit_threshold)]
  if VOCAB_ORDER.is_file():
    rows.append(method(f"layer skip + VocabTrim {trim}", "layer-skip", k=skip_k, vocab_trim=trim,
                       vocab_ids=str(VOCAB_ORDER)))
  for label in TRAINED:
    rows += trained_rows(label, drafters)
  return tuple(rows + lookup_rows("eagle-ttt", drafters))


def trained_rows(label: str, drafters=DRAFTERS, ks: tuple[int, ...] | None = None,
                 full_vocabulary: bool = True) -> list:
  """One trained drafter's rows (TRAINED[label]) if it is shipped under `drafters`: a chain at
  each k (default: its own lengths), the first k on the full vocabulary, and its tree."""
  kind, folder, own_ks = TRAINED[label]
  path = pathlib.Path(drafters) / folder
  if not path.is_dir():  # not trained or not shipped: research/train_drafters.py --ship
    return []
  ks = ks or own_ks
  heads = {"draft": str(path)} if kind == "draft-model" else {"heads": str(path)}
  rows = [method(f"{label} k={k}", kind, k=k, **heads) for k in ks]
  if full_vocabulary:
    rows.append(method(f"{label} k={ks[0]}, full vocabulary", kind, k=ks[0], **heads,
                       set={"vocab_trim": VOCAB}))
  rows.append(method(f"{label} tree ({TREES[kind].n_nodes} nodes)", kind, k=4, **heads,
                     tree=TREES[kind]))
  return rows


def lookup_rows(label: str, drafters=DRAFTERS) -> list:
  """The head drafter TRAINED[label] drafting where prompt lookup finds no match of at least 2
  (or 1, or 3) tokens, at k = 1-5 and goodput-driven k <= 4 (per match length: copies draft
  long, the head drafter short; its loop a chain of per-length loops, or a switch per step),
  beside prompt lookup's own goodput-driven length."""
  kind, folder, _ = TRAINED[label]
  path = pathlib.Path(drafters) / folder
  if not path.is_dir():
    return []
  heads = {"heads": str(path)}
  return [method("prompt lookup goodput k<=4", "prompt-lookup", k=4, goodput=True),
          *(method(f"{label} + lookup k={k}", kind, k=k, lookup=2, **heads)
            for k in (1, 2, 3, 4, 5)),
          method(f"{label} + lookup goodput k<=4", kind, k=4, lookup=2, goodput=True, **heads),
          method(f"{label} + lookup goodput k<=4 switch", kind, k=4, lookup=2,
                 goodput=Goodput(loop="switch"), **heads),
          method(f"{label} + lookup(1) goodput k<=4", kind, k=4, lookup=1, goodput=True,
                 **heads),
          method(f"{label} + lookup(3) k=3", kind, k=3, lookup=3, **heads),
          method(f"{label} + lookup(3) goodput k<=4", kind, k=4, lookup=3, goodput=True,
                 **heads)]


BENCH = BenchConfig(methods=methods(), suites=("humaneval", "chat"), prompts=3,
                    batch_sizes=(1, 8), temperatures=(0.0, 1.0), new_tokens=48)
