"""`speculax bench` (bench/): a method matrix on a prompts file against autoregressive decoding,
on the tiny target: every greedy row identical to AR, the speedups relative to the faster AR run,
the files it writes, and bad configs refused naming the value."""
import dataclasses
import json
import pathlib

import pytest

from speculax.bench import measure, report, suites
from speculax.bench.config import BenchConfig, Method, load_config, method, shipped
from speculax.bench.measure import run_prompts
from speculax.bench.run import run
from speculax.cli.main import main
from speculax.core import overrides
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.models.load import LoadedModel


class Bytes:
  """UTF-8 bytes as token ids: real text for the tiny target's 256-token vocabulary."""
  eos_ids = ()

  def encode(self, text):
    return list(text.encode())

  def decode(self, ids):
    return bytes(ids).decode(errors="replace")


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
  texts = ["def add(a, b): return a + b\ndef add(", "the cat sat on the mat, the cat", "abcabcabc"]
  path.write_text("\n".join(json.dumps({"prompt": t, "chat": False}) for t in texts))
  return path


CFG = BenchConfig(
    methods=(method("prompt lookup", "prompt-lookup", k=3, max_ngram=2, goodput=True),
             method("layer skip + exit", "layer-skip", k=3, skip=(1,), exit_threshold=0.3),
             method("draft model tree", "draft-model", k=2, draft_layers=1, tree="full:2,1"),
             method("pearl", "draft-model", k=2, draft_layers=1, pearl="two-device")),
    target="tiny", suites=("chat",), prompts=1, batch_sizes=(1, 2), temperatures=(0.0,), new_tokens=6)


def test_matrix_rows_lossless_with_speedups_and_files(tiny, prompts_file, tmp_path):
  cfg = dataclasses.replace(CFG, suites=(str(prompts_file),))
  references = {}
  result = run(cfg, "t", model=LoadedModel(*tiny, Bytes()), out=tmp_path, echo=None,
               references=references)
  rows = result["rows"]
  ids = suites.encode(Bytes(), suites.suite(str(prompts_file), 2))
  ar = generate(tiny[1], tiny[0], ids, GenerateConfig(max_new_tokens=cfg.new_tokens)).tokens
  assert references == {(str(prompts_file), 1, "greedy"): ar[:1],
                        (str(prompts_file), 2, "greedy"): ar}  # each panel's AR tokens
  names = ["autoregressive", *(m.name for m in cfg.methods), "autoregressive, again"]
  assert [r["method"] for r in rows] == names * 2  # two panels: batch 1 and batch 2
  assert [r["batch"] for r in rows] == [1] * 6 + [2] * 6
  for r in rows:
    assert r["same_as_ar"] == r["sequences"] == r["batch"], r
    assert r["tau"] >= 1 and r["tokens_per_s"] > 0 and r["compile_s"] > 0
  for panel in (rows[:6], rows[6:]):
    ar = [r["speedup"] for r in panel if r["drafter"] is None]
    assert max(ar) == pytest.approx(1.0) and min(ar) <= 1.0  # x AR: over the faster AR run
    ar = [r["decode_tokens_per_s"] for r in panel if r["drafter"] is None]
    for r in panel:  # decode x AR: over the mean of the panel's two AR runs (one round)
      assert r["decode_speedup"] == pytest.approx(2 * r["decode_tokens_per_s"] / sum(ar))
  lookup, skip, tree, pearl = rows[1:5]
  assert len(lookup["acceptance"]) == 3 and skip["drafts_per_step"] <= 3
  assert len(lookup["k_steps"]) == 4 and sum(lookup["k_steps"]) > 0  # goodput: steps by k
  assert skip["k_steps"] is None and rows[0]["k_steps"] is None
  assert 0 <= lookup["k_changes"] < sum(lookup["k_steps"]) and skip["k_changes"] is None
  assert len(lookup["step_costs"]) == 4 and skip["step_costs"] is None  # goodput's costs
  assert tree["drafts_per_step"] == 4  # the tree's 2 + 2 nodes, checked every step
  assert all(r["rows_active"] == 1.0 for r in rows[1:5])  # batch 1: the one row is active
  assert all(0 < r["rows_active"] <= 1 for r in rows[7:11]) and rows[6]["rows_active"] is None
  assert pearl["pearl"] == "two-device" and lookup["pearl"] is None
  assert lookup["verify_cost"] > 0 and rows[0]["verify_cost"] == 1.0
  assert rows[6]["verify_cost"] == 1.0 and rows[7]["verify_cost"] > 0  # batch 2 split too
  assert set(result["forward_s"]) == {1, 2}  # a one-token forward timed at each batch
  assert tree["drafter_mb"] > 0 and lookup["drafter_mb"] == 0.0
  saved = json.loads((tmp_path / "t.json").read_text())
  assert saved["rows"] == json.loads(json.dumps(rows))
  md = (tmp_path / "t.md").read_text()
  assert md == report.markdown(saved) + "\n" and "| draft model tree |" in md
  assert "| rows active |" in md and "| length changes | calibrated step ms at 0..k |" in md
  assert "| x AR | decode x AR |" in md
  assert "/".join(map(str, lookup["k_steps"])) in md
  assert (tmp_path / "t.png").stat().st_size > 5000


