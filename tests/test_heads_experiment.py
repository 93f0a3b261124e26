"""Head-drafter experiments end to end on the tiny target (stdlib text as bytes): train,
resume, save drafter.json + params, load them back, decode losslessly; and bad input."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.core.trees import StaticTree
from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters import heads_io, registry, vocab_trim
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.medusa import Medusa
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.models.load import LoadedModel
from speculax.models.sharding import MeshConfig
from speculax.train import experiment, teacher_cache
from speculax.train.distill import DistillConfig
from speculax.train.corpus import token_rows
from speculax.train.experiment import DataConfig, DistillExperiment, run
from speculax.train.heads import HeadsConfig, frozen_params
from speculax.train.metrics_log import MetricsLog
from speculax.train.optim import OptimConfig

from tiny_prompts import NEW, PROMPTS

OPTIM = OptimConfig(learning_rate=1e-2, warmup_steps=1, total_steps=6)
HEADS = HeadsConfig(Medusa(3), batch_size=4, optim=OPTIM)


class ByteTokenizer:
  """UTF-8 bytes as token ids: real text for the tiny target's 256-token vocabulary."""
  vocab_size, eos_id, source = 256, 0, "bytes"

  def encode(self, text):
    return list(text.encode())


def _exp(out_dir, name, distill):
  return DistillExperiment(
      name=name, target="tiny", draft_layers=(0,), out_dir=str(out_dir), distill=distill,
      # top-64 of 256: the held-out metrics' exact law is near the top-k law training reads
      data=DataConfig(files=40, seq_len=32, rows=16, heldout_rows=8, top_k=64),
      checkpoint_every=3, keep=2, log_every=2, eval_every=3)


@pytest.fixture(scope="module")
def model(tiny):
  return LoadedModel(*tiny, ByteTokenizer())


@pytest.fixture(scope="module")
def trained(model, tmp_path_factory):
  """A finished 6-step Medusa(3) run: (experiment, result)."""
  exp = _exp(tmp_path_factory.mktemp("runs"), "medusa", HEADS)
  return exp, run(exp, model=model)


def test_heads_run_evaluates_every_depth_and_resumes_exactly(model, trained, tmp_path):
  exp, straight = trained
  assert straight["steps"] == 6 and straight["drafter"] == str(exp.folder)
  assert (exp.folder / "teacher_train_h-1").is_dir()  # a cache with the target's features
  rows = MetricsLog(exp.folder / "metrics.csv").read()
  assert [r["step"] for r in rows if "heldout/acceptance" in r] == [3, 6]  # eval_every 3
  assert [r["step"] for r in rows] == [2, 3, 4, 6]  # log_every 2, and the evaluations
  logged = rows[-1]
  for j in (1, 2, 3):
    for name in ("loss", "acceptance", "top1"):
      assert f"heldout/{name}/depth{j}" in logged and f"{name}/depth{j}" in logged
  after = straight["heldout_after"]
  assert straight["heldout_acceptance_after"] == after["acceptance"]
  assert after["loss"] < straight["heldout_before"]["loss"]
  assert (exp.folder / "curves.png").stat().st_size > 0
  interrupted = _exp(tmp_path, "medusa", HEADS)
  stopped = run(interrupted, model=model, until=3)
  assert stopped["steps"] == 3 and stopped["drafter"] is None  # none before the last step
  assert not (interrupted.folder / heads_io.SPEC).exists()
  resumed = run(interrupted, model=model)
  assert resumed["steps"] == 6
  jax.tree.map(np.testing.assert_array_equal, resumed["state"].params, straight["state"].params)


def test_a_run_evaluates_each_step_once(model, tmp_path, monkeypatch):
  calls = []
  evaluate = experiment.heldout_metrics
  monkeypatch.setattr(experiment, "heldout_metrics",
                      lambda *a, **k: calls.append(1) or evaluate(*a, **k))
  result = run(_exp(tmp_path, "medusa", HEADS), model=model)
  rows = MetricsLog(tmp_path / "medusa" / "metrics.csv").read()
  assert len(calls) == 3  # before, and at steps 3 and 6 (eval_every 3), whose 6 is `after`
  assert result["heldout_after"] == pytest.approx(
      {k.removeprefix("heldout/"): v for k, v in rows[-1].items() if k.startswith("heldout/")})


