"""VocabTrim: drafters score only the target's most frequent tokens, and decoding stays lossless.

Greedy output equals the target's own for every drafter with an output layer (chain and tree);
the drafted tokens and the draft law q stay inside the kept set (q exactly zero outside); the
trimmed logits equal the full head's on the kept ids (tied and untied heads); the order saved
with a trained run comes back on load; bad input is refused naming the value. The sampling law
with trimmed drafters is checked in test_speculative_sampling.py.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.sampling import SamplingConfig
from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters import heads_io, registry, vocab_trim
from speculax.drafters.base import Drafter
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.medusa import Medusa
from speculax.models import llama
from speculax.models.derive import truncated
from speculax.train.experiment import warm_start
from speculax.train.heads import frozen_params

from test_hydra import random_params
from tiny_prompts import NEW, PROMPTS

N = 24  # kept tokens of the tiny model's 256
NAMES = ["draft-model", "draft-model-tree", "layer-skip", "layer-skip-tree", "medusa",
         "hydra-tree", "eagle", "eagle-tree"]  # _drafters' order


@pytest.fixture(scope="module")
def order(tiny, tiny_reference):
  """The tiny target's tokens by frequency in its own greedy answers."""
  return vocab_trim.frequency_order(tiny_reference, tiny[0].vocab_size)


def test_frequency_order_counts_ties_and_unseen():
  order = vocab_trim.frequency_order([[3, 3, 1], [1, 3, 5]], 6)
  np.testing.assert_array_equal(order, [3, 1, 5, 0, 2, 4])  # 3x3, 2x1, 1x5, then unseen by id
  with pytest.raises(ValueError, match="token id 6 is outside the vocabulary"):
    vocab_trim.frequency_order([[1, 6]], 6)


@pytest.mark.parametrize("tied", [True, False])
def test_trimmed_logits_are_the_heads_on_kept_ids(tiny, tied):
  cfg, params = tiny
  if not tied:
    cfg = dataclasses.replace(cfg, tie_embeddings=False)
    params = llama.init_params(cfg, jax.random.key(4))
  ids = np.array([200, 3, 17, 90], np.int32)
  h = jax.random.normal(jax.random.key(1), (2, 3, cfg.d_model))
  full = llama.lm_head(params, cfg, h)  # [2, 3, v]
  got = vocab_trim.trimmed_logits(vocab_trim.trimmed_head(params, cfg, ids), h, cfg.vocab_size)
  np.testing.assert_allclose(got[..., ids], full[..., ids], rtol=1e-5, atol=1e-5)
  outside = np.setdiff1d(np.arange(cfg.vocab_size), ids)
  assert np.all(np.isneginf(np.asarray(got)[..., outside]))


def _drafters(cfg, params):
  """(name, drafter, params) of every kind with an output layer, chain and tree."""
  draft = truncated(params, cfg, range(1))
  tree = StaticTree.full((3, 2))
  return [
      ("draft-model", DraftModel(draft[0]), draft[1]),
      ("draft-model-tree", DraftModel(draft[0], DynamicTree(width=3, depth=3, children=3)),
       draft[1]),
      ("layer-skip", LayerSkip.skipping(cfg.n_layers, (0,)), None),
      ("layer-skip-tree", LayerSkip.skipping(cfg.n_layers, (0,), tree), None),
      ("medusa", Medusa(3), random_params(Medusa(3), cfg)),
      ("hydra-tree", Hydra(2, tree), random_params(Hydra(2), cfg)),
      ("eagle", Eagle(), random_params(Eagle(), cfg)),
      ("eagle-tree", Eagle(tree=tree), random_params(Eagle(), cfg)),
  ]


