import json

import pytest

from speculax.cli.main import main
from speculax.core import overrides


def test_help_explains_every_flag(capsys):
  with pytest.raises(SystemExit) as e:
    main(["generate", "--help"])
  assert e.value.code == 0
  text = capsys.readouterr().out
  for flag in ["--model", "--prompt", "--humaneval", "--raw", "--max-new-tokens", "--temperature",
               "--top-k", "--top-p", "--seed", "--drafter", "-k", "--skip", "--draft-model",
               "--draft-layers", "--tree", "--heads", "--mesh", "--dtype", "--compute-dtype",
               "--cache-dtype", "--attention"]:
    assert f"  {flag} " in text or f"  {flag}\n" in text, flag


# Files the malformed-input table below names as {name}: (file name, text).
FILES = {
    "stream": ("stream.jsonl", '{"prompt": "hi"}\n'),
    "bad_jsonl": ("bad_jsonl.jsonl", '{"prompt": "hi"}\n{"text": "no prompt key"}\n'),
    "not_json": ("not_json.jsonl", '{"prompt": "hi"\n'),
    "empty_txt": ("empty.txt", "\n  \n"),
    "syntax": ("syntax.py", "EXPERIMENT = DistillExperiment(\n"),
    "not_experiment": ("not_experiment.py", "EXPERIMENT = 3\n"),
    "no_experiment": ("no_experiment.py", "OTHER = 1\n"),
    "missing_field": ("missing_field.py", "from train.experiment import DistillExperiment\n"
                                          "EXPERIMENT = DistillExperiment()\n"),
    "bad_value": ("bad_value.py", "from train.experiment import DataConfig, DistillExperiment\n"
                                  "EXPERIMENT = DistillExperiment('x', data=DataConfig(rows=0))\n"),
    "raises": ("raises.py", "import no_such_module\n"),
}

