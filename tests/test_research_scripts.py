"""The research scripts that had no test run end to end on the tiny chat target: each writes the
JSON its README table comes from (research/online_adaptation.py once printed its table, then
failed writing it)."""
import json

import pytest

from speculax.research import (
  goodput_overhead,
  goodput_serving,
  goodput_signal,
  online_adaptation,
  train_judge,
)

pytestmark = pytest.mark.slow  # the tiny chat target reads SmolLM2's tokenizer from the GGUF


def test_online_adaptation(tmp_path, tiny_chat_folder):
  online_adaptation.main(["--model", str(tiny_chat_folder), "--out", str(tmp_path),
                          "--phase-requests", "2", "--batch", "2", "--new-tokens", "4", "-k", "2",
                          "--draft-layers", "0,3", "--warm-steps", "1", "--update-every", "2",
                          "--steps", "1", "--seq-len", "64", "--all-positions"])
  result = json.loads((tmp_path / "online_adaptation.json").read_text())
  assert {(r["method"], r["phase"]) for r in result["summary"]} == {
      (m, p) for m in ("frozen draft", "online draft", "token recycling (hot)")
      for p in ("code", "chat", "code again")}
  assert result["args"]["out"] == str(tmp_path)
  assert (tmp_path / "online_adaptation.png").stat().st_size > 0


@pytest.mark.parametrize("script, args, written", [
    (goodput_serving, ["--prompts", "2", "--batch", "2"], "goodput_serving_humaneval_b2_n4.json"),
    (goodput_overhead, ["--prompts", "2", "--batch", "2"], "goodput_overhead_b2.json"),
    (goodput_signal, ["--prompts", "2"], "goodput_signal_b1.json"),
])
def test_goodput_scripts(tmp_path, tiny_chat_folder, script, args, written):
  script.main(["--model", str(tiny_chat_folder), "--out", str(tmp_path), "--repeats", "1",
               "--new-tokens", "4", *args])
  result = json.loads((tmp_path / written).read_text())
  assert result["machine"]


def test_train_judge(tmp_path, tiny_chat_folder):
  train_judge.main(["--model", str(tiny_chat_folder), "--out", str(tmp_path), "--prompts", "2",
                    "--answer-tokens", "4", "--negatives", "1"])
  report = json.loads((tmp_path / "judge-smollm2.json").read_text())
  assert report and (tmp_path / "judge-smollm2.npz").stat().st_size > 0
