"""PEARL (Liu et al. 2025, "Parallel Speculative Decoding with Adaptive Draft Length"): the draft
model drafts while the target verifies, so a step costs the longer of the two, not their sum.

Each step the target runs one forward over a window of k tokens while the draft model drafts k
tokens e_1..e_k after the window's end, as if the target kept every draft in it. The two read
nothing of each other: on two devices they are two jitted programs dispatched at once (JAX's
async dispatch overlaps them); on one device they are one program.

- pre-verify (a row with no drafts ready): the window is the pending token (in a batch where
  other rows post-verify, the rest of the window is ignored; on two devices a step where no row
  has drafts ready forwards the pending token alone), whose logits check e_1 as soon as it is
  drafted; a rejected first draft costs no verify forward of its own.
- post-verify (a row with k - 1 drafts w ready from the step before): the window is
  [pending, w_1..w_{k-1}]. Its logits check w, then e_1 (drafted after w_{k-1}: the window's
  last logits are the target's law there).

When all drafts checked are kept, the last kept draft becomes the pending token and e_2..e_k the
ready drafts: drafting went on while the target verified (the draft length adapts: it runs on
until a rejection). At a rejection the target's correction is the pending token and the drafts
made past it are dropped. A step emits the kept drafts, plus the correction at a rejection (no
bonus token: the window's last logits check e_1 instead). Lossless as chain rejection is: every
draft is checked in order against the target's law at its own context, and was drawn before any
check that selects it (ready drafts were drawn given e_1 before e_1 was checked, as a chain's
later drafts are given its earlier ones).

The draft model (drafters/draft_model.py, a chain) keeps its own cache: it holds every history
token but the pending one, plus the ready drafts but the last, whose slots are overwritten when
the target's tokens differ.

Dims: b batch, k drafts per step (the window), v vocab.
"""
from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.types import TargetView
from speculax.decode import engine
from speculax.decode.config import SpecConfig
from speculax.decode.metrics import DecodeOutput
from speculax.decode.speculative import begin, emit
from speculax.drafters.chain import draft_chain
from speculax.drafters.draft_model import DraftModel
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache
from speculax.verifiers.chain import emitted_tokens, verify_chain


@flax.struct.dataclass
class PearlState:
  cache: KVCache  # target cache: every history token but the pending last one
  history: jax.Array  # [b, S] int32 prompt, then generated tokens
  lengths: jax.Array  # [b] int32 valid tokens in history
  n_out: jax.Array  # [b] int32 generated tokens
  done: jax.Array  # [b] bool
  ready: jax.Array  # [b, k - 1] int32 drafts after the pending token, not yet checked
  ready_q: jax.Array | None  # [b, k - 1, v] their law (None when greedy)
  n_ready: jax.Array  # [b] int32 0 (pre-verify) or k - 1 (post-verify)
  key: jax.Array
  forwards: jax.Array  # [] int32 target forwards, prefill included
  row_steps: jax.Array  # [] int32 steps summed over active sequences
  post_steps: jax.Array  # [] int32 of those, steps in post-verify
  step_tokens: jax.Array  # [] int32 tokens those steps emitted
  accepted_at: jax.Array  # [k] int32 active sequences whose checked draft i was kept
  drafted: jax.Array  # [] int32 drafts the target checked, summed over active sequences
  budget: jax.Array  # [] int32 the most new tokens a row makes in this run
  drafter: KVCache | None = None  # the draft model's cache (apart while on another device)


def draft_inputs(s: PearlState):
  """What the draft model needs of the loop state: the token it has not fed [b] (the last
  ready draft, or the pending token), its cache length [b] and its key."""
  b = s.history.shape[0]
  pending = s.history[jnp.arange(b), s.lengths - 1]
  post = s.n_ready > 0
  last = jnp.where(post, s.ready[:, -1], pending) if s.ready.shape[1] else pending
  return last, s.lengths - 1 + s.n_ready, jax.random.split(s.key, 3)[1]


