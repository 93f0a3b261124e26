"""PEARL (decode/pearl.py): drafting while the target verifies, on one device or two.

Greedy output equals target-only decoding with a draft model that is sometimes right (a one-layer
cut) and one that is always right (the target itself, where every step after the first must be a
post-verify step keeping all k drafts: a draft cache out of step would break that); the two-device
form gives the one-device form's tokens draw for draw; the sampling law of the first four tokens
(prefill, a pre-verify step, then a post-verify step's ready draft and its drafted-while-verifying
one) is the target's.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_speculative_sampling as sampling_test
from test_bench import Bytes

from speculax import api
from speculax.core.sampling import SamplingConfig, probs
from speculax.core.trees import StaticTree
from speculax.decode import pearl
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.goodput import Goodput
from speculax.decode.pearl import draft_device, pearl_generate
from speculax.drafters import registry
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.registry import LoadedDrafter
from speculax.models import llama
from speculax.models.derive import truncated
from speculax.models.load import LoadedModel
from speculax.models.sharding import MeshConfig

from tiny_prompts import NEW, PROMPTS


@pytest.fixture(scope="module")
def cut(tiny):
  cfg, params = tiny
  return truncated(params, cfg, range(1))  # (config, params) of a one-layer draft model


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("devices", [1, 2])
def test_greedy_equals_target_only(tiny, tiny_reference, cut, k, devices):
  cfg, params = tiny
  draft_cfg, draft_params = cut
  out = pearl_generate(params, cfg, PROMPTS, DraftModel(draft_cfg),
                       SpecConfig(k=k, max_new_tokens=NEW), draft_params,
                       draft_device=jax.devices()[1] if devices == 2 else None)
  assert out.tokens == tiny_reference
  assert out.row_steps > 0 and 1.0 <= out.tau <= k


@pytest.mark.parametrize("devices", [1, 2])
def test_drafter_that_is_the_target_keeps_every_draft(tiny, devices):
  """k = 4, 21 new tokens, 4 rows: the prefill's token, one pre-verify step keeping its first
  draft, then post-verify steps of 4 tokens (the last cut to 3 by the budget)."""
  cfg, params = tiny
  out = pearl_generate(params, cfg, PROMPTS[:4], DraftModel(cfg),
                       SpecConfig(k=4, max_new_tokens=21), params,
                       draft_device=jax.devices()[1] if devices == 2 else None)
  assert out.new_tokens == 4 * 21 and out.forwards == 1 + 6
  assert out.row_steps == 4 * 6 and out.post_steps == 4 * 5
  np.testing.assert_array_equal(out.accepted_at, [24, 20, 20, 16])
  assert out.drafted == 4 * (1 + 5 * 4)
  assert out.tokens == generate(params, cfg, PROMPTS[:4], GenerateConfig(max_new_tokens=21)).tokens


@pytest.mark.parametrize("devices", [1, 2])
def test_the_target_drafting_from_its_int8_copy_keeps_its_output(tiny, tiny_reference, devices):
  """The draft model of all the target's layers is the target itself (its params, no cut), and
  with draft_dtype it drafts from an int8 copy made per call: output the target's, nearly
  every draft kept."""
  cfg, params = tiny
  loaded = registry.make("draft-model", params, cfg, draft_layers=cfg.n_layers,
                         draft_dtype="int8")
  assert loaded.params is params
  out = pearl_generate(params, cfg, PROMPTS, loaded.drafter, SpecConfig(k=4, max_new_tokens=NEW),
                       loaded.params, draft_device=jax.devices()[1] if devices == 2 else None)
  assert out.tokens == tiny_reference
  assert out.tau > 3


def test_two_devices_draw_like_one(tiny, cut):
  """Sampled, same key: the two forms run the same steps, so the same tokens."""
  cfg, params = tiny
  draft_cfg, draft_params = cut
  spec = SpecConfig(k=3, max_new_tokens=NEW, sampling=SamplingConfig(temperature=1.0))
  outs = [pearl_generate(params, cfg, PROMPTS, DraftModel(draft_cfg), spec, draft_params,
                         key=jax.random.key(3), draft_device=dev)
          for dev in (None, jax.devices()[1])]
  assert outs[0].tokens == outs[1].tokens
  assert outs[0].post_steps == outs[1].post_steps > 0


def test_two_device_warm_up_runs_both_windows(tiny, cut, monkeypatch):
  """The warm-up steps once with no drafts ready and once with every row's ready, so each
  window program (the pending token alone, the k-token window) compiles and first runs there,
  not in the timed run."""
  cfg, params = tiny
  draft_cfg, draft_params = cut
  sizes, real = [], pearl.two_device_loop

  def loop(*args):  # the target window's compiled programs before and after each loop run
    before = pearl._target_window._cache_size()
    out = real(*args)
    sizes.append((before, pearl._target_window._cache_size()))
    return out

  monkeypatch.setattr(pearl, "two_device_loop", loop)
  # a budget no other test uses: buffers of a new shape, so every window compiles here
  out = pearl_generate(params, cfg, PROMPTS[:2], DraftModel(draft_cfg),
                       SpecConfig(k=3, max_new_tokens=NEW + 3), draft_params,
                       draft_device=jax.devices()[1], warmup=True)
  assert out.post_steps > 0
  (b0, a0), (b1, a1), (b2, a2) = sizes  # warm-up: pre-verify, post-verify; then the timed run
  assert (a0 - b0, a1 - b1, a2 - b2) == (1, 1, 0)


def test_eos_and_budget_stop_like_target_only(tiny, tiny_reference, cut):
  cfg, params = tiny
  eos = tiny_reference[1][5]
  gen = generate(params, cfg, PROMPTS[:4], GenerateConfig(max_new_tokens=NEW, eos_ids=(eos,)))
  out = pearl_generate(params, cfg, PROMPTS[:4], DraftModel(cfg),
                       SpecConfig(k=3, max_new_tokens=NEW, eos_ids=(eos,)), params)
  assert out.tokens == gen.tokens and out.tokens[1][-1] == eos
  short = pearl_generate(params, cfg, PROMPTS[:4], DraftModel(cfg),
                         SpecConfig(k=3, max_new_tokens=NEW), params, new_tokens=7)
  assert short.tokens == [t[:7] for t in tiny_reference[:4]]


def _laws4(target, sampling):
  """Exact marginal laws [4, V] of the first four generated tokens after the prompt."""
  cfg, prompt, v = sampling_test.CFG, sampling_test.PROMPT, sampling_test.CFG.vocab_size
  grid = np.stack(np.meshgrid(*[np.arange(v)] * 3, indexing="ij"), -1).reshape(-1, 3)
  seqs = np.concatenate([np.broadcast_to(prompt, (len(grid), len(prompt))), grid], 1)
  t = seqs.shape[1]
  logits, _, _ = llama.forward_jit(target, cfg, jnp.asarray(seqs),
                                   jnp.broadcast_to(jnp.arange(t), seqs.shape))
  laws = np.asarray(probs(logits, sampling), np.float64)  # [v^3, t, v]
  joint = laws[0, t - 4]  # [x1] then extended by one token at a time
  marginals = [joint]
  for i in (3, 2, 1):  # the law after x1..x_j read at the sequences whose later tokens are 0
    step = laws[::v ** (i - 1), t - i].reshape((v,) * (4 - i) + (v,))
    joint = joint[..., None] * step
    marginals.append(joint.reshape(-1, v).sum(0))
  return np.stack(marginals)


def test_generated_tokens_follow_target():
  """k = 2, t = 1, 6000 rows of one prompt: token 1 from the prefill, 2 from a pre-verify step
  (its first draft or the correction), 3 and 4 from the next step: the ready draft, then the one
  drafted while the target verified, checked by the window's last logits. (Checking that one
  against the window's first logits instead read TV 0.067 at the 4th token against 0.016.)"""
  target = llama.init_params(sampling_test.CFG, jax.random.key(1))
  # q near p (most rows reach the post-verify step's last check) but not p: 1.2x sharper
  draft = {**target, "embed": target["embed"] * 1.2}
  sampling = SamplingConfig(temperature=1.0)
  exact = _laws4(target, sampling)
  cfg = sampling_test.CFG
  out = pearl_generate(target, cfg, [sampling_test.PROMPT] * sampling_test.ROWS, DraftModel(cfg),
                       SpecConfig(k=2, max_new_tokens=4, sampling=sampling,
                                  prompt_bucket=sampling_test.BUCKET), draft,
                       key=jax.random.key(0))
  toks = np.array(out.tokens)
  for i in range(4):
    assert sampling_test._tv(toks[:, i], exact[i]) < sampling_test.BOUND, i
  # Most rows reach the post-verify step's last check (a wrong column there moves the 4th law).
  assert out.accepted_at[1] > sampling_test.ROWS // 2, out.accepted_at


