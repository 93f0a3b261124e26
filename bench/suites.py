"""Named prompt suites for benchmarks, all held out from every training corpus of the framework.

  humaneval  HumanEval prompts after the first 4 (those calibrate layer skip's search), chat-wrapped
  chat       the held-out subjects of train/prompts.chat_prompts, chat-wrapped, subject by
             subject (its first 6 prompts are all about one subject)
  chat-mix   the same prompts across the subjects (the first 12 are 12 subjects, every ask)
  code       the opening of held-out standard-library files (split by path hash as the training
             corpus splits them), raw: code continuation
  FILE       a .jsonl of {"prompt": text, "chat": bool (default true), "phase": label} per line,
             or any other text file, one chat prompt per non-empty line
"""
from __future__ import annotations

import json
import pathlib

from speculax.models.assets import humaneval_prompts
from speculax.train import data
from speculax.train import prompts as prompt_sources
from speculax.train.experiment import DataConfig

NAMED = ("humaneval", "chat", "chat-mix", "code")
CODE_CHARS = 1200  # a code prompt: the file's lines up to this many characters (~300 tokens)


def read_prompts(path: str | pathlib.Path) -> list[dict]:
  """[{"prompt", "chat", "phase"}] from a .jsonl file or a text file of chat prompts."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"prompt file {str(path)!r} does not exist")
  lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
  if not lines:
    raise ValueError(f"prompt file {str(path)!r} holds no prompts")
  if path.suffix != ".jsonl":
    return [{"prompt": x, "chat": True, "phase": ""} for x in lines]
  items = []
  for n, line in enumerate(lines, 1):
    try:
      item = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
      raise ValueError(f"{path}:{n}: expected an object with a \"prompt\" string, got {line[:60]!r}")
    if not item["prompt"].strip():
      raise ValueError(f"{path}:{n}: the prompt is empty")
    items.append({"prompt": item["prompt"], "chat": bool(item.get("chat", True)),
                  "phase": str(item.get("phase", ""))})
  return items


def check_name(name: str) -> None:
  """A suite is a name in NAMED or an existing prompts file (ValueError / FileNotFoundError)."""
  if name in NAMED:
    return
  if not pathlib.Path(name).suffix:
    raise ValueError(f"unknown prompt suite {name!r}: one of {', '.join(NAMED)} or a prompts "
                     "file (.jsonl, or text with one prompt per line)")
  if not pathlib.Path(name).is_file():
    raise FileNotFoundError(f"prompt file {name!r} does not exist")


def suite(name: str, n: int) -> list[dict]:
  """The first n prompts of suite `name` (a name in NAMED or a prompts file), as read_prompts."""
  check_name(name)
  if name == "humaneval":
    return [_chat(t) for t in humaneval_prompts(4 + n)[4:]]
  if name in ("chat", "chat-mix"):
    return [_chat(t) for t in prompt_sources.chat_prompts("heldout", across=name == "chat-mix")[:n]]
  if name == "code":
    return [{"prompt": t, "chat": False, "phase": ""} for t in _code_openings(n)]
  return read_prompts(name)[:n]


def encode(tokenizer, items: list[dict]) -> list[list[int]]:
  """Token ids of each prompt, chat ones wrapped in the model's chat template."""
  return [tokenizer.encode(tokenizer.chat_prompt(x["prompt"]) if x["chat"] else x["prompt"])
          for x in items]


def _chat(text: str) -> dict:
  return {"prompt": text, "chat": True, "phase": ""}


def _code_openings(n: int) -> list[str]:
  """The openings of the first n non-trivial held-out stdlib files (training holds the rest)."""
  _, heldout = data.split_files(data.stdlib_files(), DataConfig().heldout_fraction)
  out = []
  for text in data.read_texts(heldout):
    head = text[:CODE_CHARS].rsplit("\n", 1)[0]
    if len(head) > CODE_CHARS // 2:
      out.append(head + "\n")
    if len(out) == n:
      break
  return out
