import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.models import llama
from speculax.models.config import LlamaConfig, get_preset
from speculax.models.kvcache import KVCache
from speculax.models.tables import Table


def _positions(b, t, start=0):
  return jnp.broadcast_to(jnp.arange(start, start + t, dtype=jnp.int32), (b, t))


def test_cached_chunks_match_one_full_forward(tiny):
  cfg, params = tiny
  tokens = jax.random.randint(jax.random.key(1), (3, 11), 0, cfg.vocab_size)
  full, _, _ = llama.forward_jit(params, cfg, tokens, _positions(3, 11))
  cache = KVCache.init(cfg, 3, 32)
  chunks = []
  for lo, hi in [(0, 5), (5, 6), (6, 11)]:  # prefill, one-token decode, multi-token step
    logits, _, cache = llama.forward_jit(params, cfg, tokens[:, lo:hi], _positions(3, hi - lo, lo), cache)
    chunks.append(logits)
  np.testing.assert_allclose(jnp.concatenate(chunks, 1), full, atol=1e-5, rtol=1e-5)
  assert cache.lengths.tolist() == [11, 11, 11]


def test_unstacked_tables_match_stacked_params(tiny):
  """Decoding's params (per-layer, dense weights as Tables) give the stacked params' logits and
  cache, at the few rows a decode or verify step has (sliced and padded forms) and past them."""
  cfg, params = tiny
  decode_params = llama.unstack_layers(params)
  assert isinstance(decode_params["layers"][0]["q"], Table)
  tokens = jax.random.randint(jax.random.key(2), (2, 40), 0, cfg.vocab_size)
  stacked, per_layer = KVCache.init(cfg, 2, 64), KVCache.init(cfg, 2, 64, per_layer=True)
  for lo, hi in [(0, 36), (36, 37), (37, 40)]:  # 72 rows (one dot), 2 rows, 6 rows (padded)
    want, _, stacked = llama.forward_jit(params, cfg, tokens[:, lo:hi], _positions(2, hi - lo, lo),
                                         stacked)
    got, _, per_layer = llama.forward_jit(decode_params, cfg, tokens[:, lo:hi],
                                          _positions(2, hi - lo, lo), per_layer)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(jnp.stack(per_layer.k), stacked.k, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("qwen", [False, True])
def test_fused_layers_decode_as_the_separate_ones(tiny, qwen):
  """q/k/v and gate/up as one table each (`fused_layer`, the form lower-precision draft copies
  take): the same logits and cache at a decode and a verify step, bit for bit where the rows
  kernel runs (each output row summed alike), with Qwen's biases and q/k norms applied after the
  split."""
  from speculax.models.kernels import rows_cpu
  cfg, params = tiny
  if qwen:
    cfg = dataclasses.replace(cfg, qkv_bias=True, qk_norm=True)
    params = llama.init_params(cfg, jax.random.key(4))
  separate = llama.unstack_layers(params)
  fused = {**separate, "layers": tuple(llama.fused_layer(layer) for layer in separate["layers"])}
  assert {"q+k+v", "gate+up"} <= fused["layers"][0].keys() and "q" not in fused["layers"][0]
  tokens = jax.random.randint(jax.random.key(5), (2, 12), 0, cfg.vocab_size)
  caches = [KVCache.init(cfg, 2, 32, per_layer=True) for _ in range(2)]
  def same(got, want, rows):  # bit for bit where every product of `rows` rows took the kernel
    exact = rows_cpu.enabled() and rows <= rows_cpu.max_rows()
    (np.testing.assert_array_equal if exact else
     functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5))(got, want)
  for lo, hi in [(0, 9), (9, 10), (10, 12)]:  # prefill, a one-token step, a 2-token verify
    (want, _, caches[0]), (got, _, caches[1]) = (
        llama.forward_jit(p, cfg, tokens[:, lo:hi], _positions(2, hi - lo, lo), cache)
        for p, cache in zip((separate, fused), caches))
    same(got, want, 2 * (hi - lo))  # batch 2
  same(jnp.stack(caches[1].k), jnp.stack(caches[0].k), 2 * 9)  # the prefill's rows too


def test_ragged_cache_lengths_are_per_sequence(tiny):
  """Sequences with different cached lengths decode exactly as they would alone."""
  cfg, params = tiny
  a = jax.random.randint(jax.random.key(2), (1, 9), 0, cfg.vocab_size)
  b = jax.random.randint(jax.random.key(3), (1, 4), 0, cfg.vocab_size)
  padded = jnp.concatenate([a, jnp.pad(b, ((0, 0), (0, 5)))], 0)
  cache = KVCache.init(cfg, 2, 16)
  _, _, cache = llama.forward_jit(params, cfg, padded, _positions(2, 9), cache)
  cache = cache.with_lengths(jnp.array([9, 4]))
  nxt = jnp.array([[7], [8]])
  step, _, cache = llama.forward_jit(params, cfg, nxt, cache.lengths[:, None], cache)
  for row, seq in enumerate([a, b]):
    ref, _, _ = llama.forward_jit(params, cfg, jnp.concatenate([seq, nxt[row:row + 1]], 1),
                              _positions(1, seq.shape[1] + 1))
    np.testing.assert_allclose(step[row, 0], ref[0, -1], atol=1e-5, rtol=1e-5)
  assert cache.lengths.tolist() == [10, 5]


