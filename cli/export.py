"""`speculax export MODEL FOLDER`: a Hugging Face-style folder to carry to an offline machine."""
from __future__ import annotations

import argparse
import pathlib

from speculax.models.export import DTYPES


def add_parser(sub) -> None:
  p = sub.add_parser(
      "export", help="write a model as a Hugging Face-style folder",
      description="Write config.json, tokenizer files and sharded safetensors that "
                  "`speculax generate --model FOLDER` (or speculax.models.load.load) reads "
                  "back: a way to move weights to an accelerator machine with no network.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("model", help="model preset name, a .gguf file, or a Hugging Face folder")
  p.add_argument("folder", type=pathlib.Path, help="output folder (created; must be empty)")
  p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES),
                 help="dtype of the written weights")
  p.add_argument("--shard-mb", type=float, default=60,
                 help="largest safetensors shard, in MB (10**6 bytes)")
  p.add_argument("--overwrite", action="store_true",
                 help="write into a non-empty folder, replacing earlier weights")
  p.set_defaults(run=run)


def run(args) -> int:
  from speculax.models.export import export
  from speculax.models.load import load
  model = load(args.model)
  for path in export(model, args.folder, dtype=args.dtype, shard_mb=args.shard_mb,
                     overwrite=args.overwrite):
    print(f"{path.stat().st_size / 1e6:10.2f} MB  {path}")
  return 0
