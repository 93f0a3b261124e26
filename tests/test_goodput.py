"""Goodput-driven draft length's loop (decode/speculative.py with decode/goodput.py; the policy
alone: tests/test_goodput_policy.py): a k' in 0..k each step, lossless (greedy equality, the
sampling law of the first three tokens), a drafter never accepted settles on plain decoding,
prompt lookup on a self-repeating target drafts long, a drafter whose signal foretells
rejections is spared them, a draft model left behind by plain steps catches up, the chain and
the switch run the same steps, calibration and carried estimates."""
import dataclasses
import re
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_speculative_sampling as sampling_test
from test_bench import Bytes
from test_eagle import _params as eagle_params
from test_goodput_policy import COSTS, INF
from test_hydra import random_params
from test_multi_draft import _target_laws

from speculax import api
from speculax.core.sampling import SamplingConfig
from speculax.core.types import Draft, TargetView, Verified
from speculax.decode import engine, goodput, speculative
from speculax.decode.calibrate import calibrate
from speculax.decode.config import SpecConfig
from speculax.decode.generate import generate
from speculax.decode.inputs import pack_prompts
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import spec_loop, speculative_generate
from speculax.drafters.base import Drafter
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models import llama
from speculax.models.kvcache import KVCache
from speculax.models.load import LoadedModel

from tiny_prompts import NEW, PROMPTS


def test_run_settings_name_the_value(tiny):
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=4, goodput=Goodput())
  run = lambda drafter, spec, **kw: speculative_generate(params, cfg, [[1, 2, 3]], drafter, spec,
                                                         **kw)
  with pytest.raises(ValueError, match="chain"):
    run(TokenRecycling(), spec, step_costs=COSTS)
  with pytest.raises(ValueError, match="step_costs go with spec.goodput.*step_costs=None"):
    run(PromptLookup(), spec)
  with pytest.raises(ValueError, match="step_costs go with spec.goodput.*goodput=None"):
    run(PromptLookup(), SpecConfig(k=3, max_new_tokens=4), step_costs=COSTS)
  for n in (0, 5, True):
    with pytest.raises(ValueError, match=f"new_tokens must be an int in \\[1, .*=4\\], got {n}"):
      run(PromptLookup(), spec, step_costs=COSTS, new_tokens=n)


@dataclasses.dataclass(frozen=True)
class Contrary(Drafter):
  """Proposes one past the target's own greedy token (read with a target forward): a drafter
  greedy verification never accepts."""
  name: ClassVar[str] = "contrary"
  summary: ClassVar[str] = "test drafter"

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    logits, _, _ = llama.forward(view.params, config, view.pending[:, None],
                                 (view.lengths - 1)[:, None], view.cache)
    wrong = (jnp.argmax(logits[:, 0], -1) + 1) % config.vocab_size  # [b]
    return Draft(jnp.broadcast_to(wrong[:, None], (wrong.shape[0], k)), None), state, view


@dataclasses.dataclass(frozen=True)
class Foresighted(Drafter):
  """Drafts the target's own greedy token where its signal (a subclass's) is 1 and one past it
  where it is 0 (its later drafts one past the first): a drafter that knows before drafting
  whether its first draft will be kept."""
  summary: ClassVar[str] = "test drafter"
  signal_bins: ClassVar[int] = 2

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    logits, _, _ = llama.forward(view.params, config, view.pending[:, None],
                                 (view.lengths - 1)[:, None], view.cache)
    own = jnp.argmax(logits[:, 0], -1)  # [b]
    first = jnp.where(self.signal(params, state, view, config) == 1, own, own + 1)
    tokens = (first[:, None] + jnp.minimum(jnp.arange(k), 1)) % config.vocab_size  # [b, k]
    return Draft(tokens.astype(jnp.int32), None), state, view


@dataclasses.dataclass(frozen=True)
class EveryThird(Foresighted):
  """Kept where the pending token's position is a multiple of 3."""
  name: ClassVar[str] = "every-third"

  def signal(self, params, state, view: TargetView, config):
    return ((view.lengths - 1) % 3 == 0).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class FirstRow(Foresighted):
  """Kept on the batch's first row only."""
  name: ClassVar[str] = "first-row"

  def signal(self, params, state, view: TargetView, config):
    return (jnp.arange(view.lengths.shape[0]) == 0).astype(jnp.int32)


def _spec(new, costs, **settings):
  """A goodput loop's SpecConfig: k = len(costs) - 1, the policy Goodput(**settings)."""
  return SpecConfig(k=len(costs) - 1, max_new_tokens=new, goodput=Goodput(**settings))


