"""Training data from real local sources: source files, packed token rows, self-distillation.

Sources that work offline: the Python standard library's own .py files (`stdlib_files`), any
user folder of text (`text_files`), and answers the target itself writes to prompts made from
that text (`self_distill`, the off-policy data of DistillSpec / FastDraft).

Held-out data stays held out: files split by a hash of their path (`split_files`), so a file's
side never depends on which other files are present; training prompts are checked against the
HumanEval evaluation prompts (`check_no_overlap`). Minibatch order is a pure function of
(seed, epoch, step), so a trainer resumed mid-epoch sees the batches it would have seen.

Dims: n rows, t tokens per row, b batch.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import os
import pathlib
import re
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

# Folders of the standard library that are not library source: its test suites and third-party
# packages installed next to it.
_STDLIB_SKIP = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages",
                          "__pycache__"})

# ----- files -----


def stdlib_root() -> pathlib.Path:
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(limit: int | None = None) -> list[pathlib.Path]:
  """The standard library's .py files (tests and site-packages excluded), sorted by path."""
  root = stdlib_root()
  files = []
  for folder, subfolders, names in os.walk(root):
    subfolders[:] = [d for d in subfolders if d not in _STDLIB_SKIP]  # never walk into them
    files += [pathlib.Path(folder, n) for n in names if n.endswith(".py")]
  files.sort()
  if not files:
    raise ValueError(f"no standard-library .py files found under {root}")
  return files if limit is None else files[:_positive(limit, "limit")]


def text_files(folder: str | pathlib.Path, pattern: str = "*.py") -> list[pathlib.Path]:
  """Files matching `pattern` anywhere under `folder`, sorted by path."""
  folder = pathlib.Path(folder)
  if not folder.is_dir():
    raise FileNotFoundError(f"data folder not found: {folder}")
  files = sorted(p for p in folder.rglob(pattern) if p.is_file())
  if not files:
    raise ValueError(f"no files matching {pattern!r} under data folder {folder}")
  return files


def read_texts(files: Iterable[str | pathlib.Path]) -> Iterator[str]:
  """File contents as text, lazily (bytes that are not UTF-8 become U+FFFD)."""
  for f in files:
    yield pathlib.Path(f).read_bytes().decode("utf-8", errors="replace")


def split_files(files: Sequence[str | pathlib.Path], heldout_fraction: float, seed: int = 0,
                root: str | pathlib.Path | None = None
                ) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
  """(train, heldout): each file's side is fixed by a hash of (seed, its relative path).

  Hashing instead of shuffling keeps a file on its side whatever else is in the list (a larger
  `limit`, a new file), so held-out files never leak into training across runs. The path is
  taken relative to `root`, else to the standard library when the file is in it (the same split
  on every machine), else it is the absolute path. The held-out share is `heldout_fraction`
  only on average.
  """
  if not 0 <= heldout_fraction < 1:
    raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
  train, heldout = [], []
  for f in map(pathlib.Path, files):
    (heldout if unit_hash(seed, _relative(f, root)) < heldout_fraction else train).append(f)
  return train, heldout


def _relative(path: pathlib.Path, root: str | pathlib.Path | None = None) -> str:
  """The path that names a file in hashes: relative to root, else to the stdlib, else absolute."""
  if root is not None:
    if not path.is_relative_to(root):
      raise ValueError(f"{path} is not under root {root}")
    return path.relative_to(root).as_posix()
  std = stdlib_root()
  return path.relative_to(std).as_posix() if path.is_relative_to(std) else path.resolve().as_posix()


def unit_hash(seed: int, key: str) -> float:
  """A number in [0, 1) fixed by (seed, key)."""
  digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
  return int.from_bytes(digest[:8], "little") / 2.0 ** 64


# ----- packing -----


def pack_ids(docs: Iterable[Sequence[int]], seq_len: int, *, sep: int, bos: int | None = None,
             max_rows: int | None = None) -> np.ndarray:  # [n, seq_len] int32
  """Packs documents as one stream `[bos] doc sep [bos] doc sep ...` cut into rows of seq_len.

  Rows cross document boundaries (the separator tells the model where one ends); the tail that
  does not fill a row is dropped. `bos` is not added again when a document already starts with
  it, nor `sep` when it already ends with it.
  """
  return pack_docs(docs, seq_len, sep=sep, bos=bos, max_rows=max_rows)[0]


