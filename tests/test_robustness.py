"""Decoding stays right when inputs are extreme or a drafter misbehaves.

- A tiny positive temperature is near-greedy decoding, not overflow garbage.
- Draft ids outside the vocabulary (a faulty drafter) never change an output token, in chains
  and trees, greedy and sampled, and never reach the model as NaN.
- tau and per-position acceptance count only the tokens a step emitted, when the token budget
  or an EOS cuts an accepted block.
- Inputs that only the model can judge (EOS ids, a batch on a mesh, a missing head drafter)
  fail with messages that name the real problem.
"""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.sampling import SamplingConfig, probs
from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters import registry
from speculax.drafters.base import Drafter
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models.sharding import MeshConfig

from tiny_prompts import NEW, PROMPTS


@dataclasses.dataclass(frozen=True)
class Faulty(Drafter):
  """Drafts as `drafter`, then puts ids outside the vocabulary at `positions` (a chain's draft
  index or a tree's node index - 1): `vocab + 3` in even rows, -2 in odd rows."""
  drafter: Drafter
  positions: tuple[int, ...]

  @property
  def tree(self):
    return self.drafter.tree

  def check(self, target, params, k):
    self.drafter.check(target, params, k)

  def prepare(self, params, target_params, target):
    return self.drafter.prepare(params, target_params, target)

  def init(self, params, view, config, max_len):
    return self.drafter.init(params, view, config, max_len)

  def propose(self, params, state, view, key, config, k, sampling):
    draft, state, view = self.drafter.propose(params, state, view, key, config, k, sampling)
    rows = jnp.arange(draft.tokens.shape[0])[:, None]
    bad = jnp.where(rows % 2 == 0, config.vocab_size + 3, -2)
    tokens = draft.tokens.at[:, jnp.asarray(self.positions)].set(bad)
    return draft.replace(tokens=tokens), state, view

  def update(self, params, state, view, verified):
    return self.drafter.update(params, state, view, verified)


@pytest.mark.parametrize("temperature", [1e-12, 1e-30, 1e-300])
def test_tiny_temperature_is_greedy(tiny, tiny_reference, temperature):
  cfg, params = tiny
  sampling = SamplingConfig(temperature=temperature)
  out = generate(params, cfg, PROMPTS[:4], GenerateConfig(max_new_tokens=NEW, sampling=sampling))
  assert out.tokens == tiny_reference[:4]
  spec = speculative_generate(params, cfg, PROMPTS[:4], PromptLookup(),
                              SpecConfig(k=3, max_new_tokens=NEW, sampling=sampling))
  assert spec.tokens == tiny_reference[:4]


def test_tiny_temperature_law_is_the_argmax():
  logits = jnp.array([[0.0, 3.0, -2.0, 2.999], [-1e30, 5.0, 5.0, 1.0]])
  for t in (1e-12, 1e-30, 1e-300):
    p = np.asarray(probs(logits, SamplingConfig(temperature=t, top_p=0.9)))
    np.testing.assert_array_equal(p, [[0, 1, 0, 0], [0, 0.5, 0.5, 0]])


@pytest.mark.parametrize("tree", [None, StaticTree.full((3, 2, 1)),
                                  DynamicTree(width=3, depth=3, children=3)],
                         ids=["chain", "static", "dynamic"])
def test_out_of_vocab_drafts_never_change_greedy_output(tiny, tiny_reference, tree):
  """The draft model is the target itself, so every valid draft would be kept: a bad id inside
  the block is the only reason to stop, and the output must still be the target's."""
  cfg, params = tiny
  faulty = Faulty(DraftModel(cfg, tree), (1,) if tree is None else (0, 4))
  out = speculative_generate(params, cfg, PROMPTS[:4], faulty,
                             SpecConfig(k=4, max_new_tokens=NEW), drafter_params=params)
  assert out.tokens == tiny_reference[:4]
  if tree is None:  # draft 0 is always kept, draft 1 never
    np.testing.assert_allclose(out.acceptance[:2], [1.0, 0.0])


