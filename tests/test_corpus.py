"""Training corpora (train/corpus.py): cached self-distilled answers that resume, prompts files,
and the rows an experiment's DataConfig asks for; on the tiny target with a char tokenizer."""
import dataclasses
import json

import numpy as np
import pytest

import speculax as sx
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters.medusa import Medusa
from speculax.models.load import LoadedModel
from speculax.train import corpus, data
from speculax.train.experiment import DataConfig

from test_data import tok  # noqa: F401 (fixture)
from tiny_prompts import NEW, PROMPTS as TINY_PROMPTS

PROMPTS = ["Say hi.", "Why is the sky blue?", "Continue: x = 1", "List three fruits.", "Ok?"]


def _answers(tiny, tok, folder, prompts, **kw):
  cfg, params = tiny
  return corpus.answers(folder, params, cfg, tok, prompts, max_new_tokens=kw.pop("new", 4),
                        batch_size=2, **kw)


def test_answers_are_the_targets_and_resume(tiny, tok, tmp_path, monkeypatch):
  cfg, params = tiny
  first = _answers(tiny, tok, tmp_path, PROMPTS[:3], temperatures=(0.0, 1.0))
  for i in (0, 2):  # greedy prompts: the target's own greedy answer
    ids = tok.encode(tok.chat_prompt(PROMPTS[i]))
    alone = generate(params, cfg, [ids], GenerateConfig(max_new_tokens=4, eos_ids=tok.eos_ids))
    assert first[i] == ids + alone.tokens[0]
  asked = []
  real = data.self_distill
  monkeypatch.setattr(data, "self_distill", lambda *a, **kw: asked.extend(a[3]) or real(*a, **kw))
  again = _answers(tiny, tok, tmp_path, PROMPTS, temperatures=(0.0, 1.0))
  assert sorted(asked) == sorted(PROMPTS[3:])  # only the new prompts were answered
  assert again[:3] == first
  lines = (tmp_path / "answers.jsonl").read_text().splitlines()
  (tmp_path / "answers.jsonl").write_text("\n".join(lines[:-1] + [lines[-1][:9]]))  # a cut line
  asked.clear()
  assert _answers(tiny, tok, tmp_path, PROMPTS, temperatures=(0.0, 1.0)) == again
  assert len(asked) == 1  # the cut one, redone the same way
  asked.clear()
  assert _answers(tiny, tok, tmp_path, PROMPTS, temperatures=(0.0, 1.0)) == again
  assert not asked  # and the redone line was not glued to the cut one
  with pytest.raises(ValueError, match="max_new_tokens: 4 there, 5 now"):
    _answers(tiny, tok, tmp_path, PROMPTS, temperatures=(0.0, 1.0), new=5)
  with pytest.raises(ValueError, match="temperatures must be"):
    _answers(tiny, tok, tmp_path / "b", PROMPTS, temperatures=(-1.0,))


def test_prompts_file_lines(tmp_path):
  f = tmp_path / "p.jsonl"
  f.write_text('{"prompt": "a?"}\n\n{"text": "some text"}\n{"prompt": "b?"}\n')
  assert corpus.read_prompts_file(f) == (["a?", "b?"], ["some text"])
  for bad, match in (('{"prompt": "a", "text": "b"}', "p.jsonl:1: each line needs one"),
                     ('{"prompt": ""}', "p.jsonl:1: each line needs one"),
                     ('["a"]', "p.jsonl:1: each line needs one"),
                     ('{"prompt": "a"', "p.jsonl:1: not valid JSON")):
    f.write_text(bad + "\n")
    with pytest.raises(ValueError, match=match):
      corpus.read_prompts_file(f)
  with pytest.raises(FileNotFoundError, match="prompts file not found"):
    corpus.read_prompts_file(tmp_path / "none.jsonl")


