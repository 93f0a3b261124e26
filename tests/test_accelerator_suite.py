"""The accelerator suite (research/accelerator_suite.py) stays runnable: its --smoke form runs
every section on tiny shapes on CPU and writes the JSON, the plot and the tables."""
import json
import math

import pytest

from speculax.models.config import PRECISIONS
from speculax.research import accelerator_report, accelerator_suite, trace_summary

pytestmark = pytest.mark.slow  # reads SmolLM2's tokenizer from the GGUF


def test_smoke_runs_every_section(tmp_path, capsys):
  path = tmp_path / "suite.json"
  results = accelerator_suite.main(["--smoke", "--results", str(path),
                                    "--drafters-dir", str(tmp_path / "no-drafters"),
                                    "--trace", str(tmp_path / "trace")])
  assert results["errors"] == {}
  assert json.loads(path.read_text())["sections"].keys() == results["sections"].keys() == {
      "autoregressive", "verify", "attention", "loops", "training", "drafters"}
  assert path.with_suffix(".png").stat().st_size > 10_000
  sec, sizes = results["sections"], accelerator_suite.SMOKE

  ar = sec["autoregressive"]
  assert len(ar) == (len(PRECISIONS) + 1) * len(sizes.batches)
  for r in ar:
    assert all(math.isfinite(r[k]) and r[k] > 0 for k in
               ("step_ms", "tokens_per_s", "bandwidth_floor_ms", "launch_floor_ms")), r
  # The bf16 settings hold half the weight bytes of float32, so half the bandwidth floor.
  floor = {r["model"]: r["bandwidth_floor_ms"] for r in ar if r["batch"] == 1}
  assert floor["smoke bf16 weights"] == pytest.approx(floor["smoke float32"] / 2, rel=1e-6)

  assert set(sec["verify"]["cost"]) == set(sizes.forward_tokens)
  assert sec["verify"]["cost"][1] == 1.0

  attention = sec["attention"]
  assert [(r["cache"], r["tree"]) for r in attention] == [
      (s, t) for s in sizes.cache_lengths for t in sizes.tree_sizes]
  assert all(r["max_abs_error"] < 0.05 for r in attention), attention  # kernel == XLA (bf16)

  loops = {(r["attention"], r["loop"]): r for r in sec["loops"]}
  assert set(loops) == {("xla", "autoregressive"), ("xla", "prompt lookup k=4"),
                        ("xla", "goodput forced k'=0"), ("xla", "goodput forced k'=1"),
                        ("xla", "prompt lookup k=1"), ("xla", "goodput free, chain"),
                        ("xla", "goodput free, switch"), ("pallas-interpret", "autoregressive"),
                        ("pallas-interpret", "prompt lookup k=4")}
  assert all(r["same_as_ar"] == r["sequences"] and r["step_ms"] > 0 for r in loops.values())
  # Forced goodput loops take the one length on every step, so they decode as the fixed loop.
  for k in (0, 1):
    steps = loops["xla", f"goodput forced k'={k}"]["k_steps"]
    assert steps[k] == sum(steps) > 0, steps
    assert loops["xla", f"goodput forced k'={k}"]["k_changes"] == 0
  assert loops["xla", "goodput forced k'=1"]["tau"] == loops["xla", "prompt lookup k=1"]["tau"]
  assert loops["xla", "goodput forced k'=0"]["tau"] == 1.0
  # Choosing freely under the same fixed costs, the chain and the switch take the same steps
  # (several lengths, so the rows time the form's length changes).
  chain, switch = (loops["xla", f"goodput free, {form}"] for form in ("chain", "switch"))
  assert chain["k_steps"] == switch["k_steps"] and chain["tau"] == switch["tau"]
  assert sum(n > 0 for n in chain["k_steps"]) > 1, chain["k_steps"]
  assert chain["k_changes"] == switch["k_changes"] > 0
  for folder in ("b1-fixed-k1", "b1-goodput-k1"):  # --trace: one profiled run each
    assert trace_summary.find(tmp_path / "trace" / folder).stat().st_size > 0

  train = sec["training"]
  assert train["tokens_per_s"] > 0 and train["steps"] == sizes.train_steps

  rows = sec["drafters"]
  assert {r["method"] for r in rows} >= {"autoregressive", "prompt lookup"}
  assert not list(tmp_path.glob("suite_drafters*"))  # done: the suite's JSON holds the rows
  assert all(r["same_as_ar"] == r["sequences"] for r in rows)  # greedy: lossless
  text = accelerator_report.markdown(results)
  assert "x floor" in text and "XLA / kernel" in text and "tokens/s" in text
  capsys.readouterr()
  accelerator_report.main([str(path)])  # the tables again, from the JSON alone
  assert capsys.readouterr().out == text + "\n"


