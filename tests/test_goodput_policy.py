"""Goodput-driven draft length's policy (decode/goodput.py), without a loop: the choice from
acceptance estimates and step costs (margins, probes, lengths taken out, rows weighed by bin and
by how far they may end), the estimate's counts per signal bin and position, the changes of
length it counts, and its settings checked."""
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core import tau
from speculax.decode import goodput
from speculax.decode.goodput import Goodput, GoodputState

COSTS = (1.0, 1.3, 1.6, 1.9)  # seconds of a step drafting k = 0..3: drafting pays ~0.3 a token
INF = float("inf")


def _state(kept, reached, costs=COSTS, plain_run=0, bins=(0,)):
  """One signal bin (kept, reached [K]) or several ([c, K]); one active row in bin 0."""
  as2 = lambda x: jnp.atleast_2d(jnp.asarray(x, jnp.float32))  # [c, K]
  return GoodputState(as2(kept), as2(reached), jnp.zeros((len(costs),), jnp.int32),
                      jnp.array(plain_run), jnp.array(16), jnp.asarray(costs, jnp.float32),
                      jnp.asarray(bins, jnp.int32), jnp.zeros((), jnp.int32),
                      jnp.zeros((), jnp.int32))


def test_choice_follows_acceptance_and_costs():
  g = Goodput()
  sure = _state([50.0] * 3, [50.0] * 3)
  assert int(goodput.choose(g, sure)) == 3  # all kept: 4 tokens for 1.9 s
  never = sure.replace(kept=jnp.zeros((1, 3)))
  assert int(goodput.choose(g, never)) == 0
  # a_1 = 0.8 (40 + 1) / (50 + 1), the rest ~0: k = 1 gives 1.8 / 1.3 > 1 / 1.0
  first = never.replace(kept=jnp.array([[40.0 - 0.2, 0.0, 0.0]]))
  assert int(goodput.choose(g, first)) == 1
  dear = first.replace(step_costs=jnp.array([1.0, 1.9, 2.8, 3.7]))
  assert int(goodput.choose(g, dear)) == 0  # drafting too dear
  # after probe_every plain steps in a row a probe whatever the estimate says: one draft where
  # no draft is kept (the cheapest)
  assert int(goodput.choose(g, never.replace(plain_run=jnp.array(15)))) == 0
  assert int(goodput.choose(g, never.replace(plain_run=jnp.array(16)))) == 1
  assert int(goodput.choose(g, sure.replace(plain_run=jnp.array(16)))) == 3  # not cut short


def test_a_draft_must_beat_a_plain_step_by_the_margin():
  """A one-draft step promising 5% more tokens per second than a plain one (a_1 = 0.365: 1.365
  tokens for 1.3 s) is taken with no margin, not with the default 10%; one promising 15% (a_1 =
  0.495) is taken by both. Deeper drafts are never kept here, so k = 1 is the best draft."""
  for a_1, taken in ((0.365, {0.0: 1, 0.1: 0}), (0.495, {0.0: 1, 0.1: 1})):
    s = _state([a_1 * 51 - 1, 0.0, 0.0], [50.0] * 3)  # (kept + 1 * prior) / (50 + 1) = a_1
    np.testing.assert_allclose(goodput.acceptance(Goodput(), s)[0, 0], a_1, rtol=1e-5)
    assert {m: int(goodput.choose(Goodput(margin=m), s)) for m in taken} == taken


def test_infinite_costs_take_lengths_out():
  """+inf: never that length (calibration forces one length so); the probe takes the drafting
  length left that promises the most tokens per second, and none when no drafting length is
  left."""
  g = Goodput()
  sure = _state([50.0] * 3, [50.0] * 3)
  assert int(goodput.choose(g, sure.replace(step_costs=jnp.array([1.0, 1.3, INF, INF])))) == 1
  never = _state([0.0] * 3, [50.0] * 3, plain_run=16)
  assert int(goodput.choose(g, never.replace(step_costs=jnp.array([1.0, INF, 1.6, 1.9])))) == 2
  # no active row rates every length 0: the probe still takes a finite one
  idle = never.replace(bins=jnp.array([-1]), step_costs=jnp.array([1.0, INF, 1.6, 1.9]))
  assert int(goodput.choose(g, idle)) == 2
  for k in range(4):  # one finite length: chosen whatever the estimate and the probe say
    only = jnp.where(jnp.arange(4) == k, 1.0, INF)
    assert int(goodput.choose(g, never.replace(step_costs=only))) == k
    assert int(goodput.choose(g, sure.replace(step_costs=only))) == k


