"""What every subcommand shares: a parser whose errors are one line, and checked number types.

argparse's own error output is a usage block and then the message; a user who typed one bad flag
needs the message only (exit status 2, as argparse's), and `--help` for the rest.
"""
from __future__ import annotations

import argparse
import functools
import sys
from typing import get_args

from speculax.drafters import heads_io, registry
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


def add_drafter_tuning(p: argparse.ArgumentParser) -> None:
  """Flags for what every drafter with an output layer or a chain law can tune (registry.COMMON)."""
  p.add_argument("--vocab-trim", type=count(1), default=None, metavar="N",
                 help="VocabTrim: the drafter scores only the N tokens the target writes most "
                      "often (trained run folders carry the order; otherwise give --vocab-ids)")
  p.add_argument("--vocab-ids", default=None, metavar="FILE.npy",
                 help="VocabTrim: the target's token ids by frequency, most frequent first")
  p.add_argument("--exit-threshold", type=float, default=None, metavar="P",
                 help="early exit (Kangaroo): a chain ends before a draft whose top draft "
                      "probability is below P, in (0, 1)")


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


def tuning_options(args) -> dict:
  return {"vocab_trim": args.vocab_trim, "vocab_ids": args.vocab_ids,
          "exit_threshold": args.exit_threshold}


def build_drafter(name: str, model, load, options: dict, k: int):
  """(drafter, params) of registry kind `name` for the loaded target from the flags' options
  (None: not set; "draft" still a model name). Adds what a kind needs from the run: the k a
  layer-skip search aims at and its calibration prompts (the first 4 HumanEval prompts)."""
  options = dict(options)
  takes = registry.options(name)
  if "k" in takes:
    options["k"] = k
  if "calibration" in takes and options.get("skip") is None:
    from speculax.models.assets import humaneval_prompts
    tok = model.tokenizer
    options["calibration"] = [tok.encode(tok.chat_prompt(p)) for p in humaneval_prompts(4)]
  if options.get("draft") is not None and not heads_io.is_saved(options["draft"]):
    other = load(options["draft"])  # a model; a distilled run folder loads as a drafter
    options["draft"] = (other.config, other.params)
  drafter, params = registry.make(name, model.params, model.config, **options)
  print(f"drafter: {drafter}", file=sys.stderr)
  return drafter, params


def fail(command: str, error: Exception) -> int:
  """The one-line report of a user error (bad value, missing file); exit status 2."""
  print(f"speculax {command}: error: {error}", file=sys.stderr)
  return 2
