"""What scoring costs a head drafter's training update on this machine: the product of n positions'
features [n, d] with v of the target's output rows [v, d], forward and back to the features under
a log-softmax loss. The rows are the frozen target's (VocabTrim gathers them), so an update pays
no weight gradient for them: this product is what the LK objective's scoring costs an EAGLE update
of n = rows x seq_len positions. Timed per dtype and per number of rows (VocabTrim's sizes) as
bench.measure.chained_seconds times a forward; seconds and GFLOP/s (4 n d v flops: two products of
2 n d v). Random values of the target's shapes: the time does not read them.

  python -m speculax.research.head_product_cost [--positions 2048] [--rows 4096 16384]
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib

import jax
import jax.numpy as jnp

from speculax.bench.measure import chained_seconds, machine
from speculax.bench.report import table
from speculax.models.config import get_preset
from speculax.research.common import OUT


def feature_grad(h: jax.Array, w: jax.Array, target: jax.Array) -> jax.Array:
  """d/dh of the mean cross-entropy of logits h @ w.T at `target`, the product in w's dtype with
  float32 accumulation. h [n, d], w [v, d], target [n] -> [n, d]."""
  def loss(h):
    logits = jnp.einsum("nd,vd->nv", h.astype(w.dtype), w,
                        preferred_element_type=jnp.float32)  # [n, v]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), target[:, None], 1))
  return jax.grad(loss)(h)


def measure(positions: int, d_model: int, rows: int, dtype: str, repeats: int) -> dict:
  """Seconds and GFLOP/s of one forward-and-back product, chained `repeats` times (each step moves
  the features by its gradient, so no step can be dropped or hoisted)."""
  kh, kw, kt = jax.random.split(jax.random.key(0), 3)
  h = jax.random.normal(kh, (positions, d_model), jnp.float32)
  w = (0.02 * jax.random.normal(kw, (rows, d_model), jnp.float32)).astype(dtype)
  target = jax.random.randint(kt, (positions,), 0, rows)
  step = lambda h, w, target: h - 1e-3 * feature_grad(h, w, target)
  seconds = chained_seconds(step, h, w, target, repeats=repeats)
  return {"positions": positions, "d_model": d_model, "rows": rows, "dtype": dtype,
          "seconds": seconds, "gflop_per_s": 4 * positions * d_model * rows / seconds / 1e9}


def main(argv: list[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--d-model", type=int, default=get_preset("smollm2-135m").d_model,
                  help="feature width (default: SmolLM2-135M's)")
  ap.add_argument("--out", type=pathlib.Path, default=OUT, help="folder for the JSON")
  ap.add_argument("--positions", type=int, default=2048,
                  help="positions an update scores (rows x seq_len: 8 x 256 in the recipe)")
  ap.add_argument("--rows", type=int, nargs="+", default=[2048, 4096, 8192, 16384],
                  help="output rows scored (VocabTrim sizes)")
  ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                  choices=["float32", "bfloat16"])
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args(argv)
  for name in ("d_model", "positions", "rows", "repeats"):
    v = getattr(args, name)
    if min(v if isinstance(v, list) else [v]) < 1:
      ap.error(f"--{name.replace('_', '-')} must be at least 1; got {v}")
  runs = [measure(args.positions, args.d_model, v, dtype, args.repeats)
          for dtype in args.dtypes for v in args.rows]
  result = {"machine": machine(), "jax": jax.__version__,
            "date": datetime.date.today().isoformat(), "runs": runs}
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / "head_product_cost.json"
  path.write_text(json.dumps(result, indent=1))
  print(f"\nThe output rows' product, forward and back to the features; {result['machine']}\n")
  print(table(["dtype", "rows", "positions", "ms", "GFLOP/s"],
              [[r["dtype"], r["rows"], r["positions"], f"{1e3 * r['seconds']:.1f}",
                f"{r['gflop_per_s']:.0f}"] for r in runs]))
  print(f"\n{path}")
  return result


if __name__ == "__main__":
  main()
