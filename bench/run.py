"""Runs a BenchConfig: every method in every panel (suite x batch x temperature) against
autoregressive decoding in the same process, on the same prompts, compile time apart.

One row per method and panel: tau, acceptance by position, draft tokens checked per step,
tokens/s, speedup over AR (of the whole call; and of its decode loop alone, the prefill being
the same work for every method, as the median over rounds of each round's ratio to that round's
AR runs), speedup/tau, greedy rows identical to AR's, compile seconds, the drafter's own params
(MB), the device's peak memory where the backend reports it, and at batch 1 where a step's time
goes, in one-token target forwards timed alone: the verify forward (timed alone for that many
tokens) and the rest (drafting and the loop's own work).

With cfg.repeats > 1 a panel runs its methods that many rounds, round-robin (AR, each method, AR
again, then all of them again), and a row's tokens/s (and step split) is the median of its
rounds: a machine whose speed drifts over minutes moves every method alike within a round,
where one run per method, in order, lets the drift land between neighbouring rows.
"""
from __future__ import annotations

import datetime
import itertools
import json
import pathlib
import statistics
import sys
from typing import Callable

import jax
import tqdm.auto as tqdm

from speculax.bench import suites
from speculax.bench.config import AUTOREGRESSIVE, BenchConfig, sampling_name
from speculax.bench.measure import forward_seconds, machine, run_prompts
from speculax.bench.methods import build_drafter, params_mb
from speculax.core.sampling import SamplingConfig
from speculax.decode.calibrate import calibrate
from speculax.decode.config import SpecConfig
from speculax.models import load as load_lib


def loader(cfg: BenchConfig) -> Callable:
  """name -> LoadedModel in the config's precision and attention (targets and draft models)."""
  def load(name):
    model = load_lib.load(name, attention_impl=cfg.attention)
    return load_lib.with_precision(model, cfg.precision)
  return load


