"""Checkpointer: periodic saves, keep-N, finalized-only restore, exact resume, sharded restore."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from speculax.models.checkpoints import Checkpointer, finalized_steps
from speculax.models.sharding import MeshConfig, make_mesh

REPO = pathlib.Path(__file__).resolve().parents[1]
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # how orbax names a step it has not committed yet


def _state(scale: float = 1.0):
  return {
      "params": {"w": scale * jnp.arange(12.0).reshape(3, 4), "b": jnp.full((4,), scale)},
      "step": jnp.int32(7),
      "key": jax.random.key(3),
  }


def _assert_tree_equal(a, b):
  """Bitwise equality of two pytrees (typed keys compared by their key data)."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      assert jax.dtypes.issubdtype(y.dtype, jax.dtypes.prng_key)
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# -- bad input --------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(every=0, keep=1), dict(every=1, keep=0), dict(every=2.0, keep=1)])
def test_rejects_bad_every_keep(tmp_path, kw):
  name = "every" if kw["every"] != 1 else "keep"
  with pytest.raises(ValueError, match=name):
    Checkpointer(tmp_path / "c", **kw)


def test_restore_without_checkpoint_names_directory(tmp_path):
  with Checkpointer(tmp_path / "empty", every=1, keep=1) as ckpt:
    assert ckpt.latest_step() is None
    with pytest.raises(FileNotFoundError, match="no finalized checkpoint.*empty"):
      ckpt.restore(like=_state())


def test_mismatched_like_names_leaf_and_shapes(tmp_path):
  with Checkpointer(tmp_path, every=1, keep=1, async_save=False) as ckpt:
    ckpt.save(1, _state())
    bad_shape = _state()
    bad_shape["params"]["w"] = jnp.zeros((4, 4))
    with pytest.raises(ValueError, match=r"params/w: checkpoint shape \(3, 4\), like shape \(4, 4\)"):
      ckpt.restore(like=bad_shape)
    bad_tree = _state()
    del bad_tree["params"]["b"]
    bad_tree["params"]["extra"] = jnp.zeros(2)
    with pytest.raises(ValueError) as err:
      ckpt.restore(like=bad_tree)
    assert "params/extra: in like (2,) but not in the checkpoint" in str(err.value)
    assert "params/b: in the checkpoint (4,) but not in like" in str(err.value)
    bad_dtype = _state()
    bad_dtype["params"]["w"] = bad_dtype["params"]["w"].astype(jnp.bfloat16)
    with pytest.raises(ValueError, match="params/w: checkpoint dtype float32, like dtype bfloat16"):
      ckpt.restore(like=bad_dtype)
    with pytest.raises(FileNotFoundError, match="step 5"):
      ckpt.restore(5, like=_state())


def test_corrupt_checkpoint_names_the_step(tmp_path):
  # One leaf: with several, orbax's failed restore leaves sibling reads that
  # later hit its closed event loop (a harmless "Event loop is closed" warning).
  state = {"w": jnp.arange(6.0)}
  with Checkpointer(tmp_path, every=1, keep=2, async_save=False) as ckpt:
    ckpt.save(1, state)
    ckpt.save(2, state)
  (tmp_path / "1" / "default" / "_METADATA").write_text("{garbage")
  shutil.rmtree(tmp_path / "2" / "default" / "d")  # the array data
  with Checkpointer(tmp_path, every=1, keep=2) as ckpt:
    with pytest.raises(ValueError, match=f"checkpoint '{tmp_path / '1'}' is corrupt"):
      ckpt.restore(1, like=state)
    with pytest.raises(ValueError, match=f"checkpoint '{tmp_path / '2'}' is corrupt"):
      ckpt.restore(2, like=state)


# -- periodic saves and keep-N ----------------------------------------------------


