"""Training corpora for drafters: raw standard-library code, the target's own answers, or both.

A drafter accepts best on text like what it will serve: the target's answers to chat prompts
(self-distillation, DistillSpec / FastDraft's off-policy data). `answers` writes those answers
to a folder as it goes (one JSON line per prompt, flushed per batch), so generating millions of
tokens shows progress and resumes where it stopped; `token_rows` turns an experiment's
DataConfig into packed (train, held-out) rows from either source or a mixture, each with a loss
mask that, with DataConfig.learn="answers", keeps the chat-templated prompts as context only:
serving drafts the answer, never the prompt.

Prompts come from train/prompts.mixture (stdlib instructions, pydoc topics, chat questions;
training and held-out split by subject) or from a .jsonl file of your own ({"prompt": ...} per
line; a line {"text": ...} is used as text as it stands, no answer generated).

Dims: n rows, t tokens per row.
"""
from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from tqdm.auto import tqdm

from speculax.core.jsonfile import read_json_object, write_json_atomic
from speculax.core.sampling import SamplingConfig
from speculax.train import data, prompts as prompt_sources

FORMAT = "speculax-answers-v1"
_META, _LINES = "meta.json", "answers.jsonl"


class Rows(NamedTuple):
  """Packed token rows and which positions the loss and held-out metrics weigh."""
  tokens: np.ndarray  # [n, t] int32
  mask: np.ndarray  # [n, t] float32: 1 where the next token is learned (data.pack_docs)


def as_rows(rows: Rows | np.ndarray) -> Rows:
  """Rows as they are; bare token rows [n, t] with every position learned."""
  if isinstance(rows, Rows):
    if np.shape(rows.mask) != np.shape(rows.tokens):
      raise ValueError(f"Rows.mask has shape {np.shape(rows.mask)}, its tokens "
                       f"{np.shape(rows.tokens)}: one weight per token")
    return rows
  tokens = np.asarray(rows)
  return Rows(tokens, np.ones(tokens.shape, np.float32))


def answers(folder: str | pathlib.Path, params: Any, config: Any, tokenizer: Any,
            prompts: Sequence[str], *, max_new_tokens: int, temperatures: Sequence[float] = (0.0,),
            batch_size: int = 32, seed: int = 0, fingerprint: str = "") -> list[list[int]]:
  """Chat-templated prompt + the target's answer as token ids, for every prompt (input order).

  Prompt i is answered at temperatures[i % len(temperatures)] (0: greedy), so one corpus holds
  greedy and sampled answers. The answers go to `folder` batch by batch; calling again with the
  same settings generates only the missing ones (other settings raise, naming the difference).
  `fingerprint` names the target's weights (e.g. teacher_cache.params_fingerprint).
  """
  if isinstance(prompts, str) or not prompts:
    raise ValueError("prompts must be a non-empty list of strings")
  temperatures = tuple(float(t) for t in temperatures)
  if not temperatures or min(temperatures) < 0:
    raise ValueError(f"temperatures must be a non-empty list of values >= 0, got {temperatures}")
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  meta = {"format": FORMAT, "max_new_tokens": max_new_tokens, "temperatures": list(temperatures),
          "seed": seed, "fingerprint": fingerprint, "vocab_size": config.vocab_size}
  old = read_json_object(folder / _META, missing={})
  diffs = [f"{k}: {old[k]!r} there, {v!r} now" for k, v in meta.items() if old and old.get(k) != v]
  if diffs:
    raise ValueError(f"answers folder {folder} was made with other settings ({'; '.join(diffs)});"
                     " use another folder or delete it")
  if not old:
    write_json_atomic(folder / _META, meta)
  done = _read_lines(folder / _LINES)
  keys = [_key(p, temperatures[i % len(temperatures)]) for i, p in enumerate(prompts)]
  todo = sorted({k: i for i, k in enumerate(keys) if k not in done}.values(),
                key=lambda i: len(prompts[i]))  # similar lengths batch together
  chunk = batch_size * 4  # a few batches per flush: little lost when stopped
  key = jax.random.key(seed)
  lines = folder / _LINES
  with open(lines, "a", encoding="utf-8") as out:
    if lines.stat().st_size and not lines.read_bytes().endswith(b"\n"):
      out.write("\n")  # end a line a stop cut short: new lines must not join it
    bar = tqdm(total=len(todo), desc="self-distill answers", unit="prompt", disable=None)
    for lo in range(0, len(todo), chunk):
      part = todo[lo:lo + chunk]
      for temperature in dict.fromkeys(temperatures):
        rows = [i for i in part if temperatures[i % len(temperatures)] == temperature]
        if not rows:
          continue
        ids = data.self_distill(params, config, tokenizer, [prompts[i] for i in rows],
                                max_new_tokens=max_new_tokens, batch_size=batch_size,
                                sampling=SamplingConfig(temperature=temperature),
                                key=jax.random.fold_in(key, _stream(keys[rows[0]])))
        for i, seq in zip(rows, ids):
          done[keys[i]] = seq
          out.write(json.dumps({"key": keys[i], "ids": seq}) + "\n")
      out.flush()
      bar.update(len(part))
    bar.close()
  return [done[k] for k in keys]


def _key(prompt: str, temperature: float) -> str:
  return hashlib.blake2b(f"{temperature}\0{prompt}".encode(), digest_size=12).hexdigest()


def _stream(key: str) -> int:
  """A batch's sampling stream, fixed by its first prompt (the same on a resumed run)."""
  return int(key[:7], 16)