def test_token_recycling_refuses_a_matrix_of_bad_ids(tiny):
  cfg, params = tiny
  shape = (cfg.vocab_size, TokenRecycling().tree.max_children)
  for matrix, message in [(np.full(shape, cfg.vocab_size, np.int32), "token id 256, outside"),
                          (np.full(shape, -1, np.int32), "token id -1, outside"),
                          (np.zeros(shape, np.float32), "integer token ids, got dtype float32")]:
    with pytest.raises(ValueError, match=message):
      speculative_generate(params, cfg, PROMPTS[:1], TokenRecycling(),
                           SpecConfig(max_new_tokens=4), drafter_params=matrix)


def _emitted_per_step(out, n_prompts):
  """Tokens the verify steps emitted: every new token but the first of each row (prefill's)."""
  return out.new_tokens - n_prompts


@pytest.mark.parametrize("cut", ["budget", "eos"])
def test_tau_counts_only_emitted_tokens(tiny, tiny_reference, cut):
  """The draft model is the target, so each step's k = 4 drafts are all accepted; the budget
  (or an EOS) lets only part of the block out, and only that part counts."""
  cfg, params = tiny
  ref = tiny_reference[1]
  if cut == "budget":
    spec = SpecConfig(k=4, max_new_tokens=3)  # 1 token from the prefill, 2 from one step
  else:
    assert ref[2] not in ref[:2]  # the first step emits ref[1], then ref[2] = EOS, and stops
    spec = SpecConfig(k=4, max_new_tokens=NEW, eos_ids=(int(ref[2]),))
  out = speculative_generate(params, cfg, PROMPTS[1:2], DraftModel(cfg), spec,
                             drafter_params=params)
  assert out.tokens[0] == ref[:3]
  assert out.row_steps == 1 and out.tau == 2.0
  np.testing.assert_array_equal(out.acceptance, [1.0, 1.0, 0.0, 0.0])
  assert out.tau * out.row_steps == _emitted_per_step(out, 1)


@pytest.mark.parametrize("drafter", ["prompt-lookup", "target"])
def test_tau_times_steps_is_every_token_after_the_first(tiny, drafter):
  cfg, params = tiny
  d, dp = (PromptLookup(), None) if drafter == "prompt-lookup" else (DraftModel(cfg), params)
  eos = (int(PROMPTS[0][0]),)
  for spec in [SpecConfig(k=5, max_new_tokens=7), SpecConfig(k=3, max_new_tokens=11, eos_ids=eos)]:
    out = speculative_generate(params, cfg, PROMPTS, d, spec, drafter_params=dp)
    emitted = _emitted_per_step(out, len(PROMPTS))
    assert round(out.tau * out.row_steps) == emitted
    # Each step emits its accepted drafts and at most one target token.
    assert 0 <= emitted - out.accepted_at.sum() <= out.row_steps


def test_eos_ids_outside_the_vocabulary_are_refused(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match=r"eos_ids \(2, 300\) name id 300, outside the vocabulary"):
    generate(params, cfg, PROMPTS[:1], GenerateConfig(eos_ids=(2, 300)))
  with pytest.raises(ValueError, match=r"eos_ids \(256,\) name id 256"):
    speculative_generate(params, cfg, PROMPTS[:1], PromptLookup(), SpecConfig(eos_ids=(256,)))


def test_a_batch_the_mesh_cannot_split_is_named_as_such(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match=r"batch size \(prompts\) 3 does not split over the mesh's "
                                       r"batch axes data=4 x fsdp=1 \(4 ways\)"):
    generate(params, cfg, PROMPTS[:3], GenerateConfig(max_new_tokens=2), mesh=MeshConfig(data=4))


@pytest.mark.parametrize("kind", ["medusa", "hydra", "eagle"])
def test_a_missing_head_drafter_points_at_its_own_config(tiny, tmp_path, kind):
  with pytest.raises(FileNotFoundError, match=f"configs/{kind}_smollm2.py"):
    registry.make(kind, tiny[1], tiny[0], heads=tmp_path)