def test_periodic_save_and_keep_n(tmp_path):
  with Checkpointer(tmp_path, every=2, keep=2) as ckpt:
    saved = [s for s in range(1, 10) if ckpt.save(s, _state(float(s)))]
    assert saved == [2, 4, 6, 8]  # no orbax "first call always saves" extra
    assert ckpt.save(9, _state(9.0), force=True)
    assert not ckpt.save(8, _state())  # not newer than the latest: skipped
    ckpt.wait()
    assert ckpt.all_steps() == [8, 9] == finalized_steps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["8", "9"]
    _assert_tree_equal(ckpt.restore(8, like=_state()), _state(8.0))
    _assert_tree_equal(ckpt.restore(like=_state()), _state(9.0))


# -- atomicity --------------------------------------------------------------------


def test_unfinished_save_is_ignored(tmp_path):
  """A step left as orbax leaves an interrupted save is neither latest nor restorable."""
  with Checkpointer(tmp_path, every=1, keep=5, async_save=False) as ckpt:
    ckpt.save(1, _state(1.0))
    ckpt.save(2, _state(2.0))
  # Step 3 as a kill just before orbax's commit leaves it: every byte written
  # (a copy of a good step, so only the commit marks it unfinished), still under
  # the tmp name, no commit file. Step 4 is a bare directory cut off at the start.
  shutil.copytree(tmp_path / "2", tmp_path / f"3{TMP_SUFFIX}")
  (tmp_path / f"3{TMP_SUFFIX}" / "commit_success.txt").unlink()
  (tmp_path / f"4{TMP_SUFFIX}" / f"default{TMP_SUFFIX}").mkdir(parents=True)
  with Checkpointer(tmp_path, every=1, keep=5) as ckpt:
    assert ckpt.latest_step() == 2
    _assert_tree_equal(ckpt.restore(like=_state()), _state(2.0))
    with pytest.raises(FileNotFoundError, match=f"step 3.*3{TMP_SUFFIX}"):
      ckpt.restore(3, like=_state())
    assert ckpt.save(3, _state(3.0))  # the retried save replaces the leftover
    ckpt.wait()
    assert ckpt.latest_step() == 3
    _assert_tree_equal(ckpt.restore(like=_state()), _state(3.0))


def test_failed_async_save_never_looks_latest(tmp_path, monkeypatch):
  """orbax's own manager reports an async step as latest before it commits; we don't."""
  ckpt = Checkpointer(tmp_path, every=1, keep=1)
  ckpt.save(1, _state(1.0))
  ckpt.wait()

  async def fail_commit(self):
    raise OSError("disk full (simulated)")

  monkeypatch.setattr(ocp.path.atomicity.AtomicRenameTemporaryPath, "finalize", fail_commit)
  assert ckpt.save(2, _state(2.0))
  assert ckpt.latest_step() == 1  # in flight or failed: not finalized either way
  with pytest.raises(RuntimeError, match="step 2.*disk full.*latest finalized step is 1"):
    ckpt.wait()
  assert ckpt.all_steps() == [1]  # keep=1 did not delete the good step for a failed one
  _assert_tree_equal(ckpt.restore(like=_state()), _state(1.0))
  monkeypatch.undo()
  assert ckpt.save(3, _state(3.0))
  ckpt.close()
  assert finalized_steps(tmp_path) == [3]


_KILLED_MID_SAVE = """
import os, sys
import jax.numpy as jnp
from speculax.models.checkpoints import Checkpointer
ckpt = Checkpointer(sys.argv[1], every=1, keep=3)
ckpt.save(1, {"w": jnp.full((1024, 1024), 1.0)})
ckpt.wait()
ckpt.save(2, {"w": jnp.full((1024, 1024), 2.0)})  # async: returns before the commit
os._exit(0)  # the process dies with the save in flight
"""