def draft(dparams, drafter: DraftModel, spec: SpecConfig, cache: KVCache, last, length, key):
  """k drafts after `last` from a draft cache holding `length` [b] tokens before it ->
  (tokens [b, k], q [b, k, v] or None, cache)."""
  output = drafter.output(dparams, None, drafter.config)
  tokens, q, _, cache = draft_chain(dparams, drafter.config, cache.with_lengths(length), last,
                                    key, spec.k, spec.sampling, output=output)
  return tokens, q, cache


def target_window(params, config: LlamaConfig, cache: KVCache, s: PearlState):
  """The target's forward over [pending, ready drafts] into its cache (s.cache is not read)
  -> (logits [b, k, v], cache)."""
  b = s.history.shape[0]
  window = jnp.concatenate([s.history[jnp.arange(b), s.lengths - 1][:, None], s.ready], 1)
  positions = (s.lengths - 1)[:, None] + jnp.arange(window.shape[1])[None]
  logits, _, cache = llama.forward(params, config, window, positions, cache)
  return logits, cache


def verify(spec: SpecConfig, s: PearlState, logits, tokens, q) -> PearlState:
  """Checks the ready drafts and e_1 = tokens[:, 0] against the window's logits [b, k, v], or
  [b, 1, v] when no row has drafts ready (s holds the cache the window's forward wrote), and
  advances every row."""
  b, k = tokens.shape
  key, _, k_verify = jax.random.split(s.key, 3)
  post = s.n_ready > 0  # [b]
  first = lambda x: x[:, :1]
  cand = jnp.where(post[:, None], jnp.concatenate([s.ready, first(tokens)], 1),
                   jnp.pad(first(tokens), ((0, 0), (0, k - 1))))  # [b, k] drafts to check
  cand_q = None if q is None else jnp.where(
      post[:, None, None], jnp.concatenate([s.ready_q, first(q)], 1),
      jnp.pad(first(q), ((0, 0), (0, k - 1), (0, 0))))
  length = s.n_ready + 1  # [b] drafts checked
  # verify_chain reads k + 1 columns: one more for a bonus token (all kept, there is none to
  # emit), and a pending-token window's missing ones (no row checks past its first).
  pad = jnp.repeat(logits[:, -1:], k + 1 - logits.shape[1], 1)
  n_acc, nxt = verify_chain(k_verify, jnp.concatenate([logits, pad], 1), cand, cand_q,
                            spec.sampling, length)
  all_kept = n_acc == length
  out = emitted_tokens(cand, n_acc, nxt)  # [b, k + 1]
  active = ~s.done
  history, lengths, n_emit, hit_eos = emit(out, n_acc + ~all_kept, s, spec.eos_ids)
  n_out = s.n_out + n_emit
  kept = jnp.arange(k)[None] < jnp.minimum(n_acc, n_emit)[:, None]  # [b, k]
  return s.replace(
      cache=s.cache.with_lengths(lengths - 1), history=history, lengths=lengths, n_out=n_out,
      done=s.done | (active & hit_eos) | (n_out >= s.budget),
      ready=tokens[:, 1:], ready_q=None if q is None else q[:, 1:],
      n_ready=jnp.where(active & all_kept, k - 1, 0).astype(jnp.int32), key=key,
      forwards=s.forwards + 1, row_steps=s.row_steps + active.sum(),
      post_steps=s.post_steps + (active & post).sum(), step_tokens=s.step_tokens + n_emit.sum(),
      accepted_at=s.accepted_at + kept.sum(0), drafted=s.drafted + jnp.where(active, length, 0).sum())


