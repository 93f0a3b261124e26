"""research/step_profile.py: a decode loop's thunks per step, the prefill's left out."""
import json

import jax
import pytest

from speculax.decode.config import SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.research import step_profile


def _event(name, module, dur):
  return dict(ph="X", name=name, pid=1, tid=2, ts=0, dur=dur, args=dict(hlo_module=module))


def test_only_the_loops_thunks_count():
  events = [_event("ffi_call.3", "jit_prefill", 5000), _event("ffi_call.3", "jit_spec_loop", 700),
            _event("ynn_fusion", "jit_decode_loop", 300), _event("add_fusion.2", "jit_stage", 90),
            _event("while.1", "jit_spec_loop", 9000),  # these hold others: not a thunk's work
            _event("cond.5.clone", "jit_spec_loop", 950),
            _event("copy.3.clone", "jit_spec_loop", 40)]
  ms, calls = step_profile.thunks(events, step_profile.in_loop)
  assert ms == pytest.approx({"products (rows kernel)": 0.7, "YNNPACK fusions": 0.3,
                             "other thunks": 0.04})
  assert calls == {"products (rows kernel)": 1, "YNNPACK fusions": 1, "other thunks": 1}


def test_a_plain_step_makes_one_kernel_call_per_table_and_lookup_adds_none(tiny):
  """The tiny model decoding repeating prompts: each loop step of autoregressive decoding and of
  prompt lookup (which drafts by copying, no products of its own) calls the rows kernel once per
  dense of every layer and once for the head, however wide its verify; the prefill's calls
  are left out (a 6-token prefill makes as many)."""
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=12)
  batches = [[[5, 6, 7, 8, 5, 6]], [[9, 10, 9, 10, 9, 10]]]
  key = jax.random.key(0)
  plain = step_profile.profile(
      lambda b, warm: generate(params, cfg, b, spec, key, warmup=warm), batches)
  lookup = step_profile.profile(
      lambda b, warm: speculative_generate(params, cfg, b, PromptLookup(), spec, None, key,
                                           warmup=warm), batches)
  tables = 7 * cfg.n_layers + 1
  assert plain["steps"] == 2 * 11 and plain["tau"] == 1.0
  assert plain["calls"]["products (rows kernel)"] == pytest.approx(tables)
  assert lookup["calls"]["products (rows kernel)"] == pytest.approx(tables)
  assert lookup["steps"] < plain["steps"] and lookup["tau"] > 1
  assert plain["wall_ms"] > 0 and plain["ms"]["products (rows kernel)"] > 0


@pytest.mark.slow  # the tiny chat target reads SmolLM2's tokenizer from the GGUF
@pytest.mark.parametrize("drafter, methods", [
    (["--drafter", "layer-skip", "--skip", "1"],  # the verify alone priced by prompt lookup
     ["autoregressive", "prompt-lookup k=2", "layer-skip skip=(1,) k=2"]),
    ([], ["autoregressive", "prompt-lookup k=2"])])  # prompt lookup is that loop already
def test_the_script_writes_each_loop(tmp_path, tiny_chat_folder, drafter, methods):
  step_profile.main(["--model", str(tiny_chat_folder), "--out", str(tmp_path), "--prompts", "1",
                     "--new-tokens", "6", "-k", "2", "--suite", "chat", *drafter])
  result = json.loads((tmp_path / "step_profile_chat.json").read_text())
  assert [r["method"] for r in result["rows"]] == methods
  # header, rule, a row per loop
  assert (tmp_path / "step_profile_chat.md").read_text().count("\n") == 2 + len(methods)
  assert (tmp_path / "step_profile_chat.png").stat().st_size > 0


def test_a_bad_suite_is_refused():
  with pytest.raises(SystemExit):
    step_profile.main(["--suite", "no-such-suite"])