def test_saved_heads_load_and_decode_like_the_target(tiny, tiny_reference, trained):
  cfg, params = tiny
  exp, result = trained
  spec = json.loads((exp.folder / heads_io.SPEC).read_text())
  assert spec["kind"] == "medusa" and spec["fields"] == {"n_heads": 3} and spec["step"] == 6
  assert spec["target"]["name"] == "tiny" and spec["target"]["config"]["d_model"] == 64
  assert "dtype" not in spec["target"]["config"]
  tree = StaticTree.full((2, 2, 1))
  drafter, heads = registry.make("medusa", params, cfg, heads=exp.folder, tree=tree)
  assert drafter == Medusa(3, tree)
  order = heads.pop(vocab_trim.IDS)  # the target's tokens by frequency on the training rows
  rows = token_rows(exp.data, LoadedModel(cfg, params, ByteTokenizer()), exp.folder)[0].tokens
  assert order[0] == np.bincount(np.ravel(rows)).argmax()
  jax.tree.map(np.testing.assert_array_equal, heads, result["state"].params)
  out = speculative_generate(params, cfg, PROMPTS[:4], drafter,
                             SpecConfig(k=3, max_new_tokens=NEW), drafter_params=heads)
  assert out.tokens == tiny_reference[:4]


TRIMMED = HeadsConfig(Eagle(vocab_trim=64), batch_size=4, optim=OPTIM)


@pytest.fixture(scope="module")
def trimmed(model, tmp_path_factory):
  """A finished 6-step EAGLE run with VocabTrim 64: (experiment, result)."""
  exp = _exp(tmp_path_factory.mktemp("runs"), "eagle", TRIMMED)
  return exp, run(exp, model=model)


def test_trimmed_heads_train_on_kept_ids_and_decode_like_the_target(
    model, tiny, tiny_reference, trimmed, tmp_path):
  cfg, params = tiny
  exp, result = trimmed
  assert 0 < result["heldout_acceptance_after"] < 1
  drafter, heads = registry.make("eagle", params, cfg, heads=exp.folder)
  assert drafter.vocab_trim == 64  # trained trimmed, served trimmed by default
  out = speculative_generate(params, cfg, PROMPTS[:4], drafter,
                             SpecConfig(k=3, max_new_tokens=NEW), drafter_params=heads)
  assert out.tokens == tiny_reference[:4]
  with pytest.raises(ValueError, match="vocab_trim=300 must be in"):
    run(_exp(tmp_path, "big", HeadsConfig(Eagle(vocab_trim=300), batch_size=4, optim=OPTIM)),
        model=model)


def test_heldout_acceptance_is_scored_against_the_targets_exact_law(model, tiny, trimmed,
                                                                     tmp_path):
  """Held-out 1 - TV at depth 1 is sum min(p, q) with p the target's own softmax on the held-out
  rows (computed here apart) and q the trimmed drafter's law (zero off its kept ids); scored
  against the cache's top-16 of 256 (data.heldout_teacher="top-k") it reads otherwise."""
  cfg, params = tiny
  exp, result = trimmed
  drafter, heads = heads_io.load_drafter(exp.folder, Eagle, cfg)
  order = heads.pop(vocab_trim.IDS)
  frozen = frozen_params(drafter, heads, params, cfg, order)
  held = token_rows(exp.data, model, exp.folder)[1]
  tokens = jnp.asarray(held.tokens)  # [8, 32]
  mask = np.ones(held.tokens.shape) if held.mask is None else np.asarray(held.mask)
  logits, hidden, _ = llama.forward(params, cfg, tokens, llama.row_positions(*tokens.shape))
  batch = {"tokens": tokens, "hidden": hidden, "mask": jnp.asarray(mask, jnp.float32)}
  z = drafter.train_outputs(heads, frozen, cfg, batch, jax.random.key(0))["logits"][:, :, 0]
  q = jax.nn.softmax(vocab_trim.full_vocabulary(frozen[vocab_trim.TRIM], z, cfg.vocab_size))
  p = jax.nn.softmax(logits)
  chance = np.minimum(np.asarray(p)[:, 1:], np.asarray(q)[:, :-1]).sum(-1)  # token i + 2 from i
  weight = mask[:, 1:] * mask[:, :-1]
  want = (chance * weight).sum() / weight.sum()
  exact = result["heldout_after"]["acceptance/depth1"]
  assert exact == pytest.approx(want, rel=1e-5)
  data = dataclasses.replace(exp.data, heldout_teacher="top-k", top_k=16)
  again = dataclasses.replace(exp, name="topk", out_dir=str(tmp_path), init_from=str(exp.folder),
                              data=data)
  top_k = run(again, model=model, until=0)["heldout_before"]["acceptance/depth1"]
  assert abs(top_k - exact) > 1e-3


