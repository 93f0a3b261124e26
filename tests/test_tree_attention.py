"""Tree-verify attention kernel (Pallas, interpret mode on CPU) against its jnp reference, for every
backend's kernel body (tests/test_kernel_lowering.py proves they lower for GPU and TPU).

Mosaic GPU's kernel runs in Mosaic GPU's own interpreter (simulated SMEM, TMA copies, barriers,
wgmma), with K transposed in global memory instead of through `transpose_ref`, which that
interpreter cannot apply (see tree_attention_mosaic_gpu.py). Its KV blocks are multiples of 64,
so its cases scale the cache and block by the same factor (`fit`), keeping the block structure.

Each distinct shape compiles the interpreted kernel once (~1.5 s here), so the cases are a chosen
list of shapes rather than a full product; tree kinds and lengths vary within one compile.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.models.kernels import tree_attention_mosaic_gpu as mosaic_gpu
from speculax.models.kernels.tree_attention import (
  BACKENDS,
  DEFAULT_BLOCK_KV,
  BlockSizes,
  tree_attention,
  tree_attention_reference,
)

# Mosaic GPU multiplies in bfloat16 (wgmma), casting a float32 cache.
ATOL = {"mosaic-tpu": 1e-5, "triton": 1e-5, "mosaic-gpu": 3e-2}

# (b, t, kv heads, g, q, s, block_kv)
SHAPES = [
    (1, 1, 1, 1, 8, 32, 16),  # root only, plain multi-head
    (3, 4, 2, 3, 16, 64, 32),
    (3, 7, 1, 4, 8, 64, 16),
    (1, 7, 2, 1, 16, 32, 32),  # one block covers the whole cache
    (3, 1, 3, 4, 16, 32, 16),  # root only, GQA
    (3, 7, 2, 3, 8, 32, 16),  # t * g = 21 rows: padded to 32
]


def chain_mask(t: int) -> np.ndarray:
  return np.tril(np.ones((t, t), bool))


def tree_from_parents(parents: np.ndarray) -> np.ndarray:
  """[t, t] ancestor-or-self mask; parents[0] is ignored (root), parents[i] < i otherwise."""
  t = len(parents)
  mask = np.eye(t, dtype=bool)
  for i in range(1, t):
    mask[i] |= mask[parents[i]]
  return mask


def random_tree(rng: np.random.Generator, t: int) -> np.ndarray:
  parents = np.array([0] + [rng.integers(0, i) for i in range(1, t)])
  return tree_from_parents(parents)


def star_tree(t: int) -> np.ndarray:
  return tree_from_parents(np.zeros(t, int))


TREES = {
    "chain": lambda rng, t: chain_mask(t),
    "random": random_tree,
    "star": lambda rng, t: star_tree(t),
}


def make_inputs(seed: int, b: int, t: int, kh: int, g: int, dq: int, s: int,
                dtype=jnp.float32):
  """q [b, t, h, q]; k, v [b, k, s, q], standard normal (numpy: no compile per shape)."""
  rng = np.random.default_rng(seed)
  shapes = ((b, t, kh * g, dq), (b, kh, s, dq), (b, kh, s, dq))
  return tuple(jnp.asarray(rng.standard_normal(x, np.float32), dtype) for x in shapes)


def ragged_lengths(rng: np.random.Generator, b: int, t: int, s: int) -> jnp.ndarray:
  """b=1: the block ends exactly at s; b=3: [0, random, s - t]."""
  if b == 1:
    return jnp.array([s - t], jnp.int32)
  return jnp.array([0, rng.integers(1, s - t), s - t][:b], jnp.int32)


reference = jax.jit(tree_attention_reference)  # one compile per shape instead of op by op


def kernel(q, k, v, lengths, tree_mask, block_kv, backend="mosaic-tpu", kv_splits=0):
  return tree_attention(q, k, v, lengths, tree_mask, backend=backend,
                        block_sizes=BlockSizes(block_kv, kv_splits), interpret=True)


def fit(backend: str, block_kv: int) -> int:
  """The factor that scales a case's cache, block (and lengths) to the backend's smallest KV
  block, so the case keeps its number of blocks."""
  return -(-64 // block_kv) if backend == "mosaic-gpu" else 1


def test_every_backend_is_tested():
  assert set(BACKENDS) == {"mosaic-tpu", "mosaic-gpu", "triton"} == set(DEFAULT_BLOCK_KV)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}_t{}_k{}_g{}_q{}_s{}_bkv{}".format(*s))
def test_matches_reference(shape, backend):
  b, t, kh, g, dq, s, block_kv = shape
  f = fit(backend, block_kv)
  s, block_kv = s * f, block_kv * f
  q, k, v = make_inputs(0, b, t, kh, g, dq, s)
  rng = np.random.default_rng(sum(shape))
  for name, make_tree in TREES.items():  # same shapes: one compile for all tree kinds
    tree = jnp.asarray(np.stack([make_tree(rng, t) for _ in range(b)]))
    lengths = ragged_lengths(rng, b, t, s)
    got = kernel(q, k, v, lengths, tree, block_kv, backend)
    want = reference(q, k, v, lengths, tree)
    assert got.shape == q.shape and got.dtype == q.dtype
    np.testing.assert_allclose(got, want, atol=ATOL[backend], rtol=0, err_msg=f"tree={name}")


def sweep_inputs(c: int, t: int = 5, kh: int = 2, g: int = 2, dq: int = 8):
  """A 4-block cache and lengths at, just before and just after block boundaries, one batch."""
  s = 4 * c
  lengths = jnp.array([0, 1, c - 5, c - 1, c, c + 1, 2 * c, 2 * c + 11, 3 * c, s - t], jnp.int32)
  b = lengths.shape[0]
  q, k, v = make_inputs(1, b, t, kh, g, dq, s)
  rng = np.random.default_rng(1)
  tree = jnp.asarray(np.stack([random_tree(rng, t) for _ in range(b)]))
  return q, k, v, lengths, tree


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_length_sweep_across_block_boundaries(backend):
  """On Mosaic GPU the default splits give each of the 4 blocks its own KV range (some empty)."""
  c = 16 * fit(backend, 16)
  q, k, v, lengths, tree = sweep_inputs(c)
  got = kernel(q, k, v, lengths, tree, c, backend)
  np.testing.assert_allclose(got, reference(q, k, v, lengths, tree), atol=ATOL[backend],
                             rtol=0)


@pytest.mark.parametrize("splits", [1, 3])
def test_mosaic_gpu_kv_ranges_of_several_blocks(splits):
  """Split-K with ranges of several blocks (double-buffered within a range, unmasked then
  masked): 3 ranges of a 4-block cache are 2 + 2 + none blocks long, 1 range is the whole
  cache (no merge)."""
  q, k, v, lengths, tree = sweep_inputs(64)
  got = kernel(q, k, v, lengths, tree, 64, "mosaic-gpu", kv_splits=splits)
  np.testing.assert_allclose(got, reference(q, k, v, lengths, tree), atol=ATOL["mosaic-gpu"],
                             rtol=0)


def test_merge_splits_is_the_softmax_over_all_ranges():
  """Partial softmaxes over three ranges of 12 scores (one range empty) merge to the full one."""
  rng = np.random.default_rng(7)
  scores, values = rng.standard_normal((5, 12)) * 4, rng.standard_normal((12, 3))
  ranges = [slice(0, 5), slice(5, 12), slice(12, 12)]
  parts, lses = [], []
  for r in ranges:
    x = scores[:, r]
    if x.shape[1] == 0:
      parts.append(np.zeros((5, 3))), lses.append(np.full(5, mosaic_gpu.common.NEG))
      continue
    w = np.exp(x - x.max(1, keepdims=True))
    parts.append(w @ values[r] / w.sum(1, keepdims=True))
    lses.append(x.max(1) + np.log(w.sum(1)))
  got = mosaic_gpu.merge_splits(jnp.asarray(np.stack(parts), jnp.float32),
                                jnp.asarray(np.stack(lses), jnp.float32))
  p = np.exp(scores - scores.max(1, keepdims=True))
  np.testing.assert_allclose(got, p @ values / p.sum(1, keepdims=True), atol=1e-5)
  nothing = mosaic_gpu.merge_splits(jnp.zeros((2, 1, 3)), jnp.full((2, 1), mosaic_gpu.common.NEG))
  np.testing.assert_array_equal(nothing, np.zeros((1, 3)))


def test_mosaic_gpu_default_splits_fill_two_waves():
  """One Llama-3-8B sequence, 16 nodes (8 kv heads x 1 row tile): 33 ranges; never more ranges
  than blocks, never fewer than one."""
  assert mosaic_gpu.kv_splits(8, 128) == 33
  assert mosaic_gpu.kv_splits(8, 4) == 4
  assert mosaic_gpu.kv_splits(1000, 128) == 1


jitted_kernel = jax.jit(kernel, static_argnames=("block_kv", "backend"))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("garbage", [1e30, -1e30, np.inf, np.nan])
# Mosaic GPU's interpreter multiplies the stale inf keys in numpy (scores later replaced).
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_stale_slots_do_not_leak(garbage, backend):
  """Slots >= lengths + t may hold anything (NaN and inf included); also runs under jit."""
  f = fit(backend, 32)
  b, t, kh, g, dq, s, block_kv = 3, 4, 2, 3, 16, 64 * f, 32 * f
  q, k, v = make_inputs(2, b, t, kh, g, dq, s)
  lengths = jnp.array([0, 21, 40], jnp.int32) * f
  rng = np.random.default_rng(2)
  tree = jnp.asarray(np.stack([random_tree(rng, t) for _ in range(b)]))
  stale = (np.arange(s)[None, :] >= (np.asarray(lengths) + t)[:, None])[:, None, :, None]
  k_bad, v_bad = (jnp.asarray(np.where(stale, np.float32(garbage), x)) for x in (k, v))
  want = reference(q, k, v, lengths, tree)
  got = jitted_kernel(q, k_bad, v_bad, lengths, tree, block_kv, backend)  # traced: no value check
  assert np.isfinite(np.asarray(got)).all()
  np.testing.assert_allclose(got, want, atol=ATOL[backend], rtol=0)


def test_mosaic_gpu_kernel_has_no_races(monkeypatch):
  """Mosaic GPU's interpreter with its happens-before race detector (TMA copies, barriers,
  wgmma and register accesses to SMEM); a shape no other test uses, so the jit cache cannot
  serve a kernel interpreted without the detector."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call, params
  monkeypatch.setattr(mosaic_gpu, "_interpret_params",
                      lambda: params.InterpretGPUParams(detect_races=True))
  b, t, kh, g, dq, s, block_kv = 2, 6, 1, 3, 8, 192, 64
  q, k, v = make_inputs(5, b, t, kh, g, dq, s)
  # 2 KV ranges: [0, 1) and [1, 2) masked; [0, 2) unmasked (double-buffered) and [2, 3) masked.
  lengths = jnp.array([60, s - t], jnp.int32)
  tree = jnp.asarray(np.stack([random_tree(np.random.default_rng(5), t) for _ in range(b)]))
  got = kernel(q, k, v, lengths, tree, block_kv, "mosaic-gpu", kv_splits=2)
  assert not interpret_pallas_call.get_races().races_found
  np.testing.assert_allclose(got, reference(q, k, v, lengths, tree), atol=ATOL["mosaic-gpu"],
                             rtol=0)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_bfloat16_inputs(backend):
  f = fit(backend, 16)
  b, t, kh, g, dq, s, block_kv = 3, 4, 1, 2, 16, 32 * f, 16 * f
  q, k, v = make_inputs(3, b, t, kh, g, dq, s, jnp.bfloat16)
  lengths = jnp.array([0, 9, s - t], jnp.int32)
  tree = jnp.broadcast_to(jnp.asarray(chain_mask(t)), (b, t, t))
  got = kernel(q, k, v, lengths, tree, block_kv, backend)
  assert got.dtype == jnp.bfloat16
  want = reference(q, k, v, lengths, tree)
  np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                             atol=max(1e-2, ATOL[backend]), rtol=0)


