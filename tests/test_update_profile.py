"""research/update_profile.py's grouping of an update's thunks, on a hand-written compiled
program (the scoring product over n = 48 output rows, a softmax pass, the drafter's own product
and a transpose) and hand-made trace events; and its refusals."""
from __future__ import annotations

import pytest

from speculax.research import update_profile as up

HLO = """HloModule jit_train_step

%fused_exp (param_0: f32[8,48]) -> f32[8,48] {
  %param_0 = f32[8,48]{1,0} parameter(0)
  ROOT %exponential.1 = f32[8,48]{1,0} exponential(%param_0)
}

ENTRY %main.9 (p0: f32[8,6], rows: f32[48,6], w: f32[6,16]) -> (f32[8,6], f32[6,16]) {
  %p0 = f32[8,6]{1,0} parameter(0)
  %rows = f32[48,6]{1,0} parameter(1)
  %w = f32[6,16]{1,0} parameter(2)
  %scores = f32[8,48]{1,0} fusion(%p0, %rows), kind=kCustom, metadata={op_name="fwd/dot_general"}
  %softmax = f32[8,48]{1,0} fusion(%scores), kind=kLoop, metadata={op_name="exp"}
  %back = f32[8,6]{1,0} fusion(%softmax, %rows), kind=kCustom, metadata={op_name="bwd/dot_general"}
  %up = f32[8,16]{1,0} fusion(%p0, %w), kind=kCustom, metadata={op_name="up/dot_general"}
  %silu_t = f32[16,8]{1,0} fusion(%up), kind=kLoop, metadata={op_name="silu"}
  %dot.38 = f32[6,16]{1,0} dot(%p0, %silu_t), lhs_contracting_dims={0}, rhs_contracting_dims={1}
  ROOT %tuple.2 = (f32[8,6]{1,0}, f32[6,16]{1,0}) tuple(%back, %dot.38)
}
"""


def test_groups_split_the_scoring_product_from_the_wide_passes_and_the_rest():
  got = up.groups(HLO, 48)
  assert {k: got[k] for k in ("scores", "back", "softmax", "up", "dot.38", "silu_t")} == {
      "scores": up.SCORING, "back": up.SCORING,  # back: its operand is [8, 48]
      "softmax": up.WIDE, "up": up.PRODUCTS, "dot.38": up.PRODUCTS, "silu_t": up.REST}
  assert "tuple.2" not in got  # a tuple's type holds spaces: not an instruction that runs


def test_thunk_groups_sum_each_group_per_update_beside_the_wall():
  x = lambda name, ts, dur: {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 2}
  events = [x("ThunkExecutor::Execute", 0, 10_000), x("ThunkExecutor::Execute", 20_000, 6_000),
            x("ThunkExecutor::Execute", 21_000, 1_000),  # nested in the second: counted once
            x("scores", 0, 3_000), x("back", 20_000, 1_000), x("softmax", 3_000, 2_000),
            x("dot.38", 5_000, 500), x("silu_t", 6_000, 250), x("while.3", 0, 9_000),  # a loop
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "x"}}]
  got = up.thunk_groups(events, up.groups(HLO, 48), updates=2)
  assert got == {"wall_ms": 8.0, "ms": {up.SCORING: 2.0, up.WIDE: 1.0, up.PRODUCTS: 0.25,
                                        up.REST: 0.125}}


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--updates", "0"]])
def test_update_profile_refuses_counts_below_one(argv, capsys):
  with pytest.raises(SystemExit):
    up.main(argv)
  assert "positive counts" in capsys.readouterr().err
