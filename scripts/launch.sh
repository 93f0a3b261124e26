#!/usr/bin/env bash
# Runs a command as N cooperating JAX processes (jax.distributed), one mesh over all of them.
#
#   bash scripts/launch.sh N -- COMMAND...   N local processes on this machine
#   bash scripts/launch.sh -- COMMAND...     one process of a cluster job: exec COMMAND as is
#
# The command must call speculax.models.distributed.initialize_from_env() before any JAX work
# (the worker in tests/multihost_worker.py does; see README "Multi-host"). It reads:
#   SPECULAX_COORDINATOR    host:port of process 0 (this script: localhost:$SPECULAX_PORT)
#   SPECULAX_NUM_PROCESSES  how many processes in all
#   SPECULAX_PROCESS_ID     this process, 0..N-1 (process 0 alone logs, prints and plots)
#   SPECULAX_CPU_DEVICES    optional: fake CPU devices per process (CPU runs, tests)
#   SPECULAX_DISTRIBUTED=auto  instead of the three above: jax.distributed.initialize() with no
#                           arguments, which detects TPU pods, SLURM, Open MPI and GKE itself.
#
# One machine, N processes (CPU with gloo collectives, or one GPU each; one process driving
# every GPU of the machine needs no launcher at all):
#   SPECULAX_CPU_DEVICES=4 bash scripts/launch.sh 2 -- .venv/bin/python my_run.py
#   SPECULAX_GPU_PER_PROCESS=1 bash scripts/launch.sh 8 -- .venv/bin/python my_run.py
#     (process i sees GPU i alone, through CUDA_VISIBLE_DEVICES=i)
# Several GPU hosts: start one process per host (or per GPU) with the three variables set by
# hand or by the scheduler, all pointing at host 0:
#   SPECULAX_COORDINATOR=host0:12355 SPECULAX_NUM_PROCESSES=4 SPECULAX_PROCESS_ID=$RANK \
#     bash scripts/launch.sh -- .venv/bin/python my_run.py
# SLURM (srun, one task per host or per GPU) and TPU pods (the same command on every worker,
# e.g. gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...):
#   SPECULAX_DISTRIBUTED=auto bash scripts/launch.sh -- .venv/bin/python my_run.py
set -euo pipefail

usage() {
  echo "usage: bash scripts/launch.sh [N] -- COMMAND..." >&2
  exit 2
}

n=""
if [[ $# -gt 0 && $1 != "--" ]]; then
  n=$1
  shift
fi
[[ $# -gt 1 && $1 == "--" ]] || usage
shift

if [[ -z $n ]]; then  # a cluster scheduler set the variables: run this one process
  exec "$@"
fi
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "launch.sh: N must be a positive integer, got '$n'" >&2; exit 2; }

port=${SPECULAX_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup INT TERM

for ((i = 0; i < n; i++)); do
  # One GPU per process on a multi-GPU machine, unless the caller pinned devices already.
  gpu=()
  if [[ -z ${CUDA_VISIBLE_DEVICES:-} && ${SPECULAX_GPU_PER_PROCESS:-0} == 1 ]]; then
    gpu=(CUDA_VISIBLE_DEVICES=$i)
  fi
  env "${gpu[@]}" SPECULAX_COORDINATOR="localhost:$port" SPECULAX_NUM_PROCESSES="$n" \
    SPECULAX_PROCESS_ID="$i" "$@" &
  pids+=($!)
done

status=0
for ((left = n; left > 0; left--)); do
  if ! wait -n; then  # whichever process ends first
    status=1
    cleanup  # one process failed: the others would wait for it in a collective forever
  fi
done
exit $status
