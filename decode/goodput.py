"""Goodput-driven draft length (SmartSpec, Liu et al. 2024): each loop step drafts the k in
0..K that maximises the batch's expected tokens per second, and k = 0 is a plain decoding step
(no draft, one target token per row).

Expected tokens of a step drafting k: summed over the rows that count, 1 + sum_{j<=k} prod_{i<=j}
a_i, with a_i the running estimate of P(draft i kept | drafts before it kept) for the row's signal
bin (below). Where finished rows are refilled (continuous batching) or an EOS may end any row, every
running row counts; a batch that ends with its last row, its rows ended by the budget alone, counts
only the rows that may end last (`Goodput.weights`), since tokens that put a row further ahead buy
that batch no time. Its cost: the measured seconds of one loop step drafting k at this batch (the
step costs, decode/calibrate.py measures them). The costs are data of the loop state, not of its
static config: one compiled loop serves any costs, so calibration times the serving loop itself and
a measured cost vector is reused across calls. A cost of +inf takes that length out of the choice
(calibration forces one length at a time this way). The choice is an argmax over K + 1 numbers
inside the jitted loop, and the loop runs the chosen step's own program (a chain of loops, one per
length, or a switch among them: `Goodput.loop`), so a short draft pays only its own drafting and
verify forward. Each step makes the next step's choice at its end (`GoodputState.choice`), so the
loop's conditions only read it: a while loop's condition is launched from the host on every
iteration on a GPU, where computing the choice there took ~10 small kernels outside the step's CUDA
graph (the fixed loop's condition: 2), 0.4 ms of a 2.2 ms step under the profiler (H200, SmolLM2 at
batch 8).

The estimate is kept per bin of the drafter's own signal, what it knows of its next draft
before drafting it (`Drafter.signal`: prompt lookup's match length; one bin for a drafter
without a free one): a step's expected tokens sum each row's from its bin's estimate, so a
batch whose rows found nothing to copy takes a plain step and one whose rows found long matches
drafts long, where one pooled estimate would draft the same k for both. Each bin's estimate
leans on the other bins' pooled one (its prior) until its own counts outweigh it. A signal must
be free: EAGLE's first-draft confidence costs an output-layer pass on every plain step (measured
32 -> 42 ms a plain step at batch 1 on a 2-core CPU) and changed nothing it chose, so EAGLE has
none. `Goodput.answer_bins` splits every bin by how far into its answer a row is (tokens
emitted by this call): a signal the loop has for free, for drafters whose drafts are kept more
at some stretch of an answer than at another, and for estimates carried from call to call.

Each outcome a drafting step adds at a bin's position decays the counts before it there (older
outcomes weigh less; a bin the step had no rows in, or a position no row reached, keeps its
counts), towards a prior (position i's: the estimate of position i - 1). A plain step observes
nothing and leaves the estimate as it is; after `probe_every` plain steps in a row the next step
drafts (a probe), so a drafter that stopped paying is re-checked and one that got better is
noticed. A probe drafts the length the estimate rates best of the drafting ones: a drafter never
kept probes with one draft (the cheapest), and one whose first draft is kept too rarely to pay
alone but whose deeper drafts are kept after it (EAGLE + TTT at batch 1: k = 1 under plain
decoding, k = 2 above it) probes deep enough to check them (a one-draft probe saw the first
position only: 0.963 of the best fixed k against 0.977, replayed). A probe after which the loop
goes back to plain steps multiplies the plain steps before the next one by `probe_backoff` (up
to `probe_every_max`), and one after which it drafts sets them back: a drafter that never pays
(accepted or not, as a layer skip that drafts through 29 of 30 layers) costs a probe every 16
plain steps at first and ever fewer as the call or the stream goes on, where a fixed interval
cost it a probe's extra on every 16 plain steps for good. The choice reads only past
verify outcomes, so output stays lossless whatever it picks.

Dims: b batch, K the most drafts a step may take, c signal bins.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.fields import Checked, field
from speculax.core.tau import expected_tokens


@dataclasses.dataclass(frozen=True)
class Goodput(Checked):
  """The policy (static: part of the compiled loop); the step costs it weighs are data."""
  # Weight of the counts before each outcome a drafting step adds at a bin's position (r rows
  # checking it: decay**r), so each position's window holds as many outcomes (~1 / (1 - decay))
  # at any batch (0.987**8 = 0.90 a step at batch 8) and whatever lengths the steps take. One
  # decay a step kept ~10 outcomes at batch 1, where a few rejections in a row sent EAGLE + TTT
  # to plain steps, and wore away deep positions on steps that never checked them.
  decay: float = field(0.987, gt=0, lt=1)
  prior: float = field(1.0, gt=0)  # pseudo-outcomes behind every position's estimate
  # The first position's prior acceptance: optimistic, so drafting is tried before its
  # estimate is trusted (deeper positions' priors follow the position before them).
  prior_acceptance: float = field(1.0, gt=0, le=1)
  # Plain steps in a row after which the next step drafts (a probe of the drafter).
  probe_every: int = field(16, ge=1)
  # What a probe followed by plain steps multiplies the plain steps before the next probe by, up
  # to probe_every_max (1: a probe every probe_every plain steps for good); a probe followed by
  # drafting sets them back to probe_every.
  probe_backoff: int = field(2, ge=1, le=16)
  probe_every_max: int = field(256, ge=1, le=1 << 20)
  # Estimates per bin of the drafter's signal (False: one estimate pooled over every row).
  signal: bool = True
  # How much more expected tokens per second a draft must promise than a plain step, and a
  # longer draft than every shorter one, to be taken: a plain step's tokens are certain, a
  # draft's an estimate (a longer one's a longer product of them), and a drafter near
  # break-even (EAGLE + TTT at batch 1 on a 2-core CPU: kept 0.32 of the time against a
  # one-draft step of 1.33 plain ones) otherwise drafts on the estimate's and the costs' noise.
  margin: float = field(0.1, ge=0)
  # Tokens into the answer (emitted by this call) where a row's estimate moves to the next
  # stretch, each bin of the signal split so ((): one stretch). A drafter's acceptance depends on
  # where in the answer a row is (EAGLE + TTT drafts an answer's opening better than its end), and
  # an estimate carried from call to call (`estimate`) otherwise starts the next answer from the
  # end of the last.
  answer_bins: tuple[int, ...] = field((), ge=1)
  # In a batch that ends with its last row and whose rows only the budget ends (no finished row
  # refilled, no EOS), the rows whose tokens count in the choice: those at most lead * sqrt(t)
  # tokens ahead of the row furthest behind, which has t tokens left (`weights`). None: every
  # running row alike.
  lead: float | None = field(0.5, ge=0)
  # How the loop runs a step of the chosen length. "chain": one while loop per length in turn
  # inside the outer loop, which updates the KV cache in place; but each pass of the outer loop
  # evaluates every length's condition, and a GPU evaluates each from the host, so a step that
  # changes length pays K + 2 of them. "switch": one while loop, a switch among the lengths' steps
  # each step (one condition from the host a step on a GPU, where XLA records the switch into the
  # step's CUDA graph); a drafting step copies the cache once (speculative.REGION_ANALYSIS: level
  # with the chain at batch 8 on a 2-core CPU). Not yet timed on a GPU.
  loop: Literal["chain", "switch"] = "chain"
  # What a call calibrated on its prompts starts from: "calibration", the acceptance counts of
  # calibration's longest drafting run on them (decode/calibrate.py), or "prior" (every position
  # at its prior: the first step drafts the longest length on the optimistic prior_acceptance,
  # 2-4% of a 48-token call at batch 8 for a drafter that does not pay there).
  start: Literal["calibration", "prior"] = "calibration"

  def __post_init__(self):
    super().__post_init__()
    if any(a >= b for a, b in zip(self.answer_bins, self.answer_bins[1:])):
      raise ValueError(f"Goodput.answer_bins must increase, got {self.answer_bins}")
    if self.probe_every_max < self.probe_every:
      raise ValueError(f"Goodput.probe_every_max={self.probe_every_max} must be at least "
                       f"probe_every={self.probe_every}")

  def signal_values(self, signal_bins: int) -> int:
    """Values of the drafter's signal the estimate tells apart (1: pooled, signal=False)."""
    return signal_bins if self.signal else 1

  def n_bins(self, signal_bins: int) -> int:
    """Estimates kept: one per signal value and stretch of the answer."""
    return self.signal_values(signal_bins) * (len(self.answer_bins) + 1)

  def bins(self, signal: jax.Array, n_out: jax.Array, done: jax.Array) -> jax.Array:
    """[b] int32 each row's estimate from its signal value [b] (0 with signal=False) and the
    tokens it has emitted [b]; -1 where the row is done."""
    stretch = jnp.searchsorted(jnp.asarray(self.answer_bins, jnp.int32), n_out, side="right")
    return jnp.where(done, -1, signal * (len(self.answer_bins) + 1) + stretch).astype(jnp.int32)

  def weights(self, n_out: jax.Array, done: jax.Array, budget: jax.Array,
              alike: jax.Array) -> jax.Array:
    """[b] float32 how much each row's expected tokens count in the choice, from the tokens each
    row has emitted [b], done [b], the budget [] and `alike` []: every running row counts where
    finished rows are refilled (the stream's tokens per second) or an EOS may end any row (any
    may end last). In a batch that ends with its last row, rows that only the budget ends,
    only the rows that may end last count: tokens that put a row further ahead of the one
    furthest behind buy that batch no time (summed over every row, prompt lookup at batch 8
    over 128 tokens drafted on 69 of 105 steps, where no fixed length beat plain decoding).
    Rows pull apart like random walks, by ~sqrt(steps left) tokens, so a row that far ahead may
    still end last and one further ahead will not."""
    running = ~done
    if self.lead is None:
      return running.astype(jnp.float32)
    behind = jnp.min(jnp.where(done, budget, n_out))  # [] the row furthest behind's tokens
    slack = self.lead * jnp.sqrt((budget - behind).astype(jnp.float32))
    return (running & (alike | (n_out - behind <= slack))).astype(jnp.float32)


