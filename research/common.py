"""What the research scripts share beyond speculax.bench: the bandwidth probe, verify cost, the
transformers peer."""
from __future__ import annotations

import pathlib
import statistics
import time

import jax
import jax.numpy as jnp

from speculax.bench.measure import forward_seconds
from speculax.bench.methods import build_drafter
from speculax.cli.args import add_drafter, check_drafter_options, drafter_options
from speculax.drafters import heads_io, registry
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models.assets import humaneval_prompts
from speculax.models.load import load

# Where research scripts write: never over the committed results/ unless told (`--out results`
# refreshes the README's tables).
OUT = pathlib.Path("runs/results")


def add_target_and_out(ap) -> None:
  """--model (the target) and --out (the output folder), the same in every research script."""
  ap.add_argument("--model", default="smollm2-135m",
                  help="the target: a preset, a .gguf file or a Hugging Face folder")
  ap.add_argument("--out", type=pathlib.Path, default=OUT,
                  help="folder for the JSON and plots (`--out results` replaces the committed "
                       "ones)")


def add_loop_runs(ap, prompts: int, drafter: bool = False) -> None:
  """--prompts, --batch, --repeats, --new-tokens, -k (and with `drafter` --drafter with every
  option `speculax generate` takes, read back by loop_drafter): the interleaved loop comparisons
  of research/goodput_*.py."""
  ap.add_argument("--prompts", type=int, default=prompts, help="prompts (a multiple of --batch)")
  ap.add_argument("--batch", type=int, default=1, help="prompts decoded at once")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--new-tokens", type=int, default=48)
  if drafter:  # default None: prompt lookup, or the kind a --heads run folder holds
    add_drafter(ap, default=None, allow_none=False, k=4)
  else:
    ap.add_argument("-k", type=int, default=4, help="the most a step drafts")


def _drafter_kind(args) -> str:
  """--drafter, or without it the kind a --heads run folder holds (FileNotFoundError for a
  folder with no drafter), else prompt lookup."""
  return args.drafter or (heads_io.saved_kind(args.heads) if args.heads else PromptLookup.name)


def loop_drafter(args, model) -> registry.LoadedDrafter:
  """The drafter add_loop_runs(drafter=True)'s flags name for the loaded target (options that do
  not fit its kind: ValueError, from the registry)."""
  options, fields = drafter_options(args)
  return build_drafter(_drafter_kind(args), model, load, options, args.k, fields)


def drafter_label(args) -> str:
  """loop_drafter's drafter as a run's JSON names it: the --heads run folder or the kind, then
  the other options given ("draft-model draft_layers=1", "runs/eagle lookup=2")."""
  options, fields = drafter_options(args)
  given = [f"{n}={v}" for n, v in {**options, **fields}.items()
           if v is not None and n != "heads"]
  return " ".join([args.heads or _drafter_kind(args), *given])


def parse_loop_runs(ap, argv):
  """The parsed arguments, a bad prompt count (and drafter flags that do not fit the drafter) a
  usage error naming the values."""
  args = ap.parse_args(argv)
  if args.batch < 1 or args.prompts < args.batch or args.prompts % args.batch:
    ap.error(f"--prompts must be a positive multiple of --batch, got {args.prompts} and "
             f"{args.batch}")
  if hasattr(args, "drafter"):  # before the model loads, which takes seconds
    try:
      check_drafter_options(_drafter_kind(args), *drafter_options(args))
    except (ValueError, FileNotFoundError) as e:
      ap.error(str(e))
  return args


def prompt_batches(args, tokenizer) -> list[list[list[int]]]:
  """args.prompts chat-wrapped HumanEval prompts (the 6th on: the first ones calibrate layer
  skip's search), args.batch at a time."""
  ids = [tokenizer.encode(tokenizer.chat_prompt(p))
         for p in humaneval_prompts(5 + args.prompts)[5:]]
  return [ids[i:i + args.batch] for i in range(0, len(ids), args.batch)]


def read_bandwidth(n_bytes: int = 512 << 20, repeats: int = 5) -> float:
  """Bytes per second that a jitted XLA reduction streams from memory (all cores).

  Decoding one token reads every weight once, so weight bytes / this rate is the time floor
  of a decode step.
  """
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    total(x).block_until_ready()
    times.append(time.perf_counter() - t)
  return n_bytes / min(times)


def verify_cost(model, k: int, repeats: int = 20) -> float:
  """A (k + 1)-token forward over a one-token one: what a verify step costs in one-token target
  steps on this machine."""
  return forward_seconds(model, k + 1, repeats) / forward_seconds(model, 1, repeats)


def median(xs) -> float:
  return statistics.median(xs)


def hf_model(name_or_path: str = "smollm2-135m"):
  """The target `load(name_or_path)` reads, in transformers (torch, fp32, CPU) from the same
  file: the peer. A checkpoint preset reads its GGUF, a .gguf file itself, else a Hugging Face
  folder."""
  import torch
  import transformers

  from speculax.models.load import CHECKPOINT_PRESETS
  path = (CHECKPOINT_PRESETS[name_or_path]() if name_or_path in CHECKPOINT_PRESETS
          else pathlib.Path(name_or_path))
  gguf = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path.parent if gguf else path, dtype=torch.float32, **gguf)
  return model.eval()
