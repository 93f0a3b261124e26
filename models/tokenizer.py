"""Text <-> token ids for the target model, from a GGUF file or a Hugging Face folder.

The BPE itself is the `tokenizers` library's; this file only assembles it the way the checkpoint
says (vocabulary, merges, pre-tokenizer, special tokens) and renders chat templates. Getting the
assembly exactly right matters for speculative decoding research: a prompt tokenized differently
from how the model was trained shifts every logit, and every comparison with llama.cpp or
transformers along with it.

GGUF: llama.cpp stores a byte-level BPE vocabulary under `tokenizer.ggml.*`. The pre-tokenizer is
named, not described (`tokenizer.ggml.pre`), so each supported name maps to a `tokenizers`
pipeline (models/gguf_pretokenizers.py); an unknown name is an error rather than a silent
fallback to GPT-2's split. A Hugging Face folder's tokenizer.json describes its own pipeline and
is used as it is.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers

from speculax.core.jsonfile import read_json_object
from speculax.models.gguf_pretokenizers import GGUF_PRE_TOKENIZERS

# llama.cpp token types (gguf.TokenType); spelled out so reading a tokenizer needs no gguf import.
_CONTROL = 3
_USER_DEFINED = 4

# Tokens that close a chat turn. A chat model stops at these even when the checkpoint's single
# eos id names another token, so they join `eos_ids` when the chat template writes them.
_TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


@dataclasses.dataclass(frozen=True, eq=False)
class Tokenizer:
  """A `tokenizers.Tokenizer` plus what the checkpoint says about BOS, EOS and chat turns.

  Build it with `from_gguf` or `from_hf_folder`. `encode` never adds EOS, and adds BOS only when
  the checkpoint asks for it (`add_bos`), so callers can concatenate encoded pieces freely.
  """
  backend: tokenizers.Tokenizer = dataclasses.field(repr=False)
  bos_id: int | None
  eos_id: int | None
  eos_ids: tuple[int, ...]
  pad_id: int | None
  add_bos: bool
  chat_template: str | None = dataclasses.field(repr=False)
  source: str

  # ----- construction -----

  @classmethod
  def from_gguf(cls, path: str | pathlib.Path, reader: Any = None) -> Tokenizer:
    """The tokenizer described by a GGUF file's metadata.

    Pass `reader` (a `gguf.GGUFReader` already open on `path`) to avoid parsing the file twice:
    opening SmolLM2's GGUF takes seconds because its 98k metadata strings are parsed one by one.
    """
    path = pathlib.Path(path)
    if reader is None:
      reader = _open_gguf(path)
    meta = _GgufMeta(reader, path)
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
      raise ValueError(
          f"{path}: tokenizer.ggml.model is {model!r}; only 'gpt2' (byte-level BPE) is supported")
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in GGUF_PRE_TOKENIZERS:
      raise ValueError(
          f"{path}: tokenizer.ggml.pre is {pre!r}; supported: {sorted(GGUF_PRE_TOKENIZERS)}")
    tokens = list(meta.require("tokenizer.ggml.tokens"))
    merges = _parse_merges(meta.require("tokenizer.ggml.merges"), path)
    token_types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if len(token_types) != len(tokens):
      raise ValueError(f"{path}: {len(token_types)} token types for {len(tokens)} tokens")
    vocab = _vocab_dict(tokens, path)

    pipeline = GGUF_PRE_TOKENIZERS[pre]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                              ignore_merges=pipeline.ignore_merges))
    if pipeline.nfc:
      backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pipeline.pre_tokenizer()
    backend.decoder = decoders.ByteLevel()
    _add_marked_tokens(backend, tokens, token_types)
    if backend.get_vocab_size(with_added_tokens=True) != len(tokens):
      raise ValueError(f"{path}: special tokens grew the vocabulary past {len(tokens)} entries")

    ids = {name: _checked_id(meta.get(f"tokenizer.ggml.{name}_token_id"), len(tokens), name, path)
           for name in ("bos", "eos", "padding")}
    template = meta.get("tokenizer.chat_template")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")  # a stored False stays False
    add_bos = pipeline.add_bos if add_bos is None else bool(add_bos)
    return cls(
        backend=backend, bos_id=ids["bos"], eos_id=ids["eos"],
        eos_ids=_eos_ids(backend, ids["eos"], (), template), pad_id=ids["padding"],
        add_bos=add_bos and ids["bos"] is not None,
        chat_template=template, source=str(path))

  @classmethod
  def from_hf_folder(cls, folder: str | pathlib.Path) -> Tokenizer:
    """The tokenizer of a Hugging Face model folder: tokenizer.json plus its config files.

    BOS / EOS and the chat template come from tokenizer_config.json (a chat_template.jinja file,
    as newer transformers saves, wins over the config's entry); generation_config.json's
    eos_token_id (an int or a list) joins `eos_ids`.
    """
    folder = pathlib.Path(folder)
    tokenizer_json = folder / "tokenizer.json"
    if not tokenizer_json.is_file():
      raise FileNotFoundError(f"no tokenizer.json in {folder} (looked for {tokenizer_json})")
    try:
      backend = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    except Exception as e:  # the Rust error names no file
      raise ValueError(f"{tokenizer_json}: not a readable tokenizer.json: {e}") from e
    config = read_json_object(folder / "tokenizer_config.json", missing={})
    generation = read_json_object(folder / "generation_config.json", missing={})

    bos_id = _hf_token_id(backend, config.get("bos_token"), "bos_token", folder)
    eos_id = _hf_token_id(backend, config.get("eos_token"), "eos_token", folder)
    pad_id = _hf_token_id(backend, config.get("pad_token"), "pad_token", folder)
    extra_eos = generation.get("eos_token_id")
    extra_eos = [extra_eos] if isinstance(extra_eos, int) else list(extra_eos or [])
    for i in extra_eos:
      _checked_id(i, backend.get_vocab_size(with_added_tokens=True), "eos_token_id",
                  folder / "generation_config.json")
    template = _hf_chat_template(folder, config)
    add_bos = config.get("add_bos_token")
    if not isinstance(add_bos, bool):
      add_bos = _post_processor_adds(backend, bos_id)
    return cls(
        backend=backend, bos_id=bos_id, eos_id=eos_id,
        eos_ids=_eos_ids(backend, eos_id, extra_eos, template), pad_id=pad_id,
        add_bos=add_bos and bos_id is not None, chat_template=template, source=str(folder))

  # ----- ids -----

  @property
  def vocab_size(self) -> int:
    """Number of ids, special tokens included (the embedding table's row count)."""
    return self.backend.get_vocab_size(with_added_tokens=True)

  def token_id(self, token: str) -> int:
    """The id of one vocabulary entry, spelled as stored (byte-level: ' a' is 'Ġa')."""
    i = self.backend.token_to_id(token)
    if i is None:
      raise KeyError(f"{token!r} is not in the vocabulary of {self.source}")
    return i

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; special tokens written in the text stay whole. BOS only if `add_bos`."""
    if not isinstance(text, str):
      raise TypeError(f"encode takes a str, got {type(text).__name__}")
    ids = self.backend.encode(text, add_special_tokens=False).ids
    return [self.bos_id, *ids] if self.add_bos else ids

  def decode(self, ids: Iterable[int] | np.ndarray, skip_special_tokens: bool = True) -> str:
    """Text of `ids` (a list, or a 1-D numpy / jax array). Ids outside the vocabulary raise.

    A cut in the middle of a multi-byte character decodes to U+FFFD; stream by decoding the
    whole prefix, not token by token.
    """
    ids = _as_id_list(ids, self.vocab_size)
    return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

  # ----- chat -----

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                          add_generation_prompt: bool = True, **extra: Any) -> str:
    """The checkpoint's chat template rendered for `messages` ({"role", "content"} dicts).

    Rendered as transformers does (sandboxed jinja2, trim_blocks, lstrip_blocks, the
    special tokens as variables), so a prompt built here tokenizes like one built there.
    `extra` reaches the template as variables (e.g. tools=...).
    """
    if not self.chat_template:
      raise ValueError(f"{self.source} has no chat template")
    messages = _checked_messages(messages)
    variables = {name: self.backend.id_to_token(i) for name, i in (
        ("bos_token", self.bos_id), ("eos_token", self.eos_id), ("pad_token", self.pad_id))
                 if i is not None}
    variables.update(extra, messages=messages, add_generation_prompt=add_generation_prompt)
    import jinja2  # deferred: only chat rendering needs it
    try:
      return _compile_template(self.chat_template).render(**variables)
    except jinja2.TemplateError as e:
      raise ValueError(f"chat template of {self.source} failed: {e}") from e

  def chat_prompt(self, user_text: str) -> str:
    """The prompt for one user message, ending where the assistant's reply starts."""
    if not isinstance(user_text, str) or not user_text:
      raise ValueError(f"chat_prompt needs a non-empty str, got {user_text!r}")
    return self.apply_chat_template([{"role": "user", "content": user_text}])


# ----- GGUF helpers -----


def _open_gguf(path: pathlib.Path) -> Any:
  """A GGUFReader on `path`, with errors that name the file."""
  if not path.is_file():
    raise FileNotFoundError(f"GGUF file not found: {path}")
  import gguf  # deferred: HF-folder users need no gguf
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # gguf raises bare ValueError / struct errors without the path
    raise ValueError(f"{path}: not a readable GGUF file: {e}") from e


class _GgufMeta:
  """Metadata lookups on a GGUFReader whose errors name the file."""

  def __init__(self, reader: Any, path: pathlib.Path):
    self.reader, self.path = reader, path

  def get(self, key: str) -> Any:
    field = self.reader.get_field(key)
    return None if field is None else field.contents()

  def require(self, key: str) -> Any:
    value = self.get(key)
    if value is None:
      raise ValueError(f"{self.path}: GGUF metadata has no {key}")
    return value


def _parse_merges(merges: Sequence[str], path: pathlib.Path) -> list[tuple[str, str]]:
  """GGUF merges are 'left right' strings; byte-level pieces never contain a space."""
  pairs = [tuple(m.split(" ")) for m in merges]
  bad = next((m for m, p in zip(merges, pairs) if len(p) != 2), None)
  if bad is not None:
    raise ValueError(f"{path}: malformed merge {bad!r} (want 'left right')")
  return pairs


def _vocab_dict(tokens: Sequence[str], path: pathlib.Path) -> dict[str, int]:
  """token -> id; a duplicate token would silently lose an id, so it is an error."""
  vocab = {t: i for i, t in enumerate(tokens)}
  if len(vocab) != len(tokens):
    seen: set[str] = set()
    dup = next(t for t in tokens if t in seen or seen.add(t))
    raise ValueError(f"{path}: token {dup!r} appears twice in tokenizer.ggml.tokens")
  return vocab


def _add_marked_tokens(backend: tokenizers.Tokenizer, tokens: Sequence[str],
                       token_types: Sequence[int]) -> None:
  """Control tokens become special added tokens, user-defined ones plain added tokens.

  Both are then matched whole in raw text before any splitting, as llama.cpp does; without this
  '<|im_start|>' would be cut into '<', '|', 'im', ... Their ids stay the file's ids because
  each one is already in the BPE vocabulary.
  """
  control = [AddedToken(t, special=True, normalized=False)
             for t, k in zip(tokens, token_types) if k == _CONTROL]
  user = [AddedToken(t, special=False, normalized=False)
          for t, k in zip(tokens, token_types) if k == _USER_DEFINED]
  if control:
    backend.add_special_tokens(control)
  if user:
    backend.add_tokens(user)


def _checked_id(i: Any, vocab_size: int, name: str, where: Any) -> int | None:
  """`i` as an int id, or None if absent; out-of-range ids are an error naming `where`."""
  if i is None:
    return None
  if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= int(i) < vocab_size:
    raise ValueError(f"{where}: {name} {i!r} is not an id in [0, {vocab_size})")
  return int(i)


# ----- Hugging Face folder helpers -----


def _hf_token_id(backend: tokenizers.Tokenizer, token: Any, name: str,
                 folder: pathlib.Path) -> int | None:
  """Id of a tokenizer_config token entry: a string, or an AddedToken dict with 'content'."""
  if isinstance(token, Mapping):
    token = token.get("content")
  if token is None:
    return None
  i = backend.token_to_id(token) if isinstance(token, str) else None
  if i is None:
    config = folder / "tokenizer_config.json"
    raise ValueError(f"{config}: {name} {token!r} is not in the vocabulary")
  return i


def _hf_chat_template(folder: pathlib.Path, config: Mapping[str, Any]) -> str | None:
  """chat_template.jinja, else the config's template (a string, or named ones: take 'default')."""
  jinja_file = folder / "chat_template.jinja"
  if jinja_file.is_file():
    return jinja_file.read_text(encoding="utf-8")
  template = config.get("chat_template")
  if isinstance(template, list):
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
    template = named.get("default")
  if template is not None and not isinstance(template, str):
    raise ValueError(f"{folder / 'tokenizer_config.json'}: chat_template is not a string")
  return template


def _post_processor_adds(backend: tokenizers.Tokenizer, bos_id: int | None) -> bool:
  """Whether tokenizer.json's post-processor prepends BOS (e.g. Llama 3's TemplateProcessing)."""
  if bos_id is None:
    return False
  ids = backend.encode("a", add_special_tokens=True).ids
  plain = backend.encode("a", add_special_tokens=False).ids
  return ids[:1] == [bos_id] and plain[:1] != [bos_id]


# ----- shared helpers -----


def _eos_ids(backend: tokenizers.Tokenizer, eos_id: int | None, extra: Iterable[int],
             template: str | None) -> tuple[int, ...]:
  """EOS first, then generation-config ids, then turn-end tokens the chat template writes."""
  turn_ends = [backend.token_to_id(t) for t in _TURN_END_TOKENS if template and t in template]
  ordered = [eos_id, *extra, *turn_ends]
  return tuple(dict.fromkeys(int(i) for i in ordered if i is not None))


def _as_id_list(ids: Any, vocab_size: int) -> list[int]:
  """Plain int ids from a list or a 1-D integer array, checked against the vocabulary."""
  arr = np.asarray(ids)
  if arr.size == 0:
    return []
  if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"decode takes a 1-D sequence of int ids, got shape {arr.shape} {arr.dtype}")
  bad = (arr < 0) | (arr >= vocab_size)
  if bad.any():
    raise ValueError(f"token id {int(arr[bad][0])} is outside the vocabulary [0, {vocab_size})")
  return arr.tolist()


def _checked_messages(messages: Any) -> list[dict[str, Any]]:
  """Messages as fresh dicts (templates see copies), each with a string role."""
  if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence) or not messages:
    raise ValueError(f"messages must be a non-empty list of dicts, got {messages!r}")
  out = []
  for m in messages:
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
      raise ValueError(f"each message needs a string 'role', got {m!r}")
    out.append(dict(m))
  return out


@functools.lru_cache(maxsize=16)
def _compile_template(source: str) -> Any:
  """A jinja2 template compiled as transformers compiles chat templates.

  Sandboxed (templates ship with checkpoints and are untrusted code), trim_blocks and
  lstrip_blocks on, loop controls, `raise_exception`, `strftime_now`, and a `tojson` that does
  not HTML-escape.
  """
  import jinja2
  from jinja2 import sandbox

  def raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)

  def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
             separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
  try:
    return env.from_string(source)
  except jinja2.TemplateSyntaxError as e:
    raise ValueError(f"chat template does not parse: {e}") from e
