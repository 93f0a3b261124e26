"""What every subcommand shares: a parser whose errors are one line, and checked number types.

argparse's own error output is a usage block and then the message; a user who typed one bad flag
needs the message only (exit status 2, as argparse's), and `--help` for the rest.
"""
from __future__ import annotations

import argparse
import sys

from speculax.drafters import registry


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
  if options.get("draft") is not None:
    other = load(options["draft"])
    options["draft"] = (other.config, other.params)
  drafter, params = registry.make(name, model.params, model.config, **options)
  print(f"drafter: {drafter}", file=sys.stderr)
  return drafter, params


def fail(command: str, error: Exception) -> int:
  """The one-line report of a user error (bad value, missing file); exit status 2."""
  print(f"speculax {command}: error: {error}", file=sys.stderr)
  return 2
