"""VocabTrim (Goel et al. 2025): a drafter scores only the N tokens the target emits most often.

A draft step's output layer is a [v, d] matmul (SmolLM2: 49152 x 576, a fifth of the target's
weights); most of those rows are tokens the target almost never writes. A trimmed drafter
multiplies by the kept rows only ([N, d], gathered once per decode call from whichever output
layer it scores with: the target's for head drafters and layer skip, its own for a draft model)
and puts -inf everywhere else, so its law q is exactly zero outside the kept set and the
verifier stays lossless (it only ever needs q of the drafted tokens and max(0, p - q)).

The kept ids are a frequency order of the whole vocabulary (most frequent first; unseen tokens
last, by id), made once from the target's own generations on a corpus; N is a decode-time
setting that takes its first N. Dims: v vocab, n kept tokens, d model.
"""
from __future__ import annotations

from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np

from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.models.tables import table_dot

IDS = "vocab_ids"  # raw drafter params: the frequency order [v] int32
TRIM = "vocab_trim"  # prepared drafter params: {"ids": [n] int32, "rows": [n, d]}


def frequency_order(token_ids: Iterable, vocab_size: int) -> np.ndarray:
  """[v] int32 every token id, most frequent in `token_ids` (sequences of ids) first; ties and
  unseen tokens by id."""
  counts = np.zeros(vocab_size, np.int64)
  for seq in token_ids:
    seq = np.asarray(seq, np.int64).ravel()
    if seq.size and (seq.min() < 0 or seq.max() >= vocab_size):
      bad = seq[(seq < 0) | (seq >= vocab_size)][0]
      raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    counts += np.bincount(seq, minlength=vocab_size)
  return np.argsort(-counts, kind="stable").astype(np.int32)


def check_order(order, vocab_size: int, n: int, where: str = "vocab_ids") -> np.ndarray:
  """The order as int32 [m], checked: distinct integer ids in [0, vocab_size), at least n of
  them, 1 <= n <= vocab_size. Raises ValueError naming the bad value."""
  if not 1 <= n <= vocab_size:
    raise ValueError(f"vocab_trim={n} must be in [1, {vocab_size}] (the vocabulary size)")
  arr = np.asarray(order)
  if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"{where} must be a 1-D array of integer token ids, got shape "
                     f"{arr.shape} of {arr.dtype}")
  bad = arr[(arr < 0) | (arr >= vocab_size)]
  if bad.size:
    raise ValueError(f"{where} holds token id {int(bad[0])}, outside the target's vocabulary "
                     f"[0, {vocab_size})")
  if len(np.unique(arr)) != len(arr):
    raise ValueError(f"{where} repeats token ids")
  if len(arr) < n:
    raise ValueError(f"vocab_trim={n} needs {n} ordered ids, but {where} holds {len(arr)}")
  return arr.astype(np.int32)


def trimmed_head(head_params, config: LlamaConfig, ids: np.ndarray, dtype=None) -> dict:
  """The kept rows of an output layer (the embedding when tied): {"ids": [n], "rows": [n, d]},
  in `dtype` (None: the layer's; a bfloat16 drafter reads the float32 target's rows in its own
  precision). Host-side, once per decode call; no new parameters."""
  ids = jnp.asarray(np.sort(ids))
  rows = jnp.take(llama.output_table(head_params, config), ids, axis=0)
  return {"ids": ids, "rows": rows if dtype is None else rows.astype(dtype)}


def trimmed_logits(trim: dict, features: jax.Array, vocab_size: int | None = None) -> jax.Array:
  """Final-normed features [..., d] -> logits [..., v] float32, -inf outside the kept ids; with
  no vocab_size, the kept ids' logits alone [..., n] (training, which scores in that space)."""
  kept = table_dot(features, trim["rows"]).astype(jnp.float32)
  return kept if vocab_size is None else full_vocabulary(trim, kept, vocab_size)


def full_vocabulary(trim: dict, kept: jax.Array, vocab_size: int) -> jax.Array:
  """The kept ids' logits [..., n] placed in the whole vocabulary [..., v], -inf elsewhere (so q
  is exactly zero outside the kept ids)."""
  full = jnp.full((*kept.shape[:-1], vocab_size), -jnp.inf, jnp.float32)
  return full.at[..., trim["ids"]].set(kept.astype(jnp.float32))
