"""Everything worth measuring on an accelerator, in one command: one JSON, one plot, one table.

Sections, in this order (each is timed; one that fails is recorded with its error and the rest
still run, so a rare GPU session is never lost to one bug):
  1. autoregressive decoding, batch 1/8/32: the target (SmolLM2-135M from --model: a preset, a
     .gguf or an exported folder) in float32, bf16 storage (weights and KV cache) and bf16
     compute, and a random-weight Llama-3-8B-shaped model in bf16; with the two floors of a
     decode step: bandwidth (weight bytes over the measured read rate) and launch (the same
     loop on a model of the same depth and width 64, whose step moves almost no bytes);
  2. the verify cost: a lone t-token forward over a one-token one, t = 1..64;
  3. tree-attention kernel vs XLA attention (the platform's Pallas backend, bf16 cache), cache
     lengths 512..16k, trees of 8..64 nodes, Llama-3-8B heads;
  4. head-drafter training throughput (EAGLE on the target, tokens/s after compilation);
  5. decode loops side by side (`loops`): ms per step of the autoregressive loop, of the goodput
     loop forced to k' = 0 and to k' = 1 on every step against fixed k = 1 (what goodput's
     bookkeeping and nested loop cost), of the goodput loop choosing freely under fixed step
     costs as a chain of per-length loops and as a switch per step (the same steps: what each
     form's length changes cost), and of autoregressive and fixed k = 4 decoding with the Pallas
     tree-attention kernel against XLA attention (prompt lookup drafts; any weights);
  6. every drafter's tau and speedup on the target (`speculax bench --config drafters`: chain and
     tree, greedy and t=1, batch 1 and 8), within what is left of --budget-min.

  python -m speculax.research.accelerator_suite --model exported/smollm2   # on the GPU
  python -m speculax.research.accelerator_suite --smoke                     # CPU, tiny, ~2 min

--smoke runs every section on tiny shapes (a width-64 model with SmolLM2's tokenizer, the kernel
in interpret mode), so that CI keeps the suite runnable. README "Accelerator" says how the
weights reach a GPU machine with no network.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import pathlib
import sys
import tempfile
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from speculax.bench import run as bench_run
from speculax.bench.measure import chained_seconds, forward_seconds, machine
from speculax.configs.bench import drafters as drafter_set
from speculax.core import overrides
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters.eagle import Eagle
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models import llama
from speculax.models.attention import attention, prefix_block_mask
from speculax.models.config import PRECISIONS, get_preset
from speculax.models.kernels.tree_attention import BlockSizes, default_backend, tree_attention
from speculax.models.load import LoadedModel, load, with_precision
from speculax.research import goodput_overhead, trace_summary
from speculax.research.accelerator_report import markdown, save, write_json
from speculax.research.common import OUT, read_bandwidth
from speculax.train import experiment
from speculax.train.heads import HeadsConfig
from speculax.train.metrics_log import MetricsLog
from speculax.train.optim import OptimConfig

RESULTS = OUT / "accelerator_suite.json"


@dataclasses.dataclass(frozen=True)
class Sizes:
  """What each section runs on: the full suite or --smoke."""
  batches: tuple[int, ...] = (1, 8, 32)
  new_tokens: int = 64
  big: str = "llama3-8b"  # preset of the random-weight model
  forward_tokens: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  cache_lengths: tuple[int, ...] = (512, 2048, 4096, 16384)
  tree_sizes: tuple[int, ...] = (8, 16, 32, 64)
  heads: tuple[int, int, int] = (32, 8, 128)  # query heads, kv heads, head dim (Llama-3-8B)
  interpret: bool = False
  loop_rounds: int = 3  # the loops section's interleaved rounds (a row: their median)
  train_steps: int = 30
  train_batch: int = 8
  seq_len: int = 256
  # The drafter section: configs/bench/drafters.py's methods (those named here: all when empty)
  # at these settings.
  drafter_methods: tuple[str, ...] = ()
  drafter_bench: tuple[str, ...] = ("suites=('humaneval',)", "prompts=3", "new_tokens=48")


SMOKE = Sizes(batches=(1,), new_tokens=8, big="tiny-untied-llama3", forward_tokens=(1, 2, 4),
              cache_lengths=(64, 128), tree_sizes=(4, 8), heads=(4, 2, 16), interpret=True,
              loop_rounds=1,
              train_steps=3, train_batch=2, seq_len=32,
              drafter_methods=("prompt lookup",),
              drafter_bench=("suites=('humaneval',)", "prompts=1", "new_tokens=8",
                             "batch_sizes=(1,)", "temperatures=(0,)"))


def synthetic_prompts(model: LoadedModel, batch: int) -> list[list[int]]:
  """batch prompts of 32 token ids (no tokenizer needed: random weights have none)."""
  return [[(7 * i + j) % model.config.vocab_size for j in range(32)] for i in range(batch)]


def step_seconds(model: LoadedModel, batch: int, new_tokens: int) -> float:
  """Seconds per decode step of the jitted loop (compiled first), batch prompts of 32 tokens."""
  prompts = synthetic_prompts(model, batch)
  return generate(model.params, model.config, prompts, GenerateConfig(max_new_tokens=new_tokens),
                  warmup=True).step_s


def launch_model(model: LoadedModel) -> LoadedModel:
  """Same depth and loop, width 64: its step time is what launching the step's kernels costs."""
  cfg = dataclasses.replace(model.config, vocab_size=256, d_model=64, n_heads=2, n_kv_heads=1,
                            head_dim=32, d_ff=128)
  return dataclasses.replace(model, config=cfg, params=llama.init_params(cfg, jax.random.key(0)))