def test_heads_train_on_a_mesh_as_on_one_device(model, trimmed, tmp_path):
  """The trimmed EAGLE run with the target sharded and the heads (and the kept output rows)
  replicated over 8 devices, data 4 x tensor 2: the same params and held-out metrics."""
  exp, one = trimmed
  mesh = MeshConfig(data=4, tensor=2)
  on_mesh = run(dataclasses.replace(exp, out_dir=str(tmp_path), mesh=mesh), model=model)
  leaves = jax.tree.leaves(on_mesh["state"].params)
  assert all(len(x.sharding.device_set) == 8 for x in leaves)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               on_mesh["state"].params, one["state"].params)
  assert on_mesh["heldout_after"]["acceptance"] == pytest.approx(
      one["heldout_after"]["acceptance"], rel=1e-4)
  assert on_mesh["heldout_after"]["acceptance"] != one["heldout_before"]["acceptance"]


def test_distill_runs_on_the_same_runner_and_saves_a_loadable_draft_model(
    model, tiny, tiny_reference, tmp_path):
  cfg, params = tiny
  exp = _exp(tmp_path, "distill", DistillConfig(batch_size=4, optim=OPTIM))
  result = run(exp, model=model)
  assert result["steps"] == 6 and result["drafter"] == str(exp.folder)
  assert (exp.folder / "teacher_train").is_dir()
  assert "heldout/acceptance" in MetricsLog(exp.folder / "metrics.csv").read()[-1]
  spec = json.loads((exp.folder / heads_io.SPEC).read_text())
  assert spec["kind"] == "draft-model" and spec["fields"]["config"]["llama"]["n_layers"] == 1
  # The run folder is a drafter: by registry.load, and as draft-model's `draft` option (the
  # CLI's --draft-model FOLDER), trimmed by the order it saved.
  drafter, dparams = registry.load(exp.folder, cfg, vocab_trim=64)
  assert drafter == DraftModel(result["draft_config"], vocab_trim=64)
  jax.tree.map(np.testing.assert_array_equal,
               {k: v for k, v in dparams.items() if k != vocab_trim.IDS}, result["state"].params)
  again = registry.make("draft-model", params, cfg, draft=str(exp.folder))
  assert again.drafter == DraftModel(result["draft_config"])
  out = speculative_generate(params, cfg, PROMPTS[:4], drafter,
                             SpecConfig(k=3, max_new_tokens=NEW), drafter_params=dparams)
  assert out.tokens == tiny_reference[:4]


def test_a_draft_model_reads_a_head_drafters_teacher_cache(model, trained, tmp_path, monkeypatch):
  """The Medusa run's cache holds the target's features too; a draft model of the same data
  reads its log-probs (no second pass of the target) and sees what its own cache would hold."""
  own = run(_exp(tmp_path / "own", "distill", DistillConfig(batch_size=4, optim=OPTIM)),
            model=model, until=1)

  def no_target_pass(*args):
    raise AssertionError("the teacher cache was built again")

  monkeypatch.setattr(teacher_cache, "_teacher_batch", no_target_pass)
  exp = dataclasses.replace(_exp(tmp_path / "shared", "distill", DistillConfig(
      batch_size=4, optim=OPTIM)), teacher_dir=str(trained[0].folder))
  shared = run(exp, model=model, until=1)
  assert not list(exp.folder.glob("teacher_*"))
  assert shared["heldout_before"] == own["heldout_before"]
  jax.tree.map(np.testing.assert_array_equal, shared["state"].params, own["state"].params)


def test_a_run_starts_from_a_finished_one_of_its_kind(model, trained, tmp_path):
  exp, first = trained
  again = run(dataclasses.replace(_exp(tmp_path, "second", HEADS), init_from=str(exp.folder)),
              model=model)
  assert again["heldout_before"] == pytest.approx(first["heldout_after"], rel=1e-5)
  assert again["heldout_before"]["acceptance"] != pytest.approx(
      first["heldout_before"]["acceptance"])
  with pytest.raises(ValueError, match="holds a medusa drafter, not eagle"):
    run(dataclasses.replace(_exp(tmp_path, "e", HeadsConfig(Eagle(), batch_size=4, optim=OPTIM)),
                            init_from=str(exp.folder)), model=model)
  with pytest.raises(ValueError, match=r"init_from=.*params do not fit this run's"):
    run(dataclasses.replace(_exp(tmp_path, "m2", HeadsConfig(Medusa(2), batch_size=4,
                                                             optim=OPTIM)),
                            init_from=str(exp.folder)), model=model)