def _run(tiny, drafter, dparams=None, prompts=PROMPTS[:4], new=48, costs=COSTS, **settings):
  cfg, params = tiny
  return speculative_generate(params, cfg, prompts, drafter, _spec(new, costs, **settings),
                              drafter_params=dparams, step_costs=costs)


def _loop(tiny, drafter, dparams=None, prompts=PROMPTS[:4], new=48, costs=COSTS, **settings):
  """_run's decode as (final loop state, DecodeOutput): speculative_generate keeps only the
  drafter's part of the state."""
  cfg, params = tiny
  spec = _spec(new, costs, **settings)
  program = speculative.spec_program(params, cfg, drafter, spec, dparams, step_costs=costs)
  return engine.run(params, cfg, prompts, spec, program, None, None, False)


def test_never_accepted_settles_on_plain_decoding(tiny):
  cfg, params = tiny
  prompts = PROMPTS[:4]
  want = generate(params, cfg, prompts, SpecConfig(max_new_tokens=48)).tokens
  out = _run(tiny, Contrary(), prompts=prompts)
  assert out.tokens == want
  assert out.accepted_at.sum() == 0
  # Optimism tries k = 3 first; then plain steps, and a one-draft probe after 16, 32, 64, ...
  assert out.k_steps[0] >= 0.85 * out.k_steps.sum(), out.k_steps
  # probes at a fixed interval: more of them over the same tokens, the same output
  fixed = _run(tiny, Contrary(), prompts=prompts, probe_backoff=1)
  assert fixed.tokens == want
  assert fixed.k_steps[1] > out.k_steps[1], (fixed.k_steps, out.k_steps)


@pytest.mark.parametrize("loop", ["chain", "switch"])
def test_the_loop_updates_cache_and_history_in_place(tiny, loop):
  """The compiled goodput loop as a chain of loops, one per length, copies no K/V or history
  buffer. XLA copies a buffer a conditional's branch updates in place: a switch per step copied
  K/V and history buffers in every branch (16 K/V copies here) and a switch per segment at every
  change of length; with copy insertion's region analysis (spec_loop's REGION_ANALYSIS) at most
  one copy of each buffer per drafting branch."""
  cfg, params = tiny
  spec = SpecConfig(k=2, max_new_tokens=NEW, goodput=Goodput(loop=loop))
  program = speculative.spec_program(params, cfg, PromptLookup(), spec, None, COSTS[:3])
  tokens, lengths = (jnp.asarray(x) for x in pack_prompts(PROMPTS, cfg.vocab_size, 1))
  max_len = tokens.shape[1] + NEW + program.extra_slots
  dparams = engine.decoding_params(params)
  state = engine.start(dparams, cfg, program, tokens, lengths,
                       KVCache.init(cfg, len(PROMPTS), max_len, per_layer=True),
                       jax.random.key(0), max_len, NEW)
  hlo = spec_loop.lower(dparams, None, cfg, spec, PromptLookup(), state,
                        jnp.zeros((len(PROMPTS),), bool)).compile().as_text()
  buffers = 2 * len(state.cache.k)  # K and V of each layer, all of one shape
  drafting = {"chain": 0, "switch": spec.k}[loop]  # branches that may copy
  for dtype, buf, most in (("f32", state.cache.k[0], drafting * buffers),
                           ("s32", state.history, drafting)):
    shape = ",".join(map(str, buf.shape))
    copies = re.findall(rf"= {dtype}\[{shape}\]\S* copy\(", hlo)
    assert len(copies) <= most, f"{len(copies)} copies of a {dtype}[{shape}] buffer ({loop})"


def test_prompt_lookup_on_a_repeating_target_drafts_long(tiny, tiny_reference):
  """The tiny random target falls into repeating a token or a short cycle, so prompt lookup's
  drafts are mostly kept: with no margin, weighing every row's tokens (lead=None), goodput never
  stops drafting and drafts 2-3 a step, even at 0.3 s a draft (weighing the rows that may end
  last, it takes a plain step where those found nothing to copy). Under costs shaped like prompt
  lookup's measured ones (its drafts cost no forward, each past the first only a verify
  position: 1 : 1.28 : 1.38 : 1.39 at batch 1 in bench_goodput_chain) it drafts 2-3 on most
  steps at the default margin and lead too, where a longer draft must beat every shorter one by
  10% (at 0.3 s a draft: 1 on 6 of 13 steps). Greedy equality holds."""
  for lead in (None, Goodput().lead):
    out = _run(tiny, PromptLookup(max_ngram=3), prompts=PROMPTS, new=NEW, margin=0.0, lead=lead)
    assert out.tokens == [list(t) for t in tiny_reference]
    if lead is None:
      assert out.k_steps[0] == 0 and out.mean_k > 2.0, out.k_steps  # of at most 3
    else:
      assert 0 < out.k_steps[0] <= 2 and out.mean_k > 1.5, out.k_steps
  out = _run(tiny, PromptLookup(max_ngram=3), prompts=PROMPTS, new=NEW, costs=(1.0, 1.3, 1.4, 1.5))
  assert out.tokens == [list(t) for t in tiny_reference]
  assert out.k_steps[2:].sum() >= 0.75 * out.k_steps.sum(), out.k_steps


