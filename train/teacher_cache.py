"""Teacher outputs computed once and cached on disk, for distilling drafters off-policy.

    cache = build_teacher_cache("runs/teacher", params, config, tokens, top_k=32)  # [n, t] rows
    cache = TeacherCache.open("runs/teacher", vocab_size=drafter_config.vocab_size)
    cache = open_covering(folders, params, config, tokens, top_k=32, hidden_layers=())  # or None
    batch = cache.batch(rows)  # tokens [b, t], logprobs, ids [b, t, K], hidden [l, b, t, d]

Layout of the folder (tensorstore zarr v3 arrays, a file a shard of rows, each row compressed
apart in it so a batch of random rows decodes only those):
  meta.json      settings and fingerprints (model config, params, tokens), written atomically first
  progress.json  indices of finished shards, rewritten atomically after each shard
  tokens         [n, t] int32
  logprobs       [n, t, v] float32 full log-probs (top_k None), or [n, t, K] the top-k ones
  ids            [n, t, K] int32 token ids of the top-k log-probs (top_k only), descending
  hidden         [l, n, t, d] float32 hidden states (HF indexing, see llama.forward), if asked

A shard counts as done only once all its arrays are written and progress.json names it, so an
interrupted build resumes at the first unfinished shard and rewrites any half-written one.
Log-probs are of the raw logits (temperature 1); apply temperature at training time.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from tqdm.auto import tqdm

from speculax.core.jsonfile import read_json_object, write_json_atomic
from speculax.models import llama
from speculax.models.config import LlamaConfig

FORMAT = "speculax-teacher-cache-v1"
# Full log-probs are n * t * v floats: fine for tiny test vocabularies, not for real ones.
FULL_VOCAB_LIMIT = 4096
_META, _PROGRESS = "meta.json", "progress.json"
# The axis of each batch array that holds the rows (every other array: axis 0).
ROW_AXIS = {"hidden": 1}
# How each row is stored. A batch reads a few rows of many shards: with a whole shard one
# compressed chunk, 4 rows of SmolLM2's features decompressed 4 x 38 MB (0.2 s a batch).
_ROW_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}},
               {"name": "zstd", "configuration": {"level": 1}}]


# ----- building -----


def build_teacher_cache(path: str | pathlib.Path, params: Any, config: LlamaConfig,
                        tokens: np.ndarray, *, top_k: int | None = None,
                        hidden_layers: tuple[int, ...] = (), rows_per_shard: int = 64,
                        batch_size: int = 8, overwrite: bool = False,
                        reuse=()) -> TeacherCache:
  """Runs the target over token rows [n, t] and stores its outputs under `path`; resumable.

  Calling it again on the same folder with the same settings, params and tokens finishes the
  shards still missing (a no-op when complete); different ones raise unless `overwrite`.
  reuse: folders to read instead when one holds a finished cache of the same outputs with at
  least `hidden_layers` (open_covering); then nothing is built.
  """
  tokens = _checked_tokens(tokens, config)
  hidden_layers = _checked_layers(hidden_layers, config)
  _check_settings(config, tokens.shape, top_k, rows_per_shard, batch_size)
  path = pathlib.Path(path)
  meta = _meta(config, params, tokens, top_k, hidden_layers, rows_per_shard)
  if found := _covering(reuse, meta, config):
    return found
  _prepare_folder(path, meta, overwrite)
  arrays = _open_arrays(path, meta, create=True)
  done = _read_progress(path)
  todo = [s for s in range(_n_shards(meta)) if s not in done]
  for s in tqdm(todo, desc="teacher cache", unit="shard", disable=None):
    lo, hi = s * rows_per_shard, min((s + 1) * rows_per_shard, meta["n"])
    outputs = _shard_outputs(params, config, tokens[lo:hi], top_k, hidden_layers, batch_size)
    outputs["tokens"] = tokens[lo:hi]
    _write_rows(arrays, lo, hi, outputs)
    done.add(s)
    write_json_atomic(path / _PROGRESS, {"done_shards": sorted(done)})
  return TeacherCache.open(path, vocab_size=config.vocab_size)


def open_covering(folders, params: Any, config: LlamaConfig, tokens: np.ndarray, *,
                  top_k: int | None, hidden_layers: tuple[int, ...] = ()) -> TeacherCache | None:
  """The first complete cache among `folders` that the same target made from the same tokens
  and top_k, storing at least `hidden_layers`, read with those layers only; else None.

  So one cache serves every drafter of a corpus that needs no more features than it holds (a
  head drafter's cache also serves the draft model, which needs none) instead of a second pass
  of the target over the same rows.
  """
  tokens, hidden_layers = _checked_tokens(tokens, config), _checked_layers(hidden_layers, config)
  return _covering(folders, _meta(config, params, tokens, top_k, hidden_layers, 0), config)


def _covering(folders, want: dict, config: LlamaConfig) -> TeacherCache | None:
  """open_covering for the outputs `want` (a _meta) describes."""
  layout = {"hidden_layers", "rows_per_shard"}  # how the cache is stored, not what it holds
  for folder in map(pathlib.Path, folders):
    have = read_json_object(folder / _META) if (folder / _META).is_file() else {}
    if (any(have.get(k) != v for k, v in want.items() if k not in layout)
        or not set(want["hidden_layers"]) <= set(have["hidden_layers"])
        or _shards_done(folder, have) < _n_shards(have)):
      continue
    cache = TeacherCache.open(folder, vocab_size=config.vocab_size)
    return cache.with_layers(tuple(want["hidden_layers"]))
  return None


def _shard_outputs(params, config, tokens, top_k, hidden_layers, batch_size) -> dict:
  """Teacher outputs of one shard's rows, in batches padded to batch_size (one compile)."""
  parts = []
  for lo in range(0, len(tokens), batch_size):
    batch = tokens[lo:lo + batch_size]
    pad = batch_size - len(batch)
    padded = np.concatenate([batch, np.repeat(batch[-1:], pad, 0)]) if pad else batch
    out = _teacher_batch(params, config, padded, top_k, hidden_layers)
    parts.append({k: (v[:, :len(batch)] if k == "hidden" else v[:len(batch)])
                  for k, v in out.items()})
  merged = {k: np.concatenate([p[k] for p in parts], axis=1 if k == "hidden" else 0)
            for k in parts[0]}
  if not np.isfinite(merged["logprobs"]).all():
    raise ValueError("the teacher produced non-finite log-probs (NaN or inf in its logits); "
                     "check the params")
  return merged


def _teacher_batch(params, config, tokens, top_k, hidden_layers) -> dict[str, np.ndarray]:
  """One forward of the target over tokens [b, t], as host arrays (tests count these calls)."""
  return jax.tree.map(np.asarray, _teacher_outputs(params, config, jnp.asarray(tokens), top_k,
                                                   hidden_layers))


@functools.partial(jax.jit, static_argnames=("config", "top_k", "hidden_layers"))
def _teacher_outputs(params, config: LlamaConfig, tokens, top_k: int | None,
                     hidden_layers: tuple[int, ...]) -> dict[str, jax.Array]:
  """log_softmax and top-k run on the device: only [b, t, K] values travel to the host."""
  positions = llama.row_positions(*tokens.shape)
  logits, hidden, _ = llama.forward_jit(params, config, tokens, positions, None,
                                        hidden_layers=hidden_layers or (-1,))
  logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [b, t, v]
  out = {"logprobs": logprobs}
  if top_k is not None:
    values, ids = jax.lax.top_k(logprobs, top_k)  # [b, t, K], descending
    out = {"logprobs": values, "ids": ids.astype(jnp.int32)}
  if hidden_layers:
    out["hidden"] = hidden.astype(jnp.float32)  # [l, b, t, d]
  return out


# ----- validation and metadata -----


def _checked_tokens(tokens: Any, config: LlamaConfig) -> np.ndarray:  # [n, t] int32
  arr = np.asarray(tokens)
  if arr.ndim != 2 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"tokens must be a non-empty 2-D integer array [n, t], got shape "
                     f"{arr.shape} {arr.dtype}")
  bad = arr[(arr < 0) | (arr >= config.vocab_size)]
  if bad.size:
    raise ValueError(f"token id {int(bad[0])} is outside the vocabulary [0, {config.vocab_size})")
  if arr.shape[1] > config.max_seq_len:
    raise ValueError(f"rows of {arr.shape[1]} tokens exceed max_seq_len {config.max_seq_len}")
  return np.ascontiguousarray(arr, np.int32)


