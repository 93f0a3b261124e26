"""A draft model proposing multi-draft chains: n first tokens by a draft scheme, each continued as
its own chain of k - 1 sampled tokens, all verified by one target forward
(verifiers/multi_draft.py).

The draft model feeds the root, then each depth's n nodes as one block whose mask covers their
ancestors only (the branches never see each other), so node i sits at slot root + i like any
tree (drafters/tree_draft.py) and its cache keeps the kept branch with one gather.

Dims: b batch, n branches, k drafts per branch, v vocab.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from speculax.core import multi_draft as md
from speculax.core.fields import field
from speculax.core.sampling import SamplingConfig, argmax, draw, probs
from speculax.core.trees import ancestor_mask
from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters.draft_model import DraftModel
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import KVCache
from speculax.verifiers.multi_draft import MultiDraftVerifier, Rule, branch_tree


@dataclasses.dataclass(frozen=True)
class MultiDraftModel(DraftModel):
  name: ClassVar[str] = "multi-draft-model"
  summary: ClassVar[str] = ("a draft model proposing n chains whose first tokens come from a "
                            "multi-draft scheme (i.i.d., without replacement, greedy top n-1)")
  n: int = field(2, ge=1)  # branches
  rule: Rule = "greedy"  # how the first level is verified; it fixes the draft scheme

  def verifier(self) -> MultiDraftVerifier:
    return MultiDraftVerifier(self.n, self.rule)

  def check(self, target: LlamaConfig, params, k: int) -> None:
    super().check(target, params, k)
    if self.tree is not None or self.vocab_trim or self.exit_threshold is not None:
      raise ValueError("a multi-draft chain has no tree, vocab_trim or exit_threshold option")
    if self.n > target.vocab_size:
      raise ValueError(f"n={self.n} drafts per step exceeds the vocabulary size "
                       f"{target.vocab_size}")

  def propose(self, params, state: KVCache, view: TargetView, key, config, k: int,
              sampling: SamplingConfig):
    output = self.output(params, view.params, config)
    tokens, q, state = draft_branches(params, self.config, state, view.pending, key, self.n, k,
                                      md.RULES[self.rule], sampling, output)
    parents = branch_tree(self.n, k).batch_parents(tokens.shape[0])
    return Draft(tokens=tokens, probs=q, parents=parents), state, view

  def update(self, params, state: KVCache, view: TargetView, verified: Verified):
    return state.gather_path(state.lengths, verified.path).with_lengths(view.lengths - 1)


def draft_branches(params, config: LlamaConfig, cache: KVCache, last: jax.Array, key: jax.Array,
                   n: int, k: int, scheme: str, sampling: SamplingConfig, output=None):
  """n chains of k drafts after `last` [b] -> tokens [b, n k] depth by depth, q [b, n k, v]
  (each node's law: the root's q for the first level; None when greedy) and the cache with every
  node written (lengths back at the root's slot). Greedy drafts the top n, then argmaxes."""
  b = last.shape[0]
  root = cache.lengths
  logits, _, cache = llama.forward(params, config, last[:, None], root[:, None], cache,
                                   output=output)  # [b, 1, v]
  parents = branch_tree(n, k).batch_parents(b)
  keys = jax.random.split(key, k)
  if sampling.greedy:
    level, q = jax.lax.top_k(logits[:, 0], n)[1].astype(jnp.int32), None
  else:
    q = probs(logits[:, 0], sampling)
    level, q = md.draw_drafts(keys[0], q, n, scheme), jnp.repeat(q[:, None], n, 1)
  tokens, laws = [level], [q]
  for d in range(1, k + 1):  # feeds depth d (the last too: the cache then holds every node)
    mask = ancestor_mask(parents[:, :1 + d * n], d)[:, -n:]  # [b, n, 1 + d n]
    positions = jnp.broadcast_to((root + d)[:, None], (b, n))
    logits, _, cache = llama.forward(params, config, level, positions, cache, mask,
                                     output=output)  # [b, n, v]
    if d == k:
      break
    if sampling.greedy:
      level = argmax(logits)
    else:
      q = probs(logits, sampling)
      level = draw(keys[d], q)
    tokens.append(level)
    laws.append(q)
  q = None if sampling.greedy else jnp.concatenate(laws, 1)
  return jnp.concatenate(tokens, 1), q, cache.with_lengths(root)