def test_an_eagle_run_can_start_from_the_targets_last_layers(model, tmp_path):
  """init_from="target": the draft layers are the target's last ones in order, the drafter's
  norm its final norm, and fc undoes the final norm's scale up to one residual-stream size."""
  eagle = HeadsConfig(Eagle(draft_layers=2), batch_size=4, optim=OPTIM)
  start = run(dataclasses.replace(_exp(tmp_path, "from-target", eagle), init_from="target"),
              model=model, until=0)
  params, target = start["state"].params, model.params
  n, d = model.config.n_layers, model.config.d_model
  for i, key in enumerate(("layer", "layer1")):
    for name in ("q", "down"):
      np.testing.assert_allclose(params[key][name], target["layers"][name][n - 2 + i])
  np.testing.assert_allclose(params["norm"], target["final_norm"])
  scale = np.diag(params["fc"][:d]) * np.asarray(target["final_norm"])  # [d]: one size
  assert scale[0] > 0 and np.allclose(scale, scale[0])
  np.testing.assert_array_equal(params["fc"][d:], 0)
  own = run(_exp(tmp_path, "own-start", eagle), model=model, until=0)
  assert start["heldout_before"]["acceptance"] != pytest.approx(
      own["heldout_before"]["acceptance"])
  with pytest.raises(ValueError, match="the medusa drafter has no start from the target"):
    run(dataclasses.replace(_exp(tmp_path, "m", HEADS), init_from="target"), model=model, until=0)
  eagle3 = HeadsConfig(Eagle.eagle3(model.config.n_layers), batch_size=4, optim=OPTIM)
  with pytest.raises(ValueError, match=r"fuses feature_layers \(1, 2\): use \(-1,\)"):
    run(dataclasses.replace(_exp(tmp_path, "e3", eagle3), init_from="target"), model=model,
        until=0)


def test_an_eagle3_run_continues_an_eagle_run_exactly(model, trimmed, tmp_path):
  """EAGLE-3 fusing the final feature with another starts, by init_from an EAGLE run, where that
  run ended: its fusion passes the final feature alone, so depth-1 acceptance is the same."""
  exp, first = trimmed
  grown = HeadsConfig(Eagle.eagle3(2, vocab_trim=64, ttt_steps=1), batch_size=4, optim=OPTIM)
  assert -1 % 3 in grown.drafter.feature_layers  # the tiny target's 2 layers: (1, 2), 2 is -1
  again = run(dataclasses.replace(_exp(tmp_path, "eagle3", grown), init_from=str(exp.folder)),
              model=model, until=0)
  key = "acceptance/depth1"
  assert again["heldout_before"][key] == pytest.approx(first["heldout_after"][key], rel=1e-5)
  fresh = run(_exp(tmp_path, "eagle3-fresh", grown), model=model, until=0)
  assert fresh["heldout_before"][key] != pytest.approx(first["heldout_after"][key], rel=1e-3)


def test_heads_of_another_target_or_kind_are_refused(tiny, trained, tmp_path):
  cfg, params = tiny
  folder = trained[0].folder
  with pytest.raises(ValueError, match=rf"head drafter in {folder} was trained on a target "
                                       r"\(tiny\) with .*n_layers 2, this target has 3"):
    registry.load(folder, get_preset("tiny-untied-llama3"))
  with pytest.raises(ValueError, match="holds a medusa drafter, not hydra"):
    registry.make("hydra", params, cfg, heads=folder)
  with pytest.raises(FileNotFoundError, match="speculax train --config configs/medusa_smollm2.py"):
    registry.load(tmp_path, cfg)
  with pytest.raises(ValueError, match="medusa needs trained heads"):
    registry.make("medusa", params, cfg)
  with pytest.raises(ValueError, match="are for the trained drafters"):
    registry.make("prompt-lookup", params, cfg, heads=folder)
  (tmp_path / heads_io.SPEC).write_text("{not json")
  with pytest.raises(ValueError, match="not valid JSON"):
    registry.load(tmp_path, cfg)