def test_signal_bins_skip_the_drafts_they_predict_rejected(tiny, tiny_reference):
  """EveryThird's first draft is kept exactly where its signal says so. Pooled, half the first
  drafts are kept (1.5 tokens for 1.3 s beats a plain step), so every step drafts and every
  other one wastes its draft; per bin, the loop drafts one token where the signal says kept and
  takes a plain step elsewhere, rejecting only while it learns. Greedy equality either way."""
  rejected = {}
  for signal in (False, True):
    out = _run(tiny, EveryThird(), prompts=PROMPTS[1:2], new=36, signal=signal)
    assert out.tokens == [list(tiny_reference[1]) + out.tokens[0][NEW:]]  # its first NEW
    rejected[signal] = out.k_steps[1:].sum() - out.accepted_at[0]  # first drafts not kept
    if signal:
      assert out.k_steps[0] >= 8 and out.k_steps[1] >= 8, out.k_steps
  assert rejected[False] >= 8 and rejected[True] <= 3, rejected


def test_a_fixed_batch_drafts_for_its_laggard_and_a_refilled_one_for_every_row(tiny,
                                                                               tiny_reference):
  """FirstRow's drafts are kept on row 0 only, and its estimate knows it (bin 1 always kept,
  bin 0 never): one draft gives row 0 two tokens, row 1 one, for 1.3 plain steps. Summed over
  both rows that pays (3 tokens against 2), so with lead=None every step drafts while row 0
  runs, yet row 0 only gets ahead: the batch ends with row 1, after as many steps as plain
  decoding. Weighing the rows that may end last (lead=0: the laggard alone), the loop drafts
  while the rows are level (the first step) and on probes only. A loop whose finished rows are
  refilled (a watched row: continuous batching) or whose rows an EOS may end weighs every row
  whatever the lead, and the weights are the call's from its first step: a row put ahead before
  the call counts nothing at lead 0 when nothing is refilled. Greedy equality throughout."""
  cfg, params = tiny
  prompts, new = PROMPTS[:2], NEW
  estimate = (np.array([[0.0], [1000.0]]), np.array([[1000.0], [1000.0]]))  # [bins, k]
  runs = {}
  for lead in (None, 0.0):
    out = speculative_generate(params, cfg, prompts, FirstRow(), _spec(new, COSTS[:2], lead=lead),
                               step_costs=COSTS[:2], estimate=estimate)
    assert out.tokens == [list(t) for t in tiny_reference[:2]]
    runs[lead] = out.k_steps.tolist()
  # lead None: drafts until row 0 is done (10 steps of 2 tokens after the prefill's 1), then
  # plain; lead 0: the first step, then plain but for one probe after 16 plain steps; 19 steps
  # either way (row 1's tokens after the prefill's)
  assert runs == {None: [9, 10], 0.0: [17, 2]}, runs
  # with an EOS id (one neither answer emits), lead 0 weighs every row too
  unused = next(i for i in range(cfg.vocab_size) if all(i not in t for t in tiny_reference[:2]))
  eos = dataclasses.replace(_spec(new, COSTS[:2], lead=0.0), eos_ids=(unused,))
  out = speculative_generate(params, cfg, prompts, FirstRow(), eos, step_costs=COSTS[:2],
                             estimate=estimate)
  assert out.tokens == [list(t) for t in tiny_reference[:2]]
  assert out.k_steps.tolist() == runs[None], out.k_steps
  spec = _spec(new, COSTS[:2], lead=0.0)
  program = speculative.spec_program(params, cfg, FirstRow(), spec, step_costs=COSTS[:2],
                                     estimate=estimate)
  tokens, lengths = (jnp.asarray(x) for x in pack_prompts(prompts, cfg.vocab_size, 1))
  max_len = tokens.shape[1] + new + program.extra_slots
  dparams = engine.decoding_params(params)
  begin = lambda: engine.start(dparams, cfg, program, tokens, lengths,
                               KVCache.init(cfg, 2, max_len, per_layer=True),
                               jax.random.key(0), max_len, new)
  # refilled rows (row 0 watched): every step drafts until row 0 is done
  state = program.loop(dparams, begin(), jnp.array([True, False]))
  assert state.goodput.steps.tolist() == [0, 10] and bool(state.done[0])
  # row 0 put 10 tokens ahead before a fixed batch's call: its start chose a draft (rows level
  # then), the call's first step re-chooses, plain
  ahead = begin()
  assert int(ahead.goodput.choice) == 1
  ahead = ahead.replace(n_out=ahead.n_out.at[0].add(10))
  state = program.loop(dparams, ahead, jnp.zeros((2,), bool))
  assert state.goodput.steps.tolist() == [18, 1], state.goodput.steps  # one probe