def _checked_layers(layers: Any, config: LlamaConfig) -> tuple[int, ...]:
  layers = tuple(int(i) for i in layers)
  for i in layers:
    if not -config.n_layers - 1 <= i <= config.n_layers:
      raise ValueError(f"hidden layer index {i} out of range for {config.n_layers} layers")
  return layers


def _check_settings(config, shape, top_k, rows_per_shard, batch_size) -> None:
  for name, value in (("rows_per_shard", rows_per_shard), ("batch_size", batch_size)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be an int >= 1, got {value!r}")
  v = config.vocab_size
  if top_k is None and v > FULL_VOCAB_LIMIT:
    gib = shape[0] * shape[1] * v * 4 / 2 ** 30
    raise ValueError(f"full log-probs over a vocabulary of {v} (> {FULL_VOCAB_LIMIT}) would take "
                     f"{gib:.2f} GiB for {shape[0]}x{shape[1]} tokens; pass top_k (e.g. 32)")
  if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                            or not 1 <= top_k <= v):
    raise ValueError(f"top_k must be an int in [1, {v}] or None, got {top_k!r}")


def _meta(config, params, tokens, top_k, hidden_layers, rows_per_shard) -> dict:
  """Everything that decides the cache's contents; a resumed build must match it exactly."""
  config_dict = json.loads(json.dumps(dataclasses.asdict(config)))
  return {
      "format": FORMAT, "n": tokens.shape[0], "t": tokens.shape[1],
      "vocab_size": config.vocab_size, "d_model": config.d_model, "top_k": top_k,
      "hidden_layers": list(hidden_layers), "rows_per_shard": rows_per_shard,
      "config": config_dict, "config_hash": _digest(json.dumps(config_dict, sort_keys=True)),
      "params_hash": params_fingerprint(params), "tokens_hash": _digest(tokens.tobytes()),
  }