@functools.partial(jax.jit, static_argnames=("config", "drafter"), donate_argnames=("state",))
def pearl_loop(params, dparams, config: LlamaConfig, spec: SpecConfig, drafter: DraftModel,
               state: PearlState, watch: jax.Array) -> PearlState:
  """One device: each step's drafting and window forward in one program, until every row is
  done or a watched one [b] bool is."""
  def step(s):
    tokens, q, dcache = draft(dparams, drafter, spec, s.drafter, *draft_inputs(s))
    logits, cache = target_window(params, config, s.cache, s)
    return verify(spec, s.replace(cache=cache, drafter=dcache), logits, tokens, q)

  return jax.lax.while_loop(lambda s: engine.running(s.done, watch), step, state)


_draft_inputs = jax.jit(draft_inputs)
_draft = jax.jit(draft, static_argnames=("drafter",), donate_argnames=("cache",))
_target_window = jax.jit(target_window, static_argnames=("config",), donate_argnames=("cache",))
_verify = jax.jit(verify, donate_argnames=("s",))


def two_device_loop(params, dparams, config: LlamaConfig, spec: SpecConfig,
                    drafter: DraftModel, state: PearlState, watch: jax.Array,
                    draft_device: jax.Device) -> PearlState:
  """The same steps with the draft model on draft_device (dparams already there) and the target
  where its params are: each step dispatches the drafting, then the window's forward, and JAX
  runs them at once. After each step the host reads whether every row is done and whether any
  has drafts ready: when none has, the window is the pending token alone (pre-verify's own
  forward, about a plain step, where the k-token window costs ~1.6 of one on a 2-core CPU)."""
  # Committed from the first step on, as every step's outputs are: one compiled program each.
  target_device = next(iter(state.lengths.devices()))
  s, dcache = jax.device_put(state.replace(drafter=None), target_device), state.drafter
  # The config's sampling values placed once on each side, not sent from the host every step.
  draft_spec, target_spec = (jax.device_put(spec, d) for d in (draft_device, target_device))
  while True:
    going, post = jax.device_get((engine.running(s.done, watch), jnp.any(s.n_ready > 0)))
    if not going:
      break
    inputs = jax.device_put(_draft_inputs(s), draft_device)
    tokens, q, dcache = _draft(dparams, drafter, draft_spec, dcache, *inputs)
    window = s.replace(cache=None) if post else s.replace(cache=None, ready=s.ready[:, :0])
    logits, cache = _target_window(params, config, s.cache, window)
    # Committed to the target's device, so that the check runs there.
    tokens, q = jax.device_put((tokens, q), target_device)
    s = _verify(target_spec, s.replace(cache=cache), logits, tokens, q)
  return s.replace(drafter=dcache)


def warm_states(state: PearlState) -> list[PearlState]:
  """The two-device loop's warm-up: one step from the state as it is (no drafts ready: the
  window is the pending token alone) and one from a copy with every row's drafts ready (the
  k-token window), so neither window program compiles, or first runs, in the timed run."""
  post = state.replace(n_ready=jnp.full_like(state.n_ready, state.ready.shape[1]))
  return [state, jax.tree.map(jnp.copy, post)]


@functools.partial(jax.jit, static_argnames=("config", "max_len"))
def _start(config, spec, tokens, lengths, logits, cache, key, max_len, budget) -> PearlState:
  """The loop state after the prefill: no drafts ready (the first step pre-verifies)."""
  key, history, lengths, n_out, done = begin(key, tokens, lengths, logits, spec, max_len, budget)
  b, k = tokens.shape[0], spec.k
  zero = jnp.zeros((), jnp.int32)
  return PearlState(
      cache=cache, history=history, lengths=lengths, n_out=n_out, done=done,
      ready=jnp.zeros((b, k - 1), jnp.int32),
      ready_q=None if spec.sampling.greedy else jnp.zeros((b, k - 1, config.vocab_size)),
      n_ready=jnp.zeros((b,), jnp.int32), key=key, forwards=jnp.ones((), jnp.int32),
      row_steps=zero, post_steps=zero, step_tokens=zero,
      accepted_at=jnp.zeros((k,), jnp.int32), drafted=zero, budget=budget)


