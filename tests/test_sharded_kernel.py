"""The tree-attention kernel under a mesh runs through shard_map (batch over data, kv heads over
tensor): same numbers as unsharded, same tokens in a sharded speculative decode, and it lowers
for TPU and GPU meshes deviceless."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from speculax.decode.config import SpecConfig
from speculax.decode.speculative import speculative_generate
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models import sharding
from speculax.models.kernels import tree_attention as tree_attention_module
from speculax.models.kernels.tree_attention import (BlockSizes, tree_attention,
                                                    tree_attention_reference)
from speculax.models.sharding import MeshConfig

from tiny_prompts import NEW, PROMPTS


def _inputs(b=4, t=5, kh=2, g=2, dq=16, s=64):
  keys = jax.random.split(jax.random.key(3), 3)
  q = jax.random.normal(keys[0], (b, t, kh * g, dq))  # [b, t, h, q]
  k = jax.random.normal(keys[1], (b, kh, s, dq))  # [b, k, s, q]
  v = jax.random.normal(keys[2], (b, kh, s, dq))  # [b, k, s, q]
  lengths = jnp.array([0, 7, 30, s - t][:b], jnp.int32)  # [b]
  tree = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))  # [b, t, t]
  return q, k, v, lengths, tree


def test_sharded_kernel_equals_reference():
  """Under a data=2 x fsdp=2 x tensor=2 mesh (batch 4 over data x fsdp, 2 kv heads over tensor)
  the kernel equals the jnp reference, and the jaxpr holds the shard_map around the pallas_call."""
  args = _inputs()
  mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
  fn = jax.jit(lambda *a: tree_attention(*a, block_sizes=BlockSizes(16), interpret=True))
  with jax.set_mesh(mesh):
    out = fn(*args)
    jaxpr = str(jax.make_jaxpr(fn)(*args))
  assert "shard_map" in jaxpr and "pallas_call" in jaxpr
  np.testing.assert_allclose(out, tree_attention_reference(*args), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("drafter", [PromptLookup(), TokenRecycling()], ids=["chain", "tree"])
def test_sharded_interpret_decode_equals_unsharded(tiny, drafter, monkeypatch):
  """A speculative decode with the interpret-mode kernel on a data=4 x tensor=2 mesh of the 8
  CPU devices emits the same tokens as the same decode unsharded, and the sharded run really
  split the kernel's batch over data and its kv heads over tensor (a spy records the split)."""
  cfg, params = tiny
  cfg = cfg.with_runtime(attention_impl="pallas-interpret", attention_block_kv=32)
  spec = SpecConfig(max_new_tokens=NEW // 2, k=3)
  prompts = PROMPTS[:4]
  plain = speculative_generate(params, cfg, prompts, drafter, spec)
  splits = []
  split = tree_attention_module._split_axes
  monkeypatch.setattr(tree_attention_module, "_split_axes",
                      lambda *a: splits.append(split(*a)) or splits[-1])
  mesh_cfg = MeshConfig(data=4, tensor=2)
  sharded = speculative_generate(params, cfg, prompts, drafter, spec, mesh=mesh_cfg)
  assert sharded.tokens == plain.tokens
  assert splits and set(splits) == {(("data",), "tensor")}  # prefill and verify, every layer


@pytest.mark.parametrize("device, target", [
    (AbstractDevice("TPU v5 lite", 1, "tpu"), "tpu_custom_call"),
    (AbstractDevice("NVIDIA H100 80GB HBM3", 132, "cuda"), "mosaic_gpu_v2")],
    ids=["tpu-v5e", "h100"])
def test_sharded_kernel_lowers_for_a_mesh(device, target):
  """On a 2 x 2 (data x tensor) abstract mesh of chips the kernel lowers to one kernel call run
  by every device on its local [b / 2, k / 2] shard."""
  s = jax.ShapeDtypeStruct
  args = (s((4, 5, 4, 64), jnp.float32), s((4, 2, 1024, 64), jnp.float32),
          s((4, 2, 1024, 64), jnp.float32), s((4,), jnp.int32), s((4, 5, 5), jnp.bool_))
  with use_abstract_mesh(AbstractMesh((2, 2), ("data", "tensor"), abstract_device=device)):
    text = jax.jit(lambda *a: tree_attention(*a)).trace(*args).lower(
        lowering_platforms=(device.platform,)).as_text()
  assert re.findall(r"custom_call @([\w$.]+)\(", text).count(target) == 1
  assert "tensor<2x1x1024x64xf32>" in text  # the per-device K/V shard
