"""Speculative sampling follows the target's distribution exactly (first and second tokens).

Many copies of one prompt run as one batch (rows draw independent randoms), with a draft model
whose distribution differs from the target's, drafting a chain, a static tree whose siblings are
drawn without replacement, or a dynamic tree of deterministic top candidates, with Medusa or
Hydra++ heads drafting a static tree, with EAGLE drafting a static tree or an
adaptive-length chain (SpecDec++ stops: fewer drafts verified, the rest rejected) or after
prompt lookup's copies (in rows whose first token occurred in the prompt), and with trimmed
drafters (VocabTrim: q is zero outside 6 of the 12 ids) that exit early (Kangaroo). The exact
target law comes from the target's own logits: p(x) after the prompt and p(y | x) after
prompt + x, through the same sampling transform. Planted verifiers (one that skips the residual
resampling, one that treats siblings drawn without replacement as i.i.d.) must fail the same
bound.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core import rejection
from speculax.core.sampling import SamplingConfig, probs
from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters import vocab_trim
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.lookup_first import LookupFirst
from speculax.drafters.medusa import Medusa
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.verifiers.tree import TreeVerifier

from test_hydra import random_params
from test_robustness import Faulty

V = 12
CFG = LlamaConfig(vocab_size=V, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                  d_ff=64, max_seq_len=64)
PROMPT = [3, 7, 1, 9]
ROWS = 6000
# Prompts pad to their own length: padded to the default bucket of 64, the 6000 rows' prefill did
# 16x the work (~2.5 of a test's ~4 s of running).
BUCKET = len(PROMPT)


@pytest.fixture(scope="module")
def models():
  target = llama.init_params(CFG, jax.random.key(1))
  # Scale the draft's embedding so its distribution is sharper than and different from p.
  draft = llama.init_params(CFG, jax.random.key(2))
  draft = {**draft, "embed": draft["embed"] * 3.0}
  return target, draft


def _exact(target, sampling):
  """p(x) [V] and the second-token marginal sum_x p(x) p(y | x) [V]."""
  seqs = jnp.array([PROMPT + [x] for x in range(V)])
  logits, _, _ = llama.forward_jit(target, CFG, seqs, jnp.broadcast_to(jnp.arange(5), (V, 5)))
  p_first = np.asarray(probs(logits[0, 3], sampling))
  p_next = np.asarray(probs(logits[:, 4], sampling))  # [V x, V y]
  return p_first, p_first @ p_next


def _tv(samples, exact):
  freq = np.bincount(samples, minlength=V) / len(samples)
  return 0.5 * np.abs(freq - exact).sum()


DRAFTERS = {"chain": DraftModel(CFG), "static-tree": DraftModel(CFG, StaticTree.full((3, 2))),
            "dynamic-tree": DraftModel(CFG, DynamicTree(width=3, depth=2, children=3)),
            "medusa-tree": Medusa(3, StaticTree.full((3, 2))),
            "eagle-tree": Eagle(tree=StaticTree.full((3, 2))),
            "eagle-adaptive": Eagle(stop_threshold=0.5),
            # Tokens read as the target's first layer's output, run on each draft.
            "eagle-shallow": Eagle(shallow_layers=1),
            "hydra-tree": Hydra(2, StaticTree.full((3, 2)), prefix_attention=True),
            # VocabTrim (q exactly zero outside the 6 kept ids) with Kangaroo's early exit.
            "trimmed-exit-chain": DraftModel(CFG, vocab_trim=6, exit_threshold=0.3),
            "eagle-trimmed-exit": Eagle(vocab_trim=6, exit_threshold=0.3),
            # Prompt lookup first: a first token seen in the prompt is continued by copying.
            "eagle-lookup-first": LookupFirst.of(Eagle(), 1),
            # Drafts from an int8 copy (q the copy's law): of the draft model, and of the target
            # with a layer skipped.
            "int8-chain": DraftModel(CFG, draft_dtype="int8"),
            "int8-layer-skip-tree": LayerSkip((1,), StaticTree.full((3, 2)), draft_dtype="int8")}
ORDER = np.array([7, 2, 11, 0, 5, 9, 1, 3, 4, 6, 8, 10], np.int32)  # a token frequency order


def _heads():
  """Random Medusa heads for CFG: their q differs from the target's p."""
  k1, k2 = jax.random.split(jax.random.key(5))
  return {"w": jax.random.normal(k1, (3, CFG.d_model, CFG.d_model)) * CFG.d_model ** -0.5,
          "b": jax.random.normal(k2, (3, CFG.d_model))}


