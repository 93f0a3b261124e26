"""The distillation trainer on tiny models: it learns, resumes exactly, and shards."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.models.checkpoints import Checkpointer
from speculax.models.derive import truncated
from speculax.models.sharding import MeshConfig
from speculax.train.distill import DistillConfig, teacher_topk
from speculax.train.loop import Target, fit, sharded_init
from speculax.train.metrics_log import MetricsLog
from speculax.train.optim import OptimConfig

K = 16


@pytest.fixture(scope="module")
def setup(tiny):
  cfg, params = tiny
  tokens = np.asarray(jax.random.randint(jax.random.key(3), (32, 24), 0, cfg.vocab_size), np.int32)
  ids, logprobs = (np.asarray(x) for x in teacher_topk(params, cfg, jnp.asarray(tokens), K))
  teacher = lambda rows: {"ids": ids[rows], "logprobs": logprobs[rows]}
  draft_cfg, draft = truncated(params, cfg, [0])  # one target layer: a weak drafter
  return cfg, params, draft_cfg, draft, tokens, teacher


def _cfg(**kw):
  return DistillConfig(**({"batch_size": 8, "optim": OptimConfig(learning_rate=3e-3, warmup_steps=2,
                                                                 total_steps=12)} | kw))


def _train(setup, cfg, steps=None, state=None, **kw):
  _, _, draft_cfg, draft, tokens, teacher = setup
  state = state if state is not None else sharded_init(draft, draft_cfg, cfg, kw.get("mesh"))
  if steps is not None:
    cfg = dataclasses.replace(cfg, optim=cfg.optim.with_total_steps(steps))
  return fit(state, draft_cfg, cfg, tokens, teacher, **kw)


@pytest.mark.parametrize("divergence, options", [
    ("fkl", ()), ("rkl", ()), ("jsd", (("beta", 0.5),)), ("tvd", ()),
    ("tvd++", (("n_samples", 32),)),  # one sample per position is too noisy to learn in 12 steps
    ("ce", ())])
def test_training_raises_acceptance(setup, tmp_path, divergence, options):
  log = MetricsLog(tmp_path / "metrics.csv")
  _train(setup, _cfg(divergence=divergence, divergence_options=options), log=log, log_every=1)
  rows = log.read()
  assert len(rows) == 12 and all(np.isfinite(r["loss"]) for r in rows)
  # CE fits the data tokens, which here are random, not target text: it lowers its own loss
  # but need not move the drafter towards the target. Every divergence must raise acceptance.
  metric, sign = ("loss", -1) if divergence == "ce" else ("acceptance", 1)
  first, last = (sign * np.mean([r[metric] for r in part]) for part in (rows[:2], rows[-2:]))
  assert last > first + 0.02, (metric, first, last)
  assert log.plot(tmp_path / "curves.png").stat().st_size > 0


def test_resume_continues_the_exact_run(setup, tmp_path):
  cfg = _cfg(divergence="tvd++", divergence_options=(("n_samples", 4),))  # uses the step key too
  straight = _train(setup, cfg)
  with Checkpointer(tmp_path / "ckpt", every=6, keep=2) as ck:
    _train(setup, cfg, checkpointer=ck, until=6)  # "killed" after 6 of 12 steps
  with Checkpointer(tmp_path / "ckpt", every=6, keep=2) as ck:
    like = sharded_init(setup[3], setup[2], cfg, None)
    restored = ck.restore(like=like)
    assert int(restored.step) == 6
    resumed = _train(setup, cfg, state=restored, checkpointer=ck)
  for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(straight.opt_state), jax.tree.leaves(resumed.opt_state)):
    np.testing.assert_array_equal(a, b)


def test_checkpoint_of_another_drafter_shape_names_the_leaf(setup, tmp_path):
  cfg = _cfg()
  with Checkpointer(tmp_path / "ckpt", every=1, keep=1) as ck:
    _train(setup, cfg, checkpointer=ck, until=1)
  tiny_cfg, params = setup[0], setup[1]
  other_cfg, other = truncated(params, tiny_cfg, [0, 1])  # two layers instead of one
  with Checkpointer(tmp_path / "ckpt", every=1, keep=1) as ck:
    with pytest.raises(ValueError, match="layers"):
      ck.restore(like=sharded_init(other, other_cfg, cfg, None))


def test_data_parallel_and_fsdp_match_one_device(setup):
  cfg = _cfg(optim=OptimConfig(learning_rate=3e-3, warmup_steps=1, total_steps=4))
  single = _train(setup, cfg)
  sharded = _train(setup, cfg, mesh=MeshConfig(data=4, fsdp=2))
  emb = sharded.params["embed"]
  assert emb.sharding.shard_shape(emb.shape)[1] == emb.shape[1] // 2  # fsdp split the params
  for a, b in zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)


def test_gradient_accumulation_updates_every_k_micro_batches(setup):
  from speculax.train.distill import init_state, train_step
  _, _, draft_cfg, draft, tokens, teacher = setup
  cfg = _cfg(optim=OptimConfig(learning_rate=3e-3, warmup_steps=0, total_steps=2, accum_steps=2))
  assert cfg.steps == 4  # 2 updates x 2 micro-batches
  rows = np.arange(8)
  batch = {"tokens": jnp.asarray(tokens[rows]), "mask": jnp.ones((8, 24)),
           **{k: jnp.asarray(v) for k, v in teacher(rows).items()}}
  s = init_state(draft, cfg)
  s, _ = train_step(s, batch, draft_cfg, cfg)
  np.testing.assert_array_equal(s.params["embed"], draft["embed"])  # first micro-batch: no update
  s, _ = train_step(s, batch, draft_cfg, cfg)
  assert not np.array_equal(s.params["embed"], draft["embed"])


def test_mixed_precision_tracks_float32(setup, tmp_path):
  logs = {}
  for mp in (False, True):
    logs[mp] = MetricsLog(tmp_path / f"{mp}.csv")
    _train(setup, _cfg(mixed_precision=mp), log=logs[mp], log_every=1)
  a, b = logs[False].read(), logs[True].read()
  assert abs(a[0]["loss"] - b[0]["loss"]) < 0.05 * abs(a[0]["loss"])
  assert b[-1]["acceptance"] > b[0]["acceptance"]


def test_on_policy_rows_come_from_the_drafter(setup, tmp_path):
  cfg_t, params = setup[0], setup[1]
  cfg = _cfg(on_policy_fraction=0.5, on_policy_prefix=8,
             optim=OptimConfig(learning_rate=3e-3, warmup_steps=0, total_steps=2))
  log = MetricsLog(tmp_path / "m.csv")
  _train(setup, cfg, target=Target(params, cfg_t, top_k=K), log=log, log_every=1)
  assert len(log.read()) == 2
  from speculax.train.loop import make_batch
  state = sharded_init(setup[3], setup[2], cfg, None)
  batch = make_batch(state, setup[2], cfg, setup[4], setup[5], Target(params, cfg_t, top_k=K), 0)
  from speculax.train.data import batch_rows
  data_rows = setup[4][batch_rows(32, 8, 0, seed=0)]
  assert (batch["tokens"][:4, :8] == data_rows[:4, :8]).all()  # the prefix is kept
  assert not (batch["tokens"][:4, 8:] == data_rows[:4, 8:]).all()  # the rest is sampled
  assert (batch["tokens"][4:] == data_rows[4:]).all()
  # A loss mask rides along for the data rows; the drafter's own continuations are learned whole.
  mask = np.zeros(setup[4].shape, np.float32)
  batch = make_batch(state, setup[2], cfg, setup[4], setup[5], Target(params, cfg_t, top_k=K), 0,
                     mask=mask)
  assert (batch["mask"][:4] == 1).all() and (batch["mask"][4:] == 0).all()
  assert (mask == 0).all()  # the caller's mask is not written through


def test_masked_positions_never_move_the_drafter(setup):
  """Teachers that differ only where the mask is 0 train the same drafter, bit for bit."""
  _, _, draft_cfg, draft, tokens, teacher = setup
  mask = np.ones(tokens.shape, np.float32)
  mask[:, 12:] = 0
  def noisy(rows):  # other laws after position 12
    out = teacher(rows)
    return out | {"logprobs": np.concatenate([out["logprobs"][:, :12],
                                              out["logprobs"][:, 12:][..., ::-1]], 1)}
  cfg = _cfg(optim=OptimConfig(learning_rate=3e-3, warmup_steps=0, total_steps=3))
  runs = [fit(sharded_init(draft, draft_cfg, cfg, None), draft_cfg, cfg, tokens, t, mask=mask)
          for t in (teacher, noisy)]
  jax.tree.map(np.testing.assert_array_equal, runs[0].params, runs[1].params)
  unmasked = fit(sharded_init(draft, draft_cfg, cfg, None), draft_cfg, cfg, tokens, noisy)
  assert not np.array_equal(unmasked.params["embed"], runs[0].params["embed"])


def test_bad_training_config():
  with pytest.raises(ValueError, match="DistillConfig.divergence must be one of 'fkl', .*, got 'kl-ish'"):
    DistillConfig(divergence="kl-ish")
  with pytest.raises(ValueError, match="OptimConfig.learning_rate must be a finite number > 0, got -0.001"):
    OptimConfig(learning_rate=-1e-3)
  with pytest.raises(ValueError, match=r"warmup_steps must be in \[0, total_steps=5\), got 5"):
    OptimConfig(warmup_steps=5, total_steps=5)
  with pytest.raises(ValueError, match="DistillConfig.on_policy_fraction must be a finite number "
                                       ">= 0 and <= 1, got 1.5"):
    DistillConfig(on_policy_fraction=1.5)


def test_metrics_log_keeps_steps_with_different_metrics(tmp_path):
  log = MetricsLog(tmp_path / "m.csv")
  log.write(2, {"loss": 2.0})
  log.write(4, {"loss": 1.0, "heldout_acceptance": 0.5})  # evaluations are rarer than logs
  assert log.read() == [{"step": 2, "loss": 2.0},
                        {"step": 4, "loss": 1.0, "heldout_acceptance": 0.5}]
  assert log.plot(tmp_path / "c.png").stat().st_size > 0


def test_plot_groups_per_depth_metrics_in_a_grid(tmp_path):
  from speculax.train.metrics_log import panel_groups
  names = ["loss", "acceptance/depth10", "acceptance/depth2", "acceptance",
           "heldout/top1/depth1", "heldout/top1/depth3", "heldout/loss"]
  assert panel_groups(names) == {
      "acceptance": ["acceptance"],
      "acceptance/depth*": ["acceptance/depth2", "acceptance/depth10"],
      "heldout/loss": ["heldout/loss"],
      "heldout/top1/depth*": ["heldout/top1/depth1", "heldout/top1/depth3"], "loss": ["loss"]}
  log = MetricsLog(tmp_path / "m.csv")
  for step in (1, 2):
    log.write(step, {name: step / 10 for name in names} | {f"x{i}": 0.0 for i in range(5)})
  import matplotlib.image
  png = matplotlib.image.imread(log.plot(tmp_path / "c.png"))
  assert png.shape[:2] == (3 * 300, 4 * 400)  # 10 panels: a grid 3 high, 4 wide (4 x 3 in each)