def params_fingerprint(params: Any) -> str:
  """Hash of every param's path, shape, dtype and bytes: a resume with other weights is caught."""
  h = hashlib.blake2b(digest_size=16)
  for keypath, leaf in jax.tree_util.tree_leaves_with_path(params):
    arr = np.asarray(leaf)
    h.update(f"{jax.tree_util.keystr(keypath)}{arr.shape}{arr.dtype}".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
  return h.hexdigest()


def _digest(data: str | bytes) -> str:
  return hashlib.blake2b(data.encode() if isinstance(data, str) else data,
                         digest_size=16).hexdigest()


def _n_shards(meta: dict) -> int:
  return -(-meta["n"] // meta["rows_per_shard"])


# ----- files -----


def _prepare_folder(path: pathlib.Path, meta: dict, overwrite: bool) -> None:
  """Creates the folder and meta.json, or checks that an existing cache was built the same way."""
  if path.exists() and not path.is_dir():
    raise ValueError(f"teacher cache path {path} is a file, not a folder")
  is_cache = (path / _META).is_file()
  if path.is_dir() and any(path.iterdir()) and not is_cache:
    raise ValueError(f"{path} is not empty and holds no {_META}: not a teacher cache, "
                     "refusing to write into it")
  if is_cache and overwrite:
    shutil.rmtree(path)
    is_cache = False
  if is_cache:
    old = read_json_object(path / _META)
    diffs = [f"{k}: cache {old.get(k)!r} != now {meta[k]!r}" for k in meta if old.get(k) != meta[k]]
    if diffs:
      raise ValueError(f"teacher cache {path} was built with other settings ("
                       + "; ".join(diffs) + "); pass overwrite=True to rebuild it")
    return
  path.mkdir(parents=True, exist_ok=True)
  write_json_atomic(path / _META, meta)


def _array_specs(meta: dict) -> dict[str, tuple[list[int], list[int], str]]:
  """name -> (shape, chunk shape, dtype); a chunk is one shard of rows (one file)."""
  n, t, r = meta["n"], meta["t"], meta["rows_per_shard"]
  last = meta["vocab_size"] if meta["top_k"] is None else meta["top_k"]
  specs = {"tokens": ([n, t], [r, t], "int32"),
           "logprobs": ([n, t, last], [r, t, last], "float32")}
  if meta["top_k"] is not None:
    specs["ids"] = ([n, t, last], [r, t, last], "int32")
  if meta["hidden_layers"]:
    l, d = len(meta["hidden_layers"]), meta["d_model"]
    specs["hidden"] = ([l, n, t, d], [l, r, t, d], "float32")
  return specs


def _open_arrays(path: pathlib.Path, meta: dict, create: bool) -> dict[str, ts.TensorStore]:
  futures = {}
  for name, (shape, chunks, dtype) in _array_specs(meta).items():
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path / name)}}
    if create:  # a shard of rows a file, each row its own chunk in it (read alone)
      row = list(chunks)
      row[ROW_AXIS.get(name, 0)] = 1
      spec["metadata"] = {
          "shape": shape, "data_type": dtype,
          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
          "codecs": [{"name": "sharding_indexed", "configuration": {
              "chunk_shape": row, "codecs": _ROW_CODECS,
              "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                               {"name": "crc32c"}]}}]}
    futures[name] = ts.open(spec, create=create, open=True)
  try:
    arrays = {name: f.result() for name, f in futures.items()}
  except ValueError as e:  # tensorstore names the array's path in its message
    raise ValueError(f"teacher cache {path}: cannot open its arrays: {e}") from e
  for name, (shape, _, _) in _array_specs(meta).items():
    if list(arrays[name].shape) != shape:
      raise ValueError(f"teacher cache {path}: array {name} has shape {list(arrays[name].shape)}, "
                       f"{_META} says {shape}")
  return arrays


def _write_rows(arrays: dict[str, ts.TensorStore], lo: int, hi: int, outputs: dict) -> None:
  """Writes rows lo:hi of every array and waits until all are committed to disk."""
  futures = [arrays[k][:, lo:hi].write(v) if k == "hidden" else arrays[k][lo:hi].write(v)
             for k, v in outputs.items()]
  for f in futures:
    f.result()


def _shards_done(path: pathlib.Path, meta: dict) -> int:
  return len(_read_progress(path) & set(range(_n_shards(meta))))


def _read_progress(path: pathlib.Path) -> set[int]:
  file = path / _PROGRESS
  return set(read_json_object(file)["done_shards"]) if file.is_file() else set()


# ----- reading -----


@dataclasses.dataclass(frozen=True, eq=False)
class TeacherCache:
  """A finished teacher cache, read in training batches."""
  path: pathlib.Path
  meta: dict = dataclasses.field(repr=False)
  arrays: dict[str, ts.TensorStore] = dataclasses.field(repr=False)

  @classmethod
  def open(cls, path: str | pathlib.Path, *, vocab_size: int) -> TeacherCache:
    """Opens a complete cache whose vocabulary is `vocab_size` (the drafter's), else raises."""
    path = pathlib.Path(path)
    if not (path / _META).is_file():
      raise FileNotFoundError(f"no teacher cache at {path} (missing {path / _META})")
    meta = read_json_object(path / _META)
    if meta.get("format") != FORMAT:
      raise ValueError(f"{path / _META}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if meta["vocab_size"] != vocab_size:
      raise ValueError(f"teacher cache {path} has vocabulary size {meta['vocab_size']}, but the "
                       f"model it is opened for has vocabulary size {vocab_size}")
    done, total = _shards_done(path, meta), _n_shards(meta)
    if done < total:
      raise ValueError(f"teacher cache {path} is incomplete: {done} of {total} shards done; "
                       "run build_teacher_cache again with the same arguments to finish it")
    return cls(path, meta, _open_arrays(path, meta, create=False))

  @property
  def n(self) -> int:
    return self.meta["n"]

  @property
  def seq_len(self) -> int:
    return self.meta["t"]

  @property
  def vocab_size(self) -> int:
    return self.meta["vocab_size"]

  @property
  def top_k(self) -> int | None:
    return self.meta["top_k"]

  @property
  def hidden_layers(self) -> tuple[int, ...]:
    return tuple(self.meta["hidden_layers"])

  def __len__(self) -> int:
    return self.n

  def with_layers(self, hidden_layers: tuple[int, ...]) -> TeacherCache:
    """This cache read with only `hidden_layers` of its stored ones (none: no hidden array)."""
    stored = self.hidden_layers
    if missing := [i for i in hidden_layers if i not in stored]:
      raise ValueError(f"teacher cache {self.path} stores hidden layers {list(stored)}, not "
                       f"{missing}")
    arrays = {k: a for k, a in self.arrays.items() if k != "hidden"}
    if hidden_layers:
      arrays["hidden"] = self.arrays["hidden"][[stored.index(i) for i in hidden_layers]]
    meta = self.meta | {"hidden_layers": list(hidden_layers)}
    return dataclasses.replace(self, meta=meta, arrays=arrays)

  def batch(self, rows: Any) -> dict[str, np.ndarray]:
    """Rows (any order, repeats allowed) of every array: tokens [b, t], logprobs [b, t, v or K],
    ids [b, t, K] (top-k caches), hidden [l, b, t, d] (when stored)."""
    rows = np.asarray(rows)
    if rows.ndim != 1 or rows.size == 0 or not np.issubdtype(rows.dtype, np.integer):
      raise ValueError(f"rows must be a non-empty 1-D integer array, got shape {rows.shape} "
                       f"{rows.dtype}")
    bad = rows[(rows < 0) | (rows >= self.n)]
    if bad.size:
      raise ValueError(f"row {int(bad[0])} is outside the cache's {self.n} rows")
    unique, inverse = np.unique(rows, return_inverse=True)  # sorted reads touch fewer chunks
    futures = {k: (a[:, unique] if k == "hidden" else a[unique]).read()
               for k, a in self.arrays.items()}
    return {k: (f.result()[:, inverse] if k == "hidden" else f.result()[inverse])
            for k, f in futures.items()}