@functools.partial(jax.jit, static_argnames=("drafter", "max_len"))
def _draft_cache(dparams, drafter: DraftModel, history, lengths, max_len: int) -> KVCache:
  """The draft model's prefill of the history [b, S] (where dparams are)."""
  return drafter.init(dparams, TargetView(None, None, history, lengths), drafter.config, max_len)


FORMS = ("one-device", "two-device")


def draft_device(form: str) -> jax.Device | None:
  """The draft model's device for a form of FORMS: None (the target's) or the second device."""
  if form not in FORMS:
    raise ValueError(f"PEARL form must be one of {FORMS}, got {form!r}")
  if form == "one-device":
    return None
  devices = jax.devices()
  if len(devices) < 2:
    raise ValueError(f"PEARL two-device needs a second device, jax.devices() has {devices}; on "
                     f"CPU set SPECULAX_CPU_DEVICES=2 (or jax_num_cpu_devices) before JAX starts")
  return devices[1]


def pearl_generate(params, config: LlamaConfig, prompts, drafter: DraftModel,
                   spec: SpecConfig = SpecConfig(), drafter_params=None,
                   key: jax.Array | None = None, draft_device: jax.Device | None = None,
                   warmup: bool = False, new_tokens: int | None = None) -> DecodeOutput:
  """PEARL decoding of a batch of prompts (lists of token ids) with a draft model drafting
  spec.k tokens per step (its window).

  draft_device: where the draft model runs, apart from the target (on jax.devices()[0]), each
  step's two programs at once; None: one program a step on the target's device.
  warmup, new_tokens: as for speculative_generate.
  """
  if not isinstance(drafter, DraftModel) or drafter.tree is not None:
    raise ValueError(f"PEARL drafts with a separate draft model, as a chain (the draft-model "
                     f"drafter without a tree); got {drafter!r}")
  if drafter.exit_threshold is not None:
    raise ValueError(f"PEARL drafts k tokens while the target verifies; early exit "
                     f"(exit_threshold={drafter.exit_threshold}) does not apply")
  if spec.goodput is not None or spec.lossy is not None:
    raise ValueError("PEARL runs lossless chain rejection with its own adaptive length: drop "
                     f"goodput={spec.goodput} and lossy={spec.lossy}")
  target_device = jax.devices()[0]
  if draft_device is not None and draft_device == target_device:
    raise ValueError(f"draft_device {draft_device} is the target's device; pass another one "
                     f"(jax.devices()[1:]) or None for the one-device form")
  drafter.check(config, drafter_params, spec.k)
  dparams = drafter.prepare(drafter_params, params, config)
  if draft_device is None:
    loop = lambda params, state, watch: pearl_loop(params, dparams, config, spec, drafter, state,
                                                   watch)
  else:
    dparams = jax.device_put(dparams, draft_device)
    loop = lambda params, state, watch: two_device_loop(params, dparams, config, spec, drafter,
                                                        state, watch, draft_device)
  def start(params, tokens, lengths, logits, hidden, cache, key, max_len, budget):
    s = _start(config, spec, tokens, lengths, logits, cache, key, max_len, budget)
    history, lengths = jax.device_put((s.history, s.lengths), draft_device)
    return s.replace(drafter=_draft_cache(dparams, drafter, history, lengths, max_len))

  # Room past the new tokens: the window, and the draft cache's k drafts past the ready ones.
  program = engine.Program(
      extra_slots=2 * spec.k + 1, hidden_layers=(), start=start, loop=loop,
      new_tokens=lambda s: (s.history, s.lengths - s.n_out, s.n_out),
      warm_states=engine.one_state if draft_device is None else warm_states)
  s, out = engine.run(params, config, prompts, spec, program, key, None, warmup, new_tokens)
  out.row_steps, out.step_tokens, out.drafted = int(s.row_steps), int(s.step_tokens), int(s.drafted)
  out.accepted_at, out.post_steps = np.asarray(s.accepted_at), int(s.post_steps)
  return out
