"""Host-side validation and packing of prompts, shared by every decode entry point.

JAX does not raise on bad values (ids outside the table are clamped), so everything is
checked here, before jit, with errors that name the bad value.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def check_prompt(prompt: Sequence[int], vocab_size: int, what: str = "prompt") -> np.ndarray:
  """A prompt's ids [T] int32, or a ValueError naming `what` ("prompt 3", "request 17")."""
  if isinstance(prompt, str):
    raise ValueError(f"{what} is a string; tokenize it first (got {prompt[:40]!r})")
  ids = np.asarray(prompt)
  if ids.ndim != 1 or ids.size == 0:
    raise ValueError(f"{what} is empty or not a flat list of token ids (shape {ids.shape})")
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"{what} holds non-integer values of dtype {ids.dtype}")
  bad = ids[(ids < 0) | (ids >= vocab_size)]
  if bad.size:
    raise ValueError(f"{what} has token id {int(bad[0])} outside the vocabulary [0, {vocab_size})")
  return ids.astype(np.int32)


def pack_prompts(prompts: Sequence[Sequence[int]], vocab_size: int,
                 bucket: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads prompts to one bucketed length. Returns tokens [b, T] int32 and lengths [b]."""
  if isinstance(prompts, (str, bytes)) or not len(prompts):
    raise ValueError("prompts must be a non-empty list of token-id lists")
  rows = [check_prompt(p, vocab_size, f"prompt {i}") for i, p in enumerate(prompts)]
  lengths = np.array([len(r) for r in rows], np.int32)
  tokens = np.zeros(compiled_shape(rows, bucket), np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  return tokens, lengths


def compiled_shape(prompts: Sequence[Sequence[int]], bucket: int) -> tuple[int, int]:
  """(rows, padded length) of a batch as pack_prompts lays it out: a decode loop compiles once
  per shape, so a caller warming up only new shapes keys them by this."""
  return len(prompts), round_up(max(map(len, prompts)), bucket)


def check_room(longest_prompt: int, max_new_tokens: int, max_seq_len: int, extra: int = 0) -> None:
  """The cache must hold the prompt, the new tokens and `extra` speculative slots."""
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
  need = longest_prompt + max_new_tokens + extra
  if need > max_seq_len:
    raise ValueError(
        f"prompt of {longest_prompt} tokens + {max_new_tokens} new tokens"
        + (f" + {extra} draft slots" if extra else "")
        + f" = {need} exceeds the model's max_seq_len {max_seq_len}")