def _valid_inputs(b=2, t=3, kh=2, g=2, dq=8, s=32):
  q, k, v = make_inputs(4, b, t, kh, g, dq, s)
  lengths = jnp.array([0, 5][:b], jnp.int32)
  tree = jnp.broadcast_to(jnp.asarray(chain_mask(t)), (b, t, t))
  return q, k, v, lengths, tree


@pytest.mark.parametrize("backend, block_kv, match, dq", [
    ("mosaic-tpu", 24, "block_kv=24 does not divide the cache length s=32", 8),
    ("mosaic-tpu", 12, "block_kv=12 must be a multiple of 8 for a float32 cache on mosaic-tpu", 8),
    ("triton", 8, "block_kv=8 must be a power of two >= 16 on triton", 8),
    ("mosaic-gpu", 16, "block_kv=16 must be a multiple of 64 and <= 256 on mosaic-gpu", 8),
    ("mosaic-gpu", 512, "block_kv=512 must be a multiple of 64 and <= 256 on mosaic-gpu", 8),
    ("mosaic-gpu", 64, "block_kv=64 does not divide the cache length s=32", 8),
    ("mosaic-gpu", 64, "head dim 320 > 256 on mosaic-gpu", 320),
    ("triton", 0, "BlockSizes.block_kv must be an int >= 1, got 0", 8),
])
def test_bad_block_size(backend, block_kv, match, dq):
  """A block (or, on Mosaic GPU, a block and head dim: wgmma's N, SMEM) that does not fit."""
  with pytest.raises(ValueError, match=match):
    kernel(*_valid_inputs(dq=dq, s=32 if dq == 8 else 512), block_kv, backend)


