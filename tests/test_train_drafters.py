"""research/train_drafters.py's command line refuses what it cannot do before loading a model."""
import argparse
import sys

import pytest

from speculax.research import train_drafters


def _main(monkeypatch, capsys, *argv) -> str:
  monkeypatch.setattr(sys, "argv", ["train_drafters", *argv])
  with pytest.raises(SystemExit):
    train_drafters.main()
  return capsys.readouterr().err


def test_a_ship_name_is_one_folder_for_one_drafter(monkeypatch, capsys):
  err = _main(monkeypatch, capsys, "--drafters", "eagle,hydra", "--ship", "mine")
  assert "--ship mine names one folder" in err and "eagle,hydra" in err


def test_a_report_of_an_empty_results_file_names_it(monkeypatch, capsys, tmp_path):
  err = _main(monkeypatch, capsys, "--report", "--results", str(tmp_path / "none.json"))
  assert "no runs in --results" in err and "none.json" in err


def _args(**kw) -> argparse.Namespace:
  return argparse.Namespace(**{**dict(divergence=None, option=[], steps=0, learn=None, prompts=0,
                                      rows=0, lr=0, batch=0, tag="", init_from=None,
                                      heldout_teacher=None),
                               **kw})


def test_init_from_replaces_the_experiments_start():
  """--init-from starts the experiment from another folder; without it, from its own."""
  args = _args(tag="more")
  assert train_drafters._experiment("eagle_ttt", args).init_from == "results/drafters/eagle-smollm2"
  args.init_from = "results/drafters/eagle-ttt-smollm2"
  exp = train_drafters._experiment("eagle_ttt", args)
  assert exp.init_from == args.init_from and exp.name == "eagle-ttt-smollm2-more"


def test_heldout_teacher_sets_the_law_and_the_report_names_it(capsys):
  """Held-out figures read the target's exact law unless --heldout-teacher top-k; rows recorded
  before the setting existed read the cache's top-k and are labelled so."""
  assert train_drafters._experiment("eagle_chat4", _args()).data.heldout_teacher == "exact"
  exp = train_drafters._experiment("eagle_chat4", _args(heldout_teacher="top-k"))
  assert exp.data.heldout_teacher == "top-k"
  row = dict(divergence="lk", options={}, updates=0, train_s=0.0, before={},
             after={"acceptance/depth1": 0.6, "top1/depth1": 0.6})
  train_drafters.report({"machine": "m", "runs": {"old": row, "new": {**row, "teacher": "exact"}}})
  lines = capsys.readouterr().out.splitlines()
  assert any("| old | all, top-k law |" in line for line in lines)
  assert any("| new | all, exact law |" in line for line in lines)


def test_steps_lr_and_batch_override_the_experiments_own():
  """--steps, --lr and --batch replace the experiment's updates, peak rate and rows an update;
  held-out evaluations fall on each quarter of the updates."""
  own = train_drafters._experiment("eagle_hour", _args()).distill
  exp = train_drafters._experiment("eagle_hour", _args(steps=2000, lr=5e-3, batch=4))
  assert (exp.distill.optim.total_steps, exp.distill.optim.learning_rate,
          exp.distill.batch_size) == (2000, 5e-3, 4)
  assert (own.optim.total_steps, own.optim.learning_rate, own.batch_size) == (1000, 3e-3, 8)
  assert exp.eval_every == 500