@pytest.mark.parametrize("drafter,spec,match", [
    (PromptLookup(), SpecConfig(k=3), "separate draft model"),
    ("tree", SpecConfig(k=3), "without a tree"),
    ("exit", SpecConfig(k=3), "exit_threshold=0.5"),
    ("chain", SpecConfig(k=3, goodput=Goodput()), "goodput="),
])
def test_settings_name_the_value(tiny, drafter, spec, match):
  cfg, params = tiny
  drafter = {"tree": DraftModel(cfg, StaticTree.full((2, 1))),
             "exit": DraftModel(cfg, exit_threshold=0.5),
             "chain": DraftModel(cfg)}.get(drafter, drafter)
  with pytest.raises(ValueError, match=match):
    pearl_generate(params, cfg, PROMPTS[:1], drafter, spec, params)


def test_draft_device_must_be_another(tiny):
  cfg, params = tiny
  with pytest.raises(ValueError, match="is the target's device"):
    pearl_generate(params, cfg, PROMPTS[:1], DraftModel(cfg), SpecConfig(k=2), params,
                   draft_device=jax.devices()[0])


def test_forms_name_the_value(monkeypatch):
  assert draft_device("one-device") is None and draft_device("two-device") == jax.devices()[1]
  with pytest.raises(ValueError, match="one of \\('one-device', 'two-device'\\), got 'three'"):
    draft_device("three")
  monkeypatch.setattr(pearl.jax, "devices", lambda: [jax.local_devices()[0]])
  with pytest.raises(ValueError, match="SPECULAX_CPU_DEVICES=2"):
    draft_device("two-device")


def test_api_pearl_equals_plain_speculation(tiny):
  model = LoadedModel(*tiny, Bytes())
  drafter = LoadedDrafter(DraftModel(tiny[0]), tiny[1])
  run = lambda **kw: api.speculate(model, PROMPTS[:2], drafter, k=3, max_new_tokens=12, **kw)
  plain, out = run(), run(pearl="two-device")
  assert out.tokens == plain.tokens and out.post_steps > 0 and "PEARL" in out.summary()
  with pytest.raises(ValueError, match="drop mesh="):
    run(pearl="one-device", mesh=MeshConfig(data=2))
