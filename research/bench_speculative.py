"""Speculative decoding speed: the train-free drafters and the untrained draft cut against our
autoregressive loop (through speculax.bench) and against transformers' prompt lookup, the peer.

SmolLM2-135M-Instruct, greedy, exactly N new tokens (EOS off everywhere, so throughputs compare),
held-out HumanEval prompts (chat), batch 1 and 8. Our methods run as one `speculax.bench` panel
per batch size (autoregressive first and last, compile time apart); transformers' prompt-lookup
`generate` then runs on the same token ids (batch 1; larger batches if transformers allows
assisted generation there), its tau = new tokens / model forwards (its prefill and first
verify share one forward), its x AR against the panel's autoregressive rows and its tokens
compared with our autoregressive decoding's. Writes <out>/bench_speculative.json, .md and .png.

  .venv/bin/python -m speculax.research.bench_speculative [--prompts 8] [--new-tokens 128] [-k 5]
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from speculax.bench import run as bench_run
from speculax.bench import suites
from speculax.bench.config import BenchConfig, method
from speculax.bench.report import markdown
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models.load import load
from speculax.research.common import add_target_and_out, hf_model

PEER = "transformers prompt lookup"


def methods(k: int, skip: tuple[int, ...] | None) -> tuple:
  """prompt lookup, layer skip (a given skip set, or the search's) and the untrained 4-layer cut."""
  return (method("prompt lookup", "prompt-lookup", k=k),
          method("layer skip" + (f" (skip {','.join(map(str, skip))})" if skip else ""),
                 "layer-skip", k=k, skip=skip),
          method("draft model (4-layer cut, untrained)", "draft-model", k=k, draft_layers=4))


def _hf_pld(hf, batch, n: int, k: int, calls: list) -> tuple[float, list[list[int]], int]:
  """transformers' prompt-lookup generate: (wall s, new tokens per prompt, model forwards)."""
  import torch
  width = max(len(p) for p in batch)
  ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])  # left padding
  mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
  calls.clear()
  with torch.inference_mode():
    t = time.perf_counter()
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                      do_sample=False, pad_token_id=0, prompt_lookup_num_tokens=k,
                      max_matching_ngram_size=PromptLookup().max_ngram)  # our n-gram range
    wall = time.perf_counter() - t
  return wall, out[:, width:].tolist(), len(calls)


def _hf_batch_limit(hf, prompts, k: int, calls: list) -> str | None:
  """None if transformers runs prompt lookup at batch 2, else its error message. Runs batch 1
  first: torch's first call is slow, and it must not land in a timed run."""
  _hf_pld(hf, prompts[:1], 2, k, calls)
  try:
    _hf_pld(hf, prompts[:2], 2, k, calls)
    return None
  except ValueError as e:
    return str(e)


def peer_row(hf, calls, panel: list[dict], ours: list[list[int]], ids, cfg: BenchConfig,
             k: int) -> dict:
  """transformers' prompt lookup on the panel's prompts (decoded as bench.run decodes them), as
  a row of the panel: x AR over the panel's faster autoregressive row, tokens against ours
  (the panel's autoregressive tokens)."""
  batch = panel[0]["batch"]
  chunk = ids[:cfg.prompts] if batch == 1 else ids[:batch]
  wall = n_tokens = forwards = rows = 0
  tokens = []
  for i in range(0, len(chunk) - batch + 1, batch):
    w, new, fwd = _hf_pld(hf, chunk[i:i + batch], cfg.new_tokens, k, calls)
    wall, n_tokens, tokens = wall + w, n_tokens + sum(map(len, new)), tokens + new
    forwards, rows = forwards + fwd, rows + fwd * batch
  base = max(r["tokens_per_s"] for r in panel if r["drafter"] is None)
  tau = n_tokens / rows
  return dict({n: panel[0][n] for n in ("suite", "batch", "sampling")}, method=PEER,
              drafter="transformers", k=k, tau=tau, acceptance=[],
              drafts_per_step=None, k_steps=None, pearl=None, step_costs=None,
              tokens_per_s=n_tokens / wall, compile_s=0.0, drafter_mb=0.0, peak_memory_mb=None,
              sequences=len(tokens), same_as_ar=sum(a == b for a, b in zip(tokens, ours)),
              speedup=n_tokens / wall / base, speedup_per_tau=n_tokens / wall / base / tau)


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--prompts", type=int, default=8, help="held-out HumanEval prompts at batch 1")
  ap.add_argument("--new-tokens", type=int, default=128)
  ap.add_argument("--batch-sizes", default="1,8")
  ap.add_argument("-k", type=int, default=5, help="draft tokens per step")
  ap.add_argument("--skip-layers", default=None,
                  help="layer skip's skipped layers, e.g. 14; default: search on 4 prompts")
  add_target_and_out(ap)
  args = ap.parse_args(argv)
  skip = None if args.skip_layers is None else tuple(int(x) for x in args.skip_layers.split(","))
  model = load(args.model)
  ids = suites.encode(model.tokenizer, suites.suite("humaneval", max(
      args.prompts, *(int(b) for b in args.batch_sizes.split(",")))))
  hf, calls = hf_model(args.model), []
  hf.register_forward_hook(lambda *_: calls.append(1))
  hf_limit = _hf_batch_limit(hf, ids, args.k, calls)
  print(f"transformers prompt lookup at batch > 1: {hf_limit or 'supported'}", flush=True)
  command = "python -m speculax.research.bench_speculative " + " ".join(
      f"{'-' if len(n) == 1 else '--'}{n.replace('_', '-')} {v}"
      for n, v in vars(args).items() if v is not None)
  result = None
  for batch in (int(b) for b in args.batch_sizes.split(",")):
    cfg = BenchConfig(methods=methods(args.k, skip), target=args.model, prompts=args.prompts,
                      batch_sizes=(batch,), new_tokens=args.new_tokens)
    references = {}
    part = bench_run.run(cfg, "bench_speculative", model=model, command=command,
                         references=references)
    if batch == 1 or hf_limit is None:
      ours, = references.values()
      part["rows"].append(peer_row(hf, calls, part["rows"], ours, ids, cfg, args.k))
    result = part if result is None else dict(result, rows=result["rows"] + part["rows"])
  result["peer_batch_limit"] = hf_limit
  paths = bench_run.write(result, args.out)
  print(markdown(result) + f"\n\nwrote {paths['json']}")


if __name__ == "__main__":
  main()