def test_mosaic_gpu_block_shrinks_to_fit_smem():
  """block_kv is an upper bound on Mosaic GPU: head dim 256 needs 320 KiB of SMEM at block 128,
  more than an H100 block has, so the kernel tiles by 64, which still divides the cache, with
  the same result; 40 nodes x 4 heads per kv head are 160 rows, 3 tiles of 64."""
  assert mosaic_gpu.fitting_block(256, 128) == 64
  assert mosaic_gpu.fitting_block(128, 256) == 128
  assert mosaic_gpu.fitting_block(64, 256) == 256  # fits: unchanged
  assert mosaic_gpu.fitting_block(256, 192) == 64  # 96 is no multiple of 64
  t, g, dq, s = 40, 4, 256, 256
  q, k, v = make_inputs(6, 1, t, 1, g, dq, s, jnp.bfloat16)
  lengths, tree = jnp.array([s - t - 32], jnp.int32), jnp.asarray(chain_mask(t))[None]
  got = kernel(q, k, v, lengths, tree, 128, "mosaic-gpu")
  want = reference(q, k, v, lengths, tree)
  np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                             atol=ATOL["mosaic-gpu"], rtol=0)


def test_kv_splits_only_on_mosaic_gpu():
  with pytest.raises(ValueError, match="kv_splits=2 is a mosaic-gpu setting; triton walks"):
    kernel(*_valid_inputs(), 16, "triton", kv_splits=2)
  with pytest.raises(ValueError, match="BlockSizes.kv_splits must be an int >= 0, got -1"):
    BlockSizes(64, -1)