def autoregressive(target: LoadedModel, sizes: Sizes):
  """Yields a row per model and batch."""
  bandwidth = read_bandwidth()
  big_cfg = get_preset(sizes.big).with_runtime(**PRECISIONS["bf16"])
  big = LoadedModel(big_cfg, llama.init_params(big_cfg, jax.random.key(0)), None, sizes.big)
  models = {f"{target.name} {p}": with_precision(target, p) for p in PRECISIONS}
  models[f"{sizes.big} (random) bf16"] = big
  for name, model in models.items():
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params))
    launch = launch_model(model)
    for batch in sizes.batches:
      step = step_seconds(model, batch, sizes.new_tokens)
      floor_launch = step_seconds(launch, batch, sizes.new_tokens)
      floor_bw = weight_bytes / bandwidth
      yield dict(model=name, batch=batch, step_ms=step * 1e3, tokens_per_s=batch / step,
                 bandwidth_floor_ms=floor_bw * 1e3, launch_floor_ms=floor_launch * 1e3,
                 over_floor=step / max(floor_bw, floor_launch))
      print(f"AR {name} b{batch}: {step * 1e3:.2f} ms/step, floors: bandwidth "
            f"{floor_bw * 1e3:.2f} ms, launch {floor_launch * 1e3:.2f} ms", flush=True)
    jax.clear_caches()


def verify_cost(target: LoadedModel, sizes: Sizes, precision: str) -> dict:
  model = with_precision(target, precision)
  seconds = {t: forward_seconds(model, t) for t in sizes.forward_tokens}
  return {"precision": precision, "forward_s": seconds,
          "cost": {t: s / seconds[1] for t, s in seconds.items()}}


