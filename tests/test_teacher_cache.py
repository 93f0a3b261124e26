"""Teacher cache: values equal a direct forward, resume recomputes only unfinished shards."""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.models import llama
from speculax.train import teacher_cache
from speculax.train.teacher_cache import TeacherCache, build_teacher_cache

N, T = 7, 12  # 7 rows in shards of 3: the last shard is partial, batches of 2 get padded


@pytest.fixture(scope="module")
def tokens(tiny):
  cfg, _ = tiny
  return np.asarray(jax.random.randint(jax.random.key(1), (N, T), 0, cfg.vocab_size), np.int32)


LAYERS = (0, 1, -1)


@pytest.fixture(scope="module")
def direct(tiny, tokens):
  """Teacher log-probs [n, t, v] and hidden states [3, n, t, d] straight from llama.forward_jit."""
  cfg, params = tiny
  positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tokens.shape)
  logits, hidden, _ = llama.forward_jit(params, cfg, jnp.asarray(tokens), positions, None,
                                        hidden_layers=LAYERS)
  return np.asarray(jax.nn.log_softmax(logits, -1)), np.asarray(hidden)


def _top_k(logprobs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  ids = np.argsort(-logprobs, axis=-1, kind="stable")[..., :k]
  return np.take_along_axis(logprobs, ids, -1), ids


def _count_batches(monkeypatch) -> list[int]:
  calls = []
  real = teacher_cache._teacher_batch

  def counted(params, config, tokens, *args):
    calls.append(len(tokens))
    return real(params, config, tokens, *args)

  monkeypatch.setattr(teacher_cache, "_teacher_batch", counted)
  return calls


def _build(path, tiny, tokens, **kw):
  cfg, params = tiny
  kw = {"top_k": 4, "rows_per_shard": 3, "batch_size": 2, **kw}  # one compile for most tests
  return build_teacher_cache(path, params, cfg, tokens, **kw)


def test_top_k_and_hidden_match_forward(tiny, tokens, direct, tmp_path):
  cache = _build(tmp_path / "c", tiny, tokens, top_k=8, hidden_layers=LAYERS)
  assert (cache.n, cache.seq_len, cache.top_k, cache.hidden_layers) == (N, T, 8, LAYERS)
  values, ids = _top_k(direct[0], 8)
  rows = np.array([6, 0, 3, 3])  # unsorted, repeated, across shards
  got = cache.batch(rows)
  assert set(got) == {"tokens", "logprobs", "ids", "hidden"}
  np.testing.assert_array_equal(got["tokens"], tokens[rows])
  np.testing.assert_array_equal(got["ids"], ids[rows])
  np.testing.assert_allclose(got["logprobs"], values[rows], rtol=1e-5, atol=1e-5)
  assert got["hidden"].shape == (3, 4, T, tiny[0].d_model)
  np.testing.assert_allclose(got["hidden"], direct[1][:, rows], rtol=1e-5, atol=1e-5)
  for name, array in cache.arrays.items():  # a file a shard of 3 rows, each row read alone
    row = teacher_cache.ROW_AXIS.get(name, 0)
    layout = array.chunk_layout
    assert (layout.write_chunk.shape[row], layout.read_chunk.shape[row]) == (3, 1), name


def test_full_logprobs_match_forward(tiny, tokens, direct, tmp_path):
  cache = _build(tmp_path / "c", tiny, tokens, top_k=None)
  got = cache.batch(np.arange(N))
  assert set(got) == {"tokens", "logprobs"}
  assert got["logprobs"].shape == (N, T, tiny[0].vocab_size)
  np.testing.assert_allclose(got["logprobs"], direct[0], rtol=1e-5, atol=1e-5)


def test_resume_recomputes_only_unfinished_shards(tiny, tokens, direct, tmp_path, monkeypatch):
  path = tmp_path / "c"
  calls = _count_batches(monkeypatch)
  _build(path, tiny, tokens)
  assert calls == [2, 2, 2, 2, 2]  # shards of 3, 3, 1 rows; partial batches padded to 2
  # Interruption: shard 1 never made it into progress.json and its rows hold garbage.
  (path / "progress.json").write_text(json.dumps({"done_shards": [0, 2]}))
  with pytest.raises(ValueError, match="incomplete: 2 of 3 shards"):
    TeacherCache.open(path, vocab_size=tiny[0].vocab_size)
  arrays = teacher_cache._open_arrays(path, json.loads((path / "meta.json").read_text()), False)
  arrays["logprobs"][3:6].write(np.zeros((3, T, 4), np.float32)).result()
  calls.clear()
  cache = _build(path, tiny, tokens)
  assert calls == [2, 2]  # shard 1 only
  got = cache.batch(np.arange(N))
  np.testing.assert_allclose(got["logprobs"], _top_k(direct[0], 4)[0], rtol=1e-5, atol=1e-5)
  calls.clear()
  _build(path, tiny, tokens)
  assert calls == []  # complete: nothing to do


class _Crash(Exception):
  pass


def test_crash_mid_build_then_resume(tiny, tokens, direct, tmp_path, monkeypatch):
  path = tmp_path / "c"
  real = teacher_cache._teacher_batch
  calls, crash_at = [], [3]  # the first batch of shard 1

  def crashing(*args):
    calls.append(1)
    if len(calls) == crash_at[0]:
      raise _Crash
    return real(*args)

  monkeypatch.setattr(teacher_cache, "_teacher_batch", crashing)
  with pytest.raises(_Crash):
    _build(path, tiny, tokens)
  assert json.loads((path / "progress.json").read_text()) == {"done_shards": [0]}
  calls.clear()
  crash_at[0] = 0
  cache = _build(path, tiny, tokens)
  assert len(calls) == 3  # shard 1 (2 batches) and shard 2 (1 batch)
  np.testing.assert_array_equal(cache.batch(np.arange(N))["ids"], _top_k(direct[0], 4)[1])


def test_open_errors(tiny, tokens, tmp_path):
  path = tmp_path / "c"
  with pytest.raises(FileNotFoundError, match="no teacher cache"):
    TeacherCache.open(path, vocab_size=256)
  _build(path, tiny, tokens[:2])
  with pytest.raises(ValueError, match="vocabulary size 256.*vocabulary size 49152"):
    TeacherCache.open(path, vocab_size=49152)
  cache = TeacherCache.open(path, vocab_size=256)
  with pytest.raises(ValueError, match="row 2 is outside"):
    cache.batch([0, 2])


def test_build_errors(tiny, tokens, tmp_path):
  cfg, params = tiny
  path = tmp_path / "c"
  with pytest.raises(ValueError, match="full log-probs over a vocabulary of 8192"):
    build_teacher_cache(path, params, dataclasses.replace(cfg, vocab_size=8192), tokens)
  with pytest.raises(ValueError, match="top_k must be"):
    _build(path, tiny, tokens, top_k=0)
  with pytest.raises(ValueError, match="token id 256 is outside"):
    _build(path, tiny, np.full((1, 4), 256))
  with pytest.raises(ValueError, match="hidden layer index 3"):
    _build(path, tiny, tokens, hidden_layers=(3,))
  assert not path.exists()  # bad input is caught before anything is written
  _build(path, tiny, tokens[:2])
  with pytest.raises(ValueError, match="other settings.*top_k: cache 4 != now 3"):
    _build(path, tiny, tokens[:2], top_k=3)
  with pytest.raises(ValueError, match="tokens_hash"):
    _build(path, tiny, tokens[2:4])
  with pytest.raises(ValueError, match="params_hash"):
    build_teacher_cache(path, jax.tree.map(lambda x: x * 2, params), cfg, tokens[:2], top_k=4,
                        rows_per_shard=3, batch_size=2)
  assert _build(path, tiny, tokens[:2], rows_per_shard=1, overwrite=True).meta[
      "rows_per_shard"] == 1
  (tmp_path / "user").mkdir()
  (tmp_path / "user" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="not a teacher cache"):
    _build(tmp_path / "user", tiny, tokens, overwrite=True)
  assert (tmp_path / "user" / "notes.txt").read_text() == "mine"


def test_a_cache_serves_runs_that_need_fewer_features(tiny, tokens, direct, tmp_path):
  cfg, params = tiny
  path = _build(tmp_path / "c", tiny, tokens, hidden_layers=LAYERS).path
  cover = lambda folders, **kw: teacher_cache.open_covering(
      folders, params, cfg, tokens, **({"top_k": 4} | kw))
  rows = np.array([5, 1, 1])
  got = cover([tmp_path / "none", path]).batch(rows)  # a folder without a cache is passed over
  assert set(got) == {"tokens", "logprobs", "ids"}
  values, ids = _top_k(direct[0], 4)
  np.testing.assert_array_equal(got["ids"], ids[rows])
  np.testing.assert_allclose(got["logprobs"], values[rows], rtol=1e-5, atol=1e-5)
  some = cover([path], hidden_layers=(-1, 0))
  assert some.hidden_layers == (-1, 0)
  np.testing.assert_allclose(some.batch(rows)["hidden"], direct[1][[2, 0]][:, rows],
                             rtol=1e-5, atol=1e-5)
  # Other contents, or features it does not hold: not served.
  assert cover([path], top_k=8) is None
  assert cover([path], hidden_layers=(2,)) is None
  assert teacher_cache.open_covering([path], params, cfg, tokens[::-1], top_k=4) is None
  with pytest.raises(ValueError, match=r"stores hidden layers \[-1, 0\], not \[1\]"):
    some.with_layers((1,))
  (path / "progress.json").write_text(json.dumps({"done_shards": [0, 1]}))
  assert cover([path]) is None  # unfinished