def test_eagle_goodput_equals_target_only(tiny, tiny_reference):
  """EAGLE's goodput loop: the target's own greedy tokens, with steps of several lengths; its
  plain steps fed in blocks before the next draft (max_lag) or each through its layer, the
  same lengths chosen and drafts kept, and (caught up) the same drafter state."""
  cfg, params = tiny
  drafter = Eagle()
  dparams = eagle_params(cfg, params, drafter)
  (lazy, out), (eager, _) = (_loop(tiny, dataclasses.replace(drafter, max_lag=m), dparams,
                                   new=NEW, decay=0.6) for m in (16, 0))
  assert out.tokens == [list(t) for t in tiny_reference[:4]]
  np.testing.assert_array_equal(lazy.history, eager.history)
  assert (lazy.goodput.steps > 0).sum() >= 2 and lazy.goodput.steps[0] > 0, lazy.goodput.steps
  np.testing.assert_array_equal(lazy.goodput.steps, eager.goodput.steps)
  np.testing.assert_array_equal(lazy.accepted_at, eager.accepted_at)
  _assert_caught_up(tiny, drafter, dparams, lazy, eager)


@pytest.mark.parametrize("make, temperature", [
    (lambda cfg: PromptLookup(), 0.0), (lambda cfg: Eagle(max_lag=3), 0.0),
    (lambda cfg: DraftModel(cfg, max_lag=3), 0.0), (lambda cfg: DraftModel(cfg), 1.0)],
    ids=["prompt-lookup", "eagle", "draft-model", "draft-model-t1"])
def test_a_switch_per_step_runs_the_chains_steps(tiny, tiny_reference, make, temperature):
  """Goodput.loop="switch" (one loop, a switch among the lengths' steps and, for a drafter with
  max_lag, catching up as a branch of its own) runs the steps the chain of per-length loops runs:
  the same tokens (greedy: the target's own; sampled: the same draws), the same lengths chosen
  and drafts kept, with changes of length and plain steps between drafts."""
  cfg, params = tiny
  drafter = make(cfg)
  dparams = {Eagle: lambda: eagle_params(cfg, params, drafter),
             DraftModel: lambda: llama.init_params(cfg, jax.random.key(7))}.get(
                 type(drafter), lambda: None)()
  prompts = PROMPTS[:4]
  sampling = SamplingConfig(temperature=temperature)

  def loop(form):
    spec = SpecConfig(k=len(COSTS) - 1, max_new_tokens=NEW, sampling=sampling,
                      goodput=Goodput(decay=0.6, probe_every=2, loop=form))
    program = speculative.spec_program(params, cfg, drafter, spec, dparams, step_costs=COSTS)
    return engine.run(params, cfg, prompts, spec, program, jax.random.key(3), None, False)

  (chain, out), (switch, _) = loop("chain"), loop("switch")
  if temperature == 0:
    assert out.tokens == [list(t) for t in tiny_reference[:4]]
  np.testing.assert_array_equal(switch.history, chain.history)
  np.testing.assert_array_equal(switch.goodput.steps, chain.goodput.steps)
  np.testing.assert_array_equal(switch.accepted_at, chain.accepted_at)
  steps = np.asarray(chain.goodput.steps)
  assert steps[0] > 0 and (steps[1:] > 0).sum() >= 2, steps
  # each length used after another is a change; at most one change per step but the last
  changes = int(chain.goodput.changes)
  assert int(switch.goodput.changes) == changes
  assert (steps > 0).sum() - 1 <= changes <= steps.sum() - 1, (steps, changes)


def test_mixed_lengths_with_a_draft_model_equal_target_only(tiny, tiny_reference):
  """A draft model of other weights: rarely kept, so steps of every length run, plain ones
  included (where the draft cache catches up); output is the target's own."""
  cfg, _ = tiny
  other = llama.init_params(cfg, jax.random.key(7))
  out = _run(tiny, DraftModel(cfg), other, prompts=PROMPTS, new=NEW, decay=0.6, probe_every=2)
  assert out.tokens == [list(t) for t in tiny_reference]
  assert out.k_steps[0] > 0 and out.k_steps[1:].sum() > 0, out.k_steps


