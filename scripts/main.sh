#!/usr/bin/env bash
# The main job on the built-in default: SmolLM2-135M-Instruct on HumanEval prompts.
# Extra arguments go to `speculax generate` (see `.venv/bin/speculax generate --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/speculax generate "$@"