MALFORMED = [
    ([], "the following arguments are required: COMMAND"),
    (["serve"], "invalid choice: 'serve'"),
    # generate
    (["generate", "--mesh", "2,2"], "--mesh must be three integers"),
    (["generate", "--prompt", "  "], "--prompt is empty"),
    (["generate", "--model", "no-such-model"], "no-such-model"),
    (["generate", "--temperature", "-1"], "temperature must be a finite number >= 0, got -1.0"),
    (["generate", "--temperature", "nan"], "temperature must be a finite number >= 0, got nan"),
    (["generate", "--top-p", "0"], "top_p must be a finite number > 0 and <= 1, got 0.0"),
    (["generate", "--top-k", "2.5"], "argument --top-k: must be an int >= 0, got '2.5'"),
    (["generate", "-k", "0"], "argument -k: must be an int >= 1, got 0"),
    (["generate", "--humaneval", "-1"], "argument --humaneval: must be an int >= 1, got -1"),
    (["generate", "--max-new-tokens", "many"], "must be an int >= 1, got 'many'"),
    (["generate", "--seed", "-3"], "argument --seed: must be an int >= 0, got -3"),
    (["generate", "--drafter", "oracle"], "argument --drafter: invalid choice: 'oracle'"),
    (["generate", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["generate", "--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
    (["generate", "--attention", "flash"], "argument --attention: invalid choice: 'flash'"),
    (["generate", "--tree", "full:2,0"], "tree must be 'chain', 'full:B1,B2,...'"),
    (["generate", "--tree", "dynamic:4,0,2"], "DynamicTree.depth must be an int >= 1, got 0"),
    (["generate", "--drafter", "medusa"],
     "medusa needs trained heads: a run folder (--heads FOLDER); train one with "
     "`speculax train --config configs/medusa_smollm2.py`"),
    (["generate", "--drafter", "eagle"], "`speculax train --config configs/eagle_smollm2.py`"),
    (["generate", "--heads", "runs/medusa-smollm2"],
     "--drafter none (autoregressive decoding) takes no drafter options, got heads"),
    (["generate", "--drafter", "prompt-lookup", "--heads", "runs/x"],
     "trained heads (--heads runs/x) are for the trained drafters (medusa, hydra, eagle), not "
     "prompt-lookup"),
    (["generate", "--drafter", "prompt-lookup", "--tree", "full:2"],
     "prompt-lookup takes no option tree (it takes: max_ngram, min_ngram)"),
    (["generate", "--drafter", "layer-skip", "--max-ngram", "2"],
     "layer-skip takes no option max_ngram"),
    (["generate", "--drafter", "prompt-lookup", "--stop-threshold", "0.5"],
     "prompt-lookup takes no --stop-threshold"),
    (["generate", "--drafter", "draft-model", "--drafts", "3"], "draft-model takes no --drafts"),
    (["generate", "--drafter", "layer-skip", "--max-lag", "4"], "layer-skip takes no --max-lag"),
    (["generate", "--drafter", "prompt-lookup", "--draft-dtype", "bfloat16"],
     "prompt-lookup takes no draft_dtype (draft_dtype is for layer-skip, draft-model"),
    (["generate", "--drafter", "layer-skip", "--draft-dtype", "int4"],
     "argument --draft-dtype: invalid choice: 'int4'"),
    (["generate", "--drafter", "eagle", "--max-lag", "-1"], "must be an int >= 0, got -1"),
    (["generate", "--drafter", "multi-draft-model", "--rule", "best"],
     "argument --rule: invalid choice: 'best'"),
    (["generate", "--compare"], "--compare sets a drafter's run beside autoregressive decoding"),
    (["generate", "--prompt", "hi", "--prompts", "{stream}"], "--prompt or --prompts FILE, not both"),
    (["generate", "--prompts", "no-such-file.jsonl"], "prompt file 'no-such-file.jsonl' does not"),
    # serve-bench
    (["serve-bench"], "the following arguments are required: prompts"),
    (["serve-bench", "no-such-file.jsonl"], "prompt file 'no-such-file.jsonl' does not exist"),
    (["serve-bench", "{bad_jsonl}"], 'bad_jsonl.jsonl:2: expected an object with a "prompt" string'),
    (["serve-bench", "{not_json}"], "not_json.jsonl:1: not a JSON line"),
    (["serve-bench", "{empty_txt}"], "empty.txt' holds no prompts"),
    (["serve-bench", "{stream}", "--limit", "-1"], "argument --limit: must be an int >= 0, got -1"),
    (["serve-bench", "{stream}", "--batch-size", "0"], "argument --batch-size: must be an int >= 1"),
    (["serve-bench", "{stream}", "--temperature", "-0.5"], "temperature must be a finite number"),
    (["serve-bench", "{stream}", "--online", "--drafter", "token-recycling"],
     "--online trains a draft model (--drafter draft-model), not token-recycling"),
    (["serve-bench", "{stream}", "--online", "--buffer-size", "0"],
     "argument --buffer-size: must be an int >= 1, got 0"),
    (["serve-bench", "{stream}", "--online", "--heldout-every", "1"],
     "OnlineConfig.heldout_every must be 0 (off) or >= 2, got 1"),
    (["serve-bench", "{stream}", "--online", "--lr", "0"],
     "OnlineConfig.learning_rate must be a finite number > 0, got 0.0"),
    (["serve-bench", "{stream}", "--divergence", "kl"], "argument --divergence: invalid choice"),
    (["serve-bench", "{stream}", "--continuous", "--goodput", "--carry-estimate"],
     "--carry-estimate is for fixed batches"),
    (["serve-bench", "{stream}", "--buffer-policy", "lru"], "argument --buffer-policy: invalid"),
    (["serve-bench", "{stream}", "--answer-bins", "16"],
     "--answer-bins 16 splits goodput's estimate; add --goodput"),
    (["serve-bench", "{stream}", "--goodput", "--answer-bins", "32,16"],
     "Goodput.answer_bins must increase, got (32, 16)"),
    (["serve-bench", "{stream}", "--goodput", "--answer-bins", "16,x"],
     "--answer-bins must be comma-separated integers, got '16,x'"),
    (["generate", "--goodput"], "--goodput picks a drafter's draft length; give --drafter"),
    (["generate", "--lossy-typical"], "--lossy-typical checks a drafter's drafts; give --drafter"),
    (["generate", "--pearl", "one-device"],
     "--pearl drafts with a draft model; give --drafter draft-model, not none"),
    (["generate", "--drafter", "draft-model", "--pearl", "three"], "argument --pearl: invalid"),
    (["generate", "--drafter", "draft-model", "--pearl", "one-device", "--goodput"],
     "--pearl runs its own adaptive length on its own devices, one fixed batch: drop --goodput"),
    (["generate", "--drafter", "draft-model", "--pearl", "one-device", "--rows", "2"],
     "one fixed batch: drop --rows"),
    (["generate", "--rows", "0"], "argument --rows"),
    (["generate", "--drafter", "prompt-lookup", "--lossy-typical", "0.09"],
     "--lossy-typical must be two numbers THRESHOLD,ALPHA, got '0.09'"),
    (["generate", "--drafter", "prompt-lookup", "--lossy-typical", "0.09,1.5"],
     "Typical.posterior_alpha must be"),
    (["generate", "--drafter", "prompt-lookup", "--lossy-judge", "no-such.npz"],
     "--lossy-judge 'no-such.npz': no such file"),
    (["generate", "--drafter", "prompt-lookup", "--lossy-judge", "{stream}"],
     "is not a judge head (an .npz of Judge.save)"),
    (["generate", "--drafter", "prompt-lookup", "--lossy-judge", "{stream}", "--lossy-typical"],
     "--lossy-typical and --lossy-judge are two rules; give one"),
    (["generate", "--drafter", "prompt-lookup", "--judge-threshold", "0.5"],
     "--judge-threshold goes with --lossy-judge FILE"),
    # train
    (["train"], "the following arguments are required: --config"),
    (["train", "--config", "no-such-config.py"], "experiment config 'no-such-config.py' does not"),
    (["train", "--config", "{syntax}"], "syntax.py:1: not valid Python: '(' was never closed"),
    (["train", "--config", "{not_experiment}"],
     "must define EXPERIMENT = DistillExperiment(...); it defines a int (3)"),
    (["train", "--config", "{no_experiment}"], "it defines nothing"),
    (["train", "--config", "{missing_field}"],
     "missing_field.py: TypeError: DistillExperiment.__init__() missing 1 required positional "
     "argument: 'name'"),
    (["train", "--config", "{bad_value}"],
     "bad_value.py: ValueError: DataConfig.rows must be an int >= 1, got 0"),
    (["train", "--config", "{raises}"], "raises.py: ModuleNotFoundError: No module named"),
    (["train", "--config", "configs/distill_smollm2.py", "--steps", "0"],
     "argument --steps: must be an int >= 1, got 0"),
    (["train", "--config", "hydra_smollm2", "--set", "data.rowz=3"],
     "--set data.rowz=3: DataConfig has no field 'rowz' (it has: corpus, files"),
    (["train", "--config", "hydra_smollm2", "--set", "data.rows=0"],
     "DataConfig.rows must be an int >= 1, got 0"),
    (["train", "--config", "hydra_smollm2", "--set", "data.rows.x=1"],
     "int has no fields to set ('x' goes too deep)"),
    # bench
    (["bench", "--config", "no-such-set"], "bench config 'no-such-set' does not exist"),
    (["bench", "--set", "prompts=0"], "BenchConfig.prompts must be an int >= 1, got 0"),
    (["bench", "--set", "suites=('nope',)"], "unknown prompt suite 'nope'"),
]


def _files(tmp_path) -> dict:
  for name, text in FILES.values():
    (tmp_path / name).write_text(text)
  return {key: tmp_path / name for key, (name, _) in FILES.items()}


@pytest.mark.parametrize("argv, message", MALFORMED,
                         ids=[" ".join(a)[:60] or "no-command" for a, _ in MALFORMED])
def test_malformed_input_exits_2_with_one_line(capsys, tmp_path, argv, message):
  """Every subcommand: a bad flag, value or file gives exit status 2 and one line on stderr
  (argparse's errors included: no usage block), never a traceback."""
  files = _files(tmp_path)
  argv = [a.format(**files) for a in argv]
  try:
    status = main(argv)
  except SystemExit as e:  # argparse's own errors
    status = e.code
  err = capsys.readouterr().err
  assert status == 2, err
  assert message in err, err
  assert err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("drafter, flags", [("none", []), ("prompt-lookup", []),
                                            ("token-recycling", ["--dtype", "bfloat16"]),
                                            ("layer-skip", ["--skip", "14",
                                                            "--draft-dtype", "bfloat16"]),
                                            ("draft-model", ["--pearl", "two-device",
                                                             "--draft-layers", "2"])])
def test_generate_chat_prompt_on_smollm2(capsys, drafter, flags):
  assert main(["generate", "--prompt", "What is the capital of France?", "--max-new-tokens", "8",
               "--drafter", drafter, *flags]) == 0
  out = capsys.readouterr().out
  assert "=== prompt 0: 'What is the capital of France?'" in out
  assert "Paris" in out  # the chat template was applied: the instruct model answers
  assert "tokens/s" in out and "tau" in out


@pytest.mark.parametrize("config", ["configs/distill_smollm2.py", "configs/medusa_smollm2.py",
                                    "hydra_smollm2"])  # a path, or a shipped experiment's name
def test_train_overrides_either_trainers_budget(config):
  from speculax.cli.train import load_experiment, overridden
  exp = load_experiment(config)
  new = overridden(exp, steps=7, out_dir="elsewhere")
  assert new.distill.optim.total_steps == 7 and new.folder.parent.name == "elsewhere"
  assert type(new.distill) is type(exp.distill)
  new = overrides.apply(new, ["distill.optim.learning_rate=1", "data.temperatures=0,0.5",
                              "data.prompts=None", "name=other"])
  assert new.distill.optim.learning_rate == 1.0 and new.data.temperatures == (0.0, 0.5)
  assert new.data.prompts is None and new.name == "other" and new.distill.optim.total_steps == 7


@pytest.mark.slow
def test_generate_json_from_a_prompts_file_is_lossless(capsys, tmp_path, tiny_chat_folder):
  """--prompts FILE, prompt lookup's n-gram flags, --rows, --compare and --json: the JSON's
  tokens are AR's (a tiny random target in a Hugging Face folder: plumbing, not the model)."""
  prompts = tmp_path / "p.jsonl"
  prompts.write_text('{"prompt": "Count from 1 to 5."}\n{"prompt": "def f(x):", "chat": false}\n')
  base = ["generate", "--model", str(tiny_chat_folder), "--prompts", str(prompts),
          "--max-new-tokens", "8", "--drafter", "prompt-lookup"]
  outs = []
  for flags in (["--max-ngram", "2", "--compare"], ["--rows", "1"]):
    assert main([*base, "--json", *flags]) == 0
    captured = capsys.readouterr()
    outs.append(json.loads(captured.out))
    assert "max_ngram=" in captured.err  # the settings line, defaults included
  lookup, one_row = outs
  ar = lookup["autoregressive"]  # --compare: the same prompts decoded autoregressively
  assert lookup["prompts"] == ["Count from 1 to 5.", "def f(x):"] and len(lookup["texts"]) == 2
  assert lookup["tokens"] == ar["tokens"] and lookup["tau"] >= 1.0 == ar["tau"]
  assert lookup["same_as_autoregressive"] == 2
  assert lookup["x_autoregressive"] == pytest.approx(lookup["tokens_per_s"] / ar["tokens_per_s"])
  decode = lambda r: (r["new_tokens"] - len(r["tokens"])) / r["decode_s"]  # prefill's tokens apart
  assert lookup["x_autoregressive_decode"] == pytest.approx(decode(lookup) / decode(ar))
  assert one_row["tokens"] == ar["tokens"] and one_row["rows_active"] == 1.0  # refilled
  assert len(lookup["acceptance"]) == 5 and lookup["new_tokens"] == 16
  # Sampled, the outputs are draws of one law, not the same draws: no equality is claimed.
  assert main([*base, "--compare", "--temperature", "1", "--max-new-tokens", "4"]) == 0
  out = capsys.readouterr().out
  assert "--- none: 2 prompts, 8 new tokens" in out
  assert "the tokens/s of autoregressive decoding, x" in out
  assert "in its decode loops (each prompt's prefill apart; one run each); sampled: the target's " \
         "law" in out


@pytest.fixture
def prompts(tmp_path):
  """A file of four short requests, one per line, for the serve-bench tests."""
  path = tmp_path / "prompts.txt"
  path.write_text("Name a fruit.\nName a color.\nName an animal.\nName a city.\n")
  return path


@pytest.mark.slow
def test_serve_bench_online_prints_the_curve_and_resumes(capsys, tmp_path, tiny_chat_folder,
                                                        prompts):
  # The draft: the tiny target's first 2 of 4 layers (all 4 would be the target: nothing to
  # learn, no update round).
  argv = ["serve-bench", str(prompts), "--model", str(tiny_chat_folder), "--online",
          "--draft-layers", "2", "--batch-size", "2", "--max-new-tokens", "6", "-k", "2",
          "--update-every", "2", "--min-positions", "1", "--steps", "1", "--train-batch", "1",
          "--seq-len", "32", "--heldout-every", "0", "--checkpoint", str(tmp_path / "ckpt")]
  assert main(argv) == 0
  out = capsys.readouterr()
  assert out.out.count("acceptance") >= 3 and "round 2: loss" in out.out
  assert "2 update rounds, 0 rolled back" in out.out
  # A restarted server picks up its drafter; continuous batching reports each 2 finished.
  assert main([*argv, "--limit", "3", "--json", "--continuous"]) == 0
  out = capsys.readouterr()
  assert "resumed from" in out.err
  report = json.loads(out.out)  # the batch lines went to stderr
  assert report["prompts"] == 3 and len(report["rows"]) == report["batches"] == 2
  assert sorted(i for r in report["rows"] for i in r["requests"]) == [0, 1, 2]


@pytest.mark.slow
def test_serve_bench_goodput_reports_the_lengths_it_chose(capsys, tiny_chat_folder, prompts):
  argv = ["serve-bench", str(prompts), "--model", str(tiny_chat_folder), "--drafter",
          "prompt-lookup", "--goodput", "-k", "2", "--carry-estimate", "--answer-bins", "3",
          "--batch-size", "2", "--max-new-tokens", "6", "--json"]
  assert main(argv) == 0
  out = capsys.readouterr()
  assert "k'=0..2: " in out.err  # each batch line says the lengths it drafted
  rows = json.loads(out.out)["rows"]
  # every loop step of a batch drafted one of 0..2: at least 5 (6 tokens, the prefill gives 1)
  assert len(rows) == 2 and all(len(r["k_steps"]) == 3 and 5 >= sum(r["k_steps"]) >= 1
                                for r in rows), rows
