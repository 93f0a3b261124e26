"""Typical acceptance (verifiers/typical.py), the lossy rule: the bar against an independent
numpy computation, the token after a rejection drawn from p (not the lossless residual), greedy
output unchanged, and the run named lossy."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.sampling import SamplingConfig
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.verifiers.chain import verify_chain
from speculax.verifiers.typical import Typical

from tiny_prompts import NEW, PROMPTS

T1 = SamplingConfig(temperature=1.0)


def _bar(p, eps, alpha):  # numpy, from the formula
  h = -sum(x * np.log(x) for x in p if x > 0)
  return min(eps, alpha * np.exp(-h))


def test_bar_matches_the_formula():
  rule = Typical(posterior_threshold=0.09, posterior_alpha=0.3)
  laws = np.array([[0.25, 0.25, 0.25, 0.25],  # flat: bar 0.3 / 4 = 0.075, every token clears it
                   [0.97, 0.01, 0.01, 0.01],  # peaked: bar 0.09, only the top token clears it
                   [0.5, 0.45, 0.05, 0.0]], np.float32)
  p = jnp.asarray(np.repeat(laws[:, None], 4, 1))  # [3, 4, 4]: each row's law at 4 positions
  tokens = jnp.tile(jnp.arange(4, dtype=jnp.int32), (3, 1))  # draft i is token i
  got = np.asarray(rule.kept(p, tokens))
  want = np.array([[laws[r, i] > _bar(laws[r], 0.09, 0.3) for i in range(4)] for r in range(3)])
  np.testing.assert_array_equal(got, want)
  assert want[0].all() and want[1].tolist() == [True, False, False, False]


def test_after_a_rejection_the_token_follows_p():
  """A draft below the bar is rejected and the next token is drawn from p, so the rejected
  token itself comes out at its rate p(x); the lossless rule's residual never emits it."""
  rows = 20000
  law = jnp.array([0.6, 0.3, 0.06, 0.04])
  logits = jnp.broadcast_to(jnp.log(law), (rows, 2, 4))
  drafts = jnp.full((rows, 1), 2, jnp.int32)  # p = 0.06 < bar min(0.09, 0.3 e^-H) = 0.09
  q = jax.nn.one_hot(drafts, 4)
  key = jax.random.key(0)
  n, nxt = verify_chain(key, logits, drafts, q, T1, lossy=Typical())
  assert int(n.sum()) == 0
  freq = np.bincount(np.asarray(nxt), minlength=4) / rows
  np.testing.assert_allclose(freq, law, atol=0.012)
  n_lossless, lossless = verify_chain(key, logits, drafts, q, T1)
  rejected = np.asarray(n_lossless) == 0
  assert rejected.sum() > rows // 2 and not np.any(np.asarray(lossless)[rejected] == 2)


def test_greedy_output_is_the_targets(tiny, tiny_reference):
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, lossy=Typical())
  out = speculative_generate(params, cfg, PROMPTS, PromptLookup(), spec)
  assert out.tokens == [list(t) for t in tiny_reference]
  assert "LOSSY: typical acceptance" in out.summary() and out.metrics()["lossy"]


def test_sampled_run_keeps_more_and_says_lossy(tiny):
  """t = 1 on the tiny target: typical acceptance keeps drafts the lossless rule would often
  reject (prompt lookup's one-hot q accepts x with probability p(x) only)."""
  cfg, params = tiny
  spec = SpecConfig(k=3, max_new_tokens=NEW, sampling=T1)
  lossless = speculative_generate(params, cfg, PROMPTS, PromptLookup(), spec,
                                  key=jax.random.key(1))
  lossy = speculative_generate(params, cfg, PROMPTS, PromptLookup(),
                               SpecConfig(k=3, max_new_tokens=NEW, sampling=T1,
                                          lossy=Typical(0.01, 0.05)),
                               key=jax.random.key(1))
  assert lossless.lossy is None and "LOSSY" not in lossless.summary()
  assert lossy.tau > lossless.tau, (lossy.tau, lossless.tau)
  assert all(len(t) == NEW for t in lossy.tokens)


def test_trees_are_refused(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match="typical acceptance 0.09/0.3 \\(lossy\\) checks a chain"):
    speculative_generate(params, cfg, [[1, 2, 3]], TokenRecycling(),
                         SpecConfig(k=3, max_new_tokens=4, lossy=Typical()))
