"""Llama-family decoder (RoPE, GQA, RMSNorm, SwiGLU) as Flax Linen modules applied functionally.

Dims: b batch, t query time, s key time (cache slots), u new-block key time, d model, h heads,
k kv heads, g heads per kv head, q head dim, f ffw, v vocab, l layers, n selected positions.

Params are a plain pytree (see `init_params`) whose layers are stacked on a leading axis and run
with `nn.scan`, so a 30-layer model compiles as one layer. Logical axis names live in the init
boxes (`param_axes`), so shardings come from one rules table (configs/meshes.py).

One `forward` serves prefill, one-token decode, chain verify and tree verify (explicit mask).
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from configs.models import LlamaConfig
from models.kvcache import KVCache

Params = dict


def rope_inv_freq(config: LlamaConfig) -> np.ndarray:  # [q/2] float32
  """Inverse frequencies, with Llama-3 frequency-dependent scaling when configured."""
  q = config.head_dim
  inv = (1.0 / (config.rope_theta ** (np.arange(0, q, 2, dtype=np.float32) / q))).astype(np.float32)
  sc = config.rope_scaling
  if sc is None:
    return inv
  low_wavelen = sc.original_max_position / sc.low_freq_factor
  high_wavelen = sc.original_max_position / sc.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / sc.factor, inv)
  smooth = (sc.original_max_position / wavelen - sc.low_freq_factor) / (
      sc.high_freq_factor - sc.low_freq_factor)
  smoothed = (1 - smooth) * scaled / sc.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(config: LlamaConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
  angles = positions[..., None].astype(jnp.float32) * rope_inv_freq(config)  # [b, t, q/2]
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotate-half RoPE (Hugging Face layout): x [b, t, h, q], cos/sin [b, t, q/2]."""
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return scale * x32.astype(x.dtype)


def attention(q, k_new, v_new, k_cache, v_cache, cache_visible, new_mask):
  """Attention of a new block over the cached prefix plus the block itself.

  q [b, t, h, q]; k_new/v_new [b, u, k, q] with u == t; k_cache/v_cache [b, s, k, q] or None;
  cache_visible [b, s] bool; new_mask [b, t, u] bool (causal, or a tree mask).
  Softmax runs in float32 over the concatenated keys. Returns [b, t, h, q].
  """
  b, t, h, dq = q.shape
  kh = k_new.shape[2]
  qg = q.reshape(b, t, kh, h // kh, dq).astype(jnp.float32) * dq ** -0.5
  neg = jnp.finfo(jnp.float32).min
  scores = jnp.einsum("btkgq,bukq->bkgtu", qg, k_new.astype(jnp.float32))
  scores = jnp.where(new_mask[:, None, None], scores, neg)
  if k_cache is not None:
    cached = jnp.einsum("btkgq,bskq->bkgts", qg, k_cache.astype(jnp.float32))
    cached = jnp.where(cache_visible[:, None, None, None, :], cached, neg)
    scores = jnp.concatenate([cached, scores], axis=-1)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bkgtu,bukq->btkgq", probs[..., -t:], v_new.astype(jnp.float32))
  if k_cache is not None:
    out += jnp.einsum("bkgts,bskq->btkgq", probs[..., :-t], v_cache.astype(jnp.float32))
  return out.reshape(b, t, h, dq).astype(q.dtype)


def _param(module: nn.Module, name: str, init, shape: tuple[int, ...], axes: tuple[str, ...]):
  dtype = jnp.dtype(module.config.param_dtype)
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


class Block(nn.Module):
  """One decoder layer; scanned over the stacked layer axis."""
  config: LlamaConfig
  collect_hidden: bool = False

  @nn.compact
  def __call__(self, x, layer_kv, ctx):
    # x [b, t, d]; layer_kv: (k, v) [b, s, k, q] each, or None; ctx: broadcast tables and masks
    c = self.config
    d, h, kh, dq, f = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff
    dense = nn.initializers.lecun_normal()
    ones = nn.initializers.ones
    attn_norm = _param(self, "attn_norm", ones, (d,), ("embed",))
    wq = _param(self, "q", dense, (d, h, dq), ("embed", "heads", "head_dim"))
    wk = _param(self, "k", dense, (d, kh, dq), ("embed", "kv_heads", "head_dim"))
    wv = _param(self, "v", dense, (d, kh, dq), ("embed", "kv_heads", "head_dim"))
    wo = _param(self, "o", nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2),
                (h, dq, d), ("heads", "head_dim", "embed"))
    mlp_norm = _param(self, "mlp_norm", ones, (d,), ("embed",))
    w_gate = _param(self, "gate", dense, (d, f), ("embed", "mlp"))
    w_up = _param(self, "up", dense, (d, f), ("embed", "mlp"))
    w_down = _param(self, "down", dense, (f, d), ("mlp", "embed"))

    cos, sin, cache_visible, new_mask = ctx
    y = rms_norm(x, attn_norm, c.norm_eps)
    q = apply_rope(jnp.einsum("btd,dhq->bthq", y, wq), cos, sin)
    k = apply_rope(jnp.einsum("btd,dkq->btkq", y, wk), cos, sin)
    v = jnp.einsum("btd,dkq->btkq", y, wv)
    k_cache, v_cache = layer_kv if layer_kv is not None else (None, None)
    att = attention(q, k, v, k_cache, v_cache, cache_visible, new_mask)
    x = x + jnp.einsum("bthq,hqd->btd", att, wo)
    y = rms_norm(x, mlp_norm, c.norm_eps)
    gated = nn.silu(jnp.einsum("btd,df->btf", y, w_gate)) * jnp.einsum("btd,df->btf", y, w_up)
    x = x + jnp.einsum("btf,fd->btd", gated, w_down)
    return x, (k, v, x if self.collect_hidden else None)