def test_rows_of_each_corpus(tiny, tok, tmp_path, monkeypatch):
  cfg, params = tiny
  model = LoadedModel(cfg, params, tok)
  f = tmp_path / "p.jsonl"
  lines = [{"prompt": f"Question {i}: why {i}?"} for i in range(8)] + [{"text": "x = 1\n" * 9}]
  f.write_text("".join(json.dumps(x) + "\n" for x in lines))
  base = DataConfig(seq_len=16, rows=6, heldout_rows=2, prompts_file=str(f), answer_tokens=4,
                    temperatures=(0.0,), generate_batch=2, heldout_fraction=0.25, files=30)
  sd = dataclasses.replace(base, corpus="self-distill")
  (train, train_mask), (held, _) = corpus.token_rows(sd, model, tmp_path / "c")
  assert (train_mask == 1).all()  # learn="all"
  assert train.shape == (6, 16) and held.shape[1] == 16 and len(held) >= 1
  # Held out: the last quarter of the prompts (questions 6, 7) and of the texts (none).
  held_text = tok.decode(held.ravel().tolist())
  assert "Question 6" in held_text or "Question 7" in held_text
  assert not any(f"Question {i}:" in tok.decode(train.ravel().tolist()) for i in (6, 7))
  mixed = dataclasses.replace(base, corpus="mixed", code_fraction=0.5)
  (m_train, _), (m_held, _) = corpus.token_rows(mixed, model, tmp_path / "c")
  (code_train, _), _ = corpus.token_rows(dataclasses.replace(base, corpus="code"), model,
                                         tmp_path)
  assert m_train.shape == (6, 16)
  np.testing.assert_array_equal(m_train[3:], code_train[:3])  # half the rows from code
  np.testing.assert_array_equal(m_train[:3], train[:3])
  np.testing.assert_array_equal(m_held, held)  # held out: self-distilled, as the serving text
  # A shipped answers folder (answers_dir) is read instead of the cache folder's, and serves a
  # run whose own folder holds none without generating.
  shipped = dataclasses.replace(sd, answers_dir=str(tmp_path / "shipped"))
  corpus.token_rows(shipped, model, tmp_path / "c")
  assert sorted(p.name for p in (tmp_path / "shipped").iterdir()) == ["answers_heldout",
                                                                       "answers_train"]
  monkeypatch.setattr(data, "self_distill", lambda *a, **k: pytest.fail("generated again"))
  (s_train, _), (s_held, _) = corpus.token_rows(shipped, model, tmp_path / "fresh")
  np.testing.assert_array_equal(s_train, train)
  np.testing.assert_array_equal(s_held, held)
  assert not (tmp_path / "fresh").exists()


def test_pack_adds_no_second_separator():
  rows = data.pack_ids([[5, 6, 0], [7, 8]], 3, sep=0)
  assert rows.ravel().tolist() == [5, 6, 0, 7, 8, 0]


def test_pack_masks_each_documents_context():
  # Stream 9 1 2 3 4 0 9 5 6 0: document 0's bos and first 2 tokens are context; position i is
  # learned when token i + 1 is (the stream's end counts as learned).
  tokens, mask = data.pack_docs([[1, 2, 3, 4], [5, 6]], 5, sep=0, bos=9, context=[2, 0])
  assert tokens.tolist() == [[9, 1, 2, 3, 4], [0, 9, 5, 6, 0]]
  assert mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
  assert (data.pack_docs([[1, 2, 3, 4], [5, 6]], 5, sep=0, bos=9)[1] == 1).all()
  for context, got in (([5, 0], "got 5 for document 0"), ([1], "got None for document 1"),
                       ([-1, 0], "got -1 for document 0")):
    with pytest.raises(ValueError, match=rf"context must give each document a count in \[0, "
                                         rf"its \d tokens\], {got}"):
      data.pack_docs([[1, 2, 3, 4], [5, 6]], 5, sep=0, context=context)


