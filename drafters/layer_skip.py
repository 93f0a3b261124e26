"""Self-speculation by layer skipping: the target with a subset of its layers drafts for itself.

The drafter shares the target's weights and its per-layer cache: the kept layers read the
target's K/V for the verified prefix (an approximation that only costs acceptance, never
correctness), and write their draft K/V into the slots the verify forward overwrites next.

On the fly (SWIFT-style): with `alternatives`, the drafter holds several keep sets and picks,
at every step, the one with the highest layer_skip_search.estimated_speedup (tau(a, k) /
(verify_cost + k x the set's share of layers)) from the acceptance it has measured for each on
the tokens being served: decayed counts of the drafts the verifier kept and the rejections it
saw, with an optimistic prior (every set starts at acceptance 1, so each is tried until its own
measurements pull it below the best; counts decay every step, so a set left aside drifts back
up and is tried again on the text at hand).
The choice is one `lax.switch` inside the jitted loop: only the chosen set's layers run.

In lower precision (`draft_dtype`, QSpec-style): the drafts read a copy of the kept layers and
the output layer in that dtype, made once per call (`prepare`), while the verify forward reads
the target's own weights, so output stays the target's. A one-token pass reads half the bytes
in bfloat16 (on a 2-core CPU a SmolLM2 forward 20.2 ms against 25.1 in float32), a quarter in
int8 (each table row scaled to 127, models/tables.Q8; norms stay float32), and the drafts part
from the float32 model's only where rounding tips a near tie.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.fields import field
from speculax.core.trees import Tree
from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters import low_precision
from speculax.drafters.base import Drafter
from speculax.drafters.chain import draft_chain
from speculax.drafters.layer_skip_search import estimated_speedup, search_skip_set
from speculax.drafters.tree_draft import draft_tree
from speculax.models import llama
from speculax.models.kvcache import KVCache

DECAY = 0.95  # weight of older measurements per step (recent context counts most)
PRIOR = 2.0  # pseudo-drafts, all kept, behind every set's estimate (optimism: try each)


@flax.struct.dataclass
class SkipState:
  """Measured acceptance of each keep set ([c]: keep, then alternatives) and the last choice."""
  kept: jax.Array  # [c] float32 decayed count of drafts the verifier kept
  checked: jax.Array  # [c] float32 decayed count of drafts kept plus rejections seen
  steps: jax.Array  # [c] int32 steps each set drafted
  choice: jax.Array  # [] int32 the set that drafted the last step
  length: jax.Array  # [b] int32 drafts that step proposed per row
  start: jax.Array  # [b] int32 history lengths before that step (rows that did not grow are done)

  def acceptance(self) -> jax.Array:  # [c] estimated per-draft acceptance
    return (self.kept + PRIOR) / (self.checked + PRIOR)


@dataclasses.dataclass(frozen=True)
class LayerSkip(Drafter):
  name: ClassVar[str] = "layer-skip"
  summary: ClassVar[str] = ("the target with some layers skipped drafts for itself (train-free; "
                            "chain or tree; SWIFT-style switching among skip sets on the fly)")
  keep: tuple[int, ...] = field(ge=0)  # indices of the target layers the drafter runs, ascending
  tree: Tree | None = None  # None: a chain of k drafts
  vocab_trim: int = field(0, ge=0)  # VocabTrim: the N most frequent target tokens (0: all)
  exit_threshold: float | None = field(None, gt=0, lt=1)  # Kangaroo early exit (chains)
  # Other keep sets to switch among on the fly by measured acceptance per draft cost (SWIFT).
  alternatives: tuple[tuple[int, ...], ...] = field((), ge=0)
  # A verify step's cost in one-token target steps, for choosing among the sets: 1 where a
  # forward is memory-bound (a GPU); more where a k + 1 token block costs compute (1.70 for 6
  # tokens on a 2-core CPU; research.common.verify_cost measures it).
  verify_cost: float = field(1.0, gt=0)
  # The dtype of the weights the drafts read ("bfloat16", "int8": a copy of the kept layers and
  # the output layer, made in `prepare`; None: the target's own weights).
  draft_dtype: low_precision.DraftDtype | None = None

  @property
  def keeps_own_drafts(self) -> bool:
    """With alternatives, `update` counts the kept drafts as the drafting set's."""
    return bool(self.alternatives)

  @classmethod
  def skipping(cls, n_layers: int, skip, tree: Tree | None = None, alternatives=(),
               draft_dtype: low_precision.DraftDtype | None = None) -> LayerSkip:
    """The drafter that runs every layer except those in `skip` (and may switch to running every
    layer except those of one of the `alternatives` skip sets)."""
    return cls(_keep(n_layers, skip), tree, draft_dtype=draft_dtype,
               alternatives=tuple(_keep(n_layers, other) for other in alternatives))

  @classmethod
  def build(cls, params, config, *, skip: tuple[int, ...] | None = None, calibration=None,
            k: int = 5, tree: Tree | None = None, adapt: int = 0, searched=None):
    """`skip` layers, or the set searched on `calibration` prompts (token-id lists) for k (or
    the result of that search, `searched`, when it ran already).
    adapt: also carry that many more skip sets from the search's trace (spread from the fewest
    to the most layers skipped) and switch among them on the fly."""
    if adapt < 0:
      raise ValueError(f"layer-skip adapt must be >= 0 (alternative skip sets), got {adapt}")
    if skip is not None:
      if adapt:
        raise ValueError("layer-skip adapt takes its skip sets from the search: give calibration "
                         "prompts instead of a skip set")
      return cls.skipping(config.n_layers, skip, tree), None
    if not calibration and searched is None:
      raise ValueError("layer-skip needs a skip set or calibration prompts to search one on")
    found = searched if searched is not None else search_skip_set(params, config, calibration, k=k)
    rounds = found.trace[1:]  # round r skips r layers
    spread = sorted({int(round(x)) for x in np.linspace(0, len(rounds) - 1, adapt + 1)}
                    - {len(found.skip) - 1}) if adapt and rounds else []
    return cls.skipping(config.n_layers, found.skip, tree,
                        [rounds[i].skip for i in spread][:adapt]), None

  @property
  def keep_sets(self) -> tuple[tuple[int, ...], ...]:
    return (self.keep, *self.alternatives)

  def check(self, target, params, k: int) -> None:
    super().check(target, params, k)
    for keep in self.keep_sets:
      if not keep:
        raise ValueError(f"layer-skip set skips every one of the target's {target.n_layers} "
                         f"layers")
      bad = [i for i in keep if not 0 <= i < target.n_layers]
      if bad:
        raise ValueError(f"layer-skip drafter keeps layer {bad[0]}, but the target has layers "
                         f"0..{target.n_layers - 1}")
      if list(keep) != sorted(set(keep)):
        raise ValueError(f"layer-skip keep list must be ascending without repeats, got {keep}")

  def prepare(self, params, target_params, target):
    """VocabTrim's rows or the output layer (Drafter.prepare) and, with draft_dtype, the kept
    layers copied in it (drafters/low_precision.py, once per call)."""
    params = super().prepare(params, target_params, target)
    if self.draft_dtype is None:
      return params
    used = tuple(sorted(set().union(*self.keep_sets)))
    return {**(params or {}), **low_precision.copy(target_params, used, self.draft_dtype)}

  def init(self, params, view: TargetView, config, max_len: int):
    if not self.alternatives:
      return ()
    c, b = len(self.keep_sets), view.lengths.shape[0]
    return SkipState(kept=jnp.zeros((c,), jnp.float32), checked=jnp.zeros((c,), jnp.float32),
                     steps=jnp.zeros((c,), jnp.int32), choice=jnp.zeros((), jnp.int32),
                     length=jnp.zeros((b,), jnp.int32), start=jnp.zeros((b,), jnp.int32))

  def propose(self, params, state, view: TargetView, key, config, k: int, sampling):
    run = functools.partial(self._draft, params=params, view=view, key=key, config=config, k=k,
                            sampling=sampling)
    if not self.alternatives:
      draft, cache = run(self.keep)
      return draft, state, view.replace(cache=cache)
    cost = jnp.asarray([len(keep) / config.n_layers for keep in self.keep_sets], jnp.float32)
    score = estimated_speedup(state.acceptance(), k, cost, verify_cost=self.verify_cost)  # [c]
    choice = jnp.argmax(score).astype(jnp.int32)  # ties: the first set
    draft, cache = jax.lax.switch(choice, [functools.partial(run, keep)
                                           for keep in self.keep_sets])
    length = jnp.full(view.lengths.shape, k, jnp.int32) if draft.length is None else draft.length
    state = state.replace(choice=choice, length=length, start=view.lengths,
                          steps=state.steps.at[choice].add(1))
    return draft, state, view.replace(cache=cache)

  def update(self, params, state, view: TargetView, verified: Verified):
    if not self.alternatives or verified.plain:  # a plain step: no set drafted
      return state
    active = view.lengths > state.start  # [b] finished rows re-verify stale drafts: not counted
    kept = jnp.where(active, jnp.minimum(verified.n_accepted, state.length), 0)  # [b]
    seen = kept + (active & (verified.n_accepted < state.length))  # a rejection ends a chain
    i = state.choice  # every set's counts decay, so one not drafting drifts back to the prior
    return state.replace(kept=(DECAY * state.kept).at[i].add(kept.sum()),
                         checked=(DECAY * state.checked).at[i].add(seen.sum()))

  def _draft(self, keep, *, params, view: TargetView, key, config, k: int, sampling):
    """Drafts through the `keep` layers; returns the draft and the target cache with the draft
    K/V written into the kept layers' buffers."""
    target = view.params
    layers = target["layers"] if self.draft_dtype is None else params["layers"]
    sub_params = {**target, "layers": tuple(layers[i] for i in keep)}
    cache = view.cache
    sub_cache = KVCache(k=tuple(cache.k[i] for i in keep), v=tuple(cache.v[i] for i in keep),
                        lengths=cache.lengths)
    sub_config = dataclasses.replace(config, n_layers=len(keep))
    last = view.pending
    parents = length = None
    output = self.output(params, target, config)  # the target's head (or its kept rows)
    if self.tree is not None:
      tokens, q, parents, sub_cache = draft_tree(sub_params, sub_config, sub_cache, last, key,
                                                 self.tree, sampling, output=output)
    else:
      tokens, q, length, sub_cache = draft_chain(sub_params, sub_config, sub_cache, last, key, k,
                                                 sampling, output=output,
                                                 exit_threshold=self.exit_threshold)
    # Hand the scribbled buffers back so XLA keeps updating the one cache in place.
    ks, vs = list(cache.k), list(cache.v)
    for j, i in enumerate(keep):
      ks[i], vs[i] = sub_cache.k[j], sub_cache.v[j]
    draft = Draft(tokens=tokens, probs=q, parents=parents, length=length)
    return draft, cache.replace(k=tuple(ks), v=tuple(vs))


def _keep(n_layers: int, skip) -> tuple[int, ...]:
  """The layers a drafter skipping `skip` keeps, ascending."""
  skip = set(skip)
  bad = sorted(i for i in skip if not 0 <= i < n_layers)
  if bad:
    raise ValueError(f"layer-skip set names layer {bad[0]}, but the target has layers "
                     f"0..{n_layers - 1}")
  return tuple(i for i in range(n_layers) if i not in skip)
