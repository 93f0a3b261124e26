"""research/trace_summary.py reads a perfetto trace as jax.profiler writes it on a GPU: each
program execution's wall time, the union of its device spans, and the host's launches."""
import gzip
import json

import pytest

from speculax.research import trace_summary

HOST, STREAM = (1, 1), (2, 7)


def _event(name, where, ts, dur):
  return dict(ph="X", name=name, pid=where[0], tid=where[1], ts=ts, dur=dur)


EVENTS = [
    dict(ph="M", name="thread_name", pid=1, tid=1, args=dict(name="python3")),
    dict(ph="M", name="thread_name", pid=2, tid=7, args=dict(name="Stream #14(Compute)")),
    _event("jit_spec_loop:XLA GPU module", HOST, 100, 1000),
    _event("cuGraphLaunch (CudaGraph:12)", HOST, 150, 5),
    _event("input_reduce_fusion.3", HOST, 200, 5),
    _event("input_reduce_fusion.7", HOST, 300, 5),
    _event("MemcpyD2H", HOST, 400, 5),
    _event("gemm_fusion_dot", STREAM, 200, 100),  # overlaps the next: the union counts once
    _event("loop_add_fusion", STREAM, 250, 150),
    _event("MemcpyD2H", STREAM, 600, 50),
    _event("fusion", STREAM, 2000, 80),  # after the execution: not its
    _event("jit_decode_loop:XLA GPU module", HOST, 5000, 3000),
    _event("fusion", STREAM, 5100, 40),
    _event("jit_spec_loop:XLA GPU module", HOST, 9000, 200),  # too short for min_ms=0.5
]


def test_busy_time_is_the_union_of_spans():
  assert trace_summary.busy_us([(30, 40), (0, 10), (5, 20)]) == 30
  assert trace_summary.busy_us([(0, 10), (2, 5)]) == 10
  assert trace_summary.busy_us([]) == 0


def test_each_execution_reads_its_own_window():
  rows = trace_summary.executions(EVENTS, module="spec_loop", min_ms=0.5)
  assert rows == [dict(module="jit_spec_loop", wall_ms=1.0, device_busy_ms=0.25, device_events=3,
                       host_launches={"input_reduce_fusion": 2, "cuGraphLaunch (CudaGraph:)": 1,
                                      "MemcpyD2H": 1})]
  assert [r["module"] for r in trace_summary.executions(EVENTS)] == [
      "jit_spec_loop", "jit_decode_loop", "jit_spec_loop"]
  assert trace_summary.executions(EVENTS, module="decode_loop")[0]["device_busy_ms"] == 0.04


def test_reads_the_file_jax_writes_and_names_a_folder_without_one(tmp_path, capsys):
  folder = tmp_path / "plugins" / "profile" / "run"
  folder.mkdir(parents=True)
  with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
    json.dump({"traceEvents": EVENTS}, f)
  rows = trace_summary.main([str(tmp_path), "--module", "spec_loop"])
  assert rows == trace_summary.executions(EVENTS, "spec_loop", 1.0)
  assert "wall 1.00 ms, device busy 0.25 ms (3 events)" in capsys.readouterr().out
  with pytest.raises(FileNotFoundError, match="no perfetto_trace.json.gz under .*empty"):
    trace_summary.find(tmp_path / "empty")