@pytest.mark.parametrize("max_lag", [0, 16])
def test_draft_model_catches_up_after_a_plain_step(tiny, max_lag):
  """After a step that drafted nothing, the draft cache holds the verified token's K/V exactly
  as a prefill over the longer history gives it: fed by `update` (max_lag 0), or left to
  `catch_up` (the loop's block after plain steps)."""
  cfg, params = tiny
  drafter = DraftModel(cfg, max_lag=max_lag)
  dparams = drafter.prepare(params, params, cfg)
  history = jnp.array([[5, 9, 2, 7, 3, 0, 0, 0], [4, 4, 8, 0, 0, 0, 0, 0]], jnp.int32)
  lengths = jnp.array([5, 3], jnp.int32)
  before = TargetView(params, None, history, lengths)
  state = drafter.init(dparams, before, cfg, 16)
  # A rejected draft's K/V in the pending token's slot, as after a step that drafted.
  stale = (jnp.arange(16)[None] >= (lengths - 1)[:, None])[:, None, :, None]  # [b, 1, S, 1]
  state = state.replace(k=tuple(jnp.where(stale, 1.0, x) for x in state.k),
                        v=tuple(jnp.where(stale, 1.0, x) for x in state.v))
  pending = before.pending
  after = TargetView(params, None, history.at[jnp.arange(2), lengths].set(11), lengths + 1)
  verified = Verified(block=pending[:, None], logits=jnp.zeros((2, 1, cfg.vocab_size)),
                      hidden=jnp.zeros((1, 2, 1, cfg.d_model)), path=jnp.zeros((2, 1), jnp.int32),
                      n_accepted=jnp.zeros((2,), jnp.int32), next_token=jnp.full((2,), 11))
  got = drafter.update(dparams, state, after, verified)
  np.testing.assert_array_equal(drafter.lag(got, after), [int(max_lag > 0)] * 2)
  got = drafter.catch_up(dparams, got, after)
  np.testing.assert_array_equal(drafter.lag(got, after), [0, 0])
  want = drafter.init(dparams, after, cfg, 16)
  np.testing.assert_array_equal(got.lengths, want.lengths)
  for layer in range(cfg.n_layers):
    for row, n in enumerate(lengths.tolist()):  # slots < n: the history before the new pending
      np.testing.assert_allclose(got.k[layer][row, :, :n], want.k[layer][row, :, :n], atol=1e-5)
      np.testing.assert_allclose(got.v[layer][row, :, :n], want.v[layer][row, :, :n], atol=1e-5)


def _assert_caught_up(tiny, drafter, dparams, lazy, eager):
  """The final loop state lazy, its drafter caught up, holds eager's drafter cache at every
  real slot (and EAGLE's last feature, Hydra++'s heads' base)."""
  cfg, params = tiny
  view = TargetView(engine.decoding_params(params), lazy.cache, lazy.history, lazy.lengths)
  caught = drafter.catch_up(drafter.prepare(dparams, params, cfg), lazy.drafter, view)
  cache = {Eagle: "cache", Hydra: "prefix"}.get(type(drafter))  # a draft model's state is one
  got, want = (s if cache is None else getattr(s, cache) for s in (caught, eager.drafter))
  np.testing.assert_array_equal(got.lengths, want.lengths)
  for layer in range(len(want.k)):
    for row, n in enumerate(want.lengths.tolist()):
      np.testing.assert_allclose(got.k[layer][row, :, :n], want.k[layer][row, :, :n], atol=1e-5)
      np.testing.assert_allclose(got.v[layer][row, :, :n], want.v[layer][row, :, :n], atol=1e-5)
  if isinstance(drafter, Eagle):
    np.testing.assert_allclose(caught.feature, eager.drafter.feature, atol=1e-5)
  if isinstance(drafter, Hydra):
    np.testing.assert_allclose(caught.base, eager.drafter.base, atol=1e-5)


@pytest.mark.parametrize("make", [lambda cfg: Eagle(max_lag=3),
                                  lambda cfg: Hydra(2, prefix_attention=True, max_lag=3),
                                  lambda cfg: DraftModel(cfg, max_lag=3)],
                         ids=["eagle", "hydra++", "draft-model"])
