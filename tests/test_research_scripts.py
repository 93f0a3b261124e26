"""Research scripts run end to end on the tiny chat target: each writes the JSON its README table
comes from (research/online_adaptation.py once printed its table, then failed writing it;
bench_autoregressive failed after its first repeat). Not here: bench_self_speculation and
bf16_agreement (SmolLM2 and its shipped drafters by design) and distillspec (six training runs)."""
import json
import subprocess
import sys

import pytest

from speculax.research import (
  bench_autoregressive,
  bench_speculative,
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
               "--new-tokens", "4", "-k", "2", *args])  # k = 2: each length is a compile
  result = json.loads((tmp_path / written).read_text())
  assert result["machine"]


def test_train_judge(tmp_path, tiny_chat_folder):
  train_judge.main(["--model", str(tiny_chat_folder), "--out", str(tmp_path), "--prompts", "2",
                    "--answer-tokens", "4", "--negatives", "1"])
  report = json.loads((tmp_path / "judge-smollm2.json").read_text())
  assert report and (tmp_path / "judge-smollm2.npz").stat().st_size > 0


def test_the_transformers_peer_reads_the_same_target(tmp_path, tiny_chat_folder):
  """Both benches compare with transformers decoding the --model target itself (it was
  SmolLM2 whatever --model said), greedy output token for token."""
  args = ["--model", str(tiny_chat_folder), "--out", str(tmp_path), "--prompts", "1",
          "--new-tokens", "4", "--batch-sizes", "1"]
  bench_autoregressive.main(args + ["--repeats", "2"])
  result = json.loads((tmp_path / "bench_autoregressive.json").read_text())
  assert result["same_as_transformers"] == result["prompt_runs"] == 1
  assert result["rows"][0][4] > 0  # compile s: the first repeat's warm-up
  with pytest.warns(UserWarning, match="no layer-skip set"):  # a random target: none pays
    bench_speculative.main(args)
  rows = json.loads((tmp_path / "bench_speculative.json").read_text())["rows"]
  peer = next(r for r in rows if r["method"] == "transformers prompt lookup")
  assert peer["same_as_ar"] == 1


def test_pearl_overlap(tmp_path, tiny_chat_folder):
  """In a process of its own: it asks JAX for two CPU devices before anything runs."""
  subprocess.run([sys.executable, "-m", "speculax.research.pearl_overlap", "--model",
                  str(tiny_chat_folder), "--out", str(tmp_path), "--layers", "1", "-k", "2",
                  "--repeats", "2"], check=True, capture_output=True)
  rows = json.loads((tmp_path / "pearl_overlap_b1.json").read_text())["rows"]
  assert rows and all(r["both, two devices"] > 0 for r in rows)
