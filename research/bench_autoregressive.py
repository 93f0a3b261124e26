"""Autoregressive decoding speed: speculax's jitted loop vs Hugging Face transformers.

SmolLM2-135M-Instruct, greedy, a fixed number of new tokens (EOS ignored on both sides so
both generate the same count), batch 1 and batch 8, on the first HumanEval prompts, both
fed the same token ids. Also prints the memory-bandwidth floor: weight bytes per decode step
over the bytes/s a large memcpy reads on this machine. Writes <out>/bench_autoregressive.json
and .md (the table).

  .venv/bin/python -m speculax.research.bench_autoregressive [--prompts 8] [--new-tokens 128]
      [--out runs/results]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.decode.config import GenerateConfig
from speculax.decode.generate import generate
from speculax.models.assets import humaneval_prompts
from speculax.models.load import load
from speculax.research.common import add_target_and_out, hf_model, median, read_bandwidth


def _hf_generate(model, batch: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
  import torch
  width = max(len(p) for p in batch)
  ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])  # left padding
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
  with torch.inference_mode():
    t = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    wall = time.perf_counter() - t
  return wall, out[:, width:].tolist()


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--prompts", type=int, default=8, help="first N HumanEval prompts")
  ap.add_argument("--new-tokens", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=3, help="timed repeats; medians are reported")
  ap.add_argument("--batch-sizes", default="1,8")
  add_target_and_out(ap)
  args = ap.parse_args(argv)

  model = load(args.model)
  tok = model.tokenizer
  prompts = [tok.encode(tok.chat_prompt(p)) for p in humaneval_prompts(args.prompts)]
  gen = GenerateConfig(max_new_tokens=args.new_tokens)  # no EOS: exactly new_tokens each
  hf = hf_model(args.model)
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params))
  bw = read_bandwidth()

  rows, agree = [], 0
  for bs in [int(x) for x in args.batch_sizes.split(",")]:
    batches = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
    ours, theirs, compile_s = [], [], []
    for rep in range(args.repeats):
      wall_o = wall_h = n_tok = 0
      for batch in batches:
        out = generate(model.params, model.config, batch, gen, warmup=(rep == 0))
        if out.compile_s is not None:  # the first repeat warms up; the others reuse its programs
          compile_s.append(out.compile_s)
        wall_o += out.wall_s
        n_tok += out.new_tokens
        wh, hf_tokens = _hf_generate(hf, batch, args.new_tokens)
        wall_h += wh
        if rep == 0:
          agree += sum(a == b for a, b in zip(out.tokens, hf_tokens))
      ours.append(n_tok / wall_o)
      theirs.append(n_tok / wall_h)
    floor = bs * bw / weight_bytes  # tokens/s if each step only streamed the weights once
    o, h = median(ours), median(theirs)
    rows.append([bs, o, h, o / h, max(compile_s), floor, floor / o])
    print(f"batch {bs}: speculax {o:.1f} tok/s, transformers {h:.1f} tok/s", flush=True)

  header = ["batch", "speculax tok/s", "transformers tok/s", "ratio", "compile s",
            "bandwidth floor tok/s", "floor / speculax"]
  result = dict(machine=machine(), date=datetime.date.today().isoformat(), model=args.model,
                prompts=args.prompts, new_tokens=args.new_tokens, repeats=args.repeats,
                weight_mb=weight_bytes / 1e6, read_gb_s=bw / 1e9, same_as_transformers=agree,
                prompt_runs=len(prompts) * len(rows), columns=header, rows=rows)
  summary = (f"{args.model} float32, greedy, {args.new_tokens} new tokens, first {args.prompts} "
             f"HumanEval prompts, median of {args.repeats}; {machine()}\nweights "
             f"{weight_bytes / 1e6:.0f} MB/step; memory read {bw / 1e9:.1f} GB/s; greedy outputs "
             f"identical to transformers on {agree}/{result['prompt_runs']} prompt runs\n\n"
             + table(header, rows))
  print("\n" + summary)
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "bench_autoregressive.json").write_text(json.dumps(result, indent=1) + "\n")
  (args.out / "bench_autoregressive.md").write_text(summary + "\n")
  print(f"wrote {args.out / 'bench_autoregressive.json'} and .md")


if __name__ == "__main__":
  main()
