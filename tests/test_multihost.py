"""Multi-process runs: two processes of 4 CPU devices each (jax.distributed, gloo collectives,
started by scripts/launch.sh) train, decode and checkpoint on one mesh spanning both, and match
this process's 8 devices on a mesh of the same shape (tests/multihost_worker.py holds the
scenarios both sides run)."""
import csv
import json
import os
import pathlib
import pickle
import signal
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from speculax.models import distributed
from speculax.models.checkpoints import Checkpointer

from multihost_worker import STEPS, decode, train, train_heads

WORKER = pathlib.Path(__file__).with_name("multihost_worker.py")
LAUNCH = pathlib.Path(__file__).parents[1] / "scripts" / "launch.sh"
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, tiny) -> pathlib.Path:
  """The folder the two-process run (started by scripts/launch.sh) wrote: params/,
  tokens.json, ckpt/."""
  out = tmp_path_factory.mktemp("multihost")
  (out / "tiny.pkl").write_bytes(pickle.dumps(jax.device_get(tiny)))
  env = os.environ | {"JAX_PLATFORMS": "cpu", "SPECULAX_CPU_DEVICES": "4",
                      "SPECULAX_PORT": str(_free_port())}
  # A session of its own: on a timeout the launcher and both workers are killed together.
  p = subprocess.Popen(["bash", str(LAUNCH), "2", "--", sys.executable, str(WORKER), str(out)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       start_new_session=True)
  try:
    log = p.communicate(timeout=TIMEOUT_S)[0]
  except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    log = p.communicate()[0] + f"\n(killed after {TIMEOUT_S} s)"
  if p.returncode != 0:
    pytest.fail(f"the two-process run failed (exit {p.returncode}):\n{log[-8000:]}")
  return out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny):
  """The same training in this process, on 8 devices."""
  return train(*tiny, tmp_path_factory.mktemp("one"))


def _saved_params(out: pathlib.Path, n: int) -> list[np.ndarray]:
  return [np.load(out / "params" / f"{i}.npy") for i in range(n)]


def test_training_matches_one_process(two_processes, one_process):
  ref = jax.tree.leaves(one_process.params)
  got = _saved_params(two_processes, len(ref))
  for a, b in zip(got, ref):
    np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-6)
  # The run moved the params: equal after training, not merely equal at init.
  assert int(one_process.step) == STEPS


def test_head_training_matches_one_process(two_processes, tiny, tmp_path):
  """Medusa heads trained on the frozen target sharded over both processes' devices, saved by
  both as one run folder, equal the same training in one process."""
  from speculax.drafters.heads_io import load_drafter
  from speculax.drafters.medusa import Medusa
  ref = train_heads(*tiny, tmp_path)
  _, got = load_drafter(two_processes / "medusa", Medusa, tiny[0])
  _, here = load_drafter(tmp_path / "medusa", Medusa, tiny[0])
  assert int(ref.step) == STEPS and float(np.abs(np.asarray(ref.params["w"])).max()) > 0
  for name in ("w", "b"):
    np.testing.assert_allclose(got[name], np.asarray(ref.params[name]), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(here[name], np.asarray(ref.params[name]))


def test_speculative_decoding_matches_one_process(two_processes, tiny):
  assert json.loads((two_processes / "tokens.json").read_text()) == decode(*tiny)


@pytest.mark.parametrize("where", ["mesh", "one device"])
def test_two_process_checkpoint_restores_here(two_processes, one_process, where):
  like = one_process if where == "mesh" else jax.device_get(one_process)
  with Checkpointer(two_processes / "ckpt", every=1, keep=1) as ck:
    assert ck.all_steps() == [STEPS]
    state = ck.restore(like=like)
  leaves = jax.tree.leaves(state.params)
  for a, b in zip(_saved_params(two_processes, len(leaves)), leaves):
    np.testing.assert_array_equal(a, np.asarray(b))
  assert int(state.step) == STEPS
  if where == "mesh":  # onto like's shardings (spelled with trailing Nones)
    assert all(x.sharding.is_equivalent_to(y.sharding, x.ndim) for x, y in
               zip(jax.tree.leaves(state), jax.tree.leaves(one_process)))


def test_process_0_writes_first_the_others_read(two_processes):
  for i in range(2):
    assert (two_processes / f"first_seen_by_{i}.txt").read_text() == "process 0"


def test_only_process_0_logs(two_processes):
  rows = list(csv.reader((two_processes / "metrics.csv").read_text().splitlines()))[1:]
  pairs = [(r[0], r[1]) for r in rows]
  assert len(pairs) == len(set(pairs)) and {p[0] for p in pairs} == {"1", "2", "3"}


def test_initialize_from_env_needs_all_three_or_none():
  assert distributed.initialize_from_env({}) is False
  with pytest.raises(ValueError, match="SPECULAX_PROCESS_ID missing"):
    distributed.initialize_from_env({"SPECULAX_COORDINATOR": "localhost:1",
                                     "SPECULAX_NUM_PROCESSES": "2"})
  with pytest.raises(ValueError, match="SPECULAX_PROCESS_ID=2 must be below"):
    distributed.initialize_from_env({"SPECULAX_COORDINATOR": "localhost:1",
                                     "SPECULAX_NUM_PROCESSES": "2", "SPECULAX_PROCESS_ID": "2"})
  with pytest.raises(ValueError, match="SPECULAX_NUM_PROCESSES='two' must be an integer"):
    distributed.initialize_from_env({"SPECULAX_COORDINATOR": "localhost:1",
                                     "SPECULAX_NUM_PROCESSES": "two", "SPECULAX_PROCESS_ID": "0"})
