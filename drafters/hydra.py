"""Hydra heads (Ankner et al. 2024): draft heads that see the tokens drafted before them.

Like Medusa, head j (1-based) starts from the target's final-normed feature h at the node that
gave the pending token and predicts the j-th token after the pending one through the target's
own output head. Unlike Medusa, it also reads the embeddings (the target's table, frozen) of the
tokens in between, the pending token and drafts 1..j-1, so its guess follows the path it
continues (sequential dependence):

  x_j = [h; e(pending); e(draft 1); ...; e(draft j-1)]   [(j + 1) d]
  z = W_j x_j + b_j, then mlp_layers residual blocks z <- z + SiLU(W z + b)
  logits_j = lm_head(z)

Initialized with W_j = [I 0 ... 0] and zero blocks, every head starts as a copy of the target's
next-token head on h; the embedding columns and the blocks get gradients from the first step.

Hydra++ options: `prefix_attention` adds one causal decoder layer (a llama.Block, zero output
projections so it starts as the identity) over the target's features of the whole context; its
output at the node that gave the pending token replaces h. Its K/V over context positions live
in the drafter state, kept in step with the target's cache by length arithmetic: `init` runs it
over the prefill's features of the prompt, `update` over the verify step's features along the
kept path (rolled back to the kept length), and goodput's plain steps (`max_lag`) leave theirs
in a backlog that `catch_up` runs it over as one block before the next draft. `mlp_layers`
deepens the heads (4 in Hydra++). Hydra++'s teacher-distillation objective is training on the
target's distributions, which train/heads.py does (HeadsConfig.divergence). Its training-time
input noise is not here.

Drafting grows the tree level by level (drafters/tree_draft.grow_tree): head j runs once per node
at depth j - 1 on that node's own path, so siblings get different children. A chain is the
one-child-per-level tree; static trees draw sampled siblings without replacement from their
parent's q; dynamic trees keep the most probable paths (deterministic, one-hot in verification).

Dims: b batch, t time, w level width, p path length, j heads, d model, v vocab.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculax.core.fields import field
from speculax.core.sampling import SamplingConfig
from speculax.core.trees import StaticTree, Tree
from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters.base import Drafter
from speculax.drafters.chain import exit_length
from speculax.drafters.feature_layer import (defer, init_layer, last_fed, layer_config,
                                             run_layers)
from speculax.drafters.tree_draft import check_heads, grow_tree
from speculax.models import llama
from speculax.models.kvcache import KVCache


@flax.struct.dataclass
class HydraState:
  base: jax.Array  # [b, d] the heads' base input at the node that gave the pending token
  prefix: KVCache | None  # prefix layer K/V over positions [0, P), P the pending token's; or None
  # [b, max_lag, d] target features plain steps left unfed, from slot prefix.lengths on (None:
  # no prefix layer or no max_lag)
  backlog: jax.Array | None
  config: object = flax.struct.field(pytree_node=False)  # the target's LlamaConfig (static)


@dataclasses.dataclass(frozen=True)
class Hydra(Drafter):
  name: ClassVar[str] = "hydra"
  summary: ClassVar[str] = ("Hydra heads that read the drafted prefix (Hydra++ options; trained; "
                            "chain or any tree)")
  trained: ClassVar[bool] = True
  hidden_layers: ClassVar[tuple[int, ...]] = (-1,)  # the final-normed features
  n_heads: int = field(4, ge=1)
  tree: Tree | None = None  # None: a chain of k <= n_heads drafts
  prefix_attention: bool = False  # Hydra++: a causal decoder layer over the context's features
  mlp_layers: int = field(1, ge=1)  # residual SiLU blocks per head (Hydra++: 4)
  vocab_trim: int = field(0, ge=0)  # VocabTrim: the N most frequent target tokens (0: all)
  exit_threshold: float | None = field(None, gt=0, lt=1)  # Kangaroo early exit (chains)
  # With prefix_attention: goodput's plain steps fed in one block (Drafter).
  max_lag: int = field(16, ge=0, le=256)

  def check(self, target, params, k: int) -> None:
    super().check(target, params, k)
    check_heads(self.tree, k, self.n_heads)

  def init(self, params, view: TargetView, config, max_len: int) -> HydraState:
    """The base at the last prompt token from the prefill's features; with prefix_attention,
    the prefix layer run over the whole prompt into its cache."""
    feats = view.prompt_hidden[0]  # [b, T, d]
    b, t = feats.shape[:2]
    rows, last = jnp.arange(b), view.lengths - 2  # the last prompt token gave the pending one
    if not self.prefix_attention:
      return HydraState(feats[rows, last], None, None, config)
    cache = KVCache.init(layer_config(config), b, max_len, per_layer=True)
    out, cache = run_layers((params["prefix"],), config, feats,
                            llama.row_positions(b, t), cache)
    backlog = jnp.zeros((b, self.max_lag, feats.shape[-1]), feats.dtype) if self.max_lag else None
    # Pad slots past each prompt were written too; the length hides them.
    return HydraState(out[rows, last], cache.with_lengths(view.lengths - 1), backlog, config)

  def propose(self, params, state: HydraState, view: TargetView, key, config, k: int,
              sampling: SamplingConfig):
    tree = self.tree if self.tree is not None else StaticTree.chain(k)
    last = view.pending
    tokens, q, parents, top = draft_heads(params, view.params, config, self.output(
        params, view.params, config), state.base, last, key, tree, sampling)
    length = None if self.exit_threshold is None else exit_length(top, self.exit_threshold)
    return Draft(tokens=tokens, probs=q, parents=None if self.tree is None else parents,
                 length=length), state, view

  def update(self, params, state: HydraState, view: TargetView, verified: Verified) -> HydraState:
    """The base at the last kept node; with prefix_attention, the kept path's features appended
    to the prefix layer's cache from the root's position (P before this step) on."""
    rows, n_acc = jnp.arange(state.base.shape[0]), verified.n_accepted
    if not self.prefix_attention:
      return state.replace(base=verified.hidden[0][rows, verified.path[rows, n_acc]])
    feats = jnp.take_along_axis(verified.hidden[0], verified.path[..., None], 1)  # [b, p, d]
    if verified.plain and state.backlog is not None:
      return state.replace(backlog=defer(state.backlog, feats[:, 0], state.prefix.lengths,
                                         view.lengths))
    out, cache = self._prefix(params, state, feats)
    # The path past n_accepted (padded with its last node) lands beyond the new length.
    return state.replace(base=out[rows, n_acc], prefix=cache.with_lengths(view.lengths - 1))

  def lag(self, state: HydraState, view: TargetView) -> jax.Array:
    if state.backlog is None:
      return super().lag(state, view)
    return view.lengths - 1 - state.prefix.lengths

  def catch_up(self, params, state: HydraState, view: TargetView) -> HydraState:
    """The prefix layer over the backlog as one block of max_lag (entries past the lag land
    beyond the new length)."""
    if state.backlog is None:
      return state
    out, cache = self._prefix(params, state, state.backlog)
    return state.replace(base=last_fed(out, state.prefix.lengths, view.lengths, state.base),
                         prefix=cache.with_lengths(view.lengths - 1))

  def _prefix(self, params, state: HydraState, feats: jax.Array):
    """The prefix layer over features feats [b, p, d] from its cache's length on -> ([b, p, d],
    cache)."""
    positions = state.prefix.lengths[:, None] + jnp.arange(feats.shape[1], dtype=jnp.int32)
    return run_layers((params["prefix"],), state.config, feats, positions, state.prefix)

  def init_params(self, config, key=None) -> dict:
    """Heads that copy the target's next-token head; a prefix layer that is the identity."""
    d = config.d_model
    params = {f"head{j}": {
        "w_in": np.eye((j + 1) * d, d, dtype=np.float32),  # [I; 0]: reads h alone
        "b_in": np.zeros((d,), np.float32),
        "w_mlp": np.zeros((self.mlp_layers, d, d), np.float32),
        "b_mlp": np.zeros((self.mlp_layers, d), np.float32),
    } for j in range(1, self.n_heads + 1)}
    if self.prefix_attention:
      params["prefix"] = init_layer(config, jax.random.key(0) if key is None else key)
    return params

  def train_outputs(self, params, frozen, config, batch, key) -> dict:
    """Teacher forcing: head j at position i reads h_i and the row's tokens i + 1..i + j (zero
    embeddings past the row's end, positions the trainer drops) and predicts token i + j + 1."""
    tokens, h = batch["tokens"], batch["hidden"][0]  # [b, t], [b, t, d]
    t = tokens.shape[1]
    if self.prefix_attention:
      positions = llama.row_positions(*tokens.shape)
      h, _ = run_layers((params["prefix"],), config, h, positions)
    e = llama.embed(frozen, config, tokens)  # [b, t, d]
    ahead = jnp.stack([jnp.pad(e[:, m:], ((0, 0), (0, m), (0, 0))) for m in
                       range(1, self.n_heads + 1)], 2)  # [b, t, j, d]: ahead[:, i, m - 1] = e_{i+m}
    output = self.train_head(frozen, config)
    return {"logits": jnp.stack([head_logits(params[f"head{j}"], output, h, ahead[:, :, :j])
                                 for j in range(1, self.n_heads + 1)], 2)}  # [b, t, j, v]