def pack_docs(docs: Iterable[Sequence[int]], seq_len: int, *, sep: int, bos: int | None = None,
              max_rows: int | None = None,
              context: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """`pack_ids`'s rows [n, seq_len] int32 and their loss mask [n, seq_len] float32.

  mask[r, i] is 1 when the token after position i is one to learn, 0 when it is context only:
  the first context[d] tokens of document d (a chat-templated prompt before the target's answer;
  with the bos added before them) are context, every other token and separator is learned.
  Position i carries the law of token i + 1 (the teacher cache's alignment), hence the shift.
  """
  if seq_len < 2:
    raise ValueError(f"seq_len must be >= 2 (an input and a next-token target), got {seq_len}")
  if max_rows is not None:
    _positive(max_rows, "max_rows")
  want = None if max_rows is None else max_rows * seq_len
  skips = iter(context) if context is not None else None
  stream: list[int] = []
  learned: list[bool] = []  # per stream token: learned (True) or context only
  for d, doc in enumerate(docs):
    doc = list(doc)
    skip = 0 if skips is None else next(skips, None)
    if skip is None or not 0 <= skip <= len(doc):
      raise ValueError(f"context must give each document a count in [0, its {len(doc)} tokens], "
                       f"got {skip} for document {d}")
    if bos is not None and doc[:1] != [bos]:
      stream.append(bos)
      learned.append(skip == 0)
    stream += doc
    learned += [i >= skip for i in range(len(doc))]
    if doc[-1:] != [sep]:  # a self-distilled answer may already end with it
      stream.append(sep)
      learned.append(True)
    if want is not None and len(stream) >= want:
      break
  n = len(stream) // seq_len if want is None else min(len(stream), want) // seq_len
  if n == 0:
    raise ValueError(f"only {len(stream)} tokens of text, fewer than one row of seq_len={seq_len}")
  size = n * seq_len
  after = learned[1:size + 1] + [True] * (size + 1 - len(learned))  # the stream's end: learned
  return (np.asarray(stream[:size], np.int32).reshape(n, seq_len),
          np.asarray(after, np.float32).reshape(n, seq_len))


def pack_sequences(tokenizer: Any, texts: Iterable[str], seq_len: int, *, bos: int | None = None,
                   sep: int | None = None, max_rows: int | None = None) -> np.ndarray:
  """Tokenizes texts (lazily: stops once max_rows are full) and packs them (see `pack_ids`).

  The separator is the tokenizer's EOS unless `sep` is given: a drafter trained on packed rows
  then sees the same end-of-document token the target emits.
  """
  sep = tokenizer.eos_id if sep is None else sep
  if sep is None:
    raise ValueError(f"tokenizer {tokenizer.source} has no EOS id; pass sep= explicitly")
  for name, i in (("sep", sep), ("bos", bos)):
    if i is not None and not 0 <= i < tokenizer.vocab_size:
      raise ValueError(f"{name} id {i} is outside the vocabulary [0, {tokenizer.vocab_size})")
  docs = (tokenizer.encode(text) for text in texts if text)
  return pack_ids(docs, seq_len, sep=sep, bos=bos, max_rows=max_rows)


# ----- minibatches -----


def steps_per_epoch(n: int, batch_size: int) -> int:
  """Full batches per epoch; the n % batch_size rows left over differ from epoch to epoch."""
  _positive(batch_size, "batch_size")
  if batch_size > n:
    raise ValueError(f"batch_size {batch_size} exceeds the {n} rows of data")
  return n // batch_size


def epoch_rows(n: int, batch_size: int, *, seed: int, epoch: int) -> np.ndarray:
  """Row indices of every batch of one epoch [steps, batch_size], a function of (seed, epoch)."""
  if epoch < 0:
    raise ValueError(f"epoch must be >= 0, got {epoch}")
  steps = steps_per_epoch(n, batch_size)
  order = np.random.default_rng([seed, epoch]).permutation(n)
  return order[:steps * batch_size].reshape(steps, batch_size)


def batch_rows(n: int, batch_size: int, step: int, *, seed: int) -> np.ndarray:  # [batch_size]
  """Rows of global training step `step` (epochs follow one another): what a resumed run needs."""
  if step < 0:
    raise ValueError(f"step must be >= 0, got {step}")
  epoch, i = divmod(step, steps_per_epoch(n, batch_size))
  return epoch_rows(n, batch_size, seed=seed, epoch=epoch)[i]


def batches(array: np.ndarray, batch_size: int, *, seed: int, epoch: int,
            start_step: int = 0) -> Iterator[np.ndarray]:
  """Shuffled full minibatches [batch_size, t] of one epoch, from step `start_step` on."""
  if np.ndim(array) != 2:
    raise ValueError(f"batches takes a 2-D array [n, t], got shape {np.shape(array)}")
  rows = epoch_rows(len(array), batch_size, seed=seed, epoch=epoch)
  if not 0 <= start_step <= len(rows):
    raise ValueError(f"start_step {start_step} outside the epoch's {len(rows)} steps")
  for r in rows[start_step:]:
    yield array[r]


def _positive(value: int, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
    raise ValueError(f"{name} must be an int >= 1, got {value!r}")
  return int(value)


# ----- prompts -----


@dataclasses.dataclass(frozen=True)
class PromptSets:
  train: list[str]  # instructions made from local source files
  heldout: list[str]  # HumanEval prompts, for evaluation only


def prompt_sets(files: Sequence[str | pathlib.Path] | None = None, *, limit: int | None = None,
                max_chars: int = 1500, seed: int = 0, ngram: int = 13) -> PromptSets:
  """Training prompts from the functions of `files` (default: the stdlib's training split).

  Dropped from training: functions named like a HumanEval entry point, and prompts sharing a
  run of `ngram` words with a HumanEval prompt (the contamination test of GPT-3's paper).
  """
  from speculax.models import assets
  heldout = assets.humaneval_prompts()
  if files is None:
    files = split_files(stdlib_files(), 0.1, seed=0)[0]
  banned = {m for p in heldout for m in re.findall(r"def\s+(\w+)\s*\(", p)}
  grams = _ngrams_of(heldout, ngram)
  train = []
  for name, prompt in function_prompts(files, max_chars=max_chars, seed=seed):
    if name not in banned and not grams & _ngrams(prompt, ngram):
      train.append(prompt)
      if limit is not None and len(train) >= limit:
        break
  check_no_overlap(train, heldout, ngram)
  return PromptSets(train=train, heldout=heldout)


def check_no_overlap(train: Sequence[str], heldout: Sequence[str], ngram: int = 13) -> None:
  """Raises if a training prompt equals or shares `ngram` consecutive words with a held-out one."""
  grams = _ngrams_of(heldout, ngram)
  exact = set(heldout)
  for i, p in enumerate(train):
    shared = grams & _ngrams(p, ngram)
    if p in exact or shared:
      what = " ".join(next(iter(shared))) if shared else "the whole prompt"
      raise ValueError(f"training prompt {i} overlaps the held-out prompts ({what!r}): {p[:80]!r}")


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
  words = re.findall(r"\w+", text.lower())
  return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _ngrams_of(texts: Iterable[str], n: int) -> set[tuple[str, ...]]:
  return set().union(*(_ngrams(t, n) for t in texts))


def function_prompts(files: Sequence[str | pathlib.Path], *, max_chars: int = 1500,
                     seed: int = 0) -> Iterator[tuple[str, str]]:
  """(function name, instruction) for each documented function of the files, lazily.

  Three kinds of instruction in turn: explain a function (docstring removed), write one from its
  signature and docstring summary, continue its first half. Files are visited in an order fixed
  by `seed`; files that do not parse are skipped.
  """
  order = sorted(files, key=lambda f: unit_hash(seed, _relative(pathlib.Path(f))))
  count = 0
  for f in order:
    tree = _parse(pathlib.Path(f))
    if tree is None:
      continue
    for node in ast.walk(tree):
      prompt = _function_prompt(node, count % 3) if isinstance(
          node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
      if prompt is not None and len(prompt) <= max_chars:
        count += 1
        yield node.name, prompt


def _parse(path: pathlib.Path) -> ast.Module | None:
  try:
    return ast.parse(path.read_bytes(), filename=str(path))
  except (SyntaxError, ValueError):
    return None


def _function_prompt(node: ast.FunctionDef | ast.AsyncFunctionDef, kind: int) -> str | None:
  doc = ast.get_docstring(node)
  summary = " ".join(doc.split("\n\n")[0].split()) if doc else ""
  if len(summary) < 20:
    return None  # undocumented or a one-word docstring: too little to ask about
  if kind == 1:
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    signature = f"{node.name}({ast.unparse(node.args)}){returns}"
    return f"Write a Python function `{signature}` that does the following: {summary}"
  bare = copy.copy(node)  # shallow: unparse only reads the children
  bare.body = node.body[1:] or [ast.Pass()]
  lines = ast.unparse(bare).splitlines()
  if kind == 0 and len(lines) >= 3:
    code = "\n".join(lines)
    return f"Explain what this Python function does:\n\n```python\n{code}\n```"
  if kind == 2 and len(lines) >= 4:
    head = "\n".join(lines[:len(lines) // 2])
    return f"Continue this code:\n\n```python\n{head}\n```"
  return None


# ----- self-distillation -----


def self_distill(params: Any, config: Any, tokenizer: Any, prompts: Sequence[str], *,
                 max_new_tokens: int, batch_size: int, sampling: Any = None,
                 key: Any = None) -> list[list[int]]:
  """Chat-templated prompt + the target's answer, as token ids, for every prompt (input order).

  The answer ends with EOS when the target stopped on its own; greedy by default.
  """
  if isinstance(prompts, str) or not prompts:
    raise ValueError("prompts must be a non-empty list of strings")
  ids = [tokenizer.encode(tokenizer.chat_prompt(p)) for p in prompts]
  answers = generate_batched(params, config, ids, max_new_tokens=max_new_tokens,
                             batch_size=batch_size, sampling=sampling, key=key,
                             eos_ids=tokenizer.eos_ids)
  return [p + a for p, a in zip(ids, answers)]


def generate_batched(params: Any, config: Any, prompt_ids: Sequence[Sequence[int]], *,
                     max_new_tokens: int, batch_size: int, sampling: Any = None, key: Any = None,
                     eos_ids: tuple[int, ...] = ()) -> list[list[int]]:
  """The target's answers (new ids only) to token-id prompts, in input order.

  Prompts run sorted by length, so a batch pads little; the last batch is filled up with copies
  of its last prompt, so every batch has one shape and the decode loop compiles once per prompt
  bucket. Batch b samples with fold_in(key, b).
  """
  import jax
  from tqdm.auto import tqdm

  from speculax.core.sampling import SamplingConfig
  from speculax.decode.config import GenerateConfig
  from speculax.decode.generate import generate
  from speculax.models import llama

  _positive(batch_size, "batch_size")
  if not prompt_ids:
    raise ValueError("prompt_ids must be a non-empty list of token-id lists")
  for i, p in enumerate(prompt_ids):
    if len(p) + max_new_tokens > config.max_seq_len:
      raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it "
                       f"exceeds the model's max_seq_len {config.max_seq_len}")
  gen = GenerateConfig(max_new_tokens=max_new_tokens, sampling=sampling or SamplingConfig(),
                       eos_ids=tuple(eos_ids))
  key = jax.random.key(0) if key is None else key
  if not isinstance(params["layers"], tuple):
    params = llama.unstack_layers(params)  # once, not once per batch inside generate
  order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
  answers: list[list[int]] = [[] for _ in prompt_ids]
  starts = range(0, len(order), batch_size)
  for b, start in enumerate(tqdm(starts, desc="self-distill", unit="batch", disable=None)):
    chunk = order[start:start + batch_size]
    batch = [prompt_ids[i] for i in chunk]
    batch += [batch[-1]] * (batch_size - len(batch))
    out = generate(params, config, batch, gen, key=jax.random.fold_in(key, b))
    for i, tokens in zip(chunk, out.tokens):
      answers[i] = tokens
  return answers
