#!/usr/bin/env bash
# The test suite on CPU (8 fake devices, see tests/conftest.py), in 2 worker processes
# (PYTEST_WORKERS=0 for one). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,reference"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# --durations: each CI log lists the slowest tests (the suite runs above its 35-minute budget)
exec .venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --durations=30 "$@"