def _read_lines(path: pathlib.Path) -> dict[str, list[int]]:
  """key -> ids of every complete line (a line cut short by a stop is dropped and redone)."""
  done = {}
  if path.is_file():
    for line in path.read_text(encoding="utf-8").splitlines():
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue
      done[row["key"]] = row["ids"]
  return done


def read_prompts_file(path: str | pathlib.Path) -> tuple[list[str], list[str]]:
  """(prompts, texts) of a .jsonl file: {"prompt": str} lines are answered, {"text": str} lines
  are used as they stand."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"prompts file not found: {path}")
  found: dict[str, list[str]] = {"prompt": [], "text": []}
  for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{n}: not valid JSON: {e}") from e
    kinds = [k for k in found if isinstance(row, dict) and isinstance(row.get(k), str)]
    if len(kinds) != 1 or not row[kinds[0]]:
      raise ValueError(f"{path}:{n}: each line needs one non-empty string field, 'prompt' or "
                       f"'text', got {line[:80]!r}")
    found[kinds[0]].append(row[kinds[0]])
  if not found["prompt"] and not found["text"]:
    raise ValueError(f"{path} holds no prompts")
  return found["prompt"], found["text"]


def token_rows(cfg: Any, model: Any, folder: str | pathlib.Path,
               fingerprint: str = "") -> tuple[Rows, Rows]:
  """(train, held-out) rows [n, seq_len] and their loss masks for an experiment's DataConfig.

  corpus "code": stdlib files split by path. "self-distill": the target's answers to the
  training prompts (held out: answers to the held-out split's prompts, or, with a prompts file,
  its last heldout_fraction of lines). "mixed": code_fraction of the rows from code, the rest
  self-distilled. Answers are cached under (cfg.answers_dir or folder)/answers_<split>.
  cfg.learn "all" learns every position; "answers" masks out the chat-templated prompts (code
  and text lines stay learned whole).
  """
  tok = model.tokenizer
  if cfg.corpus == "code":
    return (as_rows(_code_rows(cfg, tok, "train", cfg.rows)),
            as_rows(_code_rows(cfg, tok, "heldout", cfg.heldout_rows)))
  n_code = round(cfg.rows * cfg.code_fraction) if cfg.corpus == "mixed" else 0
  rows = []
  for split, want in (("train", cfg.rows - n_code), ("heldout", cfg.heldout_rows)):
    asked, texts = split_prompts(cfg, split)
    docs = [tok.encode(t) for t in texts]
    context = [0] * len(docs)
    if asked:
      answered = answers(pathlib.Path(cfg.answers_dir or folder) / f"answers_{split}",
                         model.params, model.config, tok, asked,
                         max_new_tokens=cfg.answer_tokens, temperatures=cfg.temperatures,
                         batch_size=cfg.generate_batch, fingerprint=fingerprint)
      docs += answered
      context += (prompt_lengths(tok, asked, answered) if cfg.learn == "answers"
                  else [0] * len(asked))
    order = np.random.default_rng(0).permutation(len(docs))  # sources interleave in the rows
    rows.append(Rows(*data.pack_docs([docs[i] for i in order], cfg.seq_len, sep=tok.eos_id,
                                     max_rows=want, context=[context[i] for i in order])))
  if n_code:
    code = _code_rows(cfg, tok, "train", n_code)
    rows[0] = Rows(np.concatenate([rows[0].tokens, code]),
                   np.concatenate([rows[0].mask, np.ones(code.shape, np.float32)]))
  return rows[0], rows[1]


def prompt_lengths(tok: Any, prompts: Sequence[str], docs: Sequence[Sequence[int]]) -> list[int]:
  """Tokens of each doc (answers' output: chat-templated prompt + answer) that are its prompt."""
  out = []
  for i, (prompt, doc) in enumerate(zip(prompts, docs, strict=True)):
    head = tok.encode(tok.chat_prompt(prompt))
    if list(doc[:len(head)]) != head:
      raise ValueError(f"answer {i} does not start with its chat prompt {prompt[:60]!r}")
    out.append(len(head))
  return out


def _code_rows(cfg: Any, tok: Any, split: str, rows: int) -> np.ndarray:  # [rows, seq_len]
  """Rows packed from one split of the stdlib files (split by path hash); reading stops once
  they are full."""
  files = data.split_files(data.stdlib_files(cfg.files), cfg.heldout_fraction)[split == "heldout"]
  return data.pack_sequences(tok, data.read_texts(files), cfg.seq_len, max_rows=rows)


def split_prompts(cfg: Any, split: str) -> tuple[list[str], list[str]]:
  """(prompts to answer, texts as they stand) of one split; the training split's prompts end with
  train/prompts.everyday_prompts(cfg.everyday_chat)."""
  asked, texts = _split_prompts(cfg, split)
  if split == "train":
    asked = asked + prompt_sources.everyday_prompts(cfg.everyday_chat)
  return asked, texts


def _split_prompts(cfg: Any, split: str) -> tuple[list[str], list[str]]:
  if cfg.prompts_file is None:
    # Held out: enough prompts for heldout_rows (an answer with its prompt is >= ~100 tokens).
    n = cfg.prompts if split == "train" else -(-cfg.heldout_rows * cfg.seq_len // 100)
    return prompt_sources.mixture(split)[:n], []
  asked, texts = read_prompts_file(cfg.prompts_file)
  cut = lambda xs: (xs[:len(xs) - round(len(xs) * cfg.heldout_fraction)] if split == "train"
                    else xs[len(xs) - round(len(xs) * cfg.heldout_fraction):])
  asked, texts = cut(asked), cut(texts)
  return asked[:cfg.prompts] if split == "train" else asked, texts
