"""One process of a multi-process run (tests/test_multihost.py starts two), and the scenarios
both sides run: the workers on a mesh spanning their processes, the test in one process.

  python tests/multihost_worker.py OUT_DIR

with SPECULAX_COORDINATOR / SPECULAX_NUM_PROCESSES / SPECULAX_PROCESS_ID /
SPECULAX_CPU_DEVICES set. Reads the tiny model's params from OUT_DIR/tiny.pkl (the test's own:
initializing them costs seconds per process). Writes (process 0 only) OUT_DIR/params/<i>.npy
(the trained params' leaves, in tree order), OUT_DIR/tokens.json (speculative greedy output)
and OUT_DIR/metrics.csv; both processes save the training checkpoint under OUT_DIR/ckpt and write
OUT_DIR/first_seen_by_<process>.txt (what distributed.primary_first gave them).
"""
import json
import pathlib
import pickle
import sys

MESH_SHAPE = {"data": 4, "tensor": 2}  # 8 devices: two processes of 4, or the test's one of 8
STEPS = 3


def train(cfg, params, folder: pathlib.Path):
  """STEPS distillation steps of a one-layer cut of the tiny model on the mesh, from a random
  top-k teacher (a real one costs a compile and tests nothing more), checkpointed at the end
  (folder/ckpt) and logged every step (folder/metrics.csv)."""
  import numpy as np

  from speculax.models.checkpoints import Checkpointer
  from speculax.models.derive import truncated
  from speculax.models.sharding import MeshConfig
  from speculax.train.distill import DistillConfig
  from speculax.train.loop import fit, sharded_init
  from speculax.train.metrics_log import MetricsLog
  from speculax.train.optim import OptimConfig
  draft_cfg, draft = truncated(params, cfg, [0])
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, cfg.vocab_size, (32, 24), dtype=np.int32)
  ids = np.argsort(rng.random((32, 24, cfg.vocab_size)), -1)[..., :16].astype(np.int32)
  logits = rng.normal(size=ids.shape)
  logprobs = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)
  teacher = lambda rows: {"ids": ids[rows], "logprobs": logprobs[rows]}
  dcfg = DistillConfig(batch_size=8, optim=OptimConfig(learning_rate=3e-3, warmup_steps=1,
                                                       total_steps=STEPS))
  mesh = MeshConfig(**MESH_SHAPE)
  state = sharded_init(draft, draft_cfg, dcfg, mesh)
  with Checkpointer(folder / "ckpt", every=STEPS, keep=1) as ck:
    return fit(state, draft_cfg, dcfg, tokens, teacher, checkpointer=ck, mesh=mesh,
               log=MetricsLog(folder / "metrics.csv"), log_every=1)


def decode(cfg, params) -> list[list[int]]:
  """Speculative greedy decoding of the tiny prompts with prompt lookup, on the mesh."""
  from speculax.decode.config import SpecConfig
  from speculax.decode.speculative import speculative_generate
  from speculax.drafters.prompt_lookup import PromptLookup
  from speculax.models.sharding import MeshConfig

  from tiny_prompts import NEW, PROMPTS
  return speculative_generate(params, cfg, PROMPTS, PromptLookup(),
                              SpecConfig(k=3, max_new_tokens=NEW),
                              mesh=MeshConfig(**MESH_SHAPE)).tokens


def first_writer(path: pathlib.Path) -> str:
  """A step primary_first must order: the first call writes `path`, later ones read it."""
  import jax
  if not path.exists():
    path.write_text(f"process {jax.process_index()}")
  return path.read_text()


def main(out: pathlib.Path) -> None:
  from speculax.models import distributed
  if not distributed.initialize_from_env():
    raise SystemExit("set SPECULAX_COORDINATOR, SPECULAX_NUM_PROCESSES and SPECULAX_PROCESS_ID")
  import jax
  import numpy as np
  first = distributed.primary_first(lambda: first_writer(out / "first.txt"), "first writer")
  (out / f"first_seen_by_{jax.process_index()}.txt").write_text(first)
  cfg, params = pickle.loads((out / "tiny.pkl").read_bytes())
  state = train(cfg, params, out)
  leaves = [distributed.to_host(x) for x in jax.tree.leaves(state.params)]  # a collective
  tokens = decode(cfg, params)
  if distributed.is_primary():
    (out / "params").mkdir()
    for i, leaf in enumerate(leaves):
      np.save(out / "params" / f"{i}.npy", leaf)
    (out / "tokens.json").write_text(json.dumps(tokens))


if __name__ == "__main__":
  main(pathlib.Path(sys.argv[1]))
