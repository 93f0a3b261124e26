"""The tree-attention kernel, the model forward and the whole jitted speculative loop with it
lower for GPU and TPU, proved on CPU with no accelerator.

JAX's deviceless AOT pattern: inside `jax.sharding.use_abstract_mesh` with an `AbstractDevice`
naming a chip, `jit(f).trace(...).lower(lowering_platforms=(p,))` runs the Pallas lowering for
that chip (Pallas -> Mosaic TPU MLIR / Mosaic GPU MLIR / Triton IR, with each backend's
block-shape, layout and op checks), so a kernel change that breaks GPU or TPU lowering fails
here. Not proved: the chip compilers behind the custom call (libtpu's Mosaic passes, Mosaic GPU
or Triton -> PTX, ptxas register limits), nor numerics on the chip (tests/test_tree_attention.py
checks each kernel body in interpret mode).
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

from speculax.decode.config import SpecConfig
from speculax.decode.goodput import Goodput
from speculax.decode.speculative import _start, block_shape, spec_loop
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models import llama
from speculax.models.config import get_preset
from speculax.models.kernels.tree_attention import BlockSizes, tree_attention
from speculax.models.kvcache import KVCache

CHIPS = {
    "tpu-v5e": AbstractDevice("TPU v5 lite", 1, "tpu"),
    "tpu-v5p": AbstractDevice("TPU v5p", 2, "tpu"),
    "h100": AbstractDevice("NVIDIA H100 80GB HBM3", 132, "cuda"),
}
# What each backend's kernel becomes in the lowered module: (custom call target, kernel name).
KERNEL_CALLS = {"mosaic-tpu": ("tpu_custom_call", "tree_attention_tpu"),
                "mosaic-gpu": ("mosaic_gpu_v2", "tree_attention_mosaic_gpu"),
                "triton": ("__gpu$xla.gpu.triton", "tree_attention_triton")}
S = jax.ShapeDtypeStruct
KEY = jax.random.key(0)  # made here: jax >= 0.11 runs no eager op inside an abstract-only mesh


def lower(fn, args, chip: str) -> str:
  """StableHLO text of jit(fn)(*args) lowered for `chip`, deviceless."""
  device = CHIPS[chip]
  with use_abstract_mesh(AbstractMesh((1,), ("data",), abstract_device=device)):
    platform = device.platform
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def custom_calls(text: str) -> list[str]:
  return re.findall(r"custom_call @([\w$.]+)\(", text)


def kernel_args(b=2, t=5, kh=2, g=3, dq=64, s=1024, dtype=jnp.float32):
  return (S((b, t, kh * g, dq), dtype), S((b, kh, s, dq), dtype), S((b, kh, s, dq), dtype),
          S((b,), jnp.int32), S((b, t, t), jnp.bool_))


def assert_kernel(text: str, backend: str, count: int = 1):
  target, name = KERNEL_CALLS[backend]
  assert custom_calls(text).count(target) == count, custom_calls(text)
  assert name in text


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("backend, chip", [("mosaic-tpu", "tpu-v5e"), ("mosaic-tpu", "tpu-v5p"),
                                           ("mosaic-gpu", "h100"), ("triton", "h100")])
def test_kernel_lowers(backend, chip, dtype):
  text = lower(lambda *a: tree_attention(*a, backend=backend), kernel_args(dtype=dtype), chip)
  assert_kernel(text, backend)


def test_mosaic_gpu_lowers_a_64_token_tree_with_llama3_heads():
  """r = 256 query rows at head dim 128: the shape the first H100 run refused (SMEM at the default
  block), now tiled by a smaller block."""
  args = kernel_args(b=1, t=64, kh=8, g=4, dq=128, s=2048, dtype=jnp.bfloat16)
  assert_kernel(lower(lambda *a: tree_attention(*a, backend="mosaic-gpu"), args, "h100"),
                "mosaic-gpu")


@pytest.mark.parametrize("chip, backend", [("tpu-v5e", "mosaic-tpu"), ("h100", "mosaic-gpu")])
def test_platform_picks_its_backend(chip, backend):
  """backend=None (attention_impl="pallas") reads the platform from the abstract device."""
  text = lower(lambda *a: tree_attention(*a), kernel_args(), chip)
  assert_kernel(text, backend)


@pytest.mark.parametrize("impl, chip, backend", [
    ("pallas", "tpu-v5e", "mosaic-tpu"), ("pallas", "h100", "mosaic-gpu"),
    ("pallas-mosaic-tpu", "tpu-v5p", "mosaic-tpu"), ("pallas-mosaic-gpu", "h100", "mosaic-gpu"),
    ("pallas-triton", "h100", "triton"),
])
def test_model_forward_with_kernel_lowers(impl, chip, backend):
  """The whole tiny model's tree-verify forward against a KV cache, kernel inside the layer scan
  (one kernel call in the scan body)."""
  cfg = get_preset("tiny").with_runtime(attention_impl=impl)
  b, t = 2, 4
  with use_abstract_mesh(AbstractMesh((1,), ("data",), abstract_device=CHIPS[chip])):
    params = jax.eval_shape(lambda key: llama.init_params(cfg, key), KEY)
    cache = jax.eval_shape(lambda: KVCache.init(cfg, b, 64))  # rounded to the default block
  assert cache.k.shape[3] % BlockSizes.get_default(backend).block_kv == 0
  forward = lambda p, tok, pos, c, m: llama.forward(p, cfg, tok, pos, c, m)
  args = (params, S((b, t), jnp.int32), S((b, t), jnp.int32), cache, S((b, t, t), jnp.bool_))
  assert_kernel(lower(forward, args, chip), backend)


def _pallas_call(jaxpr):
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      return eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      if found := _pallas_call(sub):
        return found
  return None


def tpu_blocks(s: int):
  """(grid, K/V block shape, scalar prefetch count) of the TPU kernel for a cache of s slots."""
  fn = lambda *a: tree_attention(*a, backend="mosaic-tpu", block_sizes=BlockSizes(256))
  grid_mapping = _pallas_call(jax.make_jaxpr(fn)(*kernel_args(s=s)).jaxpr).params["grid_mapping"]
  k_block = grid_mapping.block_mappings[1]
  return grid_mapping.grid, tuple(map(str, k_block.block_shape)), grid_mapping.num_index_operands


def test_tpu_kernel_streams_kv_blocks():
  """VMEM per step does not grow with the cache: the K/V block is [c, q] whatever s is, the grid
  walks s / c blocks, and lengths is the one scalar-prefetch operand."""
  grid_small, block_small, prefetch = tpu_blocks(1024)
  grid_big, block_big, _ = tpu_blocks(8192)
  assert block_small == block_big and "256" in block_small[2] and "64" in block_small[3]
  assert grid_small == (2, 2, 4) and grid_big == (2, 2, 32)
  assert prefetch == 1


def spec_loop_args(cfg, drafter, spec, b=2, prompt=8):
  """Abstract (params, dparams, config, spec, drafter, state, watch) for `spec_loop`: state is
  what `_start` builds after a prefill, from shapes only (eval_shape), on unstacked layers as
  the engine runs them; watch [b] the rows whose end stops the loop."""
  max_len = prompt + spec.max_new_tokens + block_shape(drafter, spec)[0] + 1
  params = jax.eval_shape(lambda key: llama.unstack_layers(llama.init_params(cfg, key)),
                          KEY)
  cache = jax.eval_shape(lambda: KVCache.init(cfg, b, max_len, per_layer=True))
  costs = estimate = None
  if spec.goodput is not None:  # numpy: no eager op runs inside an abstract-only mesh
    costs = np.linspace(1.0, 2.0, spec.k + 1, dtype=np.float32)
    estimate = (np.zeros((spec.goodput.n_bins(drafter.signal_bins), spec.k), np.float32),) * 2
  start = lambda p, tokens, lengths, logits, c, key: _start(
      p, None, cfg, spec, drafter, tokens, lengths, logits, None, c, key, max_len,
      spec.max_new_tokens, step_costs=costs, estimate=estimate)
  state = jax.eval_shape(start, params, S((b, prompt), jnp.int32), S((b,), jnp.int32),
                         S((b, cfg.vocab_size), jnp.float32), cache, KEY)
  return params, None, cfg, spec, drafter, state, S((b,), jnp.bool_)


@pytest.mark.parametrize("drafter", [PromptLookup(), TokenRecycling()], ids=["chain", "tree"])
@pytest.mark.parametrize("chip, backend", [("tpu-v5e", "mosaic-tpu"), ("h100", "mosaic-gpu")])
def test_speculative_loop_with_kernel_lowers(chip, backend, drafter):
  """The whole jitted draft-then-verify while_loop (decode/speculative.py's `spec_loop`) with
  attention_impl="pallas" lowers for the chip, the kernel in every layer's verify attention:
  a chain (causal block mask) and a Token Recycling tree (tree mask)."""
  cfg = get_preset("tiny").with_runtime(attention_impl="pallas")
  spec = SpecConfig(max_new_tokens=8, k=3)
  with use_abstract_mesh(AbstractMesh((1,), ("data",), abstract_device=CHIPS[chip])):
    args = spec_loop_args(cfg, drafter, spec)
    text = spec_loop.trace(*args).lower(lowering_platforms=(CHIPS[chip].platform,)).as_text()
  assert "stablehlo.while" in text
  assert_kernel(text, backend)  # one kernel function, called by each layer (unrolled)
  assert re.findall(r"call @(\w+)\(", text).count("_tree_attention") == cfg.n_layers


@pytest.mark.parametrize("loop", ["chain", "switch"])
@pytest.mark.parametrize("chip, backend", [("tpu-v5e", "mosaic-tpu"), ("h100", "mosaic-gpu")])
def test_goodput_loop_with_kernel_lowers(chip, backend, loop):
  """The goodput loop (a chain of while loops, one per draft length 0..k, or one loop with a
  switch among the lengths' steps; the choice made inside the step from step costs and the
  estimate held as data) lowers for the chip with the kernel in every length's verify forward:
  k + 1 forwards of n_layers attention calls each."""
  cfg = get_preset("tiny").with_runtime(attention_impl="pallas")
  spec = SpecConfig(max_new_tokens=8, k=3, goodput=Goodput(loop=loop))
  with use_abstract_mesh(AbstractMesh((1,), ("data",), abstract_device=CHIPS[chip])):
    args = spec_loop_args(cfg, PromptLookup(), spec)
    text = spec_loop.trace(*args).lower(lowering_platforms=(CHIPS[chip].platform,)).as_text()
  if loop == "chain":
    assert text.count("stablehlo.while") >= spec.k + 2  # the outer loop and one per length
  else:  # one loop, its body a switch among the k + 1 lengths' steps
    cases = re.findall(r"stablehlo.case.*", text)
    assert text.count("stablehlo.while") == 1 and cases, (text.count("stablehlo.while"), cases)
  assert_kernel(text, backend, count=spec.k + 1)  # a kernel per block width, 1..k + 1 tokens
  # each block width's kernel wrapper, numbered apart by the lowering (_tree_attention_N)
  calls = re.findall(r"call @(_tree_attention(?:_\d+)?)\(", text)
  assert len(calls) == (spec.k + 1) * cfg.n_layers and len(set(calls)) == spec.k + 1, calls