def test_answers_only_rows_mask_the_chat_prompts(tiny, tok, tmp_path):
  """learn="answers": the same tokens, with exactly the positions before a prompt token masked
  out (found here by searching the stream for each chat-templated prompt)."""
  cfg, params = tiny
  model = LoadedModel(cfg, params, tok)
  f = tmp_path / "p.jsonl"
  asked = [f"Question {i}: why {i}?" for i in range(8)]
  f.write_text("".join(json.dumps({"prompt": q}) + "\n" for q in asked)
               + json.dumps({"text": "x = 1\n" * 9}) + "\n")
  base = DataConfig(corpus="mixed", code_fraction=0.25, seq_len=16, rows=8, heldout_rows=2,
                    prompts_file=str(f), answer_tokens=4, temperatures=(0.0,), generate_batch=2,
                    heldout_fraction=0.25, files=30)
  every = corpus.token_rows(base, model, tmp_path / "c")
  train, held = corpus.token_rows(dataclasses.replace(base, learn="answers"), model,
                                  tmp_path / "c")
  for rows, all_rows in ((train, every[0]), (held, every[1])):
    np.testing.assert_array_equal(rows.tokens, all_rows.tokens)
  np.testing.assert_array_equal(train.mask[-2:], 1)  # the code rows are learned whole
  stream, learned = train.tokens[:-2].ravel().tolist(), train.mask[:-2].ravel()
  context = np.zeros(len(stream), bool)
  for q in asked:
    head = tok.encode(tok.chat_prompt(q))
    at = [i for i in range(len(stream) - len(head) + 1) if stream[i:i + len(head)] == head]
    for i in at:
      context[i:i + len(head)] = True
  assert context.sum() > 0
  # Where a whole prompt is in the stream the mask must say so; a prompt cut at the stream's end
  # is context too (those positions lie after the last eos).
  tail = len(stream) - 1 - stream[::-1].index(tok.eos_id)
  expect = ~context[1:]
  np.testing.assert_array_equal(learned[:tail], expect[:tail])
  assert learned[:tail].min() == 0 and learned[:tail].max() == 1
  with pytest.raises(ValueError, match="DataConfig.learn must be one of 'all', 'answers'"):
    DataConfig(learn="prompts")
  assert (corpus.as_rows(train.tokens).mask == 1).all()
  with pytest.raises(ValueError, match=r"Rows.mask has shape \(8, 15\), its tokens \(8, 16\)"):
    corpus.as_rows(corpus.Rows(train.tokens, train.mask[:, 1:]))


def test_train_drafter_on_the_targets_own_answers(tiny, tiny_reference, tok, tmp_path):
  cfg, params = tiny
  model = LoadedModel(cfg, params, tok)
  asked = [f"Question {i}: what is {i} plus {i}?" for i in range(20)]
  medusa = sx.train_drafter(model, Medusa(2), prompts=asked, answer_tokens=6, steps=2,
                            seq_len=16, rows=8, heldout_rows=2, batch_size=2,
                            out_dir=str(tmp_path), name="m")
  lines = (tmp_path / "m" / "answers" / "answers.jsonl").read_text().splitlines()
  assert len(lines) == 20  # every prompt answered once, cached in the run folder
  out = speculative_generate(params, cfg, TINY_PROMPTS[:2], medusa.drafter,
                             SpecConfig(k=2, max_new_tokens=NEW), drafter_params=medusa.params)
  assert out.tokens == tiny_reference[:2]
  with pytest.raises(ValueError, match="at least 2 non-empty strings between them"):
    sx.train_drafter(model, Medusa(2), prompts=["only one"], out_dir=str(tmp_path))
  with pytest.raises(ValueError, match="drafter must be a trained kind"):
    sx.train_drafter(model, "medusa", prompts=asked, out_dir=str(tmp_path))


@pytest.mark.parametrize("prompts_file", [False, True])
def test_everyday_chat_adds_training_prompts_only(tmp_path, prompts_file):
  from speculax.train import prompts
  f = tmp_path / "p.jsonl"
  f.write_text("".join(json.dumps({"prompt": f"q{i}?"}) + "\n" for i in range(8)))
  base = DataConfig(prompts=4, heldout_rows=2, seq_len=16,
                    prompts_file=str(f) if prompts_file else None)
  more = dataclasses.replace(base, everyday_chat=3)
  for split in ("train", "heldout"):
    (asked, texts), (asked_more, texts_more) = (corpus.split_prompts(c, split) for c in (base, more))
    assert texts_more == texts
    extra = prompts.everyday_prompts(3) if split == "train" else []
    assert asked_more == asked + extra  # the split's own prompts first: their answers stay
