"""Periodic, atomic, resumable training checkpoints on top of orbax.

A thin wrapper over `orbax.checkpoint.CheckpointManager` that the trainers use.
It exists to pin down three things orbax leaves loose:

- What "latest" means. The manager's own `latest_step()` reports an async save
  as soon as it is *started*, so a save that later fails (or a process killed
  mid-save) can look latest. Here only FINALIZED steps count, judged from disk:
  orbax writes a step into `<step>.orbax-checkpoint-tmp/` and commits it as
  its very last act (an atomic rename on local/posix filesystems; a
  `commit_success.txt` file on GCS, where rename is not atomic). A directory
  counts only if its name is the bare step number and orbax's own
  `is_path_finalized` accepts it, so an interrupted save is never restored.
- Clear errors. Restoring into a `like` whose structure, shapes or dtypes
  differ from what was saved is checked against the saved metadata first and
  fails naming each mismatched leaf path with both shapes, instead of orbax's
  internal error text (or a silent cast).
- Many processes. In a jax.distributed run every process calls `save` and
  `restore` with the same steps (orbax coordinates the writes: each process
  writes the shards it holds, process 0 commits), on a directory all of them
  see. A checkpoint written by N processes restores in any other layout, one
  process included: the shardings come from `like`, never from the save.
- Typed PRNG keys. orbax stores plain arrays, so key leaves are saved as
  `jax.random.key_data` and rebuilt (same impl, same sharding) on restore from
  the key dtype of the matching `like` leaf.

Saving is periodic: `save(step, ...)` writes when `step % every == 0` (or
`force=True`) and the step is newer than every checkpoint already there, as in
orbax. Unlike orbax's default policy there is no extra "first call always
saves". `keep` newest finalized steps are kept; older ones are deleted only
after a newer save has committed.

Example (the trainer's loop)::

  state = init_state(key)
  with Checkpointer(run_dir / "ckpt", every=500, keep=3) as ckpt:
    if ckpt.latest_step() is not None:
      state = ckpt.restore(like=state)  # or like=jax.eval_shape(init_state, key)
    while int(state["step"]) < num_steps:
      state = train_step(state, next(batches))
      ckpt.save(int(state["step"]), state)
"""
from __future__ import annotations

import os
import re
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath  # orbax's path type
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

PyTree = Any

_STEP_NAME = re.compile(r"^(0|[1-9]\d*)$")
_TMP_SUFFIX = ocp.path.atomicity.TMP_DIR_SUFFIX  # ".orbax-checkpoint-tmp"
_MAX_LISTED = 8  # mismatches named in one error message


def finalized_steps(directory: str | os.PathLike) -> list[int]:
  """Steps under `directory` whose save committed, ascending; [] if none.

  Reads the disk every call (never a cache), so saves from other processes and
  failed async saves are seen as they are.
  """
  root = _as_path(directory)
  if not root.is_dir():
    return []
  steps = []
  for entry in root.iterdir():
    if _STEP_NAME.match(entry.name) and _is_committed(entry):
      steps.append(int(entry.name))
  return sorted(steps)


def _as_path(directory: str | os.PathLike) -> epath.Path:
  """orbax's own path type, so gs:// and other backends work like local paths."""
  return epath.Path(directory)


def _is_committed(path) -> bool:
  """orbax's own commit rule for this path (rename locally, commit file on GCS)."""
  return path.is_dir() and bool(ocp.path.step.is_path_finalized(path))


def _unfinished_names(root) -> list[str]:
  """Step directories left by saves that never committed (for error messages)."""
  if not root.is_dir():
    return []
  names = []
  for entry in root.iterdir():
    if _TMP_SUFFIX in entry.name or (_STEP_NAME.match(entry.name) and not _is_committed(entry)):
      names.append(entry.name)
  return sorted(names)