def test_continuous_panels_refill_rows_losslessly(tiny, prompts_file, tmp_path):
  """continuous=True: batch 2 decodes all 3 prompts, 2 rows at a time, every method identical
  to the prompts decoded alone."""
  cfg = dataclasses.replace(CFG, methods=CFG.methods[:3], suites=(str(prompts_file),), prompts=3,
                            batch_sizes=(2,), continuous=True, step_split=False)
  references = {}
  result = run(cfg, "c", model=LoadedModel(*tiny, Bytes()), out=tmp_path, echo=None,
               references=references)
  ids = suites.encode(Bytes(), suites.suite(str(prompts_file), 3))
  alone = [generate(tiny[1], tiny[0], [p], GenerateConfig(max_new_tokens=cfg.new_tokens)).tokens[0]
           for p in ids]
  rows = result["rows"]
  assert len(rows) == 5 and all(r["sequences"] == r["same_as_ar"] == 3 for r in rows)
  assert all(0 < r["rows_active"] <= 1 for r in rows[1:4])
  assert result["continuous"] and "continuous batching" in (tmp_path / "c.md").read_text()
  assert references[(str(prompts_file), 2, "greedy")] == alone


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("drafter", [None, PromptLookup()])
def test_the_decode_rate_counts_the_tokens_the_loops_emitted(tiny, prompts_file, continuous,
                                                             drafter):
  """Every token but each prompt's first (its prefill's, timed apart) over the loops' seconds;
  with continuous batching the refills' prefills emit a first token each too."""
  ids = suites.encode(Bytes(), suites.suite(str(prompts_file), 3))
  spec = SpecConfig(k=2, max_new_tokens=5, eos_ids=())
  r = run_prompts(LoadedModel(*tiny, Bytes()), ids, drafter, None, spec, batch=2,
                  continuous=continuous)
  decoded = sum(map(len, r.tokens)) - len(r.tokens)
  assert len(r.tokens) == (3 if continuous else 2) and decoded == len(r.tokens) * 4
  assert r.decode_tokens_per_s * r.decode_s == pytest.approx(decoded)


def test_a_run_stopped_midway_keeps_its_rows(tiny, prompts_file, tmp_path, monkeypatch):
  """Rows are written as they come: a run stopped by a time limit keeps what it measured (the
  H100 session of 2026-11-27 lost a goodput bench stopped inside its first panel)."""
  from speculax.bench import run as bench_run
  real, done = bench_run.run_prompts, []

  def stopped(*args, **kw):
    if len(done) == 2:
      raise TimeoutError("out of device time")
    done.append(real(*args, **kw))
    return done[-1]

  monkeypatch.setattr(bench_run, "run_prompts", stopped)
  cfg = dataclasses.replace(CFG, suites=(str(prompts_file),), batch_sizes=(1,), step_split=False)
  lines = []
  with pytest.raises(TimeoutError):
    run(cfg, "s", model=LoadedModel(*tiny, Bytes()), out=tmp_path, echo=lines.append)
  rows = json.loads((tmp_path / "s.json").read_text())["rows"]
  assert [r["method"] for r in rows] == ["autoregressive", "prompt lookup"]
  assert rows[1]["tokens_per_s"] == done[1].tokens_per_s and "speedup" not in rows[1]
  assert lines[1].startswith(f"{prompts_file} b1 greedy prompt lookup: tau ")


def test_methods_are_picked_by_name(capsys):
  cfg = load_config("goodput")
  picked = cfg.only(["eagle-ttt k=1", "prompt lookup k=4"])
  assert [m.name for m in picked.methods] == ["prompt lookup k=4", "eagle-ttt k=1"]  # its order
  assert cfg.only([]) == cfg
  with pytest.raises(ValueError, match=r"no methods named \['eagle k=9'\] in this bench config; "
                                       r"its methods: \['prompt lookup k=1', "):
    cfg.only(["eagle k=9"])
  assert main(["bench", "--config", "goodput", "--method", "eagle k=9"]) == 2
  assert "no methods named ['eagle k=9']" in capsys.readouterr().err