def test_random_weights_keep_the_presets_shapes_and_refuse_the_drafters_section(capsys):
  target = accelerator_suite.random_target("tiny-untied-llama3")
  assert target.config == accelerator_suite.get_preset("tiny-untied-llama3")
  assert target.tokenizer is None and "random weights" in target.name
  with pytest.raises(SystemExit):
    accelerator_suite.main(["--random-weights", "--model", "tiny-untied-llama3"])
  assert "random weights" in capsys.readouterr().err


def test_an_unknown_drafter_row_is_named(tmp_path):
  results = accelerator_suite.main(["--smoke", "--sections", "drafters", "--results",
                                    str(tmp_path / "s.json"), "--drafter-method", "eagle k=9",
                                    "--drafters-dir", str(tmp_path / "no-drafters")])
  assert "eagle k=9" in results["errors"]["drafters"]


def test_a_section_stopped_midway_keeps_its_rows(tmp_path, monkeypatch):
  """Row-by-row sections write each row as it comes: the first H100 run's autoregressive section
  was stopped by its time limit after 8 rows and, written at its end, kept none."""
  row = dict(cache=64, tree=4, kernel_us=2.0, xla_us=3.0, speedup=1.5, max_abs_error=0.0)

  def broken(sizes):
    yield row
    raise RuntimeError("out of device time")
  monkeypatch.setattr(accelerator_suite, "kernel_vs_xla", broken)
  path = tmp_path / "s.json"
  results = accelerator_suite.main(["--smoke", "--sections", "attention", "--results", str(path)])
  assert results["sections"]["attention"] == [row]
  assert "out of device time" in results["errors"]["attention"]
  assert json.loads(path.read_text())["sections"]["attention"] == [row]


def test_a_drafters_section_stopped_midway_keeps_its_rows(tmp_path, monkeypatch):
  """The drafters section returns its rows when it ends; the bench beside it writes each row as
  it comes (s_drafters.json next to s.json, removed when the section ends), so a run stopped by a
  time limit keeps them."""
  decode, calls = accelerator_suite.bench_run.run_prompts, []

  def stops(*args, **kw):  # the first decode runs, the second finds the device time spent
    calls.append(1)
    if len(calls) > 1:
      raise RuntimeError("out of device time")
    return decode(*args, **kw)
  monkeypatch.setattr(accelerator_suite.bench_run, "run_prompts", stops)
  results = accelerator_suite.main(["--smoke", "--sections", "drafters", "--results",
                                    str(tmp_path / "s.json"),
                                    "--drafters-dir", str(tmp_path / "no-drafters")])
  assert "out of device time" in results["errors"]["drafters"]
  rows = json.loads((tmp_path / "s_drafters.json").read_text())["rows"]
  assert [r["method"] for r in rows] == ["autoregressive"] and rows[0]["tokens_per_s"] > 0


def test_the_drafters_section_decodes_with_the_attention_it_is_given(tmp_path, monkeypatch):
  """`--drafter-set attention=pallas` runs the target's decoding through the tree-attention
  kernel (the bench applies its attention only to models it loads itself)."""
  seen = []
  monkeypatch.setattr(accelerator_suite.bench_run, "run", lambda cfg, name, model, out: seen.append(
      (cfg.attention, model.config.runtime.attention_impl)) or {"rows": []})
  for extra in ([], ["--drafter-set", "attention=pallas-interpret"]):
    accelerator_suite.main(["--smoke", "--sections", "drafters", "--results",
                            str(tmp_path / "s.json"), *extra])
  assert seen == [("xla", "xla"), ("pallas-interpret", "pallas-interpret")]


def test_the_loops_section_runs_the_loops_named(tmp_path):
  """--loop-rows: a GPU session short of device time runs only the loops it came for, beside the
  autoregressive reference; a name the section does not have is refused before any compile."""
  path = str(tmp_path / "s.json")
  results = accelerator_suite.main(["--smoke", "--sections", "loops", "--results", path,
                                    "--loop-rows", "goodput free, chain;prompt lookup k=4"])
  assert results["errors"] == {}
  assert {(r["attention"], r["loop"]) for r in results["sections"]["loops"]} == {
      ("xla", "autoregressive"), ("xla", "goodput free, chain"), ("xla", "prompt lookup k=4"),
      ("pallas-interpret", "prompt lookup k=4")}
  assert {r["batch"] for r in results["sections"]["loops"]} == set(accelerator_suite.SMOKE.batches)
  results = accelerator_suite.main(["--smoke", "--sections", "loops", "--results", path,
                                    "--loop-rows", "goodput free"])
  assert "no loop named 'goodput free'" in results["errors"]["loops"]
  assert results["sections"]["loops"] == []
