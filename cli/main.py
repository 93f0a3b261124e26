"""The `speculax` command: one subcommand per module in cli/."""
from __future__ import annotations

import sys

from speculax.cli import bench, export, generate, serve_bench, train
from speculax.cli.args import Parser, fail
from speculax.models import distributed


def main(argv: list[str] | None = None) -> int:
  """Runs one subcommand; a user error (bad flag, value or file) exits 2 with one line. Under
  scripts/launch.sh (SPECULAX_COORDINATOR ... set) it first joins the multi-process run."""
  distributed.initialize_from_env()
  parser = Parser(prog="speculax", description="Speculative decoding research framework in JAX.")
  sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  generate.add_parser(sub)
  train.add_parser(sub)
  serve_bench.add_parser(sub)
  export.add_parser(sub)
  bench.add_parser(sub)
  args = parser.parse_args(argv)
  try:
    return args.run(args)
  except (ValueError, FileNotFoundError) as e:
    return fail(args.command, e)


if __name__ == "__main__":
  sys.exit(main())
