"""The `speculax` command: one subcommand per module in cli/."""
from __future__ import annotations

import argparse
import sys

from cli import generate, serve_bench, train


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="speculax", description="Speculative decoding research framework in JAX.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  generate.add_parser(sub)
  train.add_parser(sub)
  serve_bench.add_parser(sub)
  args = parser.parse_args(argv)
  try:
    return args.run(args)
  except (ValueError, FileNotFoundError) as e:
    print(f"speculax {args.command}: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
