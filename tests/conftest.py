"""Tests run on CPU with 8 fake devices so mesh code is exercised without accelerators."""
import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
# Tiny models' programs compile for seconds and run for milliseconds, so the suite compiles with
# most of XLA's optimizations off: 0.76x its time (README's CI paragraph has the measurements).
# Set in-process only: subprocess tests (notebooks, multihost workers) compile as users do.
jax.config.update("jax_disable_most_optimizations", True)

import pytest  # noqa: E402

from speculax.models import llama  # noqa: E402
from speculax.models.config import get_preset  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
  """(config, params) of the tiny tied-embedding test model."""
  cfg = get_preset("tiny")
  return cfg, llama.init_params(cfg, jax.random.key(0))


@pytest.fixture(scope="session")
def smollm2():
  """The real SmolLM2-135M-Instruct (LoadedModel), loaded once for the slow tests."""
  from speculax.models.load import load
  return load("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_chat_folder(tmp_path_factory):
  """A Hugging Face folder of the accelerator suite's smoke target (a random 4-layer, 64-wide
  Llama with SmolLM2's vocabulary, tokenizer and chat template), for CLI tests of plumbing
  (flags, JSON, losslessness, serving reports): its programs compile in a fraction of the real
  model's time."""
  from speculax.models.export import export
  from speculax.research.accelerator_suite import smoke_target
  folder = tmp_path_factory.mktemp("tiny-chat")
  export(smoke_target(), folder, dtype="float32")
  return folder


@pytest.fixture(scope="session")
def tiny_reference(tiny):
  """Greedy target-only output of each tiny_prompts.PROMPTS prompt decoded alone."""
  from speculax.decode.config import GenerateConfig
  from speculax.decode.generate import generate

  from tiny_prompts import NEW, PROMPTS
  cfg, params = tiny
  return [generate(params, cfg, [p], GenerateConfig(max_new_tokens=NEW)).tokens[0]
          for p in PROMPTS]


@pytest.fixture
def calibrations(monkeypatch):
  """The serving loop's goodput calibration replaced by test_goodput_policy.COSTS; the list
  returned holds each calibration's batch size."""
  import numpy as np
  import test_goodput_policy
  from speculax.decode.calibrate import Calibration
  from speculax.serve import loop
  sizes = []

  def calibrated(params, config, prompts, *args, **kwargs):
    sizes.append(len(prompts))
    return Calibration(np.asarray(test_goodput_policy.COSTS, np.float32), None)

  monkeypatch.setattr(loop, "calibrate", calibrated)
  return sizes


@pytest.fixture(scope="session")
def eos(tiny_reference):
  """EOS ids that end the reference rows at different steps: row i's token at step 3i."""
  return tuple(sorted({r[(3 * i) % len(r)] for i, r in enumerate(tiny_reference) if i}))


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_code():
  """Drops compiled executables after each test module. Every XLA:CPU executable keeps a few
  memory maps alive; one process compiling the whole suite's thousands of programs came close
  to the kernel's map limit (vm.max_map_count, 65530), where LLVM fails to map code and the
  process dies with a segfault in a compile."""
  yield
  jax.clear_caches()
  gc.collect()


def pytest_collection_modifyitems(items):
  """Modules holding a slow test (the real model) run first, each module kept whole (module
  fixtures load once). Collected alphabetically, the slowest modules (README snippets, the
  real-model decoding tests) came last, so the 2 workers ended on a few long tests, one of
  them idle; longest first should keep both busy to the end (not yet measured on a steady day)."""
  slow = {item.module for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.module not in slow)  # stable: file order within each group