def test_explicit_mask_controls_attention(tiny):
  """A tree mask where token 2 sees only token 0 equals running the path [0, 2] alone."""
  cfg, params = tiny
  tokens = jnp.array([[5, 9, 17]])
  mask = jnp.array([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool)
  positions = jnp.array([[0, 1, 1]])  # tokens 1 and 2 are siblings at depth 1
  tree, _, _ = llama.forward_jit(params, cfg, tokens, positions, mask=mask)
  path, _, _ = llama.forward_jit(params, cfg, jnp.array([[5, 17]]), _positions(1, 2))
  np.testing.assert_allclose(tree[0, 2], path[0, 1], atol=1e-5, rtol=1e-5)
  causal, _, _ = llama.forward_jit(params, cfg, tokens, _positions(1, 3))
  assert not np.allclose(tree[0, 2], causal[0, 2], atol=1e-3)


def test_hidden_layers_and_logits_at(tiny):
  cfg, params = tiny
  tokens = jax.random.randint(jax.random.key(4), (2, 6), 0, cfg.vocab_size)
  logits, hidden, _ = llama.forward_jit(params, cfg, tokens, _positions(2, 6), hidden_layers=(0, 1, -1))
  assert hidden.shape == (3, 2, 6, cfg.d_model)
  np.testing.assert_allclose(hidden[0], params["embed"][tokens], rtol=1e-6)
  # The last hidden state is what the (tied) LM head reads.
  np.testing.assert_allclose(hidden[2] @ params["embed"].T, logits, atol=1e-4, rtol=1e-4)
  some, _, _ = llama.forward_jit(params, cfg, tokens, _positions(2, 6), logits_at=jnp.array([[5], [2]]))
  np.testing.assert_allclose(some[:, 0], logits[jnp.arange(2), jnp.array([5, 2])], atol=1e-5)
  with pytest.raises(ValueError, match="hidden layer index 5"):
    llama.forward_jit(params, cfg, tokens, _positions(2, 6), hidden_layers=(5,))


def test_untied_llama3_config_runs_and_differs_from_unscaled_rope():
  cfg = get_preset("tiny-untied-llama3")
  params = llama.init_params(cfg, jax.random.key(0))
  assert "lm_head" in params
  tokens = jax.random.randint(jax.random.key(5), (1, 80), 0, cfg.vocab_size)
  scaled, _, _ = llama.forward_jit(params, cfg, tokens, _positions(1, 80))
  import dataclasses
  plain, _, _ = llama.forward_jit(params, dataclasses.replace(cfg, rope_scaling=None), tokens,
                              _positions(1, 80))
  assert np.isfinite(scaled).all() and not np.allclose(scaled, plain, atol=1e-3)
  inv = llama.rope_inv_freq(cfg)
  base = llama.rope_inv_freq(dataclasses.replace(cfg, rope_scaling=None))
  assert inv[0] == base[0] and np.isclose(inv[-1], base[-1] / 8)  # high freq kept, low scaled


def test_llama3_8b_shapes_without_allocation():
  cfg = get_preset("llama3-8b")
  shapes = jax.eval_shape(functools.partial(llama.init_params, cfg), jax.random.key(0))
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert n == 8_030_261_248  # Llama-3-8B's published parameter count
  axes = llama.param_axes(cfg)
  assert axes["layers"]["q"] == jax.sharding.PartitionSpec("layers", "embed", "heads", "head_dim")
  leaves = jax.tree.leaves(shapes)
  specs = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert len(leaves) == len(specs) and all(len(s) == x.ndim for s, x in zip(specs, leaves))


def test_smollm2_preset_matches_its_published_size():
  cfg = get_preset("smollm2-135m")
  shapes = jax.eval_shape(functools.partial(llama.init_params, cfg), jax.random.key(0))
  assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == 134_515_008


def test_bad_configs_and_presets():
  with pytest.raises(ValueError, match="unknown model preset 'llama-9000'"):
    get_preset("llama-9000")
  with pytest.raises(ValueError, match="n_heads=6 is not a multiple of n_kv_heads=4"):
    LlamaConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=6, n_kv_heads=4, head_dim=4, d_ff=8)
  with pytest.raises(ValueError, match="LlamaConfig.d_model must be an int >= 1, got 0"):
    LlamaConfig(vocab_size=8, d_model=0, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=4, d_ff=8)