def run(cfg: BenchConfig, name: str = "bench", model=None, out: str | pathlib.Path | None = None,
        command: str = "", echo=print, references: dict | None = None) -> dict:
  """The result dict (machine, date, config, lone-forward seconds, rows), written after every
  row to <out>/<name>.json (with .md and .png at the end) when `out` is given, so a run stopped
  by a time limit keeps what it measured (x AR comes when a panel ends). model: the
  loaded target (default: cfg.target loaded). references: a dict the run fills with each
  panel's autoregressive tokens ((suite, batch, sampling) -> one token list per prompt), for a
  caller that compares a peer's output without decoding again."""
  load = loader(cfg)
  model = load(cfg.target) if model is None else model
  want = max(cfg.prompts, *cfg.batch_sizes)
  prompt_sets = {s: suites.encode(model.tokenizer, suites.suite(s, want)) for s in cfg.suites}
  built = {m.name: (None, None) if m.drafter is None else
           build_drafter(m.drafter, model, load, m.options, m.k, m.fields) for m in cfg.methods}
  result = dict(name=name, command=command, machine=machine(),
                date=datetime.date.today().isoformat(), target=cfg.target,
                precision=cfg.precision, new_tokens=cfg.new_tokens, continuous=cfg.continuous,
                forward_s={}, rows=[])
  forwards = result["forward_s"]  # batch -> tokens -> seconds of a forward (the step split)
  order = [AUTOREGRESSIVE, *cfg.methods, AUTOREGRESSIVE]  # AR first and last: machine drift
  panels = [(s, b, t) for s in cfg.suites for b in cfg.batch_sizes for t in cfg.temperatures]
  bar = tqdm.tqdm(total=len(panels) * len(order) * cfg.repeats, desc=f"bench {name}",
                  disable=None, file=sys.stderr)
  for suite, batch, temperature in panels:
    ids = prompt_sets[suite]
    # batch b > 1 fixed: whole batches of b, at least one (prompts=3 at b=8: the first 8)
    chunk = (ids[:cfg.prompts] if batch == 1 or cfg.continuous
             else ids[:max(cfg.prompts // batch, 1) * batch])
    panel, reference, costs, step_s = [], None, {}, {}  # calibrations, step seconds: per method
    for rnd, (i, m) in itertools.product(range(cfg.repeats), enumerate(order)):
      drafter, dparams = built.get(m.name, (None, None))
      spec = SpecConfig(k=m.k, max_new_tokens=cfg.new_tokens,
                        sampling=SamplingConfig(temperature=temperature),
                        goodput=m.policy)
      bar.set_postfix_str(f"{suite} b{batch} {sampling_name(temperature)}: {m.name}")
      if i not in costs:  # calibrated once: every round weighs the same step costs
        costs[i] = None if m.policy is None else calibrate(
            model.params, model.config, chunk[:batch], drafter, spec, dparams)
      r = run_prompts(model, chunk, drafter, dparams, spec, batch, hot=m.hot,
                      calibration=costs[i], pearl_form=m.pearl,
                      continuous=cfg.continuous and batch > 1)
      step_s.setdefault(i, []).append(r.decode_s / max(r.steps, 1))
      if rnd == 0:
        reference = reference or r.tokens
        panel.append(dict(
            method=m.name if i < len(order) - 1 else f"{m.name}, again",
            drafter=m.drafter, k=m.k, suite=suite, batch=batch,
            sampling=sampling_name(temperature), tau=r.tau, acceptance=r.acceptance,
            drafts_per_step=r.drafts_per_step, rows_active=r.rows_active, k_steps=r.k_steps,
            k_changes=r.k_changes, pearl=m.pearl,
            step_costs=None if costs[i] is None else costs[i].step_costs.tolist(),
            tokens_per_s_rounds=[],
            decode_tokens_per_s_rounds=[],
            compile_s=r.compile_s, drafter_mb=params_mb(dparams),
            peak_memory_mb=_peak_memory_mb(), sequences=len(r.tokens),
            same_as_ar=(sum(a == b for a, b in zip(r.tokens, reference))
                        if temperature == 0 else None)))
      row = panel[i]
      row["tokens_per_s_rounds"].append(r.tokens_per_s)
      row["tokens_per_s"] = statistics.median(row["tokens_per_s_rounds"])
      row["decode_tokens_per_s_rounds"].append(r.decode_tokens_per_s)
      row["decode_tokens_per_s"] = statistics.median(row["decode_tokens_per_s_rounds"])
      if cfg.step_split:  # PEARL's window: the pending token and k - 1 ready drafts
        row |= _step_split(model, forwards.setdefault(batch, {}), statistics.median(step_s[i]),
                           m.k if m.pearl else _checked(drafter, m.k), batch)
      if echo is not None:
        echo(f"{suite} b{batch} {row['sampling']} {row['method']}"
             + (f" (round {rnd + 1} of {cfg.repeats})" if cfg.repeats > 1 else "")
             + f": tau {row['tau']:.2f}, {r.tokens_per_s:.1f} tok/s, compile {r.compile_s:.1f} s"
             + (f", same as AR {row['same_as_ar']}/{row['sequences']}"
                if row["same_as_ar"] is not None else ""))
      if out is not None:
        _write_json(result | {"rows": result["rows"] + panel}, out)
      bar.update()
    # Each panel compiles its own loops; dropped when it ends (memory-map limit on long runs),
    # kept until then so a later round reuses them.
    jax.clear_caches()
    base = max(r["tokens_per_s"] for r in panel if r["drafter"] is None)
    # decode_speedup pairs each round with its own AR runs (the mean of the first and the last):
    # the machine's speed moves more between rounds than within one.
    round_ar = [statistics.mean(rates) for rates in zip(
        *(r["decode_tokens_per_s_rounds"] for r in panel if r["drafter"] is None))]
    for row in panel:
      row |= dict(speedup=row["tokens_per_s"] / base,
                  speedup_per_tau=row["tokens_per_s"] / base / row["tau"],
                  decode_speedup=statistics.median(  # None: no decode step ran
                      x / a for x, a in zip(row["decode_tokens_per_s_rounds"], round_ar))
                  if all(round_ar) else None)
    if echo is not None:
      echo(f"{suite} b{batch} {sampling_name(temperature)}, x AR: "
           + ", ".join(f"{r['method']} {r['speedup']:.2f}" for r in panel if r["drafter"]))
    result["rows"] += panel
    if references is not None:
      references[(suite, batch, sampling_name(temperature))] = reference
    if out is not None:
      _write_json(result, out)
  bar.close()
  if out is not None:
    write(result, out)
  return result


def write(result: dict, out: str | pathlib.Path) -> dict[str, pathlib.Path]:
  """<out>/<name>.json, .md (report.markdown) and .png (tau against speedup, a panel each)."""
  from speculax.bench import report
  path = _write_json(result, out)
  md = path.with_suffix(".md")
  md.write_text(report.markdown(result) + "\n", encoding="utf-8")
  png = path.with_suffix(".png")
  panels = tuple(dict.fromkeys(_panel(r) for r in result["rows"]))
  report.plot_tau_speedup([r | {"panel": _panel(r)} for r in result["rows"]], png,
                          result["target"], panels=panels, key="panel")
  return {"json": path, "md": md, "png": png}


def _write_json(result: dict, out) -> pathlib.Path:
  path = pathlib.Path(out) / f"{result['name']}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
  return path


def _panel(row: dict) -> str:
  return f"{row['suite']}, batch {row['batch']}, {row['sampling']}"


def _checked(drafter, k: int) -> int:
  """Tokens one verify forward scores per sequence: the drafts and the pending token."""
  if drafter is None:
    return 1
  tree = getattr(drafter, "tree", None)
  return (tree.n_nodes if tree is not None else k) + 1


def _step_split(model, forwards: dict, step_s: float, n: int, batch: int) -> dict:
  """A loop step of step_s seconds in one-token forwards of `batch` rows timed outside the loop:
  the whole step, its verify forward (n tokens a row) and the rest (AR's rest: its loop's own
  share, below 0 when the loop runs a step faster than the timed forward)."""
  for t in {1, n} - forwards.keys():
    forwards[t] = forward_seconds(model, t, batch=batch)
  step = step_s / forwards[1]
  verify = forwards[n] / forwards[1]
  return dict(step_cost=step, verify_cost=verify, draft_cost=step - verify)


def _peak_memory_mb() -> float | None:
  stats = jax.devices()[0].memory_stats()  # None on CPU
  return None if not stats else stats.get("peak_bytes_in_use", 0) / 1e6
