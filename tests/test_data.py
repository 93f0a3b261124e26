"""Training data: stdlib files and their split, packing, resumable batches, prompts, distill."""
from __future__ import annotations

import numpy as np
import pytest
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from speculax.models.tokenizer import Tokenizer
from speculax.train import data

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_chars() -> dict[int, str]:
  """GPT-2's byte -> printable character map (what byte-level BPE vocabularies spell)."""
  keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
  extra = [b for b in range(256) if b not in keep]
  return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
  """Byte-level, one token per ASCII char (tab, newline, printable): 100 ids, fit the tiny model."""
  chars = _byte_chars()
  vocab = {t: i for i, t in enumerate(SPECIALS)}
  for b in (9, 10, *range(32, 127)):
    vocab[chars[b]] = len(vocab)
  backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
  return Tokenizer(backend=backend, bos_id=None, eos_id=0, eos_ids=(0, 2), pad_id=None,
                   add_bos=False, chat_template=TEMPLATE, source="test-chars")


# ----- files -----


def test_stdlib_files_sorted_without_tests():
  files = data.stdlib_files()
  root = data.stdlib_root()
  assert len(files) > 100 and files == sorted(files)
  assert root / "json" / "decoder.py" in files
  assert not any({"test", "tests", "site-packages"} & set(f.relative_to(root).parts[:-1])
                 for f in files)
  assert data.stdlib_files(limit=5) == files[:5]


def test_split_deterministic_disjoint_and_stable():
  files = data.stdlib_files()
  train, heldout = data.split_files(files, 0.2, seed=0)
  assert (train, heldout) == data.split_files(files, 0.2, seed=0)
  assert not set(train) & set(heldout) and len(train) + len(heldout) == len(files)
  assert 0.1 < len(heldout) / len(files) < 0.3
  # A file's side does not depend on the other files in the list.
  _, sub_heldout = data.split_files(files[::7], 0.2, seed=0)
  assert set(sub_heldout) == set(heldout) & set(files[::7])
  assert data.split_files(files, 0.2, seed=1)[1] != heldout
  with pytest.raises(ValueError, match="heldout_fraction"):
    data.split_files(files, 1.0)


def test_text_files_and_empty_folder(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "missing")):
    data.text_files(tmp_path / "missing")
  with pytest.raises(ValueError, match=f"no files matching '\\*.py' under data folder {tmp_path}"):
    data.text_files(tmp_path)
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "x.py").write_text("x = 1\n")
  (tmp_path / "a.py").write_text("a = 2\n")
  (tmp_path / "c.txt").write_text("no")
  files = data.text_files(tmp_path)
  assert files == [tmp_path / "a.py", tmp_path / "b" / "x.py"]
  assert list(data.read_texts(files)) == ["a = 2\n", "x = 1\n"]
  train, heldout = data.split_files(files, 0.5, root=tmp_path)
  assert sorted(train + heldout) == files


# ----- packing -----


def test_pack_sequences_round_trip(tok):
  texts = ["def f(x):\n\treturn x + 1\n", "", "import os  # a comment", "y = [1, 2, 3]\n" * 3]
  rows = data.pack_sequences(tok, texts, 16)
  total = sum(len(tok.encode(t)) + 1 for t in texts if t)  # + 1 separator per document
  assert rows.dtype == np.int32 and rows.shape == (total // 16, 16)
  stream = "<|endoftext|>".join(t for t in texts if t) + "<|endoftext|>"
  assert stream.startswith(tok.decode(rows.reshape(-1), skip_special_tokens=False))
  with_bos = data.pack_sequences(tok, texts, 8, bos=1, max_rows=2)
  assert with_bos.shape == (2, 8) and with_bos[0, 0] == 1


def test_pack_errors(tok):
  with pytest.raises(ValueError, match="seq_len must be >= 2"):
    data.pack_sequences(tok, ["abc"], 1)
  with pytest.raises(ValueError, match="only 4 tokens of text, fewer than one row of seq_len=8"):
    data.pack_sequences(tok, ["abc"], 8)
  with pytest.raises(ValueError, match="sep id 500 is outside"):
    data.pack_sequences(tok, ["abc"], 2, sep=500)


# ----- batches -----


def test_batches_deterministic_and_resumable():
  array = np.arange(10 * 3).reshape(10, 3)
  epoch = list(data.batches(array, 4, seed=0, epoch=0))
  assert len(epoch) == 2 and all(b.shape == (4, 3) for b in epoch)
  assert len({int(r) for b in epoch for r in b[:, 0]}) == 8  # no row twice within an epoch
  assert all(np.array_equal(a, b) for a, b in zip(epoch, data.batches(array, 4, seed=0, epoch=0)))
  resumed = list(data.batches(array, 4, seed=0, epoch=0, start_step=1))
  assert len(resumed) == 1 and np.array_equal(resumed[0], epoch[1])
  assert not np.array_equal(next(data.batches(array, 4, seed=0, epoch=1)), epoch[0])
  # Global steps run through the epochs: step 3 is the second batch of epoch 1.
  second = list(data.batches(array, 4, seed=0, epoch=1))[1]
  np.testing.assert_array_equal(array[data.batch_rows(10, 4, 3, seed=0)], second)
  with pytest.raises(ValueError, match="batch_size 11 exceeds the 10 rows"):
    next(data.batches(array, 11, seed=0, epoch=0))


# ----- prompts -----


def test_prompt_sets_never_overlap_humaneval():
  from speculax.models import assets
  files = data.stdlib_files()[:40]
  sets = data.prompt_sets(files, limit=30)
  assert sets.heldout == assets.humaneval_prompts() and len(sets.heldout) == 164
  assert 0 < len(sets.train) <= 30 and sets.train == data.prompt_sets(files, limit=30).train
  assert not set(sets.train) & set(sets.heldout)
  assert {p.split(" ")[0] for p in sets.train} >= {"Explain", "Write"}
  with pytest.raises(ValueError, match="training prompt 1 overlaps"):
    data.check_no_overlap([sets.train[0], "Finish: " + sets.heldout[5]], sets.heldout)


# ----- self-distillation -----


def test_self_distill_batches_match_one_by_one(tiny, tok):
  from speculax.decode.config import GenerateConfig
  from speculax.decode.generate import generate
  cfg, params = tiny
  prompts = ["Say hi.", "Continue this code: x = 1", "Why?"]
  got = data.self_distill(params, cfg, tok, prompts, max_new_tokens=4, batch_size=2)
  for text, seq in zip(prompts, got):
    ids = tok.encode(tok.chat_prompt(text))
    assert seq[:len(ids)] == ids and 0 < len(seq) - len(ids) <= 4
    alone = generate(params, cfg, [ids, ids], GenerateConfig(max_new_tokens=4, eos_ids=(0, 2)))
    assert seq[len(ids):] == alone.tokens[0]  # greedy: the batch does not change the answer
  with pytest.raises(ValueError, match="prompt 0 has 250 tokens"):
    data.generate_batched(params, cfg, [[1] * 250], max_new_tokens=8, batch_size=1)
