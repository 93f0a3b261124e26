"""research/goodput_replay: goodput's choices under fixed step costs, on the tiny target; the
loop scripts' drafter flags (research/common)."""
import argparse
import types

import numpy as np
import pytest

from speculax.decode.calibrate import calibrate
from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import speculative_generate
from speculax.drafters import heads_io
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.medusa import Medusa
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.research import goodput_replay
from speculax.research.common import add_loop_runs, drafter_label, loop_drafter, parse_loop_runs

from test_hydra import random_params
from tiny_prompts import PROMPTS

COSTS = (1.0, 1.3, 1.4, 1.5)  # seconds of a step drafting 0..3, prompt lookup's shape


def test_replay_models_each_run_by_the_lengths_it_took(tiny):
  """Each run's tok/s is its tokens over the costs of the steps it took (recomputed here); a
  fixed k's steps (k = 0: plain decoding) are all at k; a length of +inf cost has no fixed run
  and is never taken; the same call twice chooses the same steps (greedy: no timing, no
  noise)."""
  cfg, params = tiny
  model = types.SimpleNamespace(params=params, config=cfg)
  groups = [PROMPTS[:2], PROMPTS[2:4]]
  costs = (1.0, 1.3, float("inf"), 1.5)
  runs = goodput_replay.replay(model, PromptLookup(max_ngram=3), None, Goodput(), costs, groups,
                               new_tokens=12)
  assert sorted(runs) == ["goodput", "k=0", "k=1", "k=3"]
  for name, run in runs.items():
    assert run["tokens"] == 4 * 12
    seconds = sum(n * c for n, c in zip(run["steps"], costs) if n)
    np.testing.assert_allclose(run["tok_per_s"], run["tokens"] / seconds, rtol=1e-5)
    assert run["steps"][2] == 0, run
    if name != "goodput":
      k = int(name[2:])
      assert run["steps"][k] == sum(run["steps"]) > 0, run
  assert sum(runs["goodput"]["steps"][1:]) > 0, runs["goodput"]  # the repeating target drafts
  again = goodput_replay.replay(model, PromptLookup(max_ngram=3), None, Goodput(), costs, groups,
                                new_tokens=12)
  assert again == runs


def test_replay_starts_goodput_where_calibration_leaves_it(tiny):
  """The replay's goodput run takes the steps of calls started from calibrate()'s own estimate
  on the first group (the bench's path: Goodput.start), under the same costs."""
  cfg, params = tiny
  model = types.SimpleNamespace(params=params, config=cfg)
  groups = [PROMPTS[:2], PROMPTS[2:4]]
  spec = SpecConfig(k=3, max_new_tokens=30, eos_ids=(), goodput=Goodput())
  runs = goodput_replay.replay(model, PromptLookup(max_ngram=3), None, Goodput(), COSTS, groups,
                               new_tokens=30)
  estimate = calibrate(params, cfg, groups[0], PromptLookup(max_ngram=3), spec,
                       repeats=1).estimate
  steps = sum(np.asarray(speculative_generate(params, cfg, g, PromptLookup(max_ngram=3), spec,
                                              step_costs=COSTS, estimate=estimate).k_steps)
              for g in groups)
  assert runs["goodput"]["steps"] == steps.tolist()


def test_a_bench_without_goodput_rows_names_its_methods():
  bench = {"name": "b", "rows": [{"method": "prompt lookup k=1", "step_costs": None,
                                  "sampling": "greedy"},
                                 {"method": "eagle goodput", "step_costs": list(COSTS),
                                  "sampling": "t=1"}]}
  with pytest.raises(ValueError, match="no greedy goodput row.*'eagle goodput', 'prompt lookup"):
    goodput_replay.greedy_goodput_rows(bench)
  bench["rows"][1]["sampling"] = "greedy"
  assert goodput_replay.greedy_goodput_rows(bench, ["eagle goodput"]) == [bench["rows"][1]]
  with pytest.raises(ValueError, match=r"no greedy goodput row of \['eagle'\].*'eagle goodput'"):
    goodput_replay.greedy_goodput_rows(bench, ["eagle"])


