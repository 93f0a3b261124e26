"""Runs that span processes (jax.distributed): starting the runtime from the environment, and
moving host data into and out of arrays whose shards live in several processes.

Every process runs the same program on the same global shapes (JAX's multi-controller model).
Host data enters in one of two ways:
- a value every process holds in full (params, prompts, a zero cache): `put_global`, where each
  process fills only the shards of its own devices;
- rows each process reads for itself (a training batch): `process_rows` says which rows of the
  global batch this process's devices hold, `from_process_rows` assembles the global array.
Results leave through `to_host`, which gathers an array that spans processes (a collective:
every process must call it). In one process all of these reduce to plain device_put / asarray.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

COORDINATOR = "SPECULAX_COORDINATOR"  # host:port of process 0's coordination service
NUM_PROCESSES = "SPECULAX_NUM_PROCESSES"
PROCESS_ID = "SPECULAX_PROCESS_ID"
AUTO = "SPECULAX_DISTRIBUTED"  # "auto": let jax.distributed detect the cluster (TPU pod, SLURM)
CPU_DEVICES = "SPECULAX_CPU_DEVICES"  # fake CPU devices per process (tests, laptops)

T = TypeVar("T")


def initialize_from_env(environ: Mapping[str, str] = os.environ) -> bool:
  """Starts jax.distributed from the SPECULAX_* variables (scripts/launch.sh sets them);
  returns whether it did. Call it before any JAX computation.

  SPECULAX_DISTRIBUTED=auto calls jax.distributed.initialize() with no arguments: on TPU pods,
  SLURM, Open MPI and GKE JAX finds the coordinator, process count and id itself. Otherwise
  SPECULAX_COORDINATOR, SPECULAX_NUM_PROCESSES and SPECULAX_PROCESS_ID go together; with none
  set this is a no-op (one process).
  """
  if CPU_DEVICES in environ:
    jax.config.update("jax_num_cpu_devices", _int(environ, CPU_DEVICES, low=1))
  if environ.get(AUTO, "").lower() == "auto":
    jax.distributed.initialize()
    return True
  given = [v for v in (COORDINATOR, NUM_PROCESSES, PROCESS_ID) if v in environ]
  if not given:
    return False
  if len(given) != 3:
    missing = sorted({COORDINATOR, NUM_PROCESSES, PROCESS_ID} - set(given))
    raise ValueError(f"{', '.join(given)} set but {', '.join(missing)} missing: set all three "
                     f"(or {AUTO}=auto on TPU pods and SLURM)")
  n = _int(environ, NUM_PROCESSES, low=1)
  pid = _int(environ, PROCESS_ID, low=0)
  if pid >= n:
    raise ValueError(f"{PROCESS_ID}={pid} must be below {NUM_PROCESSES}={n}")
  jax.distributed.initialize(coordinator_address=environ[COORDINATOR], num_processes=n,
                             process_id=pid)
  return True


def _int(environ: Mapping[str, str], name: str, low: int) -> int:
  value = environ[name]
  try:
    n = int(value)
  except ValueError:
    n = low - 1
  if n < low:
    raise ValueError(f"{name}={value!r} must be an integer >= {low}")
  return n


def is_primary() -> bool:
  """Whether this is process 0, the one that prints, logs and writes files of its own."""
  return jax.process_index() == 0


def primary_first(make: Callable[[], T], what: str) -> T:
  """make() in process 0, then, once it is done, in the others: for steps that write files the
  others then read (a teacher cache, a corpus), which every process writing at once would
  garble. `make` must not run collectives (it runs in one process at a time)."""
  if jax.process_count() == 1:
    return make()
  out = make() if is_primary() else None
  multihost_utils.sync_global_devices(f"speculax primary_first: {what}")
  return out if is_primary() else make()


def put_global(x, sharding: jax.sharding.Sharding) -> jax.Array:
  """`x`, a value every process holds in full, as an array of `sharding`.

  device_put moves device data directly where it can: within one process, or from an array
  that already spans processes. A host or process-local value bound for devices of several
  processes goes through the host instead (device_put refuses a committed local array there):
  each process builds only its own devices' shards.
  """
  if sharding.is_fully_addressable or (isinstance(x, jax.Array) and not x.is_fully_addressable):
    return jax.device_put(x, sharding)
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def process_rows(sharding: jax.sharding.Sharding, n: int) -> slice:
  """Rows [lo, hi) of an n-row global batch that this process's devices hold (sharding: of a
  [n] array); the whole batch in one process. Meshes from sharding.make_mesh keep a process's
  rows contiguous."""
  spans = {index[0].indices(n)[:2] for index in sharding.addressable_devices_indices_map((n,)).values()}
  lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
  if sum(b - a for a, b in spans) != hi - lo:
    raise ValueError(f"process {jax.process_index()} holds rows {sorted(spans)} of the batch, "
                     f"not one contiguous block: order the mesh so that each process's devices "
                     f"are neighbours along the batch axes")
  return slice(lo, hi)


def from_process_rows(sharding: jax.sharding.Sharding, local: np.ndarray, n: int,
                      axis: int = 0) -> jax.Array:
  """The global array with n rows along `axis` whose rows `process_rows` are `local` here."""
  shape = list(np.shape(local))
  shape[axis] = n
  return jax.make_array_from_process_local_data(sharding, local, tuple(shape))


def to_host(x) -> np.ndarray:
  """The whole value of `x` as numpy; an array that spans processes is gathered from all of
  them (every process must call this at the same point)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)
