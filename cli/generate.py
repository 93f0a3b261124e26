"""`speculax generate`: load a model, decode prompts, print the text and the speed."""
from __future__ import annotations

import argparse
import sys
import time

import jax

from speculax.cli.args import (add_drafter_tuning, add_runtime, build_drafter, count,
                               runtime_loader, tuning_options)
from speculax.core.sampling import SamplingConfig
from speculax.core.trees import parse_tree
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters import registry
from speculax.models.sharding import MeshConfig

DEFAULT_HUMANEVAL = 4


def add_parser(sub) -> None:
  p = sub.add_parser(
      "generate", help="generate text from prompts",
      description="Generate text with a Llama-family model. With no --prompt, the first "
                  f"{DEFAULT_HUMANEVAL} HumanEval prompts are used (see --humaneval).",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--model", default="smollm2-135m",
                 help="model preset name, a .gguf file, or a Hugging Face folder "
                      "(config.json + safetensors + tokenizer.json)")
  p.add_argument("--prompt", action="append", default=[],
                 help="prompt text; repeat the flag for a batch of prompts")
  p.add_argument("--humaneval", type=count(1), default=DEFAULT_HUMANEVAL,
                 help="number of HumanEval prompts to use when no --prompt is given")
  p.add_argument("--raw", action="store_true",
                 help="feed prompts as they are instead of wrapping them in the chat template")
  p.add_argument("--max-new-tokens", type=count(1), default=128,
                 help="new tokens per prompt at most")
  p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy")
  p.add_argument("--top-k", type=count(0), default=0,
                 help="keep the k most likely tokens; 0 = off")
  p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]; 1 = off")
  p.add_argument("--seed", type=count(0), default=0, help="random seed for sampling")
  p.add_argument("--drafter", default="none", choices=("none", *registry.KINDS),
                 help="speculative decoding drafter; none = plain autoregressive decoding. "
                      + registry.describe())
  p.add_argument("-k", type=count(1), default=5, help="draft tokens per verify step (chains)")
  p.add_argument("--tree", default=None, metavar="SHAPE",
                 help="draft a token tree: 'full:3,2,1' (children per level) or "
                      "'dynamic:WIDTH,DEPTH,CHILDREN' (grown by draft probability); layer-skip, "
                      "draft-model, medusa (static trees) and token-recycling (default: its own "
                      "template)")
  p.add_argument("--skip", default=None, metavar="I,J,...",
                 help="layer-skip: target layers the drafter skips (default: searched on the "
                      "first 4 HumanEval prompts)")
  p.add_argument("--adapt", type=count(1), default=None, metavar="N",
                 help="layer-skip: also carry N more skip sets from the search and switch among "
                      "them on the fly by measured acceptance per draft cost (SWIFT-style)")
  p.add_argument("--draft-model", default=None,
                 help="draft-model: a preset, .gguf file or HF folder sharing the target's "
                      "vocabulary (default: the target's first --draft-layers layers, untrained)")
  p.add_argument("--draft-layers", type=count(1), default=None,
                 help="draft-model: layers of the target to cut the default draft model from "
                      "(default 4)")
  p.add_argument("--heads", default=None, metavar="FOLDER",
                 help=f"trained drafters ({', '.join(registry.TRAINED)}): the run folder (drafter.json "
                      "+ drafter_params) that `speculax train --config "
                      "configs/<drafter>_smollm2.py` writes; -k at most its number of heads")
  add_drafter_tuning(p)
  add_runtime(p)
  p.add_argument("--mesh", default=None, metavar="DATA,FSDP,TENSOR",
                 help="run sharded on a device mesh of this shape, e.g. 4,1,2")
  p.set_defaults(run=run)


def _mesh(text: str | None) -> MeshConfig | None:
  if text is None:
    return None
  parts = text.split(",")
  if len(parts) != 3 or not all(x.strip().isdigit() for x in parts):
    raise ValueError(f"--mesh must be three integers DATA,FSDP,TENSOR, got {text!r}")
  return MeshConfig(*(int(x) for x in parts))


def run(args) -> int:
  from speculax.models.assets import humaneval_prompts

  sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
  mesh, tree = _mesh(args.mesh), parse_tree(args.tree)
  options = _options(args, tree)
  if args.drafter != "none":  # before the model load, which takes seconds
    registry.check_options(args.drafter, **options)
  elif any(v is not None for v in options.values()):
    given = ", ".join(k for k, v in options.items() if v is not None)
    raise ValueError(f"--drafter none (autoregressive decoding) takes no drafter options, got "
                     f"{given}")
  if args.prompt and any(not p.strip() for p in args.prompt):
    raise ValueError("--prompt is empty")
  texts = args.prompt or humaneval_prompts(args.humaneval)
  t = time.perf_counter()
  load = runtime_loader(args)
  model = load(args.model)
  print(f"loaded {args.model} in {time.perf_counter() - t:.1f} s "
        f"({model.config.n_layers} layers, d={model.config.d_model}, "
        f"vocab {model.config.vocab_size}) on {jax.devices()[0].platform}: "
        f"{model.config.runtime}", file=sys.stderr)
  tok = model.tokenizer
  prompts = [tok.encode(x if args.raw else tok.chat_prompt(x)) for x in texts]
  drafter, dparams = (None, None) if args.drafter == "none" else build_drafter(
      args.drafter, model, load, options, args.k)
  key = jax.random.key(args.seed)
  if drafter is None:
    gen = GenerateConfig(max_new_tokens=args.max_new_tokens, sampling=sampling, eos_ids=tok.eos_ids)
    out = generate(model.params, model.config, prompts, gen, key, mesh=mesh, warmup=True)
  else:
    spec = SpecConfig(k=args.k, max_new_tokens=args.max_new_tokens, sampling=sampling,
                      eos_ids=tok.eos_ids)
    out = speculative_generate(model.params, model.config, prompts, drafter, spec,
                               drafter_params=dparams, key=key, mesh=mesh, warmup=True)
  for i, (text, ids) in enumerate(zip(texts, out.tokens)):
    print(f"=== prompt {i}: {text.strip().splitlines()[0][:70]!r}")
    print(tok.decode(ids))
  print(f"--- {args.drafter}: {len(prompts)} prompts, {out.summary()}")
  return 0


def _options(args, tree) -> dict:
  """The registry options the flags set (None: not set); --draft-model is still a name here."""
  skip = None if args.skip is None else _ints(args.skip, "--skip")
  return {"tree": tree, "heads": args.heads, "skip": skip, "draft": args.draft_model,
          "draft_layers": args.draft_layers, "adapt": args.adapt, **tuning_options(args)}


def _ints(text: str, flag: str) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
