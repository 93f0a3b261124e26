"""Speculative decoding speed: every drafter vs our autoregressive loop vs transformers' prompt lookup.

SmolLM2-135M-Instruct, greedy, exactly N new tokens (EOS ignored everywhere, so throughputs
compare), on the first HumanEval prompts (chat-wrapped), all methods in one process, interleaved
per batch so machine drift hits them alike. Compile time is measured apart (warmup) and not
counted. Drafters come from `drafters.registry` (layer-skip searches its skip set on the first 4
prompts). The peer is transformers' prompt-lookup `generate` on the same token ids; its tau is
new tokens / model forwards (its prefill and first verify share one forward).
Writes <out>/bench_speculative.json (--out, default runs/results).

  .venv/bin/python -m speculax.research.bench_speculative [--prompts 20] [--new-tokens 128] [-k 5]
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from speculax.bench.measure import machine
from speculax.bench.report import table
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters import registry
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models.assets import humaneval_prompts
from speculax.models.load import load
from speculax.research.common import add_target_and_out, hf_model, median

AR, HF_PLD = "autoregressive", "transformers prompt-lookup"


def _describe(drafter, config) -> str:
  """What a drafter is, short enough for one line (a searched skip set is the point of interest)."""
  if hasattr(drafter, "keep"):
    skip = [i for i in range(config.n_layers) if i not in drafter.keep]
    return f"skips layers {skip}" if skip else "skips NO layer: the drafter is the full target"
  if hasattr(drafter, "config"):
    return f"{drafter.config.n_layers}-layer draft model"
  return repr(drafter)


def _build_drafters(model, names, k, calibration, skip) -> tuple[dict, dict]:
  """name -> (drafter, params) and name -> description."""
  built, about = {}, {}
  for name in names:
    t = time.perf_counter()
    given = dict(k=k, calibration=calibration, skip=skip)
    built[name] = registry.make(name, model.params, model.config,
                                **{o: v for o, v in given.items() if o in registry.options(name)})
    about[name] = _describe(built[name][0], model.config)
    print(f"{name}: built in {time.perf_counter() - t:.1f} s; {about[name]}", flush=True)
  return built, about


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
                      max_matching_ngram_size=PromptLookup().max_ngram)  # same n-gram range as ours
    wall = time.perf_counter() - t
  return wall, out[:, width:].tolist(), len(calls)


def _hf_batch_limit(hf, prompts, k: int, calls: list) -> str | None:
  """None if transformers runs prompt lookup at batch 2, else its error message.

  Runs batch 1 first: torch's first call is slow, and it must not land in a timed run.
  """
  _hf_pld(hf, prompts[:1], 2, k, calls)
  try:
    _hf_pld(hf, prompts[:2], 2, k, calls)
    return None
  except ValueError as e:
    return str(e)


def _flips(tokens, ref) -> list[str]:
  """'p{prompt}@{first differing position}' for every prompt whose tokens differ from ref."""
  first = lambda a, b: next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
  return [f"p{i}@{first(a, b)}" for i, (a, b) in enumerate(zip(tokens, ref)) if a != b]


class Tally:
  """One method at one batch size: tokens/s per repeat; counters and tokens from the first repeat
  (greedy decoding repeats them exactly)."""

  def __init__(self):
    self.tok_s, self.tokens, self.compile_s, self.accepted_at = [], [], 0.0, np.zeros(0)
    self.forwards = self.row_steps = self.step_tokens = self._wall = self._n = 0

  def add(self, rep: int, wall_s, tokens, forwards, row_steps, step_tokens,
          accepted_at=np.zeros(0), compile_s=0.0):
    self._wall, self._n = self._wall + wall_s, self._n + sum(map(len, tokens))
    if rep == 0:
      self.tokens, self.compile_s = self.tokens + tokens, self.compile_s + compile_s
      self.forwards, self.row_steps = self.forwards + forwards, self.row_steps + row_steps
      self.step_tokens += step_tokens
      if len(accepted_at):  # [k] counts; autoregressive decoding has none
        self.accepted_at = accepted_at + (self.accepted_at if len(self.accepted_at) else 0)

  def add_output(self, rep: int, out):
    self.add(rep, out.wall_s, out.tokens, out.forwards, out.row_steps, out.step_tokens,
             out.accepted_at, out.compile_s)

  def end_repeat(self):
    self.tok_s.append(self._n / self._wall)
    self._wall = self._n = 0

  def tau(self) -> float:
    return self.step_tokens / self.row_steps if self.row_steps else 1.0

  def acceptance(self) -> list[float]:
    return (self.accepted_at / max(self.row_steps, 1)).tolist()


def _measure(model, drafters, hf, calls, hf_limit, prompts, args) -> dict:
  """(method, batch) -> Tally; methods interleaved per batch of prompts, so drift hits all alike."""
  n, k = args.new_tokens, args.k
  gen, spec = GenerateConfig(max_new_tokens=n), SpecConfig(k=k, max_new_tokens=n)
  tallies = {}
  for bs in [int(x) for x in args.batch_sizes.split(",")]:
    methods = [AR, *drafters] + ([HF_PLD] if bs == 1 or hf_limit is None else [])
    tallies.update({(m, bs): Tally() for m in methods})
    batches = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
    for rep in range(args.repeats):
      for batch in batches:
        for m in methods:
          t = tallies[m, bs]
          if m == AR:
            t.add_output(rep, generate(model.params, model.config, batch, gen, warmup=rep == 0))
          elif m == HF_PLD:  # tau: new tokens per model forward
            wall, tokens, fwd = _hf_pld(hf, batch, n, k, calls)
            t.add(rep, wall, tokens, fwd, fwd * len(batch), n * len(batch))
          else:
            d, dp = drafters[m]
            t.add_output(rep, speculative_generate(model.params, model.config, batch, d, spec,
                                                   drafter_params=dp, warmup=rep == 0))
      for m in methods:
        tallies[m, bs].end_repeat()
      print(f"batch {bs} repeat {rep}: " + ", ".join(
          f"{m} {tallies[m, bs].tok_s[-1]:.1f}" for m in methods) + " tok/s", flush=True)
  return tallies


def _rows(tallies: dict) -> list[dict]:
  """One dict per (method, batch): medians, ratios and token agreement with our autoregressive
  decoding (at the same batch; its own and transformers' rows against batch 1, if run)."""
  hf_b1 = median(tallies[HF_PLD, 1].tok_s) if (HF_PLD, 1) in tallies else None
  rows = []
  for (m, bs), t in tallies.items():
    ar = tallies[AR, 1] if m in (AR, HF_PLD) and (AR, 1) in tallies else tallies[AR, bs]
    tok_s, speedup = median(t.tok_s), median(t.tok_s) / median(tallies[AR, bs].tok_s)
    flips = _flips(t.tokens, ar.tokens)
    rows.append(dict(method=m, batch=bs, tau=t.tau(), acceptance=t.acceptance(),
                     target_forwards=t.forwards, tokens_per_s=tok_s, tokens_per_s_runs=t.tok_s,
                     speedup_vs_ar=speedup, speedup_vs_hf_pld_b1=tok_s / hf_b1 if hf_b1 else None,
                     speedup_per_tau=speedup / t.tau(), compile_s=t.compile_s,
                     same_tokens=len(t.tokens) - len(flips), prompts=len(t.tokens), flips=flips))
  return rows


def _print_table(rows: list[dict]):
  acc = lambda a: " ".join(f"{x:.2f}" for x in a) or "-"
  print(table(["method", "batch", "tau", "acceptance by position", "target fwd", "tok/s", "x AR",
               "x HF PLD b1", "speedup/tau", "compile s", "same tokens", "flips"],
              [[r["method"], r["batch"], r["tau"], acc(r["acceptance"]), r["target_forwards"],
                r["tokens_per_s"], r["speedup_vs_ar"], r["speedup_vs_hf_pld_b1"] or "-",
                r["speedup_per_tau"], r["compile_s"], f"{r['same_tokens']}/{r['prompts']}",
                " ".join(r["flips"]) or "-"] for r in rows]))


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--prompts", type=int, default=20, help="first N HumanEval prompts")
  ap.add_argument("--new-tokens", type=int, default=128)
  ap.add_argument("--batch-sizes", default="1,8")
  ap.add_argument("--repeats", type=int, default=3, help="timed repeats; medians are reported")
  ap.add_argument("-k", type=int, default=5, help="draft tokens per step")
  ap.add_argument("--drafters", default="prompt-lookup,layer-skip,draft-model")
  ap.add_argument("--skip-layers", default=None,
                  help="layer-skip drafter's skipped layers, e.g. 3,7,12; default: search on 4 prompts")
  add_target_and_out(ap)
  args = ap.parse_args()
  t_start = time.perf_counter()
  results = args.out / "bench_speculative.json"

  model = load(args.model)
  tok = model.tokenizer
  encode = lambda texts: [tok.encode(tok.chat_prompt(p)) for p in texts]
  prompts, calibration = encode(humaneval_prompts(args.prompts)), encode(humaneval_prompts(4))
  skip = None if args.skip_layers is None else tuple(int(x) for x in args.skip_layers.split(","))
  drafters, about = _build_drafters(model, args.drafters.split(","), args.k, calibration, skip)
  hf, calls = hf_model(), []
  hf.register_forward_hook(lambda *_: calls.append(1))
  hf_limit = _hf_batch_limit(hf, prompts, args.k, calls)
  print(f"transformers prompt lookup at batch > 1: {hf_limit or 'supported'}", flush=True)
  rows = _rows(_measure(model, drafters, hf, calls, hf_limit, prompts, args))

  settings = (f"SmolLM2-135M fp32, greedy, {args.new_tokens} new tokens (EOS off), k={args.k}, "
              f"first {args.prompts} HumanEval prompts (chat), median of {args.repeats}")
  print(f"\n{settings}; {machine()}")
  print(f"transformers prompt lookup: batch 1 only ({hf_limit})" if hf_limit else
        "transformers prompt lookup: run at every batch size")
  for name, text in about.items():
    print(f"{name}: {text}")
  print("same tokens: vs our autoregressive at the same batch (autoregressive and transformers rows: "
        "vs ours at batch 1); flips: p<prompt>@<first differing position>\n")
  _print_table(rows)
  results.parent.mkdir(parents=True, exist_ok=True)
  results.write_text(json.dumps(dict(settings=settings, machine=machine(), args=vars(args),
                                     hf_batch_limit=hf_limit, drafters=about,
                                     rows=rows), indent=1))
  print(f"\nwrote {results}; total run time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
  main()