def test_plain_steps_fed_in_blocks_leave_the_state_of_feeding_each(tiny, make):
  """Plain steps only, 11 of them: a drafter that feeds them in blocks of max_lag = 3 (the
  loop catching up after every third, the last two left lagging) and then catches up holds the
  drafter cache (and EAGLE's last feature, Hydra++'s base) of one that fed every step."""
  cfg, params = tiny
  drafter = make(cfg)
  dparams = (eagle_params(cfg, params, drafter) if isinstance(drafter, Eagle) else
             random_params(drafter, cfg) if isinstance(drafter, Hydra) else params)
  plain = goodput.forcing(0, 3)
  lazy, eager = (_loop(tiny, d, dparams, PROMPTS[:3], 12, plain)[0]
                 for d in (drafter, dataclasses.replace(drafter, max_lag=0)))
  np.testing.assert_array_equal(lazy.history, eager.history)
  view = TargetView(params, lazy.cache, lazy.history, lazy.lengths)
  np.testing.assert_array_equal(drafter.lag(lazy.drafter, view), [2, 2, 2])
  _assert_caught_up(tiny, drafter, dparams, lazy, eager)


def test_generated_tokens_follow_target():
  """The sampling law of the first three tokens through the goodput loop (t = 1, 6000 rows of
  one prompt): a step of two drafts, then a plain step."""
  target = llama.init_params(sampling_test.CFG, jax.random.key(1))
  draft = llama.init_params(sampling_test.CFG, jax.random.key(2))
  draft = {**draft, "embed": draft["embed"] * 3.0}
  sampling = SamplingConfig(temperature=1.0)
  exact = _target_laws(target, sampling)
  cfg, rows = sampling_test.CFG, sampling_test.ROWS
  # k = 2 first (optimism: 3 tokens for 2.0), then the measured acceptance makes a plain step
  # the better buy: one step of each.
  g = Goodput(decay=0.5)
  out = speculative_generate(target, cfg, [sampling_test.PROMPT] * rows, DraftModel(cfg),
                             SpecConfig(k=2, max_new_tokens=3, sampling=sampling, goodput=g,
                                        prompt_bucket=sampling_test.BUCKET),
                             drafter_params=draft, key=jax.random.key(0),
                             step_costs=(1.0, 1.9, 2.0))
  toks = np.array(out.tokens)
  for i in range(3):
    assert sampling_test._tv(toks[:, i], exact[i]) < sampling_test.BOUND, i
  assert out.k_steps[0] > 0 and out.k_steps[2] > 0, out.k_steps


def test_forced_length_in_a_shorter_run(tiny, tiny_reference):
  """Costs finite only at k: every step drafts k; new_tokens below max_new_tokens stops each
  row there, with the same tokens as the longer run's first ones."""
  for k in (0, 2):
    only = np.where(np.arange(4) == k, 1.0, INF)
    cfg, params = tiny
    out = speculative_generate(params, cfg, PROMPTS, PromptLookup(),
                               SpecConfig(k=3, max_new_tokens=NEW, goodput=Goodput()),
                               step_costs=only, new_tokens=5)
    assert out.k_steps.sum() == out.k_steps[k] > 0, out.k_steps
    assert out.k_changes == 0
    assert out.tokens == [list(t[:5]) for t in tiny_reference]
    np.testing.assert_array_equal(out.step_costs, only)


def test_calibrate_times_every_length_in_the_serving_loop(tiny):
  cfg, params = tiny
  other = llama.init_params(cfg, jax.random.key(7))
  spec = SpecConfig(k=2, max_new_tokens=8, goodput=Goodput(decay=0.8))
  costs, _ = calibrate(params, cfg, PROMPTS[:2], DraftModel(cfg), spec, other, new_tokens=4,
                       repeats=2)
  assert costs.shape == (3,) and (costs > 0).all() and np.isfinite(costs).all()
  assert list(costs) == sorted(costs)  # a longer draft is never timed cheaper
  # calibration compiled the loop that serves: decoding with its costs compiles nothing new
  compiled = spec_loop._cache_size()
  out = speculative_generate(params, cfg, PROMPTS[:2], DraftModel(cfg), spec, other,
                             step_costs=costs)
  assert spec_loop._cache_size() == compiled and out.k_steps.sum() > 0
  with pytest.raises(ValueError, match="repeats"):
    calibrate(params, cfg, PROMPTS[:2], DraftModel(cfg), SpecConfig(k=2), other, repeats=0)
  with pytest.raises(ValueError, match="new_tokens"):
    calibrate(params, cfg, PROMPTS[:2], DraftModel(cfg), SpecConfig(k=2), other, new_tokens=1)