def test_set_names_the_goodput_fields(tmp_path):
  """A --set of no Goodput field fails naming it and the fields, before any model loads."""
  bench = tmp_path / "b.json"
  bench.write_text('{"name": "b", "rows": []}')
  with pytest.raises(ValueError, match="Goodput has no field 'marg'.*margin"):
    goodput_replay.main(["--bench", str(bench), "--set", "marg=0"])


def test_an_accelerator_suite_result_replays_its_drafters_rows(tmp_path):
  """The suite's drafters section holds bench rows but no bench settings: its rows are read,
  named by the file, with --new-tokens given; without it the error says so."""
  row = {"method": "m", "sampling": "greedy", "step_costs": list(COSTS)}
  suite = {"sections": {"drafters": [row]}}
  bench = goodput_replay.as_bench(suite, tmp_path / "gpu_b8.json", 48)
  assert bench == {"name": "gpu_b8", "rows": [row], "new_tokens": 48}
  assert goodput_replay.greedy_goodput_rows(bench) == [row]
  with pytest.raises(ValueError, match="gpu_b8.json is an accelerator suite result.*--new-tokens"):
    goodput_replay.as_bench(suite, tmp_path / "gpu_b8.json", None)
  plain = {"name": "b", "rows": [row], "new_tokens": 48}
  assert goodput_replay.as_bench(plain, tmp_path / "b.json", None) is plain


def test_new_tokens_below_one_is_a_usage_error(tmp_path, capsys):
  bench = tmp_path / "b.json"
  bench.write_text('{"name": "b", "new_tokens": 48, "rows": [{"method": "m", "sampling": '
                   '"greedy", "step_costs": [1.0, 1.3]}]}')
  with pytest.raises(SystemExit):
    goodput_replay.main(["--bench", str(bench), "--new-tokens", "0"])
  assert "--new-tokens must be at least 1, got 0" in capsys.readouterr().err


def test_loop_scripts_build_any_drafter_from_generate_flags(tiny, tmp_path, capsys):
  """research/goodput_overhead and goodput_serving take --drafter and its options as `speculax
  generate` does: a cut draft model by its layers, a run folder's own kind without --drafter,
  prompt lookup by default, and an option the kind does not take refused before any build."""
  cfg, params = tiny
  model = types.SimpleNamespace(params=params, config=cfg)
  ap = argparse.ArgumentParser()
  add_loop_runs(ap, prompts=2, drafter=True)
  args = ap.parse_args(["--drafter", "draft-model", "--draft-layers", "1", "-k", "2"])
  drafter, dparams = loop_drafter(args, model)
  assert isinstance(drafter, DraftModel) and drafter.config.n_layers == 1 < cfg.n_layers
  assert drafter_label(args) == "draft-model draft_layers=1"
  heads_io.save_drafter(tmp_path, Medusa(3), random_params(Medusa(3), cfg), "tiny", cfg, 5)
  args = ap.parse_args(["--heads", str(tmp_path), "-k", "3"])
  drafter, dparams = loop_drafter(args, model)
  assert isinstance(drafter, Medusa) and dparams is not None
  assert drafter_label(args) == str(tmp_path)
  args = ap.parse_args(["--heads", str(tmp_path), "--lookup", "2"])
  assert drafter_label(args) == f"{tmp_path} lookup=2"
  args = ap.parse_args([])
  assert isinstance(loop_drafter(args, model).drafter, PromptLookup) and args.k == 4
  assert drafter_label(args) == "prompt-lookup"
  with pytest.raises(ValueError, match="draft-model takes no option skip"):
    loop_drafter(ap.parse_args(["--drafter", "draft-model", "--skip", "3"]), model)
  # the scripts refuse them before loading the model: a usage error naming the value
  for argv, says in ((["--drafter", "draft-model", "--skip", "3"], "takes no option skip"),
                     (["--heads", str(tmp_path / "none")], "no head drafter in")):
    with pytest.raises(SystemExit):
      parse_loop_runs(ap, argv)
    assert says in capsys.readouterr().err
