"""A serving loop over a stream of requests: batches, speculative decoding, and a drafter that
may learn from what it serves.

`serve` takes requests (token-id lists) in batches of `batch_size` and decodes each batch with
`speculative_generate`. The drafter's state between batches is one of:
  - frozen: the same drafter params every batch;
  - online (Online Speculative Decoding): an `OnlineLearner` gets every served request with the
    target laws verification recorded on it (`decode.recording.Recording`) and, when due, updates
    the drafter params the next batches use;
  - hot (Token Recycling, the train-free counterpart): the drafter's final state of one batch is
    the next batch's params (`drafter.hot_start`).
With spec.goodput (SmartSpec's serving setting) each step drafts the k' in 0..k that promises
the most tokens per second (decode/goodput.py), weighing step costs calibrated on the first
batch of each size and, with carry_estimate, an acceptance estimate carried from batch to batch
(a batch then does not open with the optimistic prior's long draft; measured 2026-11-29 from
-6% to +5% against each batch from the prior, README, so it is not the default).
With continuous=True the stream is decoded `batch_size` rows at a time, each finished request's
row refilled with the next (decode/continuous.py): no row rides along finished, the estimate
and a hot drafter's state carry from request to request in the one loop state, and a learner's
rounds run between requests, the rows after a round drafting with its params.
A request that cannot be served (too long for the cache, ids outside the vocabulary) is answered
with its error and the rest of the stream goes on. Yields one `BatchReport` per batch.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import jax
import numpy as np

from speculax.core import fields
from speculax.decode import continuous
from speculax.decode.calibrate import calibrate
from speculax.decode.config import SpecConfig
from speculax.decode.inputs import check_prompt, check_room, compiled_shape
from speculax.decode.speculative import block_shape, spec_program, speculative_generate
from speculax.drafters.draft_model import DraftModel
from speculax.serve.online import OnlineLearner, served_row
from speculax.serve.recording import Recording


@dataclasses.dataclass
class Served:
  index: int  # position in the stream
  tokens: list[int] | None  # new tokens, or None when the request was refused
  error: str | None = None


@dataclasses.dataclass
class BatchReport:
  served: list[Served]  # this batch's requests, and any refused since the last batch
  tau: float  # tokens per target forward per sequence
  acceptance: float  # accepted drafts / drafts the steps could have kept: (tau - 1) / depth
  accepted_at: np.ndarray  # [depth] fraction of steps whose draft i was accepted
  new_tokens: int
  seconds: float  # prefill + decode, compile excluded
  update: dict | None = None  # the learner's round after this batch, if one ran
  k_steps: np.ndarray | None = None  # goodput only: [k + 1] loop steps that drafted 0..k

  @property
  def tokens_per_s(self) -> float:
    return self.new_tokens / self.seconds


def _refusal(index: int, prompt, config, spec: SpecConfig, extra: int) -> Served | None:
  """Request `index` answered with why it cannot be served, or None when it can be."""
  try:
    check_prompt(prompt, config.vocab_size, "its prompt")
    check_room(len(prompt), spec.max_new_tokens, config.max_seq_len, extra=extra)
  except ValueError as e:
    return Served(index, None, f"request {index} refused: {e}")
  return None


def serve(params, config, requests: Iterable[Sequence[int]], drafter, spec: SpecConfig,
          drafter_params=None, batch_size: int = 4, learner: OnlineLearner | None = None,
          key: jax.Array | None = None, step_costs=None, carry_estimate: bool = False,
          continuous: bool = False) -> Iterator[BatchReport]:
  """Decodes `requests` in arrival order, `batch_size` at a time (the last batch may be smaller).

  learner: adapt the drafter online (its params replace drafter_params); the drafter must be
  the draft model whose params the learner trains.
  step_costs: with spec.goodput, [k + 1] seconds of a step drafting 0..k for every batch
  (decode/calibrate.py); None: calibrated on the first batch of each size, and each batch of
  that size starts from the acceptance its calibration saw (Goodput.start).
  carry_estimate: with spec.goodput, each batch starts from the acceptance estimate the last
  one ended with (False: from calibration's, or the prior where step_costs were given).
  continuous: refill each finished row with the next request (continuous batching). The stream
  is read whole first (its longest prompt sizes the cache); a report covers each `batch_size`
  requests in the order they finished (the refused ones in the first), its tau and acceptance
  the loop steps since the report before (every row's), its seconds the stream's time since
  then (a learner's rounds apart); step costs are calibrated on the first `batch_size` requests.
  """
  fields.check("batch_size", batch_size, int, ge=1)
  if continuous and carry_estimate:
    raise ValueError("continuous batching serves the stream from one loop state, whose goodput "
                     "estimate carries from request to request already; carry_estimate is for "
                     "fixed batches")
  hot = drafter.hot_start
  if learner is not None and hot:
    raise ValueError(f"{type(drafter).__name__} adapts by its own state (hot start); it has no "
                     "params for an online learner to train")
  if learner is not None and not (isinstance(drafter, DraftModel)
                                  and drafter.config == learner.config):
    raise ValueError(f"the online learner trains a draft model of config {learner.config}; "
                     f"the drafter {type(drafter).__name__} is not that model")
  if learner is not None:
    drafter = Recording(drafter, learner.online.top_k, learner.online.all_positions)
  extra, depth = block_shape(drafter, spec)
  key = jax.random.key(0) if key is None else key
  if continuous:
    yield from _continuous(params, config, requests, drafter, spec, drafter_params, batch_size,
                           learner, key, step_costs, extra, depth)
    return
  compiled = set()
  calibrated, estimate = {}, None  # goodput: step costs per batch size, the carried estimate
  stream = iter(enumerate(requests))
  refused: list[Served] = []
  while True:
    batch = []
    for index, prompt in stream:
      refusal = _refusal(index, prompt, config, spec, extra + 1)
      if refusal is None:
        batch.append((index, list(prompt)))
      else:
        refused.append(refusal)
      if len(batch) == batch_size:
        break
    if not batch:
      break
    prompts = [p for _, p in batch]
    shape = compiled_shape(prompts, spec.prompt_bucket)
    key, sub = jax.random.split(key)
    dparams = drafter_params if learner is None else learner.params
    if spec.goodput is not None and step_costs is None and len(prompts) not in calibrated:
      calibrated[len(prompts)] = calibrate(params, config, prompts, drafter, spec, dparams,
                                           key=sub)
    cal = calibrated.get(len(prompts))  # None: the costs given, no estimate beside them
    out = speculative_generate(
        params, config, prompts, drafter, spec, drafter_params=dparams, key=sub,
        warmup=shape not in compiled, step_costs=step_costs if cal is None else cal.step_costs,
        estimate=estimate if estimate is not None or cal is None else cal.estimate)
    compiled.add(shape)
    estimate = out.goodput_estimate if carry_estimate else None
    if hot:
      drafter_params = out.drafter_state
    update = None
    if learner is not None:
      rec = out.drafter_state  # one device-to-host copy per buffer, then rows on the host
      ids, logprobs, recorded = (np.asarray(x) for x in (rec.ids, rec.logprobs, rec.recorded))
      for i, (prompt, new) in enumerate(zip(prompts, out.tokens)):
        learner.observe(served_row(prompt, new, ids[i], logprobs[i], recorded[i]))
      if learner.due():
        update = learner.update()
    served = refused + [Served(i, t) for (i, _), t in zip(batch, out.tokens)]
    refused = []
    yield BatchReport(served=served, tau=out.tau, acceptance=(out.tau - 1) / depth,
                      accepted_at=out.acceptance, new_tokens=out.new_tokens, seconds=out.wall_s,
                      update=update, k_steps=out.k_steps)
  if refused:
    yield _refused(refused, depth)


def _refused(refused: list[Served], depth: int) -> BatchReport:
  """The report of requests refused after the last served one."""
  return BatchReport(served=refused, tau=float("nan"), acceptance=float("nan"),
                     accepted_at=np.zeros(depth), new_tokens=0, seconds=float("nan"))


def _counts(state) -> tuple[int, int, np.ndarray, np.ndarray | None]:
  """The loop state's running counts: (row steps, tokens they emitted, [depth] drafts kept at
  each position, [k + 1] goodput steps drafting 0..k or None)."""
  return (int(state.row_steps), int(state.step_tokens), np.asarray(state.accepted_at),
          None if state.goodput is None else np.asarray(state.goodput.steps))


def _continuous(params, config, requests, drafter, spec: SpecConfig, drafter_params,
                batch_size: int, learner: OnlineLearner | None, key: jax.Array,
                step_costs, extra: int, depth: int) -> Iterator[BatchReport]:
  """serve(continuous=True): one `continuous.Stream` over every request served; extra, depth:
  the drafter's block_shape."""
  accepted, refused = [], []
  for index, prompt in enumerate(requests):
    refusal = _refusal(index, prompt, config, spec, extra + 1)
    if refusal is None:
      accepted.append((index, list(prompt)))
    else:
      refused.append(refusal)
  if not accepted:
    if refused:
      yield _refused(refused, depth)
    return
  prompts = [p for _, p in accepted]
  dparams = drafter_params if learner is None else learner.params
  key, sub = jax.random.split(key)
  estimate = None
  if spec.goodput is not None and step_costs is None:
    step_costs, estimate = calibrate(params, config, prompts[:batch_size], drafter, spec, dparams,
                                     key=sub)
  program = lambda dparams: spec_program(params, config, drafter, spec, dparams, step_costs,
                                         estimate)
  stream = continuous.Stream(params, config, prompts, spec, program(dparams), batch_size, key,
                             warmup=True)
  no_steps = None if spec.goodput is None else np.zeros(spec.k + 1, np.int64)
  window, before, seconds = [], (0, 0, np.zeros(depth), no_steps), 0.0
  for n, f in enumerate(stream, 1):
    window.append(Served(accepted[f.index][0], f.tokens))
    if learner is not None:  # the row's recorded laws, read before the stream refills it
      rec = f.state.drafter
      ids, logprobs, recorded = (np.asarray(x[f.row]) for x in (rec.ids, rec.logprobs,
                                                                 rec.recorded))
      learner.observe(served_row(prompts[f.index], f.tokens, ids, logprobs, recorded))
    if len(window) < batch_size and n < len(prompts):
      continue
    now = _counts(f.state)
    steps, tokens = now[0] - before[0], now[1] - before[1]
    update = None
    if learner is not None and learner.due():
      update = learner.update()
      stream.program = program(learner.params)
    yield BatchReport(served=refused + window, tau=tokens / steps if steps else 1.0,
                      acceptance=(tokens / steps - 1) / depth if steps else 0.0,
                      accepted_at=(now[2] - before[2]) / max(steps, 1),
                      new_tokens=sum(len(s.tokens) for s in window), seconds=f.seconds - seconds,
                      update=update, k_steps=None if now[3] is None else now[3] - before[3])
    window, refused, before, seconds = [], [], now, f.seconds