def loops(target: LoadedModel, sizes: Sizes, precision: str, trace: pathlib.Path | None = None,
          names: tuple[str, ...] = ()):
  """Yields a row per batch, attention and loop: median ms per loop step (prefill apart) over
  interleaved rounds, tau, and whether its tokens equal the XLA autoregressive loop's. The
  goodput loop (k <= 4) runs with step costs forcing one length on every step, so it decodes
  exactly what the fixed loop of that length does: the gap is its bookkeeping. With `trace`,
  one more run of fixed k = 1 and of goodput forced to k' = 1 under the profiler (a perfetto
  trace each under trace/), their rows then holding research/trace_summary's reading of it.
  names: only the loops of these names (both attentions where both run), and the XLA
  autoregressive loop, the reference; () every loop."""
  kernel = "pallas-interpret" if sizes.interpret else "pallas"
  base = SpecConfig(k=4, max_new_tokens=sizes.new_tokens, eos_ids=())
  lookup = PromptLookup()
  model = with_precision(target, precision)
  p = model.params
  for batch in sizes.batches:
    prompts = synthetic_prompts(model, batch)
    runs = {("xla", name): run for name, run in goodput_overhead.overhead_runs(
        p, model.config, prompts, lookup, None, base.k, base.max_new_tokens,
        "prompt lookup").items()}
    pallas = model.config.with_runtime(attention_impl=kernel)
    runs[kernel, "autoregressive"] = lambda: generate(p, pallas, prompts, base, warmup=True)
    for impl, c in (("xla", model.config), (kernel, pallas)):
      runs[impl, "prompt lookup k=4"] = lambda c=c: speculative_generate(
          p, c, prompts, lookup, base, warmup=True)
    unknown = sorted(set(names) - {name for _, name in runs})
    if unknown:  # raised before anything compiles
      raise ValueError(f"no loop named {unknown[0]!r}; the loops: "
                       f"{', '.join(dict.fromkeys(name for _, name in runs))}")
    if names:
      runs = {key: run for key, run in runs.items()
              if key[1] in names or key == ("xla", "autoregressive")}
    step_ms, outs = goodput_overhead.interleaved(runs, sizes.loop_rounds)
    traced = {} if trace is None else {
        key: traced_run(runs[key], trace / f"b{batch}-{folder}") for key, folder in TRACED
        if key in runs}
    reference = outs["xla", "autoregressive"].tokens
    for (impl, name), out in outs.items():
      ms = float(np.median(step_ms[impl, name]))
      row = dict(batch=batch, attention=impl, loop=name, step_ms=ms, rounds_ms=step_ms[impl, name],
                 tau=out.tau,
                 k_steps=None if out.k_steps is None else out.k_steps.tolist(),
                 k_changes=out.k_changes,
                 same_as_ar=sum(a == b for a, b in zip(out.tokens, reference)), sequences=batch,
                 trace=traced.get((impl, name)))
      print(f"loops b{batch} {impl} {name}: {ms:.3f} ms/step", flush=True)
      yield row
    jax.clear_caches()


# The loops --trace runs under the profiler, each with its trace's folder name.
TRACED = ((("xla", "prompt lookup k=1"), "fixed-k1"),
          (("xla", "goodput forced k'=1"), "goodput-k1"))


def traced_run(run, folder: pathlib.Path) -> dict | None:
  """Runs once under the profiler into folder: the loop program's longest execution as
  research/trace_summary reads it, with the steps it ran (None where the platform writes no
  per-program events, as XLA:CPU)."""
  with jax.profiler.trace(folder, create_perfetto_trace=True):
    out = run()
  found = trace_summary.executions(trace_summary.read(trace_summary.find(folder)), "spec_loop")
  if not found:
    return None
  return dict(max(found, key=lambda r: r["wall_ms"]), steps=out.forwards - 1)


def kernel_vs_xla(sizes: Sizes):
  """One layer's verify attention over a bf16 cache filled to s - t, a chain mask of t nodes: yields
  a row per cache length and tree size."""
  h, kh, dq = sizes.heads
  block = BlockSizes(32) if sizes.interpret else None

  def pallas(blocks):
    return jax.jit(lambda q, k, v, n, m: tree_attention(q, k, v, n, m, block_sizes=blocks,
                                                        interpret=sizes.interpret))

  kernel = pallas(block)
  # On Mosaic GPU also the kernel with one KV range per program: what split-K adds.
  one_range = (pallas(dataclasses.replace(BlockSizes.get_default("mosaic-gpu"), kv_splits=1))
               if default_backend(sizes.interpret) == "mosaic-gpu" else None)
  xla = jax.jit(lambda q, k, v, n, m: attention(q, k, v, prefix_block_mask(n, m, k.shape[2])))
  for s in sizes.cache_lengths:
    for t in sizes.tree_sizes:
      keys = jax.random.split(jax.random.key(s + t), 3)
      q = jax.random.normal(keys[0], (1, t, h, dq), jnp.bfloat16)
      k = jax.random.normal(keys[1], (1, kh, s, dq), jnp.bfloat16)
      v = jax.random.normal(keys[2], (1, kh, s, dq), jnp.bfloat16)
      args = (q, k, v, jnp.asarray([s - t], jnp.int32), jnp.tril(jnp.ones((1, t, t), bool)))
      # Each call's output is the next one's q (same shape): timed without host dispatch.
      ours, theirs, one = (None if fn is None else chained_seconds(
          lambda q, *rest: fn(q, *rest).astype(q.dtype), *args, repeats=20) * 1e6
          for fn in (kernel, xla, one_range))
      error = float(jnp.abs(kernel(*args).astype(jnp.float32)
                            - xla(*args).astype(jnp.float32)).max())
      yield dict(cache=s, tree=t, kernel_us=ours, xla_us=theirs, speedup=theirs / ours,
                 max_abs_error=error, one_range_us=one)
      one = "-" if one is None else f"{one:.1f}"
      print(f"attention s={s} t={t}: kernel {ours:.1f} us, XLA {theirs:.1f} us, one KV range "
            f"{one} us", flush=True)


