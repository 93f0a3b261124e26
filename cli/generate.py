"""`speculax generate`: load a model, decode prompts, print the text and the speed."""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

from speculax.bench import suites
from speculax.cli.args import (
  add_drafter,
  add_runtime,
  announce,
  build_drafter,
  check_drafter_options,
  count,
  drafter_options,
  runtime_loader,
)
from speculax.core.sampling import SamplingConfig
from speculax.decode.calibrate import calibrate
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.goodput import Goodput
from speculax.decode.pearl import FORMS, draft_device, pearl_generate
from speculax.decode.speculative import speculative_generate
from speculax.models.sharding import MeshConfig
from speculax.verifiers.judge import Judge
from speculax.verifiers.typical import Typical

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
  p.add_argument("--prompts", default=None, metavar="FILE",
                 help="prompts from a file: JSON lines {\"prompt\": text, \"chat\": bool} or "
                      "one chat prompt per line")
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
  add_drafter(p, default="none", allow_none=True)
  add_runtime(p)
  p.add_argument("--goodput", action="store_true",
                 help="goodput-driven draft length (SmartSpec): each step drafts the 0..k "
                      "with the most expected tokens per second, from step costs timed first "
                      "on these prompts (chains only)")
  p.add_argument("--lossy-typical", nargs="?", const="0.09,0.3", default=None,
                 metavar="THRESHOLD,ALPHA",
                 help="LOSSY: Medusa's typical acceptance instead of the lossless rule (chains, "
                      "sampled decoding; default 0.09,0.3): faster, no longer the target's law")
  p.add_argument("--lossy-judge", default=None, metavar="FILE",
                 help="LOSSY: also keep drafts a judge head (.npz, research/train_judge.py) "
                      "calls correct (chains, greedy too): faster, no longer the target's output")
  p.add_argument("--judge-threshold", type=float, default=None, metavar="P",
                 help="the judge's score above which it keeps a draft (default: the file's)")
  p.add_argument("--pearl", choices=FORMS, default=None,
                 help="PEARL: the draft model (--drafter draft-model, a chain) drafts while the "
                      "target verifies; two-device puts it on the second device (on CPU: "
                      "SPECULAX_CPU_DEVICES=2)")
  p.add_argument("--rows", type=count(1), default=None, metavar="N",
                 help="continuous batching: decode the prompts N at a time, each finished row "
                      "refilled with the next prompt (default: all prompts as one batch)")
  p.add_argument("--mesh", default=None, metavar="DATA,FSDP,TENSOR",
                 help="run sharded on a device mesh of this shape, e.g. 4,1,2")
  p.add_argument("--compare", action="store_true",
                 help="then decode the same prompts autoregressively (same sampling, seed and "
                      "batching) and print the drafter's tokens/s over it and, greedy, on how "
                      "many prompts the output is the same: one run each, compile apart")
  p.add_argument("--json", action="store_true",
                 help="print the texts and metrics as one JSON object on stdout instead")
  p.set_defaults(run=run)


def _mesh(text: str | None) -> MeshConfig | None:
  if text is None:
    return None
  parts = text.split(",")
  if len(parts) != 3 or not all(x.strip().isdigit() for x in parts):
    raise ValueError(f"--mesh must be three integers DATA,FSDP,TENSOR, got {text!r}")
  return MeshConfig(*(int(x) for x in parts))


def _typical(text: str) -> Typical:
  parts = text.split(",")
  try:
    values = [float(x) for x in parts]
  except ValueError:
    values = []
  if len(values) != 2:
    raise ValueError(f"--lossy-typical must be two numbers THRESHOLD,ALPHA, got {text!r}")
  return Typical(*values)  # checks each is in (0, 1)


def _lossy(args) -> Typical | Judge | None:
  if args.lossy_typical is not None and args.lossy_judge is not None:
    raise ValueError("--lossy-typical and --lossy-judge are two rules; give one")
  if args.judge_threshold is not None and args.lossy_judge is None:
    raise ValueError("--judge-threshold goes with --lossy-judge FILE")
  if args.lossy_judge is not None:
    if not pathlib.Path(args.lossy_judge).is_file():
      raise ValueError(f"--lossy-judge {args.lossy_judge!r}: no such file")
    return Judge.load(args.lossy_judge, args.judge_threshold)
  return None if args.lossy_typical is None else _typical(args.lossy_typical)


