"""Where a PEARL step's time goes: its two halves alone and together. The draft half is the
draft model drafting k tokens (decode/pearl.draft), the target half the target's forward over
the k-token window (decode/pearl.target_window); PEARL on two devices dispatches them at once,
on one device it runs them in one program. Prints the median milliseconds of each half alone,
of both dispatched at once on two devices and on one, and the ideal (the longer half), and
writes JSON. Needs two devices (on CPU it asks JAX for two before JAX starts).

  .venv/bin/python -m speculax.research.pearl_overlap [--layers 8 24] [-k 3] [--batch 1]
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("SPECULAX_CPU_DEVICES", "2")  # read when main() starts JAX


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  from speculax.research.common import add_target_and_out
  add_target_and_out(ap)
  ap.add_argument("--layers", type=int, nargs="+", default=[8, 24],
                  help="draft models: cuts of the target's first N layers")
  ap.add_argument("-k", type=int, default=3, help="drafts per step (the window)")
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--repeats", type=int, default=20)
  args = ap.parse_args(argv)

  import jax
  import jax.numpy as jnp

  from speculax.bench.measure import machine
  from speculax.bench.report import table
  from speculax.core.sampling import SamplingConfig
  from speculax.drafters.chain import draft_chain
  from speculax.models import distributed, llama
  from speculax.models.derive import truncated
  from speculax.models.kvcache import KVCache
  from speculax.models.load import load
  from speculax.research.common import median

  distributed.initialize_from_env()
  if len(jax.devices()) < 2:
    raise SystemExit(f"two devices needed, JAX has {jax.devices()}")
  target_device, draft_device = jax.devices()[:2]
  model = load(args.model)
  cfg, b, k = model.config, args.batch, args.k
  params = jax.device_put(llama.unstack_layers(model.params), target_device)
  filled = lambda c: c.with_lengths(jnp.full((b,), 256, jnp.int32))  # 256 tokens of context
  cache = jax.device_put(filled(KVCache.init(cfg, b, 512, per_layer=True)), target_device)
  window = jax.jit(lambda p, c: llama.forward(p, cfg, jnp.ones((b, k), jnp.int32),
                                              256 + jnp.broadcast_to(jnp.arange(k), (b, k)), c)[0])
  def seconds(f):  # median of repeats, after a first (compiling) call
    f()
    times = []
    for _ in range(args.repeats):
      t = time.perf_counter()
      f()
      times.append(time.perf_counter() - t)
    return median(times)

  rows = []
  for layers in args.layers:
    dcfg, dparams = truncated(model.params, cfg, range(layers))
    drafts = jax.jit(lambda p, c, last, dcfg=dcfg: draft_chain(
        p, dcfg, c, last, jax.random.key(0), k, SamplingConfig())[0])
    on = {}
    for name, dev in (("two", draft_device), ("one", target_device)):
      on[name] = (jax.device_put(llama.unstack_layers(dparams), dev),
                  jax.device_put(filled(KVCache.init(dcfg, b, 512, per_layer=True)), dev),
                  jax.device_put(jnp.ones((b,), jnp.int32), dev))
    timed = {
        "draft k": lambda: drafts(*on["two"]).block_until_ready(),
        "window": lambda: window(params, cache).block_until_ready(),
        "both, two devices": lambda: jax.block_until_ready((drafts(*on["two"]),
                                                            window(params, cache))),
        "both, one device": lambda: jax.block_until_ready((drafts(*on["one"]),
                                                           window(params, cache))),
    }
    ms = {name: 1e3 * seconds(f) for name, f in timed.items()}
    ms["ideal (the longer half)"] = max(ms["draft k"], ms["window"])
    rows.append({"draft_layers": layers, **ms})
    print(f"{layers}-layer draft: " + ", ".join(f"{n} {v:.1f} ms" for n, v in ms.items()))
  result = dict(machine=machine(), k=k, batch=b, target=args.model, rows=rows)
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / f"pearl_overlap_b{b}.json"
  path.write_text(json.dumps(result, indent=1))
  names = list(rows[0])[1:]
  (args.out / f"pearl_overlap_b{b}.md").write_text(table(
      ["draft layers", *(f"{n} ms" for n in names)],
      [[r["draft_layers"], *(r[n] for n in names)] for r in rows]) + "\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