def head_logits(head: dict, output, base: jax.Array, path: jax.Array) -> jax.Array:
  """One head: base [..., d] and the path's embeddings [..., p, d] -> logits [..., v] through
  `output` (features -> logits)."""
  base = jnp.broadcast_to(base, path.shape[:-2] + base.shape[-1:])
  x = jnp.concatenate([base, path.reshape(*path.shape[:-2], -1)], -1)  # [..., (p + 1) d]
  z = x @ head["w_in"] + head["b_in"]  # [..., d]
  for w, b in zip(head["w_mlp"], head["b_mlp"]):
    z = z + jax.nn.silu(z @ w + b)
  return output(z)


def draft_heads(params, target_params, config, output, base: jax.Array, last: jax.Array,
                key: jax.Array, tree: Tree, sampling: SamplingConfig):
  """One tree per row after the pending token `last` [b]: tokens [b, n], q [b, n, v] or None,
  parents [b, n + 1], top [b, n] (grow_tree's). Head j runs on each depth j - 1 node's path of
  embeddings."""
  path = llama.embed(target_params, config, last)[:, None, None]  # [b, 1, 1, d] the root's
  root_logits = head_logits(params["head1"], output, base[:, None], path)

  def feed(path, depth, level, local, mask):  # path [b, w', depth, d] of depth - 1's nodes
    path = jnp.concatenate([jnp.take_along_axis(path, local[:, :, None, None], 1),
                            llama.embed(target_params, config, level)[:, :, None]], 2)
    logits = head_logits(params[f"head{depth + 1}"], output, base[:, None], path)
    return logits, path  # [b, w, v], [b, w, depth + 1, d]

  tokens, q, parents, _, top = grow_tree(feed, path, root_logits, key, tree, sampling)
  return tokens, q, parents, top

