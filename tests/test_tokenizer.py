"""Tokenizer tests: SmolLM2's GGUF tokenizer against transformers, plus tiny self-made checkpoints.

transformers' GGUF tokenizer is the independent reference, except around digits: it drops the
`smollm` pre-tokenizer's digit split. There the reference is transformers applied to each
fragment the digit split produces, plus ids checked by hand against the vocabulary.
"""
from __future__ import annotations

import json
import os
import pathlib
import unicodedata

import gguf
import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from speculax.models.tokenizer import Tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ----- SmolLM2 (real GGUF) -----


@pytest.fixture(scope="module")
def gguf_path() -> pathlib.Path:
  from speculax.models.assets import smollm2_gguf_path
  return smollm2_gguf_path()


@pytest.fixture(scope="module")
def tok(gguf_path) -> Tokenizer:
  return Tokenizer.from_gguf(gguf_path, reader=gguf.GGUFReader(gguf_path))


@pytest.fixture(scope="module")
def hf(gguf_path):
  import transformers
  return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


def _hf_ids(hf, text: str) -> list[int]:
  return hf.encode(text, add_special_tokens=False)


def _numeric_split(text: str) -> list[str]:
  """Text cut as `\\p{N}` isolation cuts it: each numeric char alone, the runs between kept."""
  pieces, run = [], ""
  for c in text:
    if unicodedata.category(c).startswith("N"):
      pieces += [run, c] if run else [c]
      run = ""
    else:
      run += c
  return pieces + [run] if run else pieces


NO_DIGITS = [
    "Hello world",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\n",
    "def fib(n):\n    if n < two:\n        return n\n\treturn fib(n - one) + fib(n - two)\n",
    "class A:\n\n    def __init__(self):\n        self.x = {'a': [None, True]}  # note\n",
    "café, naïve, Ærøskøbing, 日本語のテキスト, 한국어, emoji 😀👍🏽 and ZWJ 👩‍💻",
    "   leading spaces",
    "trailing spaces   ",
    " \t\n mixed \r\n whitespace \n\n\n",
    "it's they're we've I'm you'll he'd",
    "<|endoftext|>text right after<|im_end|><|im_start|>",
]

# Texts with numerics where the digit split changes the result (whitespace runs or non-ASCII
# numerics before a number), and ones where it does not.
WITH_DIGITS = [
    "2024",
    "hello 2024 world",
    "    1",
    "x = [\n    1,\n    22]\n",
    "a  1",
    "\n\n1",
    "½ and ² and ٣",
    "pi is 3.14159, e is 2.71828",
    "<|im_start|>user\nwhat is 12+30?<|im_end|>",
]


@pytest.mark.slow
def test_metadata_matches_transformers(tok, hf):
  assert tok.vocab_size == len(hf) == 49152
  assert tok.bos_id == hf.bos_token_id == tok.token_id("<|im_start|>")
  # SmolLM2's GGUF eos is already the turn end, so eos_ids needs nothing extra.
  assert tok.eos_id == hf.eos_token_id == tok.token_id("<|im_end|>")
  assert tok.eos_ids == (tok.eos_id,)
  assert tok.pad_id == hf.pad_token_id
  assert tok.add_bos is False
  assert tok.chat_template == hf.chat_template


@pytest.mark.slow
@pytest.mark.parametrize("text", NO_DIGITS)
def test_ids_match_transformers_without_digits(tok, hf, text):
  assert not any(unicodedata.category(c).startswith("N") for c in text)
  assert tok.encode(text) == _hf_ids(hf, text)


@pytest.mark.slow
@pytest.mark.parametrize("text", WITH_DIGITS)
def test_ids_with_digits_match_fragmentwise_reference(tok, hf, text):
  # The smollm pipeline isolates numerics first and runs the regex split and BPE inside each
  # fragment, so its ids are the reference's ids of each fragment, concatenated.
  expected = [i for piece in _numeric_split(text) for i in _hf_ids(hf, piece)]
  assert tok.encode(text) == expected


# Ids worked out by hand: split numerics one by one, then GPT-2's regex inside each fragment
# ('\s+(?!\S)' takes a whole whitespace run that ends a fragment), then BPE. Each expected piece
# is cross-checked by a vocabulary lookup below (ASCII '!'..'~' sit at ids 17..110, so a
# printable ASCII char c has id ord(c) - 16; 'Ġ' is the byte-level space).
HAND_VERIFIED = [
    ("2024", ["2", "0", "2", "4"], [34, 32, 34, 36]),
    (" 12", ["Ġ", "1", "2"], [216, 33, 34]),
    ("hello 2024", ["hello", "Ġ", "2", "0", "2", "4"], [28120, 216, 34, 32, 34, 36]),
    # transformers gives ['ĠĠĠ', 'Ġ', '1']: without the digit split, ' ?\p{N}+' takes a space.
    ("    1", ["ĠĠĠĠ", "1"], [289, 33]),
    ("a  1", ["a", "ĠĠ", "1"], [81, 256, 33]),
    ("\n\n7", ["ĊĊ", "7"], [1116, 39]),
]