def test_calibration_times_every_length_from_one_prefill(tiny, monkeypatch):
  """The warm-up's prefill and one timed one, whatever k and the rounds: every length's runs
  start from copies of it (a prefill each before: a calibration at batch 8 on a 2-core CPU took
  108 s, 49-51 s from one prefill). A loop with one step program runs each round from a copy
  too (the loop donates its state)."""
  cfg, params = tiny
  budgets, real = [], engine.start
  monkeypatch.setattr(engine, "start", lambda *a: budgets.append(int(a[-1])) or real(*a))
  spec = SpecConfig(k=3, max_new_tokens=8, goodput=Goodput())
  costs, _ = calibrate(params, cfg, PROMPTS[:2], PromptLookup(), spec, new_tokens=5, repeats=3)
  assert costs.shape == (4,) and np.isfinite(costs).all() and budgets == [2, 5]
  fixed = SpecConfig(k=2, max_new_tokens=8)
  times, _ = engine.step_seconds(params, cfg, PROMPTS[:2], fixed,
                              speculative.spec_program(params, cfg, PromptLookup(), fixed),
                              None, None, 4, repeats=2)
  assert times.shape == (2, 1) and (times > 0).all() and budgets == [2, 5, 2, 4]


def test_api_reuses_measured_costs(tiny, monkeypatch):
  """sx.speculate(goodput=True) calibrates and reports the costs; passing them back decodes
  the same tokens without timing anything again."""
  model = LoadedModel(*tiny, Bytes())
  run = lambda goodput: api.speculate(model, PROMPTS[:2], "prompt-lookup", k=3,
                                      max_new_tokens=12, goodput=goodput)
  first = run(True)
  assert first.step_costs.shape == (4,) and first.k_steps.sum() > 0
  monkeypatch.setattr(api, "calibrate", lambda *a, **kw: pytest.fail("calibrated again"))
  again = run(first.step_costs.tolist())
  assert again.tokens == first.tokens
  np.testing.assert_array_equal(again.step_costs, first.step_costs)
  with pytest.raises(ValueError, match="k=3 \\(4 numbers\\)"):
    run([1.0, 2.0])


def test_a_carried_estimate_starts_where_the_last_call_ended(tiny, tiny_reference):
  """A call from a fresh estimate tries its longest draft first (the optimistic prior); one
  started from that call's final counts knows the drafter is never kept and drafts nothing
  but its one-token probes. Output stays the target's."""
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, goodput=Goodput())
  run = lambda estimate: speculative_generate(params, cfg, PROMPTS[:2], Contrary(), spec,
                                              step_costs=COSTS, estimate=estimate)
  fresh = run(None)
  assert fresh.k_steps[3] >= 1, fresh.k_steps
  kept, reached = fresh.goodput_estimate
  assert kept.shape == reached.shape == (1, 3) and kept.sum() == 0 and reached[0, 0] > 0
  carried = run(fresh.goodput_estimate)
  assert carried.tokens == [list(t) for t in tiny_reference[:2]]
  assert carried.k_steps[2:].sum() == 0 and carried.k_steps[0] > fresh.k_steps[0], (
      fresh.k_steps, carried.k_steps)


def test_a_calibrated_call_starts_from_what_calibration_saw(tiny, tiny_reference):
  """Calibration's longest run (k = 3, forced) checks every draft of a drafter never kept: its
  counts hold no kept draft and as many first positions checked as that run's row-steps, and
  a call started from them (under fixed costs) drafts nothing but its one-draft probes where
  one from the prior tries k = 3 first. Goodput(start="prior") returns no estimate. Output
  stays the target's."""
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, goodput=Goodput(decay=1 - 1e-6))
  _, (kept, reached) = calibrate(params, cfg, PROMPTS[:2], Contrary(), spec, new_tokens=6,
                                 repeats=1)
  # never kept: each step checks position 1 only, one token a row, 5 steps after the prefill's
  np.testing.assert_allclose(reached, [[10, 0, 0]], rtol=1e-4)
  assert kept.sum() == 0
  run = lambda estimate: speculative_generate(params, cfg, PROMPTS[:2], Contrary(), spec,
                                              step_costs=COSTS, estimate=estimate)
  fresh, started = run(None), run((kept, reached))
  assert fresh.k_steps[3] >= 1 and started.k_steps[2:].sum() == 0, (fresh.k_steps,
                                                                    started.k_steps)
  assert started.tokens == [list(t) for t in tiny_reference[:2]]
  prior = dataclasses.replace(spec, goodput=Goodput(start="prior"))
  assert calibrate(params, cfg, PROMPTS[:2], Contrary(), prior, new_tokens=6,
                   repeats=1).estimate is None


@dataclasses.dataclass(frozen=True)
class Opening(Drafter):
  """Drafts the target's own greedy token first (its later drafts one past it) while a row has
  emitted fewer than `until` tokens, and one past it after: a drafter kept only at the opening
  of an answer."""
  name: ClassVar[str] = "opening"
  summary: ClassVar[str] = "test drafter"
  until: int = 12

  def init(self, params, view: TargetView, config, max_len):
    return view.lengths - 1  # [b] the prompt's length: emitted tokens = lengths - this

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    logits, _, _ = llama.forward(view.params, config, view.pending[:, None],
                                 (view.lengths - 1)[:, None], view.cache)
    own = jnp.argmax(logits[:, 0], -1)  # [b]
    first = jnp.where(view.lengths - state < self.until, own, own + 1)
    tokens = (first[:, None] + jnp.minimum(jnp.arange(k), 1)) % config.vocab_size  # [b, k]
    return Draft(tokens.astype(jnp.int32), None), state, view


