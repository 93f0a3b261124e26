#!/usr/bin/env bash
# The main job on the built-in default: SmolLM2-135M-Instruct on the first 4 HumanEval prompts,
# one at a time, decoded by the shipped EAGLE + TTT drafter behind prompt lookup's copies (k = 3),
# then by plain autoregressive decoding: the texts, both speeds, the speedup and whether the
# outputs are the same. Arguments, when given, replace those defaults and go to
# `speculax generate` (see `.venv/bin/speculax generate --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -eq 0 ]; then
  set -- --drafter eagle --heads results/drafters/eagle-ttt-smollm2 --lookup 2 -k 3 --rows 1 \
    --compare
fi
exec .venv/bin/speculax generate "$@"