def test_a_probe_drafts_the_length_that_pays_best():
  """A drafter whose first draft is dear and rarely kept (a_1 = 0.3 for 1.5 s) but whose deeper
  drafts are cheap and kept (0.9 for 0.1 s more each): k = 3 promises 1.07 tokens a second, within
  the margin of a plain step's 1.0, so the loop steps plain; its probe drafts 3, which checks the
  deeper positions too, where a one-draft probe (0.87 tokens a second) would check the first
  alone. A drafter never kept probes with the cheapest draft."""
  costs = (1.0, 1.5, 1.6, 1.7)
  # (kept + prior x the position before's estimate (the first's: 1)) / (50 + prior)
  s = _state([0.3 * 51 - 1, 0.9 * 51 - 0.3, 0.9 * 51 - 0.9], [50.0] * 3, costs=costs)
  np.testing.assert_allclose(goodput.acceptance(Goodput(), s)[0], [0.3, 0.9, 0.9], rtol=1e-5)
  assert int(goodput.choose(Goodput(), s)) == 0
  assert int(goodput.choose(Goodput(), s.replace(plain_run=jnp.array(16)))) == 3
  never = _state([0.0] * 3, [50.0] * 3, costs=costs, plain_run=16)
  assert int(goodput.choose(Goodput(), never)) == 1


def test_expected_tokens():
  """1 + sum_j prod_{i<=j} alpha_i for each k, over leading dims; i.i.d. a: 1 + a + ... + a^k."""
  np.testing.assert_allclose(tau.expected_tokens([0.5, 0.5]), [1, 1.5, 1.75])
  np.testing.assert_allclose(tau.expected_tokens([[1.0] * 5, [0.0] * 5])[:, 5], [6, 1])
  np.testing.assert_allclose(tau.expected_tokens([0.8, 0.5, 0.0]), [1, 1.8, 2.2, 2.2])


def test_unreached_positions_read_like_the_one_before():
  """Draft 1 kept 6 of 20 times, drafts 2-3 never checked: their estimates follow draft 1's
  (1/3), not the optimistic prior (1), so k = 1 pays (1.33 / 1.3 s) and k = 3 does not
  (1.48 / 1.9 s; with a prior of 1 on drafts 2-3 it would be 2.0 / 1.9 s, the best)."""
  g = Goodput(margin=0.0)  # k = 1 wins by 2.6%, under the default margin
  s = _state([6.0, 0.0, 0.0], [20.0, 0.0, 0.0])
  np.testing.assert_allclose(goodput.acceptance(g, s), [[7 / 21] * 3], rtol=1e-6)
  assert int(goodput.choose(g, s)) == 1
  # a reached position weighs its own counts against the one before it: (4 + 1/3) / (5 + 1)
  deep = _state([6.0, 4.0, 0.0], [20.0, 5.0, 0.0])
  np.testing.assert_allclose(goodput.acceptance(g, deep)[0, 1], (4 + 1 / 3) / 6, rtol=1e-6)


def test_observe_counts_reached_and_kept_positions():
  g = Goodput(decay=0.5)
  s = _state([1.0] * 3, [2.0] * 3, plain_run=5, bins=[0, 0, 0, -1])
  nxt = jnp.array([0, 0, -1, -1])  # row 2 finished in the step
  # a plain step observes nothing: the counts stay, and it counts towards the next probe
  plain = goodput.observe(g, s, 0, jnp.zeros((4,), jnp.int32), jnp.zeros((4,), jnp.int32), nxt)
  np.testing.assert_allclose(plain.kept, s.kept)
  np.testing.assert_allclose(plain.reached, s.reached)
  assert plain.steps.tolist() == [1, 0, 0, 0] and int(plain.plain_run) == 6
  assert plain.bins.tolist() == nxt.tolist()
  # rows: 0 kept nothing of 3; 1 kept 2 of 3; 2 (adaptive length 1) kept 1; 3 done before.
  s = goodput.observe(g, s, 3, jnp.array([3, 3, 1, 3]), jnp.array([0, 2, 1, 3]), nxt)
  # 3 rows reached draft 1 and 1 row drafts 2 and 3: each position's counts decay by 0.5 per
  # outcome it adds
  decayed = 0.5 ** np.array([3, 1, 1])
  np.testing.assert_allclose(s.reached, [decayed * 2 + np.array([3, 1, 1])])
  np.testing.assert_allclose(s.kept, [decayed * 1 + np.array([2, 1, 0])])
  assert s.steps.tolist() == [0, 0, 0, 1] and int(s.plain_run) == 0
  assert s.bins.tolist() == nxt.tolist()
  # each observed state carries the next step's choice, which the loop's conditions read: a
  # drafter never kept takes plain steps until the probe after 16 of them
  state, zeros = s.replace(kept=jnp.zeros_like(s.kept), plain_run=jnp.array(14)), jnp.zeros(4, int)
  for want in (0, 1):
    state = goodput.observe(g, state, 0, zeros, zeros, nxt)
    assert int(state.choice) == int(goodput.choose(g, state)) == want