def test_heads_set_has_rows_for_the_shipped_head_drafters_only(tmp_path):
  from speculax.configs.bench import heads
  assert "heads" in shipped()
  (tmp_path / "medusa-smollm2").mkdir()
  rows = heads.methods(tmp_path)
  assert [m.name for m in rows] == ["medusa k=1", "medusa k=2", "medusa k=4",
                                    "medusa tree (15 nodes)"]
  assert {m.drafter for m in rows} == {"medusa"}
  assert rows[-1].options["tree"].n_nodes == 15
  assert rows[0].options["heads"] == str(tmp_path / "medusa-smollm2")


def test_draft_model_set_reads_the_trained_run_or_says_to_train_it(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the set reads runs/ of the working directory
  with pytest.raises(ValueError, match="no trained draft model in runs/distill-smollm2"):
    load_config("draft_model")
  (tmp_path / "runs" / "distill-smollm2-fkl").mkdir(parents=True)
  rows = load_config("draft_model").methods
  assert [m.name for m in rows] == ["draft-model k=1", "draft-model k=2", "draft-model k=4",
                                    "draft-model tree (9 nodes)"]
  assert rows[0].options["draft"] == "runs/distill-smollm2-fkl"


@pytest.mark.parametrize("name", [n for n in shipped() if n != "draft_model"])  # runs/: above
def test_every_shipped_set_builds_its_drafters_options(name):
  """Each shipped method set loads, and every method's options are ones its drafter kind takes
  (what the CLI checks before a model loads), its trained heads shipped with the repository."""
  from speculax.drafters import registry
  for m in load_config(name).methods:
    if m.drafter is None:
      continue
    registry.check_options(m.drafter, **m.options)
    if "heads" in m.options:
      assert (pathlib.Path(m.options["heads"]) / "drafter.json").is_file(), (name, m.name)


def test_shipped_sets_load_and_overrides_apply():
  assert {"quick", "drafters"} <= set(shipped())
  cfg = overrides.apply(load_config("quick"), ["prompts=5", "batch_sizes=1,8",
                                               "temperatures=(0, 1)", "new_tokens=16"])
  assert (cfg.prompts, cfg.batch_sizes, cfg.temperatures, cfg.new_tokens) == (5, (1, 8),
                                                                              (0.0, 1.0), 16)
  with pytest.raises(ValueError, match="BenchConfig has no field 'prompt'.*prompts"):
    overrides.apply(cfg, ["prompt=2"])
  with pytest.raises(ValueError, match="BenchConfig.prompts must be an int >= 1, got 0"):
    overrides.apply(cfg, ["prompts=0"])
  with pytest.raises(ValueError, match="FIELD.PATH=VALUE, got 'prompts'"):
    overrides.apply(cfg, ["prompts"])
  assert overrides.apply(cfg, ["repeats=3"]).repeats == 3
  for bad in ("0", "2.5", "True"):
    with pytest.raises(ValueError, match=f"BenchConfig.repeats must be an int >= 1, got {bad}"):
      overrides.apply(cfg, [f"repeats={bad}"])


@pytest.mark.parametrize("build, message", [
    (lambda: Method("m", "no-such-drafter"), "unknown drafter 'no-such-drafter'"),
    (lambda: Method("m", None, options={"k": 2}), "autoregressive decoding .* takes no options"),
    (lambda: Method("m", None, goodput=True), "takes no options, got \\[\\] and goodput=True"),
    (lambda: Method("m", "prompt-lookup", pearl="one-device"),
     "pearl must be one of .* with the draft-model drafter .* drafter 'prompt-lookup'"),
    (lambda: Method("m", "draft-model", pearl="three"), "got pearl='three'"),
    (lambda: dataclasses.replace(CFG, methods=(method("a", "prompt-lookup"),) * 2),
     "distinct names"),
    (lambda: dataclasses.replace(CFG, methods=(method("autoregressive", "prompt-lookup"),)),
     "none 'autoregressive'"),
    (lambda: dataclasses.replace(CFG, precision="fp8"), "precision must be one of .* got 'fp8'"),
    (lambda: suites.suite("no-such-suite", 2), "unknown prompt suite 'no-such-suite'"),
    (lambda: dataclasses.replace(CFG, suites=("chat", "nope")), "unknown prompt suite 'nope'"),
    (lambda: dataclasses.replace(CFG, prompts=3, continuous=True),
     r"PEARL decodes fixed batches: drop \['pearl'\]"),
    (lambda: dataclasses.replace(CFG, methods=CFG.methods[:1], prompts=2, continuous=True),
     "continuous at batch 2 needs more prompts than rows to refill them; prompts=2"),
])
def test_bad_configs_are_refused(build, message):
  with pytest.raises(ValueError, match=message):
    build()


def test_bad_method_options_fail_before_any_decoding(tiny, prompts_file):
  model = LoadedModel(*tiny, Bytes())
  for m, message in [(method("x", "prompt-lookup", skip=(1,)), "prompt-lookup takes no option skip"),
                     (method("x", "layer-skip", skip=(1,), set={"stop_threshold": 0.5}),
                      "layer-skip has no field stop_threshold")]:
    cfg = dataclasses.replace(CFG, methods=(m,), suites=(str(prompts_file),))
    with pytest.raises(ValueError, match=message):
      run(cfg, model=model, echo=None)


def test_cli_refuses_a_missing_config(capsys):
  assert main(["bench", "--config", "no-such-set"]) == 2
  assert "bench config 'no-such-set' does not exist (shipped ones: " in capsys.readouterr().err


def test_named_suites_are_held_out_prompts():
  from speculax.models.assets import humaneval_prompts
  from speculax.train import prompts
  assert [x["prompt"] for x in suites.suite("humaneval", 2)] == humaneval_prompts(6)[4:]
  for name in ("chat", "chat-mix"):
    chat = suites.suite(name, 3)
    assert all(x["chat"] for x in chat) and {x["prompt"] for x in chat} <= set(
        prompts.chat_prompts("heldout")) and not {x["prompt"] for x in chat} & set(
        prompts.chat_prompts("train"))
  assert suites.suite("chat", 2)[1]["prompt"].endswith("pruning roses?")  # subject by subject
  assert "pruning roses" not in suites.suite("chat-mix", 2)[1]["prompt"]  # across subjects
  code = suites.suite("code", 2)
  assert len(code) == 2 and not any(x["chat"] for x in code)
  assert all(suites.CODE_CHARS // 2 < len(x["prompt"]) <= suites.CODE_CHARS + 1 for x in code)


def test_repeats_run_round_robin_and_report_the_median(tiny, prompts_file, tmp_path,
                                                        monkeypatch):
  from speculax.bench import run as bench_run
  real_run, real_calibrate, calls, calibrated = bench_run.run_prompts, bench_run.calibrate, [], []

  def counted(model, chunk, drafter, *args, **kw):
    calls.append(None if drafter is None else drafter.name)
    return real_run(model, chunk, drafter, *args, **kw)

  def calibrate(*args, **kw):
    calibrated.append(args[3].name)
    return real_calibrate(*args, **kw)

  monkeypatch.setattr(bench_run, "run_prompts", counted)
  monkeypatch.setattr(bench_run, "calibrate", calibrate)
  cfg = dataclasses.replace(CFG, methods=CFG.methods[:2], suites=(str(prompts_file),),
                            batch_sizes=(1,), repeats=3)
  result = run(cfg, "r", model=LoadedModel(*tiny, Bytes()), out=tmp_path, echo=None)
  one_round = [None, "prompt-lookup", "layer-skip", None]
  assert calls == one_round * 3  # round-robin, not each method three times in a row
  assert calibrated == ["prompt-lookup"]  # goodput's costs measured once, reused every round
  rows = result["rows"]
  assert [r["method"] for r in rows] == ["autoregressive", "prompt lookup", "layer skip + exit",
                                         "autoregressive, again"]
  for r in rows:
    assert len(r["tokens_per_s_rounds"]) == 3 and r["same_as_ar"] == 1
    assert r["tokens_per_s"] == sorted(r["tokens_per_s_rounds"])[1]
    assert len(r["decode_tokens_per_s_rounds"]) == 3
    assert r["decode_tokens_per_s"] == sorted(r["decode_tokens_per_s_rounds"])[1]
  round_ar = [(a + b) / 2 for a, b in zip(rows[0]["decode_tokens_per_s_rounds"],
                                          rows[-1]["decode_tokens_per_s_rounds"])]
  lookup = rows[1]["decode_tokens_per_s_rounds"]  # paired with its own round's AR runs
  assert rows[1]["decode_speedup"] == pytest.approx(
      sorted(x / a for x, a in zip(lookup, round_ar))[1])
  assert max(r["speedup"] for r in rows if r["drafter"] is None) == pytest.approx(1.0)
  md = (tmp_path / "r.md").read_text()
  assert "| tok/s | tok/s rounds |" in md and "the median of each row's rounds" in md
  rounds = " ".join(f"{x:.3g}" for x in rows[1]["tokens_per_s_rounds"])
  assert f"| {rounds} |" in md


def test_the_machine_line_names_the_cpu_model(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14\n"
                  "processor\t: 1\nmodel name\t: AMD EPYC 9R14\n")
  assert measure.cpu_model(info) == "AMD EPYC 9R14"
  info.write_text("processor\t: 0\nmodel name\t:\n")
  assert measure.cpu_model(info) is None
  assert measure.cpu_model(tmp_path / "absent") is None
