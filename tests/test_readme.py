"""The README's Python snippets run, in order, as written (on the real SmolLM2 model), so the
README cannot drift from the code. Each snippet's own asserts (greedy speculative output equals
autoregressive output) are checked too."""
import os
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def snippets() -> list[str]:
  return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_snippets():
  blocks = snippets()
  assert len(blocks) >= 5 and "import speculax as sx" in blocks[0]


@pytest.mark.slow
def test_readme_snippets_run(tmp_path, capsys):
  namespace: dict = {}
  cwd = os.getcwd()
  os.chdir(tmp_path)  # run folders land here
  try:
    for i, code in enumerate(snippets()):
      exec(compile(code, f"README.md python block {i}", "exec"), namespace)
  finally:
    os.chdir(cwd)
  out = capsys.readouterr().out
  assert "tau" in out and "acceptance by position" in out
  assert (tmp_path / "runs" / "eagle-readme" / "drafter.json").is_file()
