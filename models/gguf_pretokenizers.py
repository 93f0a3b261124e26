"""llama.cpp's named pre-tokenizers (`tokenizer.ggml.pre`) as `tokenizers` pipelines.

A GGUF file names its pre-tokenizer instead of describing it; llama.cpp's llama-vocab.cpp maps
each name to a regex group and a few flags. Only groups that `tokenizers` reproduces exactly are
listed; each is checked against transformers on the checkpoint's own tokenizer.json
(tests/test_tokenizer.py for smollm, tests/test_targets.py for llama-bpe and qwen2).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tokenizers import Regex, pre_tokenizers


def _digits_then_gpt2_split() -> pre_tokenizers.PreTokenizer:
  """llama.cpp's `smollm` family: every numeric char alone (`\\p{N}`), then GPT-2's regex split.

  `Digits` uses Unicode's numeric categories (Nd, Nl, No), as `\\p{N}` does.
  """
  return pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
  ])


def _gpt2_split() -> pre_tokenizers.PreTokenizer:
  """llama.cpp's `gpt-2` pre-tokenizer: GPT-2's regex split alone."""
  return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


# tiktoken's cl100k split, as Llama-3's and Qwen2's own tokenizer.json write it: contractions,
# letter runs with one leading non-letter, numbers (Llama-3: up to 3 digits a piece; Qwen2: one),
# punctuation runs, newline runs, whitespace not before a word.
_TIKTOKEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = _TIKTOKEN_SPLIT % "{1,3}"
QWEN2_SPLIT = _TIKTOKEN_SPLIT % ""


def _regex_then_bytes(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
  """Llama-3 / Qwen2 style: the regex split, then byte-level mapping without GPT-2's regex."""
  return lambda: pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
  ])


@dataclasses.dataclass(frozen=True)
class GgufPipeline:
  """What one llama.cpp `tokenizer.ggml.pre` group means besides the split itself."""
  pre_tokenizer: Callable[[], pre_tokenizers.PreTokenizer]
  ignore_merges: bool = False  # a piece that is a whole vocabulary entry skips BPE (Llama-3)
  add_bos: bool = False  # when the file has no tokenizer.ggml.add_bos_token
  # Qwen2's own tokenizer.json (and transformers) NFC-normalize first; llama.cpp does not.
  nfc: bool = False


_SMOLLM = GgufPipeline(_digits_then_gpt2_split)
_LLAMA3 = GgufPipeline(_regex_then_bytes(LLAMA3_SPLIT), ignore_merges=True, add_bos=True)
_QWEN2 = GgufPipeline(_regex_then_bytes(QWEN2_SPLIT), nfc=True)
# tokenizer.ggml.pre -> pipeline. Names grouped as llama.cpp's llama-vocab.cpp groups their
# regexes; only groups that `tokenizers` reproduces exactly are listed.
GGUF_PRE_TOKENIZERS: dict[str, GgufPipeline] = {
    "smollm": _SMOLLM, "starcoder": _SMOLLM, "refact": _SMOLLM,
    "gpt-2": GgufPipeline(_gpt2_split),
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
}
