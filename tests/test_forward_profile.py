"""research/forward_profile.py sums XLA:CPU's per-thunk trace events by kind, per forward."""
import json

import pytest

from speculax.models.load import LoadedModel
from speculax.research import forward_profile

EXEC, PY = (1, 5), (1, 9)


def _event(name, where, ts, dur):
  return dict(ph="X", name=name, pid=where[0], tid=where[1], ts=ts, dur=dur)


EVENTS = [  # two forwards' worth, in microseconds
    dict(ph="M", name="thread_name", pid=1, tid=9, args=dict(name="python")),
    _event("ThunkExecutor::Execute", EXEC, 0, 3000),
    _event("ThunkExecutor::Execute", EXEC, 100, 500),  # nested: counted once
    _event("while.2", EXEC, 50, 2900),  # the chained loop holds every thunk
    _event("ffi_call", EXEC, 100, 1000),
    _event("ffi_call.17", EXEC, 1200, 600),
    _event("end: ffi_call", EXEC, 1100, 1),
    _event("ynn_fusion.3", EXEC, 1900, 400),
    _event("add_rsqrt_fusion.12", EXEC, 2400, 100),
    _event("wrapped_scatter", EXEC, 2550, 60),
    _event("SlinkyThreadPool::Await", EXEC, 2700, 200),  # a wait, not a thunk's work
    _event("PjitFunction(loop)", PY, 0, 3100),  # the host's frames
    _event("$api.py:2479 block_until_ready", PY, 0, 3100),
]


def test_thunks_are_summed_by_kind_per_forward():
  got = forward_profile.thunk_ms(EVENTS, forwards=2)
  assert got["wall_ms"] == pytest.approx(1.5)
  assert got["ms"] == pytest.approx({"products (rows kernel)": 0.8, "YNNPACK fusions": 0.2,
                                     "other thunks": 0.08})
  assert got["calls"] == {"products (rows kernel)": 1, "YNNPACK fusions": 0.5,
                          "other thunks": 1}


def test_a_traced_forward_makes_one_kernel_call_per_table(tiny):
  """The tiny model's 2-token forward, traced: every dense of every layer (q, k, v, o, gate, up,
  down) and the head is one call of the rows kernel, in each of the chained forwards."""
  cfg, params = tiny
  got = forward_profile.profile(LoadedModel(cfg, params, None), t=2, repeats=3)
  assert got["calls"]["products (rows kernel)"] == 7 * cfg.n_layers + 1
  assert got["calls"]["other thunks"] > 0 and got["wall_ms"] > 0


@pytest.mark.slow  # the tiny chat target reads SmolLM2's tokenizer from the GGUF
def test_the_script_writes_a_row_per_width(tmp_path, tiny_chat_folder):
  forward_profile.main(["--model", str(tiny_chat_folder), "--out", str(tmp_path), "--tokens", "1",
                        "3", "--repeats", "2"])
  result = json.loads((tmp_path / "forward_profile.json").read_text())
  assert [r["t"] for r in result["rows"]] == [1, 3] and result["machine"]
  assert (tmp_path / "forward_profile.md").read_text().count("\n") == 4  # header, rule, 2 rows
  assert (tmp_path / "forward_profile.png").stat().st_size > 0


def test_bad_widths_are_refused():
  with pytest.raises(SystemExit):
    forward_profile.main(["--tokens", "0"])
