import pytest

from cli.main import main


def test_help_explains_every_flag(capsys):
  with pytest.raises(SystemExit) as e:
    main(["generate", "--help"])
  assert e.value.code == 0
  text = capsys.readouterr().out
  for flag in ["--model", "--prompt", "--humaneval", "--raw", "--max-new-tokens", "--temperature",
               "--top-k", "--top-p", "--seed", "--drafter", "-k", "--skip", "--draft-model",
               "--draft-layers", "--tree", "--heads", "--mesh"]:
    assert f"  {flag} " in text or f"  {flag}\n" in text, flag


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "2,2"], "--mesh must be three integers"),
    (["--prompt", "  "], "--prompt is empty"),
    (["--model", "no-such-model"], "no-such-model"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0, got -1.0"),
    (["--top-p", "0"], r"top_p must be in (0, 1], got 0.0"),
    (["--tree", "full:2,0"], "tree must be 'chain', 'full:B1,B2,...'"),
    (["--tree", "dynamic:4,0,2"], "DynamicTree depth must be >= 1, got 0"),
    (["--drafter", "medusa"],
     "medusa needs trained heads: a run folder (--heads FOLDER); train one with "
     "`speculax train --config configs/medusa_smollm2.py`"),
    (["--heads", "runs/medusa-smollm2"], "are for the head drafters (medusa, "),
])
def test_bad_flags_exit_with_a_clear_error(capsys, argv, message):
  assert main(["generate", *argv]) == 2
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["none", "prompt-lookup", "token-recycling"])
def test_generate_chat_prompt_on_smollm2(capsys, drafter):
  assert main(["generate", "--prompt", "What is the capital of France?", "--max-new-tokens", "8",
               "--drafter", drafter]) == 0
  out = capsys.readouterr().out
  assert "=== prompt 0: 'What is the capital of France?'" in out
  assert "Paris" in out  # the chat template was applied: the instruct model answers
  assert "tokens/s" in out and "tau" in out


@pytest.mark.parametrize("config", ["configs/distill_smollm2.py", "configs/medusa_smollm2.py",
                                    "configs/hydra_smollm2.py"])
def test_train_overrides_either_trainers_budget(config):
  from cli.train import load_experiment, overridden
  exp = load_experiment(config)
  new = overridden(exp, steps=7, out_dir="elsewhere")
  assert new.distill.optim.total_steps == 7 and new.folder.parent.name == "elsewhere"
  assert type(new.distill) is type(exp.distill)


@pytest.mark.parametrize("argv, message", [
    (["no-such-file.jsonl"], "prompt file 'no-such-file.jsonl' does not exist"),
    (["{stream}", "--online", "--drafter", "token-recycling"],
     "--online trains a draft model (--drafter draft-model), not token-recycling"),
    (["{stream}", "--online", "--buffer-size", "0"], "buffer_size must be >= 1 row, got 0"),
    (["{stream}", "--online", "--update-every", "0"], "update_every must be >= 1, got 0"),
    (["{bad}"], "bad.jsonl:2: expected an object with a \"prompt\" string"),
])
def test_serve_bench_bad_input_exits_with_a_clear_error(capsys, tmp_path, argv, message):
  stream, bad = tmp_path / "stream.jsonl", tmp_path / "bad.jsonl"
  stream.write_text('{"prompt": "hi"}\n')
  bad.write_text('{"prompt": "hi"}\n{"text": "no prompt key"}\n')
  argv = [a.format(stream=stream, bad=bad) for a in argv]
  assert main(["serve-bench", *argv]) == 2
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_serve_bench_online_prints_the_curve_and_resumes(capsys, tmp_path):
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("Name a fruit.\nName a color.\nName an animal.\nName a city.\n")
  argv = ["serve-bench", str(prompts), "--online", "--batch-size", "2", "--max-new-tokens", "6",
          "-k", "2", "--update-every", "2", "--min-positions", "1", "--steps", "1", "--train-batch", "1", "--seq-len",
          "32", "--heldout-every", "0", "--checkpoint", str(tmp_path / "ckpt")]
  assert main(argv) == 0
  out = capsys.readouterr()
  assert out.out.count("acceptance") >= 3 and "round 2: loss" in out.out
  assert "2 update rounds, 0 rolled back" in out.out
  assert main([*argv, "--limit", "2"]) == 0  # a restarted server picks up its drafter
  assert "resumed from" in capsys.readouterr().err
