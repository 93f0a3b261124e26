"""What every subcommand shares: a parser whose errors are one line, and checked number types.

argparse's own error output is a usage block and then the message; a user who typed one bad flag
needs the message only (exit status 2, as argparse's), and `--help` for the rest.
"""
from __future__ import annotations

import argparse
import sys


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


def fail(command: str, error: Exception) -> int:
  """The one-line report of a user error (bad value, missing file); exit status 2."""
  print(f"speculax {command}: error: {error}", file=sys.stderr)
  return 2