def test_answer_bins_carry_what_the_opening_of_an_answer_keeps(tiny, tiny_reference):
  """Opening's first draft is kept for an answer's first 12 tokens only. Carried from call to
  call, one estimate for the whole answer starts the next call from the end of the last, where
  nothing was kept, and takes plain steps through the opening; split at 12 tokens
  (answer_bins), the opening's own estimate remembers its drafts were kept and drafts there
  from the first step. Output stays the target's."""
  cfg, params = tiny
  kept = {}
  for bins in ((), (12,)):
    spec = SpecConfig(k=3, max_new_tokens=40, goodput=Goodput(answer_bins=bins, decay=0.6))
    run = lambda estimate: speculative_generate(params, cfg, PROMPTS[1:2], Opening(), spec,
                                                step_costs=COSTS, estimate=estimate)
    first = run(None)
    assert first.goodput_estimate[0].shape == (len(bins) + 1, 3)
    second = run(first.goodput_estimate)
    assert second.tokens[0][:NEW] == list(tiny_reference[1])
    kept[bins] = (int(first.accepted_at[0]), int(second.accepted_at[0]))
  assert kept[(12,)][1] >= 4 and kept[()][1] <= 1, kept


@pytest.mark.parametrize("estimate,match", [
    ((np.zeros((1, 2)), np.zeros((1, 2))), "shape \\(1, 3\\).*got \\(1, 2\\)"),
    ((np.ones((1, 3)), np.zeros((1, 3))), "0 <= kept <= reached, got kept \\[\\[1.0"),
    ((np.zeros((1, 3)), np.full((1, 3), np.nan)), "finite counts"),
])
def test_bad_estimates_name_the_value(tiny, estimate, match):
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=4, goodput=Goodput())
  with pytest.raises(ValueError, match=match):
    speculative_generate(params, cfg, PROMPTS[:1], Contrary(), spec, step_costs=COSTS,
                         estimate=estimate)
  with pytest.raises(ValueError, match="estimate goes with spec.goodput; .* fixed k=3"):
    speculative_generate(params, cfg, PROMPTS[:1], Contrary(), SpecConfig(k=3),
                         estimate=estimate)


def test_warm_up_runs_every_length_on_the_served_executable(tiny, monkeypatch):
  """The warm-up runs one step from a state forced to each length (a segment's first execution
  is slow on XLA:CPU), each with buffers of its own and the served state's placement, so the
  timed run reuses the warm-up's executable: one compile for the whole call."""
  cfg, params = tiny
  # a budget no other test uses: a loop of its own, compiled in this call
  spec = SpecConfig(k=3, max_new_tokens=NEW + 5, goodput=Goodput())
  seen, real = [], speculative.warm_states

  def record(state):
    states = list(real(state))  # the copies, made at once here
    meta = lambda s: [(x.sharding, x.committed, x.unsafe_buffer_pointer())
                      for x in jax.tree.leaves(s.replace(key=None))]
    seen.append((None if state.goodput is None else
                 [(int(goodput.choose(spec.goodput, s.goodput)), int(s.goodput.choice))
                  for s in states],
                 meta(state), [meta(s) for s in states]))
    return states

  monkeypatch.setattr(speculative, "warm_states", record)
  compiled = spec_loop._cache_size()
  out = speculative_generate(params, cfg, PROMPTS[:1], PromptLookup(), spec, warmup=True,
                             step_costs=COSTS)
  assert spec_loop._cache_size() == compiled + 1 and out.compile_s > 0
  (choices, served, warm), = seen
  assert choices == [(0, 0), (1, 1), (2, 2), (3, 3)]  # each state holds the choice it forces
  for leaves in warm:
    assert [m[:2] for m in leaves] == [m[:2] for m in served]  # placement, committed or not
  pointers = [m[2] for leaves in [served, *warm] for m in leaves]
  assert len(set(pointers)) == len(pointers)  # no buffer shared: each state is donated
  seen.clear()  # a fixed-k loop: the served state itself, one step
  speculative_generate(params, cfg, PROMPTS[:1], PromptLookup(),
                       SpecConfig(k=3, max_new_tokens=NEW), warmup=True)
  (choices, served, warm), = seen
  assert choices is None and warm == [served]