def test_observe_counts_changes_of_length():
  """A step whose next choice is another length counts one change (what the loop form pays
  for); one followed by its own length, none."""
  g, one, row = Goodput(), jnp.array([1]), jnp.array([0])
  sure = _state([50.0] * 3, [50.0] * 3)  # every draft kept: the choice is k = 3
  stay = goodput.observe(g, sure, 3, jnp.array([3]), jnp.array([3]), row)
  assert (int(stay.choice), int(stay.changes)) == (3, 0)
  up = goodput.observe(g, stay, 1, one, one, row)
  assert (int(up.choice), int(up.changes)) == (3, 1)
  never = _state([0.0] * 3, [50.0] * 3)  # never kept: plain steps
  plain = goodput.observe(g, never, 0, jnp.array([0]), jnp.array([0]), row)
  assert (int(plain.choice), int(plain.changes)) == (0, 0)
  down = goodput.observe(g, plain, 1, one, jnp.array([0]), row)
  assert (int(down.choice), int(down.changes)) == (0, 1)


def test_observe_counts_each_row_in_its_signal_bin():
  g = Goodput(decay=0.5)
  s = _state([[2, 0], [4, 2], [2, 2]], [[2, 2], [4, 4], [2, 2]], costs=COSTS[:3],
             bins=[2, 0, 2, -1])
  s = goodput.observe(g, s, 2, jnp.array([2, 2, 2, 2]), jnp.array([2, 0, 1, 2]),
                      jnp.array([1, 1, 0, -1]))
  # bins 0 and 2 had rows: each position decays by 0.5 per outcome it adds (bin 0: one at draft
  # 1, none at draft 2, which its row did not reach; bin 2: two at each) and counts them; bin 1
  # had none and keeps its counts; row 3 was done before the step and counts nowhere
  np.testing.assert_allclose(s.reached, [[1 + 1, 2 + 0], [4, 4], [0.5 + 2, 0.5 + 2]])
  np.testing.assert_allclose(s.kept, [[1 + 0, 0 + 0], [4, 2], [0.5 + 2, 0.5 + 1]])
  assert s.bins.tolist() == [1, 1, 0, -1]


def test_probes_that_change_nothing_come_ever_later():
  """A probe after which the choice stays plain doubles the plain steps before the next (up to
  probe_every_max); one after which the loop drafts sets them back to probe_every."""
  g = Goodput(probe_every_max=64)
  zeros, rows = jnp.zeros((1,), jnp.int32), jnp.array([0])
  state = _state([0.0] * 3, [40.0] * 3, plain_run=0)  # the first draft never kept
  waits = []
  for _ in range(4):  # plain steps until the probe, then the probe: nothing kept
    plain = 0
    while int(state.choice) == 0:
      state, plain = goodput.observe(g, state, 0, zeros, zeros, rows), plain + 1
    assert int(state.choice) == 1
    state = goodput.observe(g, state, 1, jnp.array([1]), zeros, rows)
    waits.append(plain)
  assert waits == [16, 32, 64, 64], waits
  # a probe whose draft is kept, often enough that drafting pays: the interval starts over
  state = state.replace(plain_run=jnp.array(64), kept=jnp.array([[39.0, 0.0, 0.0]]))
  state = goodput.observe(g, state, 1, jnp.array([1]), jnp.array([1]), rows)
  assert int(state.choice) == 1 and int(state.probe_after) == 16
  # backoff 1: every probe after probe_every plain steps, as before backoff
  fixed = _state([0.0] * 3, [40.0] * 3, plain_run=16)
  fixed = goodput.observe(Goodput(probe_backoff=1), fixed, 1, jnp.array([1]), zeros, rows)
  assert int(fixed.choice) == 0 and int(fixed.probe_after) == 16


def test_probe_every_max_below_probe_every_names_both():
  with pytest.raises(ValueError, match="probe_every_max=8 must be at least probe_every=16"):
    Goodput(probe_every_max=8)


def test_a_longer_draft_must_beat_every_shorter_one_by_the_margin():
  """First draft kept ~0.90, second ~0.60: two drafts promise 1.53 tokens a second against one
  draft's 1.46 (4.5% more), inside the 10% margin, so one draft is taken; with no margin, two."""
  s = _state([90.0, 54.0, 0.0], [100.0, 90.0, 0.0])
  assert int(goodput.choose(Goodput(), s)) == 1
  assert int(goodput.choose(Goodput(margin=0.0), s)) == 2


