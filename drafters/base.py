"""The drafter interface: what the decode loop, the trainers, the registry and the CLI read.

A drafter is a frozen dataclass subclassing `Drafter` (static, hashable: a jit static argument;
its fields are checked when it is built, core/fields.py) plus a pytree state that rides in the
loop state. Arrays it reads but never changes (a draft model's weights, trained heads) are its
`params`, passed apart from the donated loop state. Every attribute anything reads is declared
here with its default; a drafter overrides what it needs.

The loop's invariant (core/types.py): `view.history[b, :lengths[b]]` holds the prompt and every
token emitted so far; the target cache holds all of them but the pending last one.
"""
from __future__ import annotations

import abc
import functools
import os
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from speculax.core.dtypes import narrowest_float
from speculax.core.fields import Checked
from speculax.core.sampling import SamplingConfig
from speculax.core.trees import Tree
from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters import heads_io, low_precision, vocab_trim
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.tables import table_dot
from speculax.verifiers.base import Verifier
from speculax.verifiers.chain import ChainVerifier
from speculax.verifiers.tree import TreeVerifier


class Drafter(Checked, abc.ABC):
  # --- what the registry and the CLI show (drafters/registry.py) ---
  name: ClassVar[str]  # the registry and CLI name, e.g. "prompt-lookup"
  summary: ClassVar[str]  # one line for --help
  # Trained on the target's features and loaded from a run folder (drafters/heads_io.py), with
  # `init_params` and `train_outputs` for train/heads.py.
  trained: ClassVar[bool] = False
  # A serving loop passes each batch's final state back as the next batch's params.
  hot_start: ClassVar[bool] = False
  # `update` takes the kept drafts for its own (a draft model keeps their K/V from drafting), so
  # it cannot follow drafts another drafter proposed (drafters/lookup_first.py).
  keeps_own_drafts: ClassVar[bool] = False

  # --- what the decode loop reads ---
  tree: Tree | None = None  # a tree drafted instead of a chain of k (a field where supported)
  # Target hidden states (Hugging Face indexing) the drafter reads: the prefill's at init
  # (TargetView.prompt_hidden) and the verify step's (Verified.hidden); () for none.
  hidden_layers: tuple[int, ...] = ()
  # VocabTrim (drafters/vocab_trim.py): score only the first N ids of the frequency order held in
  # the params under "vocab_ids" (0: the whole vocabulary; a field where supported).
  vocab_trim: int = 0
  # Kangaroo's early exit: a chain ends before the first draft (after the first) whose top draft
  # probability is below this, in (0, 1) (None: off; a field where supported).
  exit_threshold: float | None = None
  # The dtype of the weight copy its own forward's drafts read (drafters/low_precision.py; None:
  # the weights as they are; a field where supported).
  draft_dtype: str | None = None

  @classmethod
  def build(cls, params, config: LlamaConfig, *, heads: str | os.PathLike,
            tree: Tree | None = None) -> tuple[Drafter, Any]:
    """(drafter, its params) for the target (params, config), from keyword options (the
    registry's `make` checks them). This default serves trained drafters: load the run folder
    `heads` that `speculax train` wrote. Train-free drafters override it."""
    if not cls.trained:
      raise NotImplementedError(f"{cls.__name__} must define build()")
    return heads_io.load_drafter(heads, cls, config, tree)

  def verifier(self) -> Verifier:
    """How the loop checks this drafter's drafts."""
    return ChainVerifier() if self.tree is None else TreeVerifier(self.tree)

  def check(self, target: LlamaConfig, params, k: int) -> None:
    """Host-side, before anything compiles: raises ValueError naming what does not fit."""
    if self.tree is not None and self.tree.max_children > target.vocab_size:
      raise ValueError(f"tree asks {self.tree.max_children} candidates per node, more than the "
                       f"vocabulary size {target.vocab_size}")
    if self.exit_threshold is not None and self.tree is not None:
      raise ValueError(f"exit_threshold={self.exit_threshold} (early exit) applies to chains; "
                       f"drop the tree")
    if self.vocab_trim:
      if not isinstance(params, dict) or vocab_trim.IDS not in params:
        raise ValueError(f"vocab_trim={self.vocab_trim} needs the target's token frequency "
                         f"order in the drafter params under {vocab_trim.IDS!r} (see "
                         f"drafters/vocab_trim.frequency_order)")
      vocab_trim.check_order(params[vocab_trim.IDS], target.vocab_size, self.vocab_trim)
      if self.tree is not None and self.tree.max_children > self.vocab_trim:
        raise ValueError(f"tree asks {self.tree.max_children} candidates per node, more than "
                         f"the {self.vocab_trim} tokens vocab_trim keeps")
    if self.trained:
      self.check_params(target, without_order(params))

  def prepare(self, params, target_params, target: LlamaConfig):
    """Host-side, once per call: the drafter's params in the form `propose` reads: with
    VocabTrim, the kept rows of its output layer gathered once here (in draft_dtype, kept_rows);
    else with draft_dtype, its whole output layer copied in it (`output` reads either). A
    drafter's own prepare adds its layers."""
    if self.vocab_trim:
      head = self.kept_rows(params, target_params, target,
                            params[vocab_trim.IDS][:self.vocab_trim])
      return {**without_order(params), vocab_trim.TRIM: head}
    params = without_order(params)
    if self.draft_dtype is None:
      return params
    table = llama.output_table(*self.output_layer(params, target_params, target))
    return {**(params or {}), low_precision.HEAD: low_precision.lowered(table, self.draft_dtype)}

  def kept_rows(self, params, target_params, target: LlamaConfig, ids) -> dict:
    """VocabTrim's rows of the output layer the drafter scores with, for the kept `ids`, in the
    drafter's own weight dtype (a bfloat16 drafter reads a float32 target's rows in bfloat16), or
    its draft_dtype: what decoding reads (prepare) and the training objective too
    (train/heads.frozen_params)."""
    rows = vocab_trim.trimmed_head(*self.output_layer(params, target_params, target), ids,
                                   dtype=narrowest_float(without_order(params)))
    if self.draft_dtype is None:
      return rows
    return {**rows, "rows": low_precision.lowered(rows["rows"], self.draft_dtype)}

  def output_layer(self, params, target_params, target: LlamaConfig) -> tuple[Any, LlamaConfig]:
    """(params, config) of the output layer the drafter scores with: the target's."""
    return target_params, target

  def output(self, params, target_params, target: LlamaConfig) -> Callable[[jax.Array], jax.Array]:
    """In `propose`, on prepared params: final-normed features [..., d] -> logits [..., v]
    float32 through the drafter's output layer (only the kept rows with VocabTrim; -inf
    elsewhere, so q is exactly zero there; with draft_dtype, its copy)."""
    if isinstance(params, dict) and low_precision.HEAD in params:
      return lambda features: table_dot(features, params[low_precision.HEAD]).astype(jnp.float32)
    if self.vocab_trim:
      return functools.partial(vocab_trim.trimmed_logits, params[vocab_trim.TRIM],
                               vocab_size=target.vocab_size)
    return functools.partial(llama.lm_head, *self.output_layer(params, target_params, target))

  def train_head(self, frozen, config: LlamaConfig) -> Callable[[jax.Array], jax.Array]:
    """In `train_outputs`: features [..., d] -> logits through the target's output layer,
    [..., v], or [..., n] over the kept ids when training a trimmed drafter (the trainer puts
    the kept rows in frozen[vocab_trim.TRIM]): a draft step that never scores a token need not
    learn it, and training pays n / v of the output layer."""
    if vocab_trim.TRIM in frozen:
      return functools.partial(vocab_trim.trimmed_logits, frozen[vocab_trim.TRIM])
    return functools.partial(llama.lm_head, frozen, config)

  def init(self, params, view: TargetView, config: LlamaConfig, max_len: int) -> Any:
    """State after the target's prefill (history holds the prompt and the first new token)."""
    return ()

  @abc.abstractmethod
  def propose(self, params, state, view: TargetView, key: jax.Array, config: LlamaConfig,
              k: int, sampling: SamplingConfig) -> tuple[Draft, Any, TargetView]:
    """k draft tokens (or the tree's nodes) continuing each row of view.history."""

  def update(self, params, state, view: TargetView, verified: Verified) -> Any:
    """After verification: view has the new history and lengths. With max_lag, a plain step's
    (verified.plain) tokens may wait for `catch_up` instead of being fed."""
    return state

  # --- what goodput's plain steps read (decode/speculative.py) ---
  # Goodput's plain steps (k = 0) in a row whose tokens the drafter may leave unfed, to feed
  # them all in one block (`catch_up`) before it next drafts: a plain step then costs the
  # target's forward alone and a run of them one block forward of the drafter, where feeding
  # each step costs a forward of the drafter per step. 0: `update` feeds every step (drafters
  # with no forward of their own to keep current). A field where supported; a state the loop
  # returns may lag (`catch_up` brings it level).
  max_lag: int = 0

  def lag(self, state, view: TargetView) -> jax.Array:
    """[b] int32 tokens plain steps left unfed (0 without max_lag; at most max_lag)."""
    return jnp.zeros(view.lengths.shape, jnp.int32)

  def catch_up(self, params, state, view: TargetView) -> Any:
    """The state with every token plain steps left unfed fed (lag 0), on prepared params."""
    return state

  # --- what goodput-driven draft length reads (decode/goodput.py) ---

  @property
  def signal_bins(self) -> int:
    """How many values `signal` takes (1: no signal; goodput pools every row's outcomes)."""
    return 1

  def signal(self, params, state, view: TargetView, config: LlamaConfig) -> jax.Array:
    """[b] int32 in [0, signal_bins): what the drafter knows of its next draft before drafting
    it, read off its state after `update` (or `init`) and view.history, on prepared params.
    Goodput keeps an acceptance estimate per value, so it should sort rows by how likely their
    drafts are kept, and it runs on every loop step, plain ones included, so it should cost
    nearly nothing (a drafter whose signal needs a forward pass has none)."""
    return jnp.zeros(view.lengths.shape, jnp.int32)

  # --- trained drafters (train/heads.py) ---

  def init_params(self, config: LlamaConfig, key: jax.Array | None = None) -> dict:
    """Initial trainable params for a target of `config`."""
    raise NotImplementedError(f"{type(self).__name__} has no trainable params")

  def warm_params(self, saved: Drafter, params: dict, fresh: dict, target: LlamaConfig) -> dict:
    """The params a run of this drafter starts from when it continues `saved`'s (train/
    experiment.warm_start, which then checks them leaf by leaf against `fresh`, this run's own
    init): as saved, unless a drafter knows how to grow them."""
    return params

  def target_start(self, params: dict, target_params, config: LlamaConfig,
                   tokens: jax.Array) -> dict:
    """The params a run starts from when it takes them from the target's own weights
    (DistillExperiment.init_from="target"; tokens [b, t] real text where a scale is read off the
    target's activations); `params` is this run's own init."""
    raise ValueError(f"init_from='target': the {self.name} drafter has no start from the "
                     f"target's weights (eagle has: its layers become the target's last)")

  def train_outputs(self, params, frozen, config: LlamaConfig, batch: dict, key) -> dict:
    """Per-depth logits [b, t, J, v] (and optional aux_loss, accept_logits, metrics)."""
    raise NotImplementedError(f"{type(self).__name__} is not trained on target features")

  def check_params(self, target: LlamaConfig, params) -> None:
    """Trained params must have the tree and shapes `init_params` gives for this target."""
    if params is None:
      raise ValueError(f"the {type(self).__name__} drafter needs its trained params "
                       f"(drafter_params=...)")
    want = _shapes(jax.eval_shape(lambda: self.init_params(target)))
    got = _shapes(params)
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    wrong = {k: got[k] for k in want.keys() & got.keys() if got[k] != want[k]}
    if missing or extra or wrong:
      raise ValueError(
          f"{type(self).__name__} params do not fit this drafter on this target (d_model "
          f"{target.d_model}, vocab {target.vocab_size}): "
          + "; ".join(x for x in (f"missing {missing}" if missing else "",
                                  f"unexpected {extra}" if extra else "",
                                  f"shapes {wrong}, expected "
                                  f"{ {k: want[k] for k in wrong} }" if wrong else "") if x)
          + ". Were they trained on another target, or with other drafter settings?")


def without_order(params):
  """The params without VocabTrim's frequency order (what training and shape checks see)."""
  if isinstance(params, dict) and vocab_trim.IDS in params:
    return {k: v for k, v in params.items() if k != vocab_trim.IDS}
  return params


def _shapes(params) -> dict[str, tuple[int, ...]]:
  return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
