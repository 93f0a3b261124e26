"""What every subcommand shares: a parser whose errors are one line, and checked number types.

argparse's own error output is a usage block and then the message; a user who typed one bad flag
needs the message only (exit status 2, as argparse's), and `--help` for the rest.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from typing import get_args

from speculax.bench import methods
from speculax.core import multi_draft
from speculax.core.trees import parse_tree
from speculax.drafters import registry
from speculax.drafters.low_precision import DRAFT_DTYPES
from speculax.models.config import AttentionImpl


class Parser(argparse.ArgumentParser):
  def error(self, message: str):
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def count(lo: int):
  """An argparse type: an int >= lo (a count, a size, a seed), refused with its value otherwise."""
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"must be an int >= {lo}, got {text!r}") from None
    if value < lo:
      raise argparse.ArgumentTypeError(f"must be an int >= {lo}, got {value}")
    return value
  return parse


def add_drafter(p: argparse.ArgumentParser, default: str, allow_none: bool, k: int = 5) -> None:
  """--drafter and every option a drafter kind takes (registry.make's, and the fields no option
  sets), shared by generate and serve-bench; drafter_options(args) reads them back."""
  kinds = (*(("none",) if allow_none else ()), *registry.KINDS)
  p.add_argument("--drafter", default=default, choices=kinds,
                 help=("none = plain autoregressive decoding. " if allow_none else "")
                      + registry.describe())
  p.add_argument("-k", type=count(1), default=k, help="draft tokens per verify step (chains)")
  p.add_argument("--tree", default=None, metavar="SHAPE",
                 help="draft a token tree: 'full:3,2,1' (children per level) or "
                      "'dynamic:WIDTH,DEPTH,CHILDREN' (grown by draft probability); layer-skip, "
                      "draft-model, the trained heads and token-recycling (default: its own "
                      "template)")
  p.add_argument("--max-ngram", type=count(1), default=None,
                 help="prompt-lookup: longest n-gram matched (default 3)")
  p.add_argument("--min-ngram", type=count(1), default=None,
                 help="prompt-lookup: shortest n-gram matched (default 1)")
  p.add_argument("--skip", default=None, metavar="I,J,...",
                 help="layer-skip: target layers the drafter skips (default: searched on the "
                      "first 4 HumanEval prompts; '' skips none: with --draft-dtype the target "
                      "drafts from its own copy)")
  p.add_argument("--adapt", type=count(1), default=None, metavar="N",
                 help="layer-skip: also carry N more skip sets from the search and switch among "
                      "them on the fly by measured acceptance per draft cost (SWIFT-style)")
  p.add_argument("--draft-dtype", default=None, choices=DRAFT_DTYPES,
                 help="layer-skip, draft-model: the drafts read a copy of the drafting layers "
                      "and output layer in this dtype (the verify reads the target's own; "
                      "default: the weights as they are)")
  p.add_argument("--draft-model", default=None,
                 help="draft-model: a preset, .gguf file, HF folder or distilled run folder "
                      "sharing the target's vocabulary (default: the target's first "
                      "--draft-layers layers, untrained)")
  p.add_argument("--draft-layers", type=count(1), default=None,
                 help="draft-model: layers of the target to cut the default draft model from "
                      "(default 4; all of them: the target itself, with --draft-dtype drafting "
                      "from its own copy)")
  p.add_argument("--heads", default=None, metavar="FOLDER",
                 help=f"trained drafters ({', '.join(registry.TRAINED)}): the run folder "
                      "(drafter.json + drafter_params) that `speculax train --config "
                      "configs/<drafter>_smollm2.py` writes; -k at most its number of heads")
  p.add_argument("--drafts", type=count(1), default=None, metavar="N",
                 help="multi-draft-model: chains proposed per step (default 2)")
  p.add_argument("--rule", default=None, choices=tuple(multi_draft.RULES),
                 help="multi-draft-model: how the first level is verified, which fixes how its "
                      "drafts are drawn (default greedy: top n-1 plus one sampled, optimal)")
  p.add_argument("--max-lag", type=count(0), default=None, metavar="N",
                 help="eagle, hydra (prefix attention), draft-model with --goodput: plain "
                      "steps whose tokens the drafter feeds in one block before its next draft "
                      "(default 16; 0: every step)")
  p.add_argument("--stop-threshold", type=float, default=None, metavar="P",
                 help="eagle trained with an acceptance head: SpecDec++ adaptive length, a "
                      "chain stops once P(some draft rejected) exceeds P, in (0, 1)")
  p.add_argument("--vocab-trim", type=count(1), default=None, metavar="N",
                 help="VocabTrim: the drafter scores only the N tokens the target writes most "
                      "often (trained run folders carry the order; otherwise give --vocab-ids)")
  p.add_argument("--vocab-ids", default=None, metavar="FILE.npy",
                 help="VocabTrim: the target's token ids by frequency, most frequent first")
  p.add_argument("--exit-threshold", type=float, default=None, metavar="P",
                 help="early exit (Kangaroo): a chain ends before a draft whose top draft "
                      "probability is below P, in (0, 1)")
  p.add_argument("--lookup", type=count(1), default=None, metavar="N",
                 help="prompt lookup first: rows whose last N or more tokens occurred earlier "
                      "draft what followed them, the others the drafter's own chain (not for "
                      "draft models)")


def drafter_options(args) -> tuple[dict, dict]:
  """(registry.make options, drafter fields) the flags set; None: not set. The fields are the
  settings no build option takes (SpecDec++'s stop threshold, a multi-draft model's n and rule,
  the plain steps fed in one block)."""
  skip = None if args.skip is None else ints(args.skip, "--skip")
  options = {"tree": args.tree, "heads": args.heads, "skip": skip, "draft": args.draft_model,
             "draft_layers": args.draft_layers, "adapt": args.adapt,
             "draft_dtype": args.draft_dtype,
             "max_ngram": args.max_ngram, "min_ngram": args.min_ngram,
             "vocab_trim": args.vocab_trim, "vocab_ids": args.vocab_ids,
             "exit_threshold": args.exit_threshold, "lookup": args.lookup}
  fields = {name: value for name, value in (("stop_threshold", args.stop_threshold),
                                            ("max_lag", args.max_lag),
                                            ("n", args.drafts), ("rule", args.rule))
            if value is not None}
  return options, fields


def check_drafter_options(kind: str, options: dict, fields: dict) -> None:
  """Host-side, before the model loads: the options fit the kind (none takes none)."""
  parse_tree(options["tree"])  # a bad shape fails first, whatever else is wrong
  given = [k for k, v in {**options, **fields}.items() if v is not None]
  if kind == "none":
    if given:
      raise ValueError(f"--drafter none (autoregressive decoding) takes no drafter options, got "
                       f"{', '.join(given)}")
    return
  registry.check_options(kind, **options)
  for name in fields:
    if not any(f.name == name for f in dataclasses.fields(registry.get(kind))):
      flag = {"n": "drafts"}.get(name, name).replace("_", "-")
      raise ValueError(f"{kind} takes no --{flag}")


def ints(text: str, flag: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None


def add_runtime(p: argparse.ArgumentParser) -> None:
  """Flags for how the target (and a draft model cut from or loaded beside it) runs."""
  dtypes = ("float32", "bfloat16")
  p.add_argument("--dtype", default="float32", choices=dtypes,
                 help="weights (logits and sampling stay float32 whatever the dtypes)")
  p.add_argument("--compute-dtype", default="float32", choices=dtypes,
                 help="activations; bfloat16 (for accelerators: slower on CPU) rounds a verify "
                      "forward and a one-token step differently, so speculative greedy output "
                      "can part from autoregressive on a near tie (README 'bf16')")
  p.add_argument("--cache-dtype", default=None, choices=dtypes,
                 help="KV cache (default: the compute dtype); bfloat16 as for --compute-dtype")
  p.add_argument("--attention", default="xla", choices=get_args(AttentionImpl),
                 help="cache attention: XLA, or the Pallas tree-attention kernel (pallas: "
                      "the platform's backend; pallas-interpret runs anywhere, slowly)")


def runtime_loader(args):
  """models.load.load with the runtime flags applied: load(name) -> LoadedModel."""
  from speculax.models.load import load
  return functools.partial(load, dtype=args.dtype, compute_dtype=args.compute_dtype,
                           cache_dtype=args.cache_dtype, attention_impl=args.attention)


def build_drafter(name: str, model, load, options: dict, k: int, fields: dict | None = None):
  """(drafter, params) of registry kind `name` for the loaded target from the flags' options
  (None: not set; "draft" still a model name), as a benchmark method builds it; prints it."""
  drafter, params = methods.build_drafter(name, model, load, options, k, fields)
  print(f"drafter: {drafter}", file=sys.stderr)
  return drafter, params


def announce(args) -> None:
  """Every setting of the run, the defaults included, once, after the flags passed their checks
  and before the slow part: a log then says what ran."""
  given = {k: v for k, v in vars(args).items() if k not in ("run", "command")}
  print(f"speculax {args.command}: " + " ".join(f"{k}={v!r}" for k, v in given.items()),
        file=sys.stderr)


def fail(command: str, error: Exception) -> int:
  """The one-line report of a user error (bad value, missing file); exit status 2."""
  print(f"speculax {command}: error: {error}", file=sys.stderr)
  return 2