def test_a_bins_prior_is_the_other_bins_estimate():
  """A bin's prior holds the other bins' counts, not its own again: one rejected first draft in
  bin 0 reads (0 + 1) / (1 + 1) = 0.5 there, as one pooled estimate would (counted twice it read
  0.25, under the margin of a step that pays at 0.5); with counts in both bins each leans on the
  other's: bin 0 kept 10 of 20, bin 1 18 of 20 -> (10 + 19/21) / 21 and (18 + 11/21) / 21."""
  g = Goodput()
  once = goodput.acceptance(g, _state([[0.0] * 3, [0.0] * 3], [[1.0, 0, 0], [0.0] * 3]))
  np.testing.assert_allclose(once[:, 0], [0.5, 0.5], rtol=1e-6)
  both = goodput.acceptance(g, _state([[10.0, 0, 0], [18.0, 0, 0]], [[20.0, 0, 0], [20.0, 0, 0]]))
  np.testing.assert_allclose(both[:, 0], [(10 + 19 / 21) / 21, (18 + 11 / 21) / 21], rtol=1e-6)


def test_choice_weighs_each_row_by_its_bin():
  """Bin 0's first draft is never kept, bin 1's always (50 row-steps each): rows all in bin 0
  take a plain step, rows all in bin 1 draft 3, where one pooled estimate (a_1 = 0.5, then 1)
  drafts 2 for both (2.0 tokens for 1.6 s; 3's 2.5 for 1.9 s is within the margin); a bin never
  seen reads the pooled estimate; done rows (-1) weigh nothing."""
  g = Goodput()
  kept = [[0.0] * 3, [50.0] * 3]
  s = _state(kept, [[50.0, 0.0, 0.0], [50.0] * 3], bins=[0, 0])
  assert int(goodput.choose(g, s)) == 0
  assert int(goodput.choose(g, s.replace(bins=jnp.array([1, 1])))) == 3
  assert int(goodput.choose(g, s.replace(bins=jnp.array([1, -1])))) == 3
  pooled = _state(np.sum(kept, 0), [100.0, 50.0, 50.0], bins=[0, 0])
  assert int(goodput.choose(g, pooled)) == 2
  unseen = _state(kept + [[0.0] * 3], [[50.0, 0, 0], [50.0] * 3, [0.0] * 3], bins=[2])
  np.testing.assert_allclose(goodput.acceptance(g, unseen)[2], goodput.acceptance(g, pooled)[0],
                             rtol=1e-6)


def test_a_fixed_batch_weighs_the_rows_that_may_end_last():
  """Rows 12 and 2 tokens ahead of the one furthest behind (10 emitted, 40 left): in a batch
  that ends with its last row, the one 12 ahead counts at lead 2 but not at lead 1 (a slack of
  sqrt(40) = 6.3 tokens); refilled, every running row counts; done rows never do."""
  n_out, done = jnp.array([22, 10, 12, 30]), jnp.array([False, False, False, True])
  weights = lambda g, refill: g.weights(n_out, done, jnp.array(50), jnp.array(refill)).tolist()
  assert weights(Goodput(lead=1.0), False) == [0, 1, 1, 0]
  assert weights(Goodput(lead=2.0), False) == [1, 1, 1, 0]
  assert weights(Goodput(lead=0.0), False) == [0, 1, 0, 0]
  assert weights(Goodput(), True) == weights(Goodput(lead=None), False) == [1, 1, 1, 0]
  # a leading row in a bin whose drafts are always kept, the laggard in one never kept: the
  # fixed batch takes plain steps (the leader's tokens buy no time), the refilled one drafts
  # (two drafts: 4 tokens for 1.6 s, within the margin of three's 4.9 for 1.9 s)
  s = _state([[0.0] * 3, [50.0] * 3], [[50.0, 0.0, 0.0], [50.0] * 3], bins=[1, 0])
  assert int(goodput.choose(Goodput(), s)) == 2
  assert int(goodput.choose(Goodput(), s, jnp.array([0.0, 1.0]))) == 0
  with pytest.raises(ValueError, match="Goodput.lead must be a finite number >= 0 or None, got -1"):
    Goodput(lead=-1.0)


@pytest.mark.parametrize("costs,match", [
    ((1.0, 1.3), "k=3 \\(4 numbers\\), got shape \\(2,\\)"),
    ((1.0, 1.3, -1.6, 1.9), "> 0 seconds.*-1.6"),
    ((1.0, 1.3, float("nan"), 1.9), "> 0 seconds.*nan"),
    ((INF,) * 4, "at least one finite.*inf"),
])
def test_step_costs_name_the_value(costs, match):
  with pytest.raises(ValueError, match=match):
    goodput.step_costs(costs, 3)


@pytest.mark.parametrize("bins", [(0,), (8, 8), (16, 4)])
def test_answer_bins_name_the_value(bins):
  with pytest.raises(ValueError, match="answer_bins"):
    Goodput(answer_bins=bins)