def test_bfloat16_block_rule_on_mosaic_tpu():
  q, k, v, lengths, tree = _valid_inputs()
  with pytest.raises(ValueError, match="multiple of 16 for a bfloat16 cache on mosaic-tpu"):
    kernel(q, k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), lengths, tree, 8)


def test_unknown_backend():
  with pytest.raises(ValueError, match="unknown tree-attention backend 'cuda'; known:"):
    kernel(*_valid_inputs(), 16, "cuda")
  with pytest.raises(ValueError, match="unknown tree-attention backend 'flash'"):
    BlockSizes.get_default("flash")


def test_default_block_sizes():
  """Each backend's documented default; interpret mode (any platform) picks the TPU-style kernel,
  and the default divides a power-of-two cache (as KVCache.init rounds it)."""
  assert BlockSizes.get_default("mosaic-tpu") == BlockSizes(512)
  assert BlockSizes.get_default("triton") == BlockSizes(64)
  assert BlockSizes.get_default("mosaic-gpu") == BlockSizes(128)
  assert BlockSizes.get_default(interpret=True) == BlockSizes(512)
  q, k, v, lengths, tree = _valid_inputs(s=512)
  got = tree_attention(q, k, v, lengths, tree, interpret=True)  # backend and blocks by default
  np.testing.assert_allclose(got, reference(q, k, v, lengths, tree), atol=ATOL["mosaic-tpu"],
                             rtol=0)


def test_pallas_without_interpret_refuses_cpu():
  with pytest.raises(ValueError, match="no Pallas tree-attention backend for platform 'cpu'"):
    tree_attention(*_valid_inputs())


def test_heads_not_multiple_of_kv_heads():
  q, k, v, lengths, tree = _valid_inputs(kh=2, g=2)
  q = q[:, :, :3]
  with pytest.raises(ValueError, match="query heads h=3 are not a multiple of kv heads k=2"):
    kernel(q, k, v, lengths, tree, 16)


@pytest.mark.parametrize("edit, match", [
    (lambda q, k, v, n, m: (q, k, v[:, :, :16], n, m), r"k \(2, 2, 32, 8\) and v \(2, 2, 16, 8\)"),
    (lambda q, k, v, n, m: (q[..., :4], k, v, n, m), r"do not match q \(2, 3, 4, 4\)"),
    (lambda q, k, v, n, m: (q, k, v, n[:1], m), r"lengths must have shape \(2,\), got \(1,\)"),
    (lambda q, k, v, n, m: (q, k, v, n, m[:, :2]), r"tree_mask must have shape \(2, 3, 3\)"),
    (lambda q, k, v, n, m: (q, k, v, n.astype(jnp.float32), m), "lengths must be integer"),
    (lambda q, k, v, n, m: (q, k, v, n, m.astype(jnp.int32)), "tree_mask must be bool, got int32"),
    (lambda q, k, v, n, m: (q.astype(jnp.int32), k, v, n, m), "q must be floating point"),
    (lambda q, k, v, n, m: (q, k, v.astype(jnp.bfloat16), n, m), "k and v must share a dtype"),
    (lambda q, k, v, n, m: (q, k, v, n.at[1].set(30), m), r"lengths \[30\] leave no room for t=3"),
    (lambda q, k, v, n, m: (q, k, v, n.at[0].set(-1), m), r"lengths \[-1\]"),
], ids=["kv_shape", "head_dim", "lengths_shape", "tree_shape", "lengths_dtype", "tree_dtype",
        "q_dtype", "kv_dtype", "length_too_long", "length_negative"])
def test_bad_inputs(edit, match):
  with pytest.raises(ValueError, match=match):
    kernel(*edit(*_valid_inputs()), 16)