def run(args) -> int:
  from speculax.models.assets import humaneval_prompts

  sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
  mesh = _mesh(args.mesh)
  options, fields = drafter_options(args)
  check_drafter_options(args.drafter, options, fields)  # before the model load, which takes seconds
  if args.goodput and args.drafter == "none":
    raise ValueError("--goodput picks a drafter's draft length; give --drafter")
  lossy = _lossy(args)
  if lossy is not None and args.drafter == "none":
    raise ValueError(f"--lossy-{'judge' if isinstance(lossy, Judge) else 'typical'} checks a "
                     f"drafter's drafts; give --drafter")
  if args.pearl and args.drafter != "draft-model":
    raise ValueError(f"--pearl drafts with a draft model; give --drafter draft-model, not "
                     f"{args.drafter}")
  if args.pearl and (args.goodput or args.mesh or args.rows):
    raise ValueError("--pearl runs its own adaptive length on its own devices, one fixed batch: "
                     "drop " + " and ".join(f for f, on in (("--goodput", args.goodput),
                                                            ("--mesh", args.mesh),
                                                            ("--rows", args.rows)) if on))
  if args.compare and args.drafter == "none":
    raise ValueError("--compare sets a drafter's run beside autoregressive decoding; give "
                     "--drafter")
  if args.prompt and args.prompts:
    raise ValueError("give prompts with --prompt or --prompts FILE, not both")
  if args.prompt and any(not p.strip() for p in args.prompt):
    raise ValueError("--prompt is empty")
  if args.prompts:
    items = suites.read_prompts(args.prompts)
  else:
    items = [{"prompt": t, "chat": not args.raw}
             for t in args.prompt or humaneval_prompts(args.humaneval)]
  t = time.perf_counter()
  load = runtime_loader(args)
  model = load(args.model)
  announce(args)
  print(f"loaded {args.model} in {time.perf_counter() - t:.1f} s "
        f"({model.config.n_layers} layers, d={model.config.d_model}, "
        f"vocab {model.config.vocab_size}) on {jax.devices()[0].platform}: "
        f"{model.config.runtime}", file=sys.stderr)
  tok = model.tokenizer
  prompts = suites.encode(tok, items)
  drafter, dparams = (None, None) if args.drafter == "none" else build_drafter(
      args.drafter, model, load, options, args.k, fields)
  key = jax.random.key(args.seed)
  gen = GenerateConfig(max_new_tokens=args.max_new_tokens, sampling=sampling, eos_ids=tok.eos_ids)
  autoregressive = lambda: generate(model.params, model.config, prompts, gen, key, mesh=mesh,
                                    warmup=True, rows=args.rows)
  if drafter is None:
    out = autoregressive()
  else:
    spec = SpecConfig(k=args.k, max_new_tokens=args.max_new_tokens, sampling=sampling,
                      eos_ids=tok.eos_ids, goodput=Goodput() if args.goodput else None,
                      lossy=lossy)
    if args.pearl:
      out = pearl_generate(model.params, model.config, prompts, drafter, spec, dparams, key,
                           draft_device(args.pearl), warmup=True)
    else:
      costs = estimate = None
      if args.goodput:
        costs, estimate = calibrate(model.params, model.config, prompts[:args.rows], drafter,
                                    spec, dparams, key=key, mesh=mesh)
        print("goodput: seconds per step drafting k = 0..{}: {}".format(
            args.k, " ".join(f"{s:.4f}" for s in costs)), file=sys.stderr)
      out = speculative_generate(model.params, model.config, prompts, drafter, spec,
                                 drafter_params=dparams, key=key, mesh=mesh, warmup=True,
                                 step_costs=costs, estimate=estimate, rows=args.rows)
  texts = [tok.decode(ids) for ids in out.tokens]
  ar = autoregressive() if args.compare else None
  # Greedy, a lossless drafter's output is AR's token for token; sampled, the same law but
  # other draws (the drafter's verify consumes randomness AR does not).
  same = None if ar is None or sampling.temperature > 0 else sum(
      a == b for a, b in zip(out.tokens, ar.tokens))
  if args.json:
    compared = {} if ar is None else {
        "autoregressive": ar.metrics(), "x_autoregressive": out.tokens_per_s / ar.tokens_per_s,
        "x_autoregressive_decode": out.decode_tokens_per_s / ar.decode_tokens_per_s,
        "same_as_autoregressive": same}
    print(json.dumps({"drafter": args.drafter, "prompts": [x["prompt"] for x in items],
                      "texts": texts, **out.metrics(), **compared}))
    return 0
  for i, (item, text) in enumerate(zip(items, texts)):
    print(f"=== prompt {i}: {item['prompt'].strip().splitlines()[0][:70]!r}")
    print(text)
  n = f"{len(prompts)} prompt{'s' * (len(prompts) > 1)}"
  print(f"--- {args.drafter}: {n}, {out.summary()}")
  if ar is not None:
    print(f"--- none: {n}, {ar.summary()}")
    print(f"--- {args.drafter} runs x{out.tokens_per_s / ar.tokens_per_s:.2f} the tokens/s of "
          f"autoregressive decoding, x{out.decode_tokens_per_s / ar.decode_tokens_per_s:.2f} in "
          f"its decode loops (each prompt's prefill apart; one run each); "
          + (f"output the same as autoregressive decoding on {same}/{len(prompts)} prompts"
             if same is not None else "sampled: the target's law, other draws"))
  return 0
