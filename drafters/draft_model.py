"""A separate, smaller draft model sharing the target's vocabulary, with its own KV cache.

The draft cache mirrors the target's: it holds every history token but the pending last one,
and after verification it is rolled back by length arithmetic, exactly like the target's.
"""
from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

import jax
import jax.numpy as jnp

from speculax.core.fields import field
from speculax.core.trees import Tree
from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters import heads_io, low_precision
from speculax.drafters.base import Drafter
from speculax.drafters.chain import draft_chain
from speculax.drafters.tree_draft import draft_tree
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.derive import truncated
from speculax.models.kvcache import KVCache


@dataclasses.dataclass(frozen=True)
class DraftModel(Drafter):
  name: ClassVar[str] = "draft-model"
  summary: ClassVar[str] = ("a smaller model of the same vocabulary (default: a cut of the "
                            "target's layers; distil it with `speculax train`); chain or tree")
  keeps_own_drafts: ClassVar[bool] = True  # its cache keeps the K/V of what it drafted
  config: LlamaConfig
  tree: Tree | None = None  # None: a chain of k drafts
  vocab_trim: int = field(0, ge=0)  # VocabTrim: the N most frequent target tokens (0: all)
  exit_threshold: float | None = field(None, gt=0, lt=1)  # Kangaroo early exit (chains)
  max_lag: int = field(16, ge=0, le=256)  # goodput's plain steps fed in one block (Drafter)
  # The dtype of the copy of its weights the drafts read (drafters/low_precision.py; None: as
  # they are): with draft_layers = the target's, the target drafts for itself from its copy.
  draft_dtype: low_precision.DraftDtype | None = None

  @classmethod
  def build(cls, params, config, *, draft=None, draft_layers: int = 4,
            tree: Tree | None = None):
    """`draft` = (config, params) of a model sharing the vocabulary, or the run folder of one
    distilled by `speculax train`, or else the target's first `draft_layers` layers (an
    untrained cut)."""
    if isinstance(draft, (str, os.PathLike)):
      return heads_io.load_drafter(draft, cls, config, tree)
    if draft is None:
      draft = truncated(params, config, range(draft_layers))
    draft_config, draft_params = draft
    return cls(draft_config, tree), draft_params

  def check(self, target: LlamaConfig, params, k: int) -> None:
    super().check(target, params, k)
    if self.config.vocab_size != target.vocab_size:
      raise ValueError(f"draft model vocabulary size {self.config.vocab_size} differs from the "
                       f"target's {target.vocab_size}; they must share one vocabulary")
    if params is None:
      raise ValueError("a DraftModel drafter needs its params (drafter_params=...)")

  def init_params(self, config, key=None) -> dict:
    """Random params of the draft model (the shapes a saved run restores into)."""
    return llama.init_params(self.config, jax.random.key(0) if key is None else key)

  def output_layer(self, params, target_params, target):
    return params, self.config  # its own

  def prepare(self, params, target_params, target):
    """VocabTrim's rows or the output layer (Drafter.prepare) and the layers in decoding's form,
    or with draft_dtype a copy of the layers in it (once per call)."""
    params = super().prepare(params, target_params, target)
    if self.draft_dtype is None:
      return llama.unstack_layers(params) if not isinstance(params["layers"], tuple) else params
    n = self.config.n_layers
    copy = low_precision.copy({"layers": params["layers"]}, tuple(range(n)), self.draft_dtype)
    return {**params, **copy, "layers": tuple(copy["layers"][i] for i in range(n))}

  def init(self, params, view: TargetView, config, max_len: int) -> KVCache:
    cache = KVCache.init(self.config, view.lengths.shape[0], max_len, per_layer=True)
    positions = llama.row_positions(*view.history.shape)
    # Prefill on the whole buffer; only the first lengths - 1 slots stay valid.
    _, _, cache = llama.forward(params, self.config, view.history, positions, cache,
                                logits_at=jnp.zeros((view.history.shape[0], 1), jnp.int32))
    return cache.with_lengths(view.lengths - 1)

  def propose(self, params, state: KVCache, view: TargetView, key, config, k: int, sampling):
    last = view.pending
    output = self.output(params, view.params, config)  # its own head (or its kept rows)
    if self.tree is not None:
      tokens, q, parents, state = draft_tree(params, self.config, state, last, key, self.tree,
                                             sampling, feed_leaves=True, output=output)
      return Draft(tokens=tokens, probs=q, parents=parents), state, view
    tokens, q, length, state = draft_chain(params, self.config, state, last, key, k, sampling,
                                           extra_step=True, output=output,
                                           exit_threshold=self.exit_threshold)
    return Draft(tokens=tokens, probs=q, length=length), state, view

  def update(self, params, state: KVCache, view: TargetView, verified: Verified):
    if verified.plain:  # propose fed nothing this step: the pending token it verified goes
      # into the draft cache now, or with max_lag at the next catch_up (history holds it)
      return state if self.max_lag else self._feed(params, state, verified.block, view)
    if self.tree is not None:  # the kept path's K/V into contiguous slots after the root's
      state = state.gather_path(state.lengths, verified.path)
    return state.with_lengths(view.lengths - 1)

  def lag(self, state: KVCache, view: TargetView) -> jax.Array:
    return view.lengths - 1 - state.lengths

  def catch_up(self, params, state: KVCache, view: TargetView) -> KVCache:
    """Feeds the history tokens plain steps left as one block of max_lag (those past the lag
    land beyond the new length)."""
    if not self.max_lag:
      return state
    slots = state.lengths[:, None] + jnp.arange(self.max_lag)  # [b, max_lag]
    rows = jnp.arange(slots.shape[0])[:, None]
    return self._feed(params, state,
                      view.history[rows, jnp.minimum(slots, view.history.shape[1] - 1)], view)

  def _feed(self, params, state: KVCache, tokens: jax.Array, view: TargetView) -> KVCache:
    """tokens [b, t] into the cache from its length on (no logits); it ends at the pending
    token's slot."""
    _, _, state = llama.forward(params, self.config, tokens,
                                state.lengths[:, None] + jnp.arange(tokens.shape[1]), state,
                                logits_at=jnp.zeros((tokens.shape[0], 0), jnp.int32))
    return state.with_lengths(view.lengths - 1)