@dataclasses.dataclass(frozen=True)
class Spy(Drafter):
  """Drafts as `drafter` and tallies, in its state, drafted tokens outside `kept` and the
  largest draft probability mass outside it."""
  drafter: Drafter
  kept: tuple[int, ...]

  @property
  def tree(self):
    return self.drafter.tree

  @property
  def hidden_layers(self):
    return self.drafter.hidden_layers

  def verifier(self):
    return self.drafter.verifier()

  def check(self, target, params, k):
    self.drafter.check(target, params, k)

  def prepare(self, params, target_params, target):
    return self.drafter.prepare(params, target_params, target)

  def init(self, params, view, config, max_len):
    return self.drafter.init(params, view, config, max_len), jnp.zeros((), jnp.int32), \
        jnp.zeros((), jnp.float32)

  def propose(self, params, state, view, key, config, k, sampling):
    inner, outside_tokens, outside_mass = state
    draft, inner, view = self.drafter.propose(params, inner, view, key, config, k, sampling)
    kept = jnp.zeros(config.vocab_size, bool).at[jnp.asarray(self.kept)].set(True)
    outside_tokens += (~kept[draft.tokens]).sum()
    if draft.probs is not None:
      outside_mass = jnp.maximum(outside_mass, jnp.where(kept, 0.0, draft.probs).sum(-1).max())
    return draft, (inner, outside_tokens, outside_mass), view

  def update(self, params, state, view, verified):
    return self.drafter.update(params, state[0], view, verified), *state[1:]


@pytest.mark.parametrize("i", range(len(NAMES)), ids=NAMES)
def test_trimmed_greedy_equals_target_and_drafts_stay_kept(tiny, tiny_reference, order, i):
  cfg, params = tiny
  _, drafter, dparams = _drafters(cfg, params)[i]
  drafter = dataclasses.replace(drafter, vocab_trim=N)
  dparams = {**(dparams or {}), vocab_trim.IDS: order}
  spy = Spy(drafter, tuple(int(t) for t in order[:N]))
  out = speculative_generate(params, cfg, PROMPTS[:4], spy, SpecConfig(k=3, max_new_tokens=NEW),
                             drafter_params=dparams)
  assert out.tokens == tiny_reference[:4]
  assert int(out.drafter_state[1]) == 0  # no drafted token outside the kept set
  assert out.step_tokens > out.row_steps  # some drafts were accepted: the trim is not a no-op


def test_trimmed_sampled_q_is_zero_outside_the_kept_set(tiny, order):
  cfg, params = tiny
  draft = truncated(params, cfg, range(1))
  drafter = DraftModel(draft[0], vocab_trim=N)
  spy = Spy(drafter, tuple(int(t) for t in order[:N]))
  out = speculative_generate(params, cfg, PROMPTS[:4], spy,
                             SpecConfig(k=3, max_new_tokens=NEW,
                                        sampling=SamplingConfig(temperature=1.0)),
                             drafter_params={**draft[1], vocab_trim.IDS: order})
  assert int(out.drafter_state[1]) == 0 and float(out.drafter_state[2]) == 0.0
  untrimmed = Spy(DraftModel(draft[0]), spy.kept)
  out = speculative_generate(params, cfg, PROMPTS[:4], untrimmed,
                             SpecConfig(k=3, max_new_tokens=NEW,
                                        sampling=SamplingConfig(temperature=1.0)),
                             drafter_params=draft[1])
  assert float(out.drafter_state[2]) > 0.01  # the spy sees mass outside when nothing is trimmed


def test_saved_order_round_trips_and_trims_on_load(tiny, order, tmp_path):
  cfg, _ = tiny
  heads = random_params(Medusa(3), cfg)
  heads_io.save_drafter(tmp_path, Medusa(3), heads, "tiny", cfg, 5, vocab_ids=order)
  drafter, loaded = registry.load(tmp_path, cfg, vocab_trim=N)
  assert drafter.vocab_trim == N
  np.testing.assert_array_equal(loaded[vocab_trim.IDS], order)
  untrimmed, _ = registry.load(tmp_path, cfg)
  assert untrimmed.vocab_trim == 0
  np.save(tmp_path / heads_io.ORDER, np.append(order[:-1], cfg.vocab_size))
  with pytest.raises(ValueError, match=rf"vocab_ids.npy holds token id {cfg.vocab_size}, outside"):
    registry.load(tmp_path, cfg)


