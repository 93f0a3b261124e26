#!/usr/bin/env bash
# The accelerator suite on a lent GPU machine (no network; jax, flax, optax, orbax, tensorstore,
# tokenizers, safetensors, matplotlib already there), in three verbs run from the repository root
# there by back-to-back device calls (README "Accelerator suite" has the calls and what each
# carries; ignored files and /tmp stay on the machine while it is warm):
#   start ...   first call (carries .whl/ and the first weight shard): installs the wheels and
#               speculax into /tmp/site and starts, in the background, every section that needs
#               no weights (random weights of the same shapes time the same; arguments, if any,
#               replace its default batches and sections)
#   status      the calls that carry the other shards: the background run's last lines
#   finish ...  last call (carries the last shard): waits for the background run (at most
#               WAIT_S, default 120 s, then stops it: its rows so far are kept), runs the drafters
#               section on the real weights in .gpu/smollm2 (arguments, if any, replace its
#               default rows and settings) and copies the JSONs, plots, logs and gpu.txt to $OUT
#   run ...     one call alone, no weights carried (carries .whl/): installs as start does and runs
#               the suite on random weights in the foreground with these arguments, its JSON, plot
#               and log in $OUT (e.g. `run --batches 1,8 --sections loops`)
# python3 -P: the repository root must not shadow the installed package (its speculax/ folder
# holds only api.py and __init__.py; the rest is mapped by pyproject's package-dir).
set -euo pipefail
cd "$(dirname "$0")/.."
bg=/tmp/speculax-bg
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
suite=(python3 -P -m speculax.research.accelerator_suite)
install() {  # the wheels and speculax into /tmp/site; the GPU and jax into $1/gpu.txt
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
    --target /tmp/site .
  rm -rf build
  mkdir -p "$1"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$1/gpu.txt"
  python3 -P -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$1/gpu.txt"
}
case "${1:-}" in
  start)
    shift
    picked=("$@")
    [ ${#picked[@]} -gt 0 ] || picked=(
      --batches 1,8 --sections loops,attention,verify,training,autoregressive)
    install "$bg"
    setsid nohup "${suite[@]}" --random-weights --model smollm2-135m "${picked[@]}" \
      --trace "$bg/trace" --results "$bg/accelerator_suite.json" \
      >"$bg/accelerator_suite.log" 2>&1 </dev/null &
    echo $! >"$bg/pid"
    sleep 20
    tail -5 "$bg/accelerator_suite.log";;
  status)
    tail -5 "$bg/accelerator_suite.log";;
  finish)
    shift
    pid=$(cat "$bg/pid")
    for _ in $(seq $(( ${WAIT_S:-120} / 2 ))); do kill -0 "$pid" 2>/dev/null || break; sleep 2; done
    kill "$pid" 2>/dev/null && echo "stopped the background run after ${WAIT_S:-120} s" || true
    out="${OUT:-results/accelerator}"
    mkdir -p "$out"
    cp "$bg"/*.json "$bg"/*.png "$bg"/*.log "$bg/gpu.txt" "$out"/ 2>/dev/null || true
    picked=("$@")
    [ ${#picked[@]} -gt 0 ] || picked=(
      --drafter-method "prompt lookup" --drafter-method "layer skip"
      --drafter-method "eagle k=1" --drafter-method "eagle k=4"
      --drafter-method "eagle tree (9 nodes)" --drafter-method "eagle-ttt k=4"
      --drafter-method "eagle-ttt tree (9 nodes)"
      --drafter-set "batch_sizes=(1,8)" --drafter-set "temperatures=(0.0,)")
    "${suite[@]}" --model .gpu/smollm2 --sections drafters "${picked[@]}" \
      --results "$out/accelerator_drafters.json" 2>&1 | tee "$out/accelerator_drafters.log";;
  run)
    shift
    out="${OUT:-results/accelerator}"
    install "$out"
    "${suite[@]}" --random-weights --model smollm2-135m "$@" \
      --results "$out/accelerator_suite.json" 2>&1 | tee "$out/accelerator_suite.log";;
  *)
    echo "usage: bash scripts/accelerator.sh start|status|finish|run [suite arguments]" >&2
    exit 2;;
esac
