"""research/train_drafters.py's command line refuses what it cannot do before loading a model."""
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