def _eagle(target):
  """EAGLE params for CFG whose q differs from p, and whose acceptance head stops chains after
  1, 2 or 3 drafts depending on the drafted features."""
  k1, k2 = jax.random.split(jax.random.key(6))
  params = Eagle().init_params(CFG, k1)
  params["fc"] = params["fc"] + jax.random.normal(k1, params["fc"].shape) * 0.3
  params["layer"] = {**params["layer"], **{n: jax.random.normal(k2, params["layer"][n].shape) * 0.1
                                           for n in ("o", "down")}}
  params["accept"] = {"w": jax.random.normal(k2, (CFG.d_model,)), "b": jnp.asarray(1.0)}
  return params


def _run(target, draft, sampling, seed, drafter=DRAFTERS["chain"]):
  out = speculative_generate(target, CFG, [PROMPT] * ROWS, drafter,
                             SpecConfig(k=3, max_new_tokens=2, sampling=sampling,
                                        prompt_bucket=BUCKET),
                             drafter_params=draft, key=jax.random.key(seed))
  toks = np.array(out.tokens)
  return toks[:, 0], toks[:, 1]


# TV noise at 6000 draws over 12 cells is ~0.02; the planted bug moves the law by > 0.08.
BOUND = 0.045
# Temperatures share a loop program (a traced value), so one test runs both; top-p is its own.
SETTINGS = {"t0.7,t1.0": (SamplingConfig(temperature=0.7), SamplingConfig(temperature=1.0)),
            "top_p0.9": (SamplingConfig(temperature=1.0, top_p=0.9),)}


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("settings", list(SETTINGS))
def test_first_and_second_tokens_follow_target(models, settings, drafter):
  target, draft = models
  dparams = (_heads() if drafter.startswith("medusa") else
             _eagle(target) if drafter.startswith("eagle") else
             random_params(DRAFTERS[drafter], CFG) if drafter.startswith("hydra") else
             None if isinstance(DRAFTERS[drafter], LayerSkip) else draft)
  if DRAFTERS[drafter].vocab_trim:
    dparams = {**dparams, vocab_trim.IDS: ORDER}
  for sampling in SETTINGS[settings]:
    p1, p2 = _exact(target, sampling)
    first, second = _run(target, dparams, sampling, seed=0, drafter=DRAFTERS[drafter])
    tv = _tv(first, p1), _tv(second, p2)
    assert max(tv) < BOUND, (sampling, tv)
    assert np.all(p1[first] > 0) and np.all(p2[second] > 0), sampling  # nothing outside top-p


@pytest.mark.parametrize("drafter", [Faulty(DraftModel(CFG), (1,)),
                                     Faulty(DraftModel(CFG, StaticTree.full((3, 2))), (1, 4))],
                         ids=["chain", "static-tree"])
def test_out_of_vocab_drafts_keep_the_target_law(models, drafter):
  """Draft 1 of the chain (nodes 2 and 5 of the tree) are ids outside the vocabulary: the
  verifier stops there and the law is still the target's."""
  target, draft = models
  sampling = SamplingConfig(temperature=1.0)
  p1, p2 = _exact(target, sampling)
  first, second = _run(target, draft, sampling, seed=0, drafter=drafter)
  assert _tv(first, p1) < BOUND and _tv(second, p2) < BOUND


def test_planted_verifier_without_residual_fails(models, monkeypatch):
  """Resampling from p instead of normalize(max(0, p - q)) after a rejection is biased."""
  target, draft = models
  sampling = SamplingConfig(temperature=1.0)
  p1, p2 = _exact(target, sampling)
  monkeypatch.setattr(rejection, "residual", lambda p, q: p)
  jax.clear_caches()
  try:
    first, second = _run(target, draft, sampling, seed=0)
  finally:
    monkeypatch.undo()
    jax.clear_caches()
  assert max(_tv(first, p1), _tv(second, p2)) > BOUND


@dataclasses.dataclass(frozen=True)
class IidVerifiedDraftModel(DraftModel):
  """A draft model whose tree is verified as if siblings were i.i.d. draws (they are drawn
  without replacement): a planted bug, through the Verifier a drafter chooses."""

  def verifier(self):
    return TreeVerifier(self.tree, without_replacement=False)


def test_planted_tree_verifier_with_replacement_fails(models):
  """Siblings drawn without replacement, verified as if i.i.d. (q not reduced): biased."""
  target, draft = models
  sampling = SamplingConfig(temperature=1.0)
  p1, p2 = _exact(target, sampling)
  first, second = _run(target, draft, sampling, seed=0,
                       drafter=IidVerifiedDraftModel(CFG, StaticTree.full((3, 2))))
  assert max(_tv(first, p1), _tv(second, p2)) > BOUND