@pytest.mark.slow
@pytest.mark.parametrize("text,pieces,ids", HAND_VERIFIED)
def test_digits_hand_verified(tok, text, pieces, ids):
  assert [tok.token_id(p) for p in pieces] == ids
  assert tok.encode(text) == ids


@pytest.mark.slow
@pytest.mark.parametrize(
    "text", NO_DIGITS + WITH_DIGITS + ["", " ", "\n", "a" * 1000, "\x00\x7f\u00ad"])
def test_round_trip(tok, text):
  assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


@pytest.mark.slow
def test_decode_skips_special_tokens_by_default(tok):
  ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
  assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
  assert tok.decode(ids) == "user\nhi"
  assert tok.decode(np.asarray(ids, np.int32)) == "user\nhi"


@pytest.mark.slow
def test_empty_and_bad_ids(tok):
  assert tok.encode("") == []
  assert tok.decode([]) == ""
  with pytest.raises(ValueError, match="49152"):
    tok.decode([5, 49152])
  with pytest.raises(ValueError, match="-1"):
    tok.decode([-1])
  with pytest.raises(ValueError, match="1-D"):
    tok.decode([[1, 2]])
  with pytest.raises(TypeError):
    tok.encode(b"bytes")  # type: ignore[arg-type]


@pytest.mark.slow
def test_chat_template_matches_transformers(tok, hf):
  chats = [
      [{"role": "user", "content": "What is 2+2?"},
       {"role": "assistant", "content": "4."},
       {"role": "user", "content": "And times 3?"}],
      [{"role": "system", "content": "Answer in French."},
       {"role": "user", "content": "Hello"}],
  ]
  for messages in chats:
    for gen in (True, False):
      expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
      assert tok.apply_chat_template(messages, add_generation_prompt=gen) == expected
  one = [{"role": "user", "content": "Write a haiku."}]
  assert tok.chat_prompt("Write a haiku.") == hf.apply_chat_template(
      one, tokenize=False, add_generation_prompt=True)
  assert tok.chat_prompt("hi").endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_chat_bad_input(tok):
  with pytest.raises(ValueError, match="non-empty"):
    tok.apply_chat_template([])
  with pytest.raises(ValueError, match="role"):
    tok.apply_chat_template([{"content": "no role"}])
  with pytest.raises(ValueError):
    tok.chat_prompt("")


@pytest.mark.slow
def test_hf_folder_of_the_gguf_tokenizer(tok, tmp_path):
  tok.backend.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({
      "bos_token": {"content": "<|im_start|>", "special": True},
      "eos_token": "<|im_end|>", "chat_template": tok.chat_template, "add_bos_token": False}))
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
  folder = Tokenizer.from_hf_folder(tmp_path)
  for text in NO_DIGITS + WITH_DIGITS:
    assert folder.encode(text) == tok.encode(text)
  assert (folder.bos_id, folder.eos_id, folder.eos_ids) == (1, 2, (2, 0))
  messages = [{"role": "user", "content": "hi"}]
  assert folder.apply_chat_template(messages) == tok.apply_chat_template(messages)


# ----- tiny self-made checkpoints -----

TINY_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['user', 'assistant'] %}"
    "{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "{{ '<|turn|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn|>assistant\n' }}{% endif %}")


def _tiny_backend(post_bos: bool = False) -> tokenizers.Tokenizer:
  """A byte-level BPE trained on a few lines, with <s>, </s>, <|turn|> and <|im_end|> specials."""
  backend = tokenizers.Tokenizer(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<s>", "</s>", "<|turn|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  backend.train_from_iterator(["the cat sat on the mat", "the dog ate the hat"] * 10, trainer)
  if post_bos:
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)])
  return backend


def _write_folder(folder: pathlib.Path, backend, config: dict) -> pathlib.Path:
  folder.mkdir(parents=True, exist_ok=True)
  backend.save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps(config))
  return folder


def test_hf_folder_tiny(tmp_path):
  backend = _tiny_backend()
  folder = _write_folder(tmp_path, backend, {
      "bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
      "chat_template": TINY_TEMPLATE})
  tok = Tokenizer.from_hf_folder(folder)
  assert tok.vocab_size == backend.get_vocab_size()
  text = "the cat<|im_end|> ate"
  ids = tok.encode(text)
  assert ids[0] == tok.bos_id == backend.token_to_id("<s>")
  assert ids[1:] == backend.encode(text, add_special_tokens=False).ids
  assert backend.token_to_id("<|im_end|>") in ids  # kept whole
  assert tok.decode(ids, skip_special_tokens=False) == "<s>" + text
  # The template ends turns with <|im_end|>, so it stops generation too.
  assert tok.eos_ids == (backend.token_to_id("</s>"), backend.token_to_id("<|im_end|>"))
  assert tok.chat_prompt("the dog") == "<|turn|>user\nthe dog<|im_end|>\n<|turn|>assistant\n"
  with pytest.raises(ValueError, match="bad role system"):
    tok.apply_chat_template([{"role": "system", "content": "x"}])