class Checkpointer:
  """Periodic (optionally async) saves of one training-state pytree per step.

  Args:
    directory: where the step directories live (created if missing).
    every: save when `step % every == 0`; must be >= 1.
    keep: how many newest finalized steps to keep; must be >= 1.
    async_save: write in a background thread; `save` returns once the arrays
      are copied off the device, so the caller may donate or overwrite them.
  """

  def __init__(self, directory: str | os.PathLike, *, every: int, keep: int,
               async_save: bool = True):
    _check_positive_int("every", every)
    _check_positive_int("keep", keep)
    where = os.fspath(directory)
    root = _as_path(where if "://" in where else os.path.abspath(where))  # orbax wants absolute
    if root.exists() and not root.is_dir():
      raise ValueError(f"checkpoint directory {os.fspath(root)!r} exists and is not a directory")
    self.directory = root
    self.every = every
    self.keep = keep
    self.async_save = async_save
    self._pending: int | None = None  # step of an async save not yet waited on
    self._closed = False
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=every, max_to_keep=keep,
        enable_async_checkpointing=async_save)
    self._mngr = ocp.CheckpointManager(
        root, options=options, item_handlers=ocp.StandardCheckpointHandler())

  # -- saving ---------------------------------------------------------------

  def save(self, step: int, state: PyTree, *, force: bool = False) -> bool:
    """Saves `state` as `step` if it is due (or `force`); returns whether it did.

    A due step that is not newer than the newest checkpoint on record is
    skipped (orbax's rule), so a resumed run never overwrites a checkpoint.
    Raises RuntimeError if an earlier async save failed.
    """
    self._check_open()
    _check_step(step)
    if not force and step % self.every != 0:
      return False
    if not force and not self._mngr.should_save(step):
      return False
    self.wait()  # surfaces a failed earlier save before starting another
    saved = self._mngr.save(step, args=ocp.args.StandardSave(_keys_to_data(state)), force=force)
    if saved and self.async_save:
      self._pending = step
    return bool(saved)

  def wait(self) -> None:
    """Blocks until async saves are committed; raises RuntimeError if one failed."""
    pending, self._pending = self._pending, None
    try:
      self._mngr.wait_until_finished()
    except Exception as e:  # orbax re-raises whatever the background thread hit
      self._mngr.reload()  # forget the failed step; only disk state counts
      raise RuntimeError(
          f"async checkpoint save of step {pending} under {os.fspath(self.directory)!r} "
          f"failed and was not committed ({type(e).__name__}: {e}); "
          f"the latest finalized step is {self.latest_step()}") from e

  # -- reading --------------------------------------------------------------

  def all_steps(self) -> list[int]:
    """Finalized steps on disk, ascending."""
    return finalized_steps(self.directory)

  def latest_step(self) -> int | None:
    """Newest finalized step on disk, or None. In-flight or failed saves don't count."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def restore(self, step: int | None = None, *, like: PyTree) -> PyTree:
    """Restores `step` (default: latest finalized) shaped, typed and sharded as `like`.

    `like` is a concrete or abstract pytree (e.g. `jax.eval_shape(init)`);
    leaves that carry a sharding (jax.Array, or jax.ShapeDtypeStruct with
    `sharding=`) are restored directly onto it, others onto the default
    device. Typed PRNG key leaves in `like` are rebuilt from the stored key
    data. Raises FileNotFoundError if the step is not a finalized checkpoint
    and ValueError if its contents do not match `like`.
    """
    self._check_open()
    self.wait()
    step = self._resolve_step(step)
    path = self.directory / str(step)
    saved = self._saved_leaves(step)
    expected = _expected_leaves(like)
    _check_match(saved, expected, path)
    target = jax.tree.map(_abstract_stored, like)
    try:
      restored = self._mngr.restore(step, args=ocp.args.StandardRestore(target))
    except Exception as e:  # tensorstore/orbax errors bury the step in a long spec
      raise ValueError(f"checkpoint {os.fspath(path)!r} is corrupt or unreadable: {_brief(e)}") from e
    return jax.tree.map(_data_to_key, like, restored)

  def _resolve_step(self, step: int | None) -> int:
    steps = self.all_steps()
    if step is None and steps:
      return steps[-1]
    if step is not None:
      _check_step(step)
      if step in steps:
        return step
    where = os.fspath(self.directory)
    unfinished = _unfinished_names(self.directory)
    note = f" (unfinished saves, ignored: {', '.join(unfinished)})" if unfinished else ""
    if step is None:
      raise FileNotFoundError(f"no finalized checkpoint in {where!r}{note}")
    raise FileNotFoundError(
        f"no finalized checkpoint for step {step} in {where!r}; finalized steps: {steps}{note}")

  def _saved_leaves(self, step: int) -> dict[tuple[str, ...], Any]:
    """Flat {path: value metadata} of what `step` holds, from its metadata only."""
    if step not in self._mngr.all_steps():
      self._mngr.reload()  # saved by another process after we opened
    path = os.fspath(self.directory / str(step))
    try:
      meta = self._mngr.item_metadata(step)
    except Exception as e:
      raise ValueError(f"checkpoint {path!r} is corrupt: its metadata cannot be read: {_brief(e)}") from e
    tree = getattr(meta, "tree", meta)  # TreeMetadata in current orbax, a dict in older
    if tree is None:
      raise FileNotFoundError(f"checkpoint {path!r} has no item metadata (orbax's _METADATA file)")
    is_leaf = lambda x: x is not None and not isinstance(x, (dict, list, tuple))
    return ocp.tree.to_flat_dict(tree, is_leaf=is_leaf)

  # -- lifecycle ------------------------------------------------------------

  def close(self) -> None:
    """Waits for pending saves (raising if one failed), then releases orbax."""
    if self._closed:
      return
    self._closed = True
    try:
      self.wait()
    finally:
      self._mngr.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.close()
      return
    try:  # already failing: don't let a save error hide the original one
      self.close()
    except Exception:
      pass

  def _check_open(self) -> None:
    if self._closed:
      raise ValueError(f"Checkpointer for {os.fspath(self.directory)!r} is closed")


# -- validation ---------------------------------------------------------------


def _check_positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"Checkpointer {name} must be an int >= 1, got {value!r}")


def _check_step(step: Any) -> None:
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
    raise ValueError(f"checkpoint step must be an int >= 0, got {step!r}")


def _brief(e: Exception, limit: int = 400) -> str:
  text = f"{type(e).__name__}: {e}"
  return text if len(text) <= limit else text[:limit] + " ..."


def _render(path: tuple[str, ...]) -> str:
  return "/".join(path) or "<root>"


def _expected_leaves(like: PyTree) -> dict[tuple[str, ...], tuple[tuple[int, ...], np.dtype]]:
  """Flat {path: (shape, dtype)} that `like` expects on disk (key leaves as key data)."""
  flat = ocp.tree.to_flat_dict(like)
  return {p: (tuple(a.shape), np.dtype(a.dtype)) for p, a in
          ((p, _stored_aval(x)) for p, x in flat.items())}


def _check_match(saved: dict, expected: dict, path) -> None:
  """Raises ValueError naming every leaf where the checkpoint and `like` disagree."""
  problems = []
  for p in sorted(expected.keys() - saved.keys()):
    problems.append(f"{_render(p)}: in like {expected[p][0]} but not in the checkpoint")
  for p in sorted(saved.keys() - expected.keys()):
    problems.append(f"{_render(p)}: in the checkpoint {tuple(saved[p].shape)} but not in like")
  for p in sorted(saved.keys() & expected.keys()):
    shape, dtype = expected[p]
    m = saved[p]
    got_shape = tuple(getattr(m, "shape", None) or ())
    got_dtype = getattr(m, "dtype", None)
    if got_shape != shape:
      problems.append(f"{_render(p)}: checkpoint shape {got_shape}, like shape {shape}")
    elif (got_dtype is not None and not isinstance(m, ocp.metadata.ScalarMetadata)
          and np.dtype(got_dtype) != dtype):
      problems.append(f"{_render(p)}: checkpoint dtype {np.dtype(got_dtype)}, like dtype {dtype}")
  if problems:
    more = len(problems) - _MAX_LISTED
    listed = "\n  ".join(problems[:_MAX_LISTED]) + (f"\n  ... and {more} more" if more > 0 else "")
    raise ValueError(f"checkpoint {os.fspath(path)!r} does not match `like`:\n  {listed}")


# -- typed PRNG keys and abstract targets -------------------------------------


def _is_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _keys_to_data(tree: PyTree) -> PyTree:
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _stored_aval(x: Any) -> jax.ShapeDtypeStruct:
  """Shape and dtype of `x` as stored on disk (key leaves become uint32 key data)."""
  if _is_key(x):
    return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
  if hasattr(x, "shape") and hasattr(x, "dtype"):  # jax/np arrays, ShapeDtypeStruct
    return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
  a = np.asarray(x)
  return jax.ShapeDtypeStruct(a.shape, a.dtype)


def _target_sharding(x: Any, ndim: int) -> jax.sharding.Sharding:
  """Where leaf `x` should land; key data gets the key's sharding plus replicated trailing dims."""
  sharding = getattr(x, "sharding", None)
  if sharding is None:  # this process's own first device (jax.devices()[0] is process 0's)
    return SingleDeviceSharding(jax.local_devices()[0])
  if isinstance(sharding, NamedSharding) and len(sharding.spec) != ndim:
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return NamedSharding(sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind)
  return sharding


def _abstract_stored(x: Any) -> jax.ShapeDtypeStruct:
  aval = _stored_aval(x)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=_target_sharding(x, len(aval.shape)))


def _key_impl(x: Any):
  if isinstance(x, jax.Array):
    return jax.random.key_impl(x)
  impl = getattr(x.dtype, "_impl", None)  # jax.random.key_impl rejects ShapeDtypeStruct
  if impl is None:
    raise ValueError(f"cannot tell the PRNG impl of key dtype {x.dtype}; pass a concrete key in `like`")
  return impl


def _data_to_key(like_leaf: Any, restored: Any) -> Any:
  if not _is_key(like_leaf):
    return restored
  return jax.random.wrap_key_data(restored, impl=_key_impl(like_leaf))