class Llama(nn.Module):
  config: LlamaConfig
  collect_hidden: bool = False

  @nn.compact
  def __call__(self, tokens, ctx, kv, logits_at):
    c = self.config
    # std 1/sqrt(d): tied logits come out ~N(0, 1) instead of echoing the input token.
    embed = _param(self, "embed", nn.initializers.normal(c.d_model ** -0.5), (c.vocab_size, c.d_model),
                   ("vocab", "embed"))
    x = jnp.take(embed, tokens, axis=0).astype(jnp.dtype(c.dtype))  # [b, t, d]
    stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                    in_axes=(0, nn.broadcast), length=c.n_layers,
                    metadata_params={nn.PARTITION_NAME: "layers"})
    out, (k_new, v_new, layer_out) = stack(c, self.collect_hidden, name="layers")(x, kv, ctx)
    final = rms_norm(out, _param(self, "final_norm", nn.initializers.ones, (c.d_model,),
                                 ("embed",)), c.norm_eps)
    head = final if logits_at is None else jnp.take_along_axis(final, logits_at[..., None], 1)
    if c.tie_embeddings:
      logits = jnp.einsum("bnd,vd->bnv", head, embed)
    else:
      w = _param(self, "lm_head", nn.initializers.lecun_normal(), (c.d_model, c.vocab_size),
                 ("embed", "vocab"))
      logits = jnp.einsum("bnd,dv->bnv", head, w)
    return logits.astype(jnp.float32), (x, layer_out, final), k_new, v_new


def init_params(config: LlamaConfig, key: jax.Array) -> Params:
  """Random params (plain arrays, boxes removed)."""
  return jax.jit(lambda k: nn.unbox(_init_boxed(config, k)))(key)


def param_axes(config: LlamaConfig):
  """Logical axis names of every param leaf, as a PartitionSpec pytree (no allocation)."""
  return nn.get_partition_spec(
      jax.eval_shape(functools.partial(_init_boxed, config), jax.random.key(0)))


def _init_boxed(config: LlamaConfig, key: jax.Array):
  tokens = jnp.zeros((1, 1), jnp.int32)
  ctx = (*rope_tables(config, tokens), None, jnp.ones((1, 1, 1), bool))
  return Llama(config).init(key, tokens, ctx, None, None)["params"]


def _select_hidden(config: LlamaConfig, layers: tuple[int, ...], embedded, layer_out, final):
  """Hidden states in Hugging Face's indexing: 0 embeddings, i output of layer i, L final-normed."""
  picked = []
  for i in layers:
    j = i + config.n_layers + 1 if i < 0 else i
    if not 0 <= j <= config.n_layers:
      raise ValueError(f"hidden layer index {i} out of range for {config.n_layers} layers")
    picked.append(embedded if j == 0 else final if j == config.n_layers else layer_out[j - 1])
  return jnp.stack(picked)


def causal_mask(batch: int, t: int) -> jax.Array:  # [b, t, t] bool
  return jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (batch, t, t))


def forward(params: Params, config: LlamaConfig, tokens: jax.Array, positions: jax.Array,
            cache: KVCache | None = None, mask: jax.Array | None = None, *,
            hidden_layers: tuple[int, ...] = (-1,), logits_at: jax.Array | None = None):
  """Runs the model on a block of new tokens against a cache.

  tokens, positions: [b, t] int32 (positions drive RoPE). cache: KVCache or None (no prefix).
  mask: [b, t, t] bool attention among the new tokens (default causal; a tree mask for trees).
  hidden_layers: static indices of hidden states to return (HF indexing: 0 embeddings, i after
  layer i, -1 / L the final-normed features that feed the LM head).
  logits_at: [b, n] int32 indices into t; logits only there (prefill needs just the last one).
  Returns logits [b, n or t, v] float32, hidden [len(hidden_layers), b, t, d], and the cache
  with the block appended (lengths += t), or None when no cache was given.
  """
  b, t = tokens.shape
  mask = causal_mask(b, t) if mask is None else mask
  visible = cache.visible() if cache is not None else None
  kv = (cache.k, cache.v) if cache is not None else None
  collect = any(0 < (i % (config.n_layers + 1)) < config.n_layers for i in hidden_layers)
  logits, (embedded, layer_out, final), k_new, v_new = Llama(config, collect).apply(
      {"params": params}, tokens, (*rope_tables(config, positions), visible, mask), kv, logits_at)
  hidden = _select_hidden(config, hidden_layers, embedded, layer_out, final)
  return logits, hidden, (cache.append(k_new, v_new) if cache is not None else None)


# Jitted forward for callers outside a jitted loop (tests, tools); static config and layers.
forward_jit = jax.jit(forward, static_argnames=("config", "hidden_layers"))
