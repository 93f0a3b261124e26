"""Medusa heads (Cai et al. 2024): extra heads on the target's last hidden state draft ahead.

Head j (1-based) reads the final-normed feature h_i the target computed at position i, whose own
output head predicts token i + 1, and predicts token i + 1 + j:
logits_j = lm_head(h_i + SiLU(W_j h_i + b_j)), the output head shared with the target. With W_j
and b_j at zero a head starts as a copy of the target's next-token head.

In the loop, h is the feature of the last kept node of the previous verify step (the node whose
logits gave the pending token), so head j drafts the j-th token after the pending one. A chain
takes each head's top (or sampled) token; a static tree takes, at depth j, head j's candidates
in rank order under every parent (the heads do not see the drafted prefix, so every parent at a
depth shares them). Sampled siblings are draws without replacement from the head's q.

Dims: b batch, d model, v vocab, j heads, c candidates.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from speculax.core.fields import field
from speculax.core.sampling import SamplingConfig, candidates, probs, sample, top_probability
from speculax.core.trees import StaticTree
from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters.base import Drafter
from speculax.drafters.chain import exit_length
from speculax.drafters.tree_draft import check_heads


@dataclasses.dataclass(frozen=True)
class Medusa(Drafter):
  name: ClassVar[str] = "medusa"
  summary: ClassVar[str] = ("Medusa heads on the target's last features (trained; chain or "
                            "static tree)")
  trained: ClassVar[bool] = True
  hidden_layers: ClassVar[tuple[int, ...]] = (-1,)  # the final-normed features
  n_heads: int = field(4, ge=1)
  tree: StaticTree | None = None  # None: a chain of k <= n_heads drafts
  vocab_trim: int = field(0, ge=0)  # VocabTrim: the N most frequent target tokens (0: all)
  exit_threshold: float | None = field(None, gt=0, lt=1)  # Kangaroo early exit (chains)

  def check(self, target, params, k: int) -> None:
    super().check(target, params, k)
    check_heads(self.tree, k, self.n_heads)

  def init(self, params, view: TargetView, config, max_len: int) -> jax.Array:
    """h [b, d]: the target's feature at the last prompt token (the one that gave the pending
    token), from the prefill."""
    rows = jnp.arange(view.history.shape[0])
    return view.prompt_hidden[0][rows, view.lengths - 2]  # [b, d]

  def propose(self, params, state: jax.Array, view: TargetView, key, config, k: int,
              sampling: SamplingConfig):
    depth = self.tree.depth if self.tree is not None else k
    output = self.output(params, view.params, config)
    logits = heads_logits(params, output, state)[:, :depth]  # [b, depth, v]
    b = logits.shape[0]
    if self.tree is None:
      tokens = sample(key, logits, sampling)  # [b, k]
      q = None if sampling.greedy else probs(logits, sampling)
      length = None if self.exit_threshold is None else exit_length(
          top_probability(logits, q), self.exit_threshold)
      return Draft(tokens=tokens, probs=q, length=length), state, view
    cand, q = candidates(key, logits, sampling, self.tree.max_children)  # [b, depth, c]
    depths = jnp.asarray(self.tree.node_depths[1:] - 1)  # [n] head of each node
    ranks = jnp.asarray(self.tree.ranks[1:])
    return Draft(tokens=cand[:, depths, ranks], probs=None if q is None else q[:, depths],
                 parents=self.tree.batch_parents(b)), state, view

  def update(self, params, state, view: TargetView, verified: Verified) -> jax.Array:
    rows = jnp.arange(state.shape[0])
    last = verified.path[rows, verified.n_accepted]  # [b] the node that gave the pending token
    return verified.hidden[0][rows, last]  # [b, d]

  def init_params(self, config, key=None) -> dict:
    return init_heads(config, self.n_heads)

  def train_outputs(self, params, frozen, config, batch, key) -> dict:
    """Head j at position i predicts the token the cache's distribution at i + j is of."""
    output = self.train_head(frozen, config)
    return {"logits": heads_logits(params, output, batch["hidden"][0])}  # [b, t, j, v]


def init_heads(config, n_heads: int) -> dict:
  """Zero residual blocks: every head starts as the target's own next-token head."""
  d = config.d_model
  return {"w": jnp.zeros((n_heads, d, d), jnp.float32), "b": jnp.zeros((n_heads, d), jnp.float32)}


def heads_logits(params, output, h: jax.Array) -> jax.Array:
  """h [..., d] final-normed features -> [..., j, v] logits of every head through `output`
  (features -> logits: the target's output layer, or its VocabTrim rows)."""
  x = h[..., None, :]  # [..., 1, d]
  z = jnp.einsum("...d,jde->...je", h, params["w"]) + params["b"]  # [..., j, d]
  return output(x + jax.nn.silu(z))