def test_bfloat16_drafters_ship_small_and_decode_in_bfloat16(tiny, tiny_reference, order,
                                                             tmp_path):
  """A drafter stored in bfloat16 decodes in it beside a float32 target (its values exact there,
  half the bytes a draft step reads), its kept output rows too, and stays lossless; one stored in
  float32 keeps float32; a trainer starting from either gets float32."""
  cfg, params = tiny
  heads = random_params(Medusa(3), cfg)
  drafter = Medusa(3, vocab_trim=N)
  for dtype in ("float32", "bfloat16"):
    heads_io.save_drafter(tmp_path / dtype, drafter, heads, "tiny", cfg, 1, vocab_ids=order,
                          dtype=dtype)
  back, loaded = registry.load(tmp_path / "bfloat16", cfg)
  assert back.vocab_trim == N  # saved trimmed: loads trimmed
  for got, want in zip(jax.tree.leaves(without_ids(loaded)), jax.tree.leaves(heads)):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got, jnp.asarray(want).astype(jnp.bfloat16))
  assert back.prepare(loaded, params, cfg)[vocab_trim.TRIM]["rows"].dtype == jnp.bfloat16
  # the training path's kept rows (research/acceptance_gap.py scores drafts through it) alike
  frozen = frozen_params(back, without_ids(loaded), params, cfg, order)
  assert frozen[vocab_trim.TRIM]["rows"].dtype == jnp.bfloat16
  out = speculative_generate(params, cfg, PROMPTS[:4], back, SpecConfig(k=3, max_new_tokens=NEW),
                             drafter_params=loaded)
  assert out.tokens == tiny_reference[:4] and out.tau > 1
  _, wide = registry.load(tmp_path / "float32", cfg)
  assert {x.dtype for x in jax.tree.leaves(without_ids(wide))} == {jnp.dtype(jnp.float32)}
  assert back.prepare(wide, params, cfg)[vocab_trim.TRIM]["rows"].dtype == jnp.float32
  like = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), heads)
  started = warm_start(str(tmp_path / "bfloat16"), Medusa, like, cfg)
  assert {x.dtype for x in jax.tree.leaves(started)} == {jnp.dtype(jnp.float32)}
  size = lambda d: sum(f.stat().st_size for f in (tmp_path / d / heads_io.PARAMS).rglob("*")
                       if f.is_file())
  assert size("bfloat16") < 0.7 * size("float32")
  with pytest.raises(ValueError, match="dtype must be 'float32' or 'bfloat16', got 'int8'"):
    heads_io.save_drafter(tmp_path / "x", drafter, heads, "tiny", cfg, 1, order, dtype="int8")


def without_ids(params):
  return {k: v for k, v in params.items() if k != vocab_trim.IDS}


def test_bad_vocab_trim_input(tiny, order):
  cfg, params = tiny
  v = cfg.vocab_size
  with pytest.raises(ValueError, match=rf"vocab_trim={v + 1} must be in \[1, {v}\]"):
    registry.make("layer-skip", params, cfg, skip=(0,), vocab_trim=v + 1, vocab_ids=order)
  with pytest.raises(ValueError, match=rf"vocab_trim=0 must be in \[1, {v}\]"):
    registry.make("layer-skip", params, cfg, skip=(0,), vocab_trim=0, vocab_ids=order)
  with pytest.raises(ValueError, match="LayerSkip.vocab_trim must be an int >= 0, got -1"):
    LayerSkip((1,), vocab_trim=-1)
  with pytest.raises(ValueError, match=rf"holds token id {v}, outside the target's vocabulary"):
    registry.make("layer-skip", params, cfg, skip=(0,), vocab_trim=4,
                  vocab_ids=np.array([1, 2, 3, v]))
  with pytest.raises(ValueError, match="repeats token ids"):
    registry.make("layer-skip", params, cfg, skip=(0,), vocab_trim=2, vocab_ids=[1, 1, 2])
  with pytest.raises(ValueError, match="prompt-lookup takes no vocab_trim"):
    registry.make("prompt-lookup", params, cfg, vocab_trim=4, vocab_ids=order)
  with pytest.raises(ValueError, match="needs the target's token frequency order"):
    registry.make("layer-skip", params, cfg, skip=(0,), vocab_trim=4)
  # Straight into the decode loop: ids outside the vocabulary, or a tree wider than the trim.
  drafter = LayerSkip.skipping(cfg.n_layers, (0,), StaticTree.full((3, 2)))
  with pytest.raises(ValueError, match=r"holds token id -1, outside"):
    speculative_generate(params, cfg, [[1, 2]], dataclasses.replace(drafter, vocab_trim=2),
                         drafter_params={vocab_trim.IDS: np.array([-1, 4, 5])})
  with pytest.raises(ValueError, match="tree asks 3 candidates per node, more than the 2 tokens"):
    speculative_generate(params, cfg, [[1, 2]], dataclasses.replace(drafter, vocab_trim=2),
                         drafter_params={vocab_trim.IDS: order})