def test_process_killed_mid_save(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
  subprocess.run([sys.executable, "-c", _KILLED_MID_SAVE, str(tmp_path)], env=env, cwd=REPO,
                 check=True, capture_output=True, timeout=120)
  like = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}
  with Checkpointer(tmp_path, every=1, keep=3) as ckpt:
    latest = ckpt.latest_step()
    restored = ckpt.restore(like=like)["w"]
    # The kill can land before or after orbax creates step 2's tmp folder (a race), but an
    # unfinished step 2 left on disk must never count as the latest one.
    if (tmp_path / f"2{TMP_SUFFIX}").exists():
      assert latest == 1
    assert latest in (1, 2) and np.all(np.asarray(restored) == float(latest))


# -- exact resume -----------------------------------------------------------------

STEPS, BATCH = 8, 16
TX = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 3e-2, 2, STEPS), weight_decay=1e-2))


def _init_train_state(seed: int = 0):
  """Fresh state, committed to device 0 like restored arrays, so both runs share one executable."""
  rng = np.random.default_rng(seed)
  params = {"w1": 0.5 * rng.standard_normal((4, 8), np.float32), "b1": np.zeros(8, np.float32),
            "w2": 0.5 * rng.standard_normal((8, 1), np.float32), "b2": np.zeros(1, np.float32)}
  state = {"params": params, "opt_state": TX.init(params), "step": np.int32(0),
           "key": jax.random.key(seed)}
  return jax.device_put(state, jax.devices()[0])


@jax.jit
def _train_step(state):
  """One adamw step of a 2-layer MLP on freshly sampled data with dropout noise."""
  key, k_data, k_drop = jax.random.split(state["key"], 3)
  x = jax.random.normal(k_data, (BATCH, 4))
  y = jnp.sin(x.sum(-1, keepdims=True))

  def loss(p):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    h = h * jax.random.bernoulli(k_drop, 0.9, h.shape) / 0.9
    return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

  grads = jax.grad(loss)(state["params"])
  updates, opt_state = TX.update(grads, state["opt_state"], state["params"])
  return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
          "step": state["step"] + 1, "key": key}


def test_resume_is_bitwise_exact(tmp_path):
  straight = _init_train_state()
  for _ in range(STEPS):
    straight = _train_step(straight)

  state = _init_train_state()
  with Checkpointer(tmp_path, every=STEPS // 2, keep=2) as ckpt:
    for _ in range(STEPS // 2):
      state = _train_step(state)
      ckpt.save(int(state["step"]), state)
  del state  # nothing in memory survives: the rest comes from disk only

  like = jax.eval_shape(_init_train_state)
  with Checkpointer(tmp_path, every=STEPS // 2, keep=2) as ckpt:
    assert ckpt.latest_step() == STEPS // 2
    resumed = ckpt.restore(like=like)
  assert int(resumed["step"]) == STEPS // 2
  for _ in range(STEPS - STEPS // 2):
    resumed = _train_step(resumed)
  _assert_tree_equal(resumed, straight)
  assert _train_step._cache_size() == 1  # restored leaves match the fresh ones exactly


# -- sharded restore --------------------------------------------------------------


def test_restore_onto_mesh(tmp_path):
  mesh = make_mesh(MeshConfig(data=4, tensor=2))
  state = {"w": jnp.arange(32.0).reshape(8, 4), "b": jnp.arange(4.0),
           "keys": jax.random.split(jax.random.key(5), 8)}
  with Checkpointer(tmp_path, every=1, keep=1, async_save=False) as ckpt:
    ckpt.save(1, state)  # saved unsharded, from one device
  shardings = {"w": NamedSharding(mesh, P("data", "tensor")), "b": NamedSharding(mesh, P("tensor")),
               "keys": NamedSharding(mesh, P("data"))}
  like = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
  with Checkpointer(tmp_path, every=1, keep=1) as ckpt:
    restored = ckpt.restore(like=like)
    for name, sharding in shardings.items():
      assert restored[name].sharding.is_equivalent_to(sharding, restored[name].ndim), name
    _assert_tree_equal(restored, state)
    concrete = ckpt.restore(like=jax.device_put(state, shardings))  # arrays as `like` work too
    assert concrete["w"].sharding.is_equivalent_to(shardings["w"], 2)
    _assert_tree_equal(concrete, state)
