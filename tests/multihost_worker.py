"""One process of a multi-process run (tests/test_multihost.py starts two), and the scenarios
both sides run: the workers on a mesh spanning their processes, the test in one process.

  python tests/multihost_worker.py OUT_DIR

with SPECULAX_COORDINATOR / SPECULAX_NUM_PROCESSES / SPECULAX_PROCESS_ID /
SPECULAX_CPU_DEVICES set. Reads the tiny model's params from OUT_DIR/tiny.pkl (the test's own:
initializing them costs seconds per process). Writes (process 0 only) OUT_DIR/params/<i>.npy
(the trained params' leaves, in tree order), OUT_DIR/tokens.json (speculative greedy output)
and OUT_DIR/metrics.csv; both processes save the training checkpoint under OUT_DIR/ckpt and the
trained Medusa heads under OUT_DIR/medusa, and write
OUT_DIR/first_seen_by_<process>.txt (what distributed.primary_first gave them).
"""
import json
import pathlib
import pickle
import sys

MESH_SHAPE = {"data": 4, "tensor": 2}  # 8 devices: two processes of 4, or the test's one of 8
STEPS = 3


def random_teacher(cfg, seed: int, features: bool = False):
  """(tokens [32, 24], teacher) of a random top-k teacher (a real one costs a compile and tests
  nothing more); with features, the teacher also gives random last-layer hidden states."""
  import numpy as np
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, cfg.vocab_size, (32, 24), dtype=np.int32)
  ids = np.argsort(rng.random((32, 24, cfg.vocab_size)), -1)[..., :16].astype(np.int32)
  logits = rng.normal(size=ids.shape)
  logprobs = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)
  hidden = rng.normal(size=(1, 32, 24, cfg.d_model)).astype(np.float32)  # [l, n, t, d]
  return tokens, lambda rows: {"ids": ids[rows], "logprobs": logprobs[rows]} | (
      {"hidden": hidden[:, rows]} if features else {})


def optim():
  from speculax.train.optim import OptimConfig
  return OptimConfig(learning_rate=3e-3, warmup_steps=1, total_steps=STEPS)


def train(cfg, params, folder: pathlib.Path):
  """STEPS distillation steps of a one-layer cut of the tiny model on the mesh, checkpointed at
  the end (folder/ckpt) and logged every step (folder/metrics.csv)."""
  from speculax.models.checkpoints import Checkpointer
  from speculax.models.derive import truncated
  from speculax.models.sharding import MeshConfig
  from speculax.train.distill import DistillConfig
  from speculax.train.loop import fit, sharded_init
  from speculax.train.metrics_log import MetricsLog
  draft_cfg, draft = truncated(params, cfg, [0])
  tokens, teacher = random_teacher(cfg, 3)
  dcfg = DistillConfig(batch_size=8, optim=optim())
  mesh = MeshConfig(**MESH_SHAPE)
  state = sharded_init(draft, draft_cfg, dcfg, mesh)
  with Checkpointer(folder / "ckpt", every=STEPS, keep=1) as ck:
    return fit(state, draft_cfg, dcfg, tokens, teacher, checkpointer=ck, mesh=mesh,
               log=MetricsLog(folder / "metrics.csv"), log_every=1)


def train_heads(cfg, params, folder: pathlib.Path):
  """STEPS steps of two Medusa heads on the tiny target (frozen, sharded over the mesh), from
  random features, saved as a run folder (folder/medusa) by every process."""
  from speculax.drafters.heads_io import save_drafter
  from speculax.drafters.medusa import Medusa
  from speculax.models.sharding import MeshConfig
  from speculax.train.heads import HeadsConfig
  from speculax.train.loop import fit, place_frozen, sharded_init
  tokens, teacher = random_teacher(cfg, 4, features=True)
  hcfg = HeadsConfig(drafter=Medusa(n_heads=2), batch_size=8, optim=optim())
  mesh = MeshConfig(**MESH_SHAPE)
  state = sharded_init(hcfg.drafter.init_params(cfg), cfg, hcfg, mesh)
  state = fit(state, cfg, hcfg, tokens, teacher, frozen=place_frozen(params, cfg, mesh),
              mesh=mesh)
  save_drafter(folder / "medusa", hcfg.drafter, state.params, "tiny", cfg, STEPS)
  return state


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
  train_heads(cfg, params, out)
  leaves = [distributed.to_host(x) for x in jax.tree.leaves(state.params)]  # a collective
  tokens = decode(cfg, params)
  if distributed.is_primary():
    (out / "params").mkdir()
    for i, leaf in enumerate(leaves):
      np.save(out / "params" / f"{i}.npy", leaf)
    (out / "tokens.json").write_text(json.dumps(tokens))


if __name__ == "__main__":
  main(pathlib.Path(sys.argv[1]))