def test_hf_folder_bos_from_post_processor(tmp_path):
  # No add_bos_token in the config: follow tokenizer.json's post-processor, without doubling BOS.
  folder = _write_folder(tmp_path, _tiny_backend(post_bos=True), {"bos_token": "<s>"})
  tok = Tokenizer.from_hf_folder(folder)
  ids = tok.encode("the hat")
  assert tok.add_bos and ids[0] == tok.bos_id and tok.bos_id not in ids[1:]
  assert tok.eos_id is None and tok.eos_ids == ()


def test_hf_folder_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer.json")):
    Tokenizer.from_hf_folder(tmp_path)
  folder = _write_folder(tmp_path / "no_template", _tiny_backend(), {"eos_token": "</s>"})
  with pytest.raises(ValueError, match="no chat template"):
    Tokenizer.from_hf_folder(folder).chat_prompt("hi")
  folder = _write_folder(tmp_path / "bad_eos", _tiny_backend(), {"eos_token": "<missing>"})
  with pytest.raises(ValueError, match="<missing>"):
    Tokenizer.from_hf_folder(folder)
  (tmp_path / "corrupt").mkdir()
  (tmp_path / "corrupt" / "tokenizer.json").write_text("{not json")
  with pytest.raises(ValueError, match="corrupt"):
    Tokenizer.from_hf_folder(tmp_path / "corrupt")


def _write_gguf(path: pathlib.Path, model: str, pre: str | None = "smollm",
                tokens: list[str] | None = None, merges: list[str] | None = None,
                types: list[int] | None = None, **ids: int) -> pathlib.Path:
  """A tensor-less GGUF holding only tokenizer metadata."""
  writer = gguf.GGUFWriter(str(path), "llama")
  writer.add_tokenizer_model(model)
  if pre is not None:
    writer.add_tokenizer_pre(pre)
  tokens = tokens or ["<unk>", "a", "b"]
  writer.add_token_list(tokens)
  writer.add_token_types(types or [1] * len(tokens))
  if merges is not None:
    writer.add_token_merges(merges)
  for name, value in ids.items():
    if name == "add_bos":
      writer.add_add_bos_token(bool(value))
    else:
      getattr(writer, f"add_{name}_token_id")(value)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def _byte_level_tokens() -> list[str]:
  return list(pre_tokenizers.ByteLevel.alphabet())


def test_tiny_gguf_byte_level(tmp_path):
  # 256 byte tokens, two merges, one control and one user-defined token.
  tokens = [*_byte_level_tokens(), "Ġt", "Ġth", "<|end|>", "<think>"]
  types = [1] * (len(tokens) - 2) + [3, 4]
  path = _write_gguf(tmp_path / "tiny.gguf", "gpt2", "smollm", tokens, ["Ġ t", "Ġt h"], types,
                     bos=tokens.index("<|end|>"), eos=tokens.index("<|end|>"), add_bos=True)
  tok = Tokenizer.from_gguf(path)
  end, think = tokens.index("<|end|>"), tokens.index("<think>")
  ids = tok.encode(" th<think> t 42<|end|>")
  pieces = ["Ġth", "<think>", "Ġt", "Ġ", "4", "2", "<|end|>"]
  assert ids == [end] + [tokens.index(p) for p in pieces]
  assert tok.vocab_size == len(tokens) and tok.eos_ids == (end,)
  # Control tokens are dropped on decode by default; user-defined ones are text.
  assert tok.decode(ids) == " th<think> t 42"
  assert think in ids


def test_unsupported_gguf_tokenizers(tmp_path):
  path = _write_gguf(tmp_path / "spm.gguf", "llama")
  with pytest.raises(ValueError, match=r"'llama'.*") as info:
    Tokenizer.from_gguf(path)
  assert str(path) in str(info.value)
  tokens = _byte_level_tokens()
  path = _write_gguf(tmp_path / "pre.gguf", "gpt2", "made-up-pre", tokens, [])
  with pytest.raises(ValueError, match="made-up-pre") as info:
    Tokenizer.from_gguf(path)
  assert str(path) in str(info.value)
  path = _write_gguf(tmp_path / "nomerges.gguf", "gpt2", "smollm", tokens)
  with pytest.raises(ValueError, match="tokenizer.ggml.merges"):
    Tokenizer.from_gguf(path)
  path = _write_gguf(tmp_path / "badeos.gguf", "gpt2", "smollm", tokens, [], eos=len(tokens))
  with pytest.raises(ValueError, match="eos"):
    Tokenizer.from_gguf(path)
  with pytest.raises(FileNotFoundError, match="missing.gguf"):
    Tokenizer.from_gguf(tmp_path / "missing.gguf")
  (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
  with pytest.raises(ValueError, match="junk.gguf"):
    Tokenizer.from_gguf(tmp_path / "junk.gguf")
