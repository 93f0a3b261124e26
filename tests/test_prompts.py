"""Self-distillation prompts: three sources, split by subject, never sharing one across splits
and never overlapping HumanEval."""
import pytest

from speculax.cli.train import load_experiment, shipped_experiments
from speculax.models import assets
from speculax.train import data, prompts


@pytest.mark.parametrize("source", [prompts.chat_prompts, prompts.topic_prompts])
def test_splits_share_no_subject_and_are_fixed(source):
  train, held = source("train"), source("heldout")
  assert train and held and not set(train) & set(held)
  assert source("train") == train  # a fixed hash, no randomness
  assert source("train", seed=1) != train  # another seed splits other subjects


def test_chat_subjects_go_whole_to_one_split():
  train = " ".join(prompts.chat_prompts("train"))
  held = " ".join(prompts.chat_prompts("heldout"))
  for subject in prompts.CHAT_SUBJECTS:
    assert (subject in train) != (subject in held), subject
  assert len(prompts.chat_prompts("train")) + len(prompts.chat_prompts("heldout")) == \
      len(prompts.CHAT_SUBJECTS) * len(prompts.CHAT_ASKS)


def test_chat_prompts_across_subjects_are_the_same_prompts_reordered():
  held, across = prompts.chat_prompts("heldout"), prompts.chat_prompts("heldout", across=True)
  assert sorted(across) == sorted(held) and across != held
  subjects = [s for s in prompts.CHAT_SUBJECTS if s in " ".join(held)]
  first = across[:len(subjects)]  # one prompt about each subject, the asks rotating
  assert [next(s for s in subjects if s in p) for p in first] == subjects
  assert {next(a for a in prompts.CHAT_ASKS if p.startswith(a.split("{}")[0])) for p in
          first[:len(prompts.CHAT_ASKS)]} == set(prompts.CHAT_ASKS)


def test_topic_prompts_ask_about_this_interpreters_documentation():
  from pydoc_data.topics import topics
  every = prompts.topic_prompts("train") + prompts.topic_prompts("heldout")
  assert any(p.endswith('The "assert" statement.') for p in every)
  assert len(every) > 3 * len(topics)  # titles and paragraphs
  assert all(len(p) < 1400 for p in every)


def test_mixture_interleaves_the_sources_and_never_meets_humaneval():
  mix = prompts.mixture("train", per_source=5)
  assert len(mix) == 15
  assert mix[1] in prompts.topic_prompts("train")
  assert mix[2] in prompts.chat_prompts("train")
  data.check_no_overlap(mix, assets.humaneval_prompts())
  held = prompts.mixture("heldout", per_source=5)
  assert not set(mix) & set(held)


def test_everyday_prompts_are_training_prompts_of_new_subjects():
  every = prompts.everyday_prompts()
  assert len(every) == len(set(every)) == len(prompts.EVERYDAY_SUBJECTS) * len(prompts.CHAT_ASKS)
  assert not set(prompts.EVERYDAY_SUBJECTS) & set(prompts.CHAT_SUBJECTS)
  held = prompts.mixture("heldout")
  assert not set(every) & set(held)
  for subject in prompts.CHAT_SUBJECTS:  # no held-out subject is asked about here
    if prompts.split_of(subject) == "heldout":
      assert not any(subject in p for p in every), subject
  data.check_no_overlap(every, assets.humaneval_prompts())
  counts = {load_experiment(name).data.everyday_chat for name in shipped_experiments()} - {0}
  assert len(counts) >= 3  # every chat round's config names its count
  for subjects in counts:  # the data each config trained on: later subjects only append
    first = prompts.everyday_prompts(subjects)
    assert first == every[:len(first)] and len(first) == subjects * len(prompts.CHAT_ASKS)
  assert prompts.everyday_prompts(0) == []


@pytest.mark.parametrize("subjects", [-1, len(prompts.EVERYDAY_SUBJECTS) + 1, True, 2.0])
def test_everyday_prompts_rejects_a_bad_subject_count(subjects):
  with pytest.raises(ValueError, match="everyday_prompts subjects"):
    prompts.everyday_prompts(subjects)