def step_costs(costs, k: int) -> np.ndarray:
  """[k + 1] float32 seconds of one loop step drafting 0..k, checked: positive, no NaN, +inf
  only for lengths the loop must not take, at least one length it may."""
  c = np.asarray(costs, np.float64)
  if c.shape != (k + 1,):
    raise ValueError(f"goodput step costs must hold the seconds of a step drafting 0..k={k} "
                     f"({k + 1} numbers), got shape {c.shape}: {costs}")
  if np.isnan(c).any() or (c <= 0).any() or not np.isfinite(c).any():
    raise ValueError(f"goodput step costs must be > 0 seconds (+inf: never take that length) "
                     f"with at least one finite, got {costs}")
  return c.astype(np.float32)


def estimate(counts, n_bins: int, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The (kept, reached) float32 [n_bins, k] counts a goodput loop starts from (a previous
  call's DecodeOutput.goodput_estimate, for the same drafter, k and policy), checked: that shape,
  finite, 0 <= kept <= reached."""
  kept, reached = (np.asarray(c, np.float64) for c in counts)
  if kept.shape != (n_bins, k) or reached.shape != (n_bins, k):
    raise ValueError(f"a goodput estimate holds (kept, reached) counts of shape ({n_bins}, {k}) "
                     f"(signal bins, k) here, got {kept.shape} and {reached.shape}")
  if not (np.isfinite(kept).all() and np.isfinite(reached).all()
          and (kept >= 0).all() and (kept <= reached + 1e-6 * (1 + reached)).all()):
    raise ValueError(f"a goodput estimate needs finite counts with 0 <= kept <= reached, got "
                     f"kept {kept.tolist()} and reached {reached.tolist()}")
  return kept.astype(np.float32), reached.astype(np.float32)


def forcing(k: int, n_lengths: int) -> np.ndarray:
  """[n_lengths] float32 step costs under which every loop step drafts k: 1 there, +inf (never)
  at every other length (calibration times one length so; the warm-up runs each)."""
  return np.where(np.arange(n_lengths) == k, 1.0, np.inf).astype(np.float32)


@flax.struct.dataclass
class GoodputState:
  kept: jax.Array  # [c, K] float32 decayed count of row-steps that kept draft i
  reached: jax.Array  # [c, K] float32 decayed count of row-steps that checked draft i (all
  # before it kept)
  steps: jax.Array  # [K + 1] int32 loop steps that drafted k
  plain_run: jax.Array  # [] int32 plain steps since the last one that drafted
  probe_after: jax.Array  # [] int32 plain steps in a row before the next probe
  step_costs: jax.Array  # [K + 1] float32 seconds of a step drafting k (+inf: never)
  bins: jax.Array  # [b] int32 each row's signal bin for the next step (-1: the row is done)
  choice: jax.Array  # [] int32 the k the next step drafts: `choose` of this state
  # [] int32 steps after which the next one drafts another length, what a loop form pays for
  # (on a GPU the chain evaluates K + 2 conditions from the host at a change, one a step else)
  changes: jax.Array

  @classmethod
  def init(cls, goodput: Goodput, step_costs: jax.Array, bins: jax.Array,
           estimate: tuple[jax.Array, jax.Array]) -> GoodputState:
    """estimate: the (kept, reached) [c, K] counts to start from (zeros: every position at its
    prior; a previous call's to go on learning, as `estimate` checks them). Its choice weighs
    every row alike (the loop re-chooses with its call's weights before the first step)."""
    k = step_costs.shape[0] - 1
    kept, reached = estimate
    state = cls(jnp.asarray(kept, jnp.float32), jnp.asarray(reached, jnp.float32),
                jnp.zeros((k + 1,), jnp.int32), jnp.zeros((), jnp.int32),
                jnp.asarray(goodput.probe_every, jnp.int32),
                jnp.asarray(step_costs, jnp.float32), jnp.asarray(bins, jnp.int32),
                jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    return state.replace(choice=choose(goodput, state))


def acceptance(goodput: Goodput, state: GoodputState) -> jax.Array:
  """[c, K] estimated P(draft i kept | drafts before it kept), per signal bin.

  The pooled estimate: each position's prior is the pooled estimate of the one before it (the
  first's: prior_acceptance), so a deep position that short steps rarely reach reads like the
  shallower ones, not like the optimistic prior: otherwise every long draft looks nearly free
  of rejections and the loop keeps drafting long with a drafter whose first draft is kept a
  third of the time. A bin's prior at each position is that estimate from the other bins'
  counts: a prior holding the bin's own counts would count each of them twice (one rejected
  first draft read 0.25 in its bin, 0.5 pooled). A bin never seen reads the pooled estimate.
  """
  def chain(kept, reached):  # [..., K] counts -> [..., K] estimates, each the next's prior
    alphas, before = [], jnp.full(kept.shape[:-1], goodput.prior_acceptance, jnp.float32)
    for i in range(kept.shape[-1]):
      before = (kept[..., i] + goodput.prior * before) / (reached[..., i] + goodput.prior)
      alphas.append(before)
    return jnp.stack(alphas, -1)

  if state.kept.shape[0] == 1:
    return chain(state.kept, state.reached)
  others = chain(state.kept.sum(0) - state.kept, state.reached.sum(0) - state.reached)  # [c, K]
  return (state.kept + goodput.prior * others) / (state.reached + goodput.prior)


def probe_due(state: GoodputState) -> jax.Array:
  """[] bool: enough plain steps in a row that a step drafting now is a probe."""
  return state.plain_run >= state.probe_after


def choose(goodput: Goodput, state: GoodputState, weights: jax.Array | None = None) -> jax.Array:
  """[] int32 the shortest k in 0..K whose expected tokens per second for the rows' bins come
  within goodput.margin of the best length's (a length of infinite cost rates 0): a plain step
  unless some draft beats it by more than the margin, and a longer draft only where the best
  length beats every shorter one so; after probe_every plain steps in a row the drafting length
  of finite cost that rates best (state.probe_after of them: probe_every, or more after probes
  that changed nothing). weights [b]: how much each row's tokens count (Goodput.weights; None:
  every running row alike)."""
  weights = (state.bins >= 0).astype(jnp.float32) if weights is None else weights  # [b]
  rows = weights @ jax.nn.one_hot(state.bins, state.kept.shape[0])  # [c] (done: none)
  tokens = rows @ expected_tokens(acceptance(goodput, state))  # [K + 1] summed over rows
  rate = tokens / state.step_costs  # [K + 1]
  best = jnp.argmax(rate * (1 + goodput.margin) >= rate.max()).astype(jnp.int32)
  may_draft = jnp.isfinite(state.step_costs[1:])  # [K]
  probe = (best == 0) & probe_due(state) & may_draft.any()
  # masked: a finite-cost length even where no row is active (every rate 0)
  probe_k = 1 + jnp.argmax(jnp.where(may_draft, rate[1:], -jnp.inf)).astype(jnp.int32)
  return jnp.where(probe, probe_k, best)


def observe(goodput: Goodput, state: GoodputState, k: int, checked: jax.Array,
            n_accepted: jax.Array, bins: jax.Array,
            weights: jax.Array | None = None) -> GoodputState:
  """After a step that drafted k (static): checked [b] drafts each row's verify looked at (k, or
  fewer with an adaptive length), n_accepted [b] kept, counted in the bin each row had before
  the step (rows done before it count nothing); bins and weights [b] the rows' for the next
  step (Goodput.bins, Goodput.weights). A plain step (k = 0) leaves the estimate as it is and
  counts towards the next probe; a probe (a draft after probe_after plain steps) that leaves the
  choice plain lengthens the wait for the next one, and a drafting step that leads to another
  sets it back. The state returned holds its own choice for the next step."""
  steps = state.steps.at[k].add(1)
  if k == 0:
    state = state.replace(steps=steps, plain_run=state.plain_run + 1, bins=bins)
    return chosen(state, choose(goodput, state, weights), k)
  probed = probe_due(state)  # this step was a probe (choose's condition, before it reset)
  pos = jnp.arange(state.kept.shape[1])[None]  # [1, K]
  reached = (pos < checked[:, None]) & (pos <= n_accepted[:, None])  # [b, K]
  kept = reached & (pos < n_accepted[:, None])
  row_bin = jax.nn.one_hot(state.bins, state.kept.shape[0]).T  # [c, b], a done row all zero
  seen = row_bin @ reached  # [c, K] outcomes this step adds to each bin's position
  # Each outcome decays the counts before it at its own bin and position: a bin rarely met, or a
  # deep position short steps never check, keeps what it learnt.
  decay = goodput.decay ** seen  # [c, K]
  state = state.replace(
      kept=decay * state.kept + row_bin @ kept, reached=decay * state.reached + seen,
      steps=steps, plain_run=jnp.zeros_like(state.plain_run), bins=bins)
  choice = choose(goodput, state, weights)
  longer = jnp.minimum(state.probe_after * goodput.probe_backoff, goodput.probe_every_max)
  probe_after = jnp.where(choice > 0, goodput.probe_every,
                          jnp.where(probed, longer, state.probe_after))
  return chosen(state.replace(probe_after=probe_after.astype(jnp.int32)), choice, k)


def chosen(state: GoodputState, choice: jax.Array, k: int) -> GoodputState:
  """The state after a step that drafted k, holding the next step's choice, counted as a change
  of length where it is another and a row runs on (state.bins: the rows' for the next step)."""
  change = (choice != k) & jnp.any(state.bins >= 0)
  return state.replace(choice=choice, changes=state.changes + change.astype(jnp.int32))