def training_throughput(target: LoadedModel, sizes: Sizes, folder: pathlib.Path) -> dict:
  """EAGLE on the target's cached features: tokens/s over the steps after the first (which
  compiles), from the run's own steps_per_s log."""
  rng = np.random.default_rng(0)
  n = sizes.train_batch * 4
  rows = (rng.integers(0, target.config.vocab_size, (n, sizes.seq_len)),
          rng.integers(0, target.config.vocab_size, (sizes.train_batch, sizes.seq_len)))
  steps = sizes.train_steps
  exp = experiment.DistillExperiment(
      name="eagle-throughput", target=target.name or "model",
      data=experiment.DataConfig(seq_len=sizes.seq_len, rows=n, heldout_rows=sizes.train_batch),
      distill=HeadsConfig(Eagle(), batch_size=sizes.train_batch,
                          optim=OptimConfig(learning_rate=1e-3, warmup_steps=1, total_steps=steps)),
      out_dir=str(folder), checkpoint_every=steps, log_every=1, eval_every=steps)
  t0 = time.perf_counter()
  experiment.run(exp, model=target, rows=rows)
  rates = {int(r["step"]): r["steps_per_s"]
           for r in MetricsLog(folder / exp.name / "metrics.csv").read()}
  # steps_per_s at step i is i / (time since start): the time of steps 2..n is n/r_n - 1/r_1.
  seconds = steps / rates[steps] - 1 / rates[1]
  per_s = (steps - 1) / seconds
  return dict(drafter="eagle", batch=sizes.train_batch, seq_len=sizes.seq_len, steps=steps,
              steps_per_s=per_s, tokens_per_s=per_s * sizes.train_batch * sizes.seq_len,
              wall_s=time.perf_counter() - t0)


def drafters(target: LoadedModel, sizes: Sizes, args) -> list[dict]:
  """speculax bench's rows for the drafters found under --drafters-dir."""
  cfg = dataclasses.replace(drafter_set.BENCH, methods=drafter_set.methods(args.drafters_dir),
                            precision=args.precision)
  cfg = overrides.apply(cfg.only(sizes.drafter_methods), sizes.drafter_bench)
  # The bench applies its attention to the models it loads; the target is loaded here.
  model = with_precision(target, args.precision)
  model = dataclasses.replace(model, config=model.config.with_runtime(attention_impl=cfg.attention))
  # The bench writes its rows as they come beside the suite's JSON (<results>_drafters.json):
  # this section returns only when done, and in the sixth GPU run a call's time cap stopped it in
  # its second panel and lost the first. Done, the suite's JSON holds the rows and the bench's
  # files go (a device call brings back at most 8 files).
  folder, name = args.results.parent, f"{args.results.stem}_drafters"
  rows = bench_run.run(cfg, name, model=model, out=folder)["rows"]
  for suffix in (".json", ".md", ".png"):
    (folder / f"{name}{suffix}").unlink(missing_ok=True)
  return rows


def smoke_target() -> LoadedModel:
  """A width-64, 4-layer random model with SmolLM2's tokenizer (the prompt suites need one)."""
  real = get_preset("smollm2-135m")
  cfg = dataclasses.replace(real, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16,
                            d_ff=128, max_seq_len=1024)
  from speculax.models.assets import smollm2_gguf_path
  from speculax.models.tokenizer import Tokenizer
  return LoadedModel(cfg, llama.init_params(cfg, jax.random.key(0)),
                     Tokenizer.from_gguf(smollm2_gguf_path()), "smoke")


def random_target(preset: str) -> LoadedModel:
  """The preset's shapes with random weights (no tokenizer: only the drafters section needs one)."""
  cfg = get_preset(preset)
  return LoadedModel(cfg, llama.init_params(cfg, jax.random.key(0)), None,
                     f"{preset} (random weights)")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="smollm2-135m",
                  help="the target: a preset, a .gguf file or a Hugging Face / exported folder")
  ap.add_argument("--smoke", action="store_true", help="tiny shapes, any platform (CI)")
  ap.add_argument("--random-weights", action="store_true",
                  help="the --model preset's shapes with random weights: every section but the "
                       "drafters' times the same as with the real ones, so a GPU session can "
                       "measure while the weights are still on their way")
  ap.add_argument("--batches", default=None, metavar="B,B",
                  help="batch sizes of the autoregressive section (default: 1,8,32)")
  ap.add_argument("--drafter-method", action="append", default=[], metavar="NAME",
                  help="a row of configs/bench/drafters.py to run (repeatable; default: all)")
  ap.add_argument("--drafter-set", action="append", default=[], metavar="FIELD=VALUE",
                  help="a BenchConfig override for the drafters section (repeatable), e.g. "
                       "'temperatures=(0.0,)'")
  ap.add_argument("--sections",
                  default="autoregressive,verify,attention,loops,training,drafters")
  ap.add_argument("--precision", default="bf16 weights", choices=sorted(PRECISIONS),
                  help="the target's precision in the verify and drafter sections (the "
                       "autoregressive one runs each)")
  ap.add_argument("--budget-min", type=float, default=18.0,
                  help="the drafter section starts only with this much of the run left")
  ap.add_argument("--drafters-dir", type=pathlib.Path, default=pathlib.Path("results/drafters"))
  ap.add_argument("--loop-rows", default="", metavar="NAME;NAME",
                  help="the loops section runs only these loops (as its table names them) beside "
                       "autoregressive decoding, e.g. 'goodput free, chain;goodput free, switch' "
                       "(';'-separated: the names hold commas); default every loop")
  ap.add_argument("--trace", type=pathlib.Path, default=None, metavar="DIR",
                  help="the loops section also traces fixed k = 1 and goodput forced to k' = 1 "
                       "once each under the profiler into DIR (research/trace_summary.py)")
  ap.add_argument("--results", type=pathlib.Path, default=RESULTS,
                  help="JSON to write (and a .png beside it)")
  args = ap.parse_args(argv)
  if args.random_weights and "drafters" in args.sections.split(","):
    ap.error("--random-weights: the drafters section measures acceptance, which random weights "
             "do not have; leave it out of --sections")
  t0 = time.perf_counter()
  sizes = SMOKE if args.smoke else Sizes()
  if args.batches:
    sizes = dataclasses.replace(sizes, batches=tuple(int(b) for b in args.batches.split(",")))
  if args.drafter_method or args.drafter_set:
    sizes = dataclasses.replace(sizes, drafter_methods=tuple(args.drafter_method) or
                                sizes.drafter_methods,
                                drafter_bench=sizes.drafter_bench + tuple(args.drafter_set))
  target = (smoke_target() if args.smoke else random_target(args.model) if args.random_weights
            else load(args.model))
  results = {"machine": machine(), "jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
             "command": "python -m speculax.research.accelerator_suite " + " ".join(
                 argv if argv is not None else sys.argv[1:]),
             "smoke": args.smoke, "sections": {}, "errors": {}, "seconds": {}}
  with tempfile.TemporaryDirectory() as tmp:
    sections = {"autoregressive": lambda: autoregressive(target, sizes),
                "verify": lambda: verify_cost(target, sizes, args.precision),
                "attention": lambda: kernel_vs_xla(sizes),
                "loops": lambda: loops(target, sizes, args.precision, args.trace,
                                       tuple(n for n in args.loop_rows.split(";") if n)),
                "training": lambda: training_throughput(target, sizes, pathlib.Path(tmp)),
                "drafters": lambda: drafters(target, sizes, args)}
    for name in args.sections.split(","):
      if name == "drafters" and time.perf_counter() - t0 > args.budget_min * 60:
        results["errors"][name] = f"skipped: the run passed --budget-min {args.budget_min}"
        continue
      start = time.perf_counter()
      try:
        out = sections[name]()
        if inspect.isgenerator(out):  # rows kept as they come: a run stopped midway keeps them
          rows = results["sections"][name] = []
          for row in out:
            rows.append(row)
            write_json(results, args.results)
        else:
          results["sections"][name] = out
      except Exception as e:  # noqa: BLE001 - one broken section must not lose the others
        traceback.print_exc()
        results["errors"][name] = f"{type(e).__name__}: {e}"
      results["seconds"][name] = time.perf_counter() - start
      jax.clear_caches()
      save(results, args.results)
  print(markdown(results))
  print(f"\nwrote {args.results} and {args.results.with_suffix('.png')} in "
        f"{time.perf_counter() - t0:.0f} s")
  return results


if __name__ == "__main__":
  main()
