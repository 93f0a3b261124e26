"""Llama-family decoder (RoPE, GQA, RMSNorm, SwiGLU) as Flax Linen modules applied functionally;
the config adds Qwen2's q/k/v biases and Qwen3's q/k RMSNorm.

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

from speculax.models import kvcache
from speculax.models.attention import attention
from speculax.models.config import LlamaConfig
from speculax.models.kernels.tree_attention import runtime_kernel, tree_attention
from speculax.models.kvcache import KVCache
from speculax.models.tables import as_table, dense, dense_fused, fuse, table_dot

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


def _param(module: nn.Module, name: str, init, shape: tuple[int, ...], axes: tuple[str, ...]):
  dtype = jnp.dtype(module.config.runtime.param_dtype)
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


# Dense weights of a layer with how many leading axes each contracts; `unstack_layers` stores
# them as Tables for decoding.
DENSE_IN_AXES = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}


# Dense weights that read the same input, which `fused_layer` stores as one table each group.
FUSABLE = (("q", "k", "v"), ("gate", "up"))


def _dense(p: dict, name: str, x: jax.Array) -> jax.Array:
  return dense(x, p[name], DENSE_IN_AXES[name])


def _denses(p: dict, names: tuple[str, ...], x: jax.Array) -> list[jax.Array]:
  """x through each dense weight of `names` (a FUSABLE group): one product where p holds them
  fused (`fused_layer`), else one each."""
  fused = p.get("+".join(names))
  return dense_fused(x, fused) if fused is not None else [_dense(p, n, x) for n in names]


def _bias_and_norm(p: dict, name: str, out: jax.Array, norm_eps: float) -> jax.Array:
  """out [b, t, n, q] (the layer input's product with p[name] [d, n, q]) plus its bias [n, q]
  (Qwen2) and an RMSNorm over q (Qwen3's q/k norm, applied before RoPE) where the architecture
  has them."""
  bias, norm = p.get(f"{name}_bias"), p.get(f"{name}_norm")
  if bias is not None:
    out = out + bias.astype(out.dtype)
  return out if norm is None else rms_norm(out, norm, norm_eps)


def block(config: LlamaConfig, p: dict, x, layer_kv, ctx, collect_hidden: bool = False):
  """One decoder layer as a pure function of its params p (as loaded, or with Tables).

  x [b, t, d]; layer_kv: this layer's cache (k, v) [b, k, s, q] or None;
  ctx: (cos, sin [b, t, q/2], lengths [b] or None, mask [b, t, s] or [b, t, t] without
  cache, or None with block_mask [b, t, t] for the kernel, which builds the rest itself).
  Returns (x, (layer_kv, x if collect_hidden else None)).
  """
  c = config
  cos, sin, lengths, mask, block_mask = ctx
  y = rms_norm(x, p["attn_norm"], c.norm_eps)
  q, k, v = (_bias_and_norm(p, name, out, c.norm_eps)
             for name, out in zip("qkv", _denses(p, ("q", "k", "v"), y)))
  q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # [b, t, h, q], [b, t, k, q]
  if layer_kv is None:
    keys, values = k.swapaxes(1, 2), v.swapaxes(1, 2)  # [b, k, t, q]
  else:  # write the block first, then attend over the whole cache with one [b, t, s] mask
    layer_kv = tuple(kvcache.write(buf, new, lengths) for buf, new in zip(layer_kv, (k, v)))
    keys, values = layer_kv
  if block_mask is None:
    attended = attention(q, keys, values, mask)  # [b, t, h, q]
  else:
    backend, block_sizes, interpret = runtime_kernel(c.runtime)
    attended = tree_attention(q, keys, values, lengths, block_mask, backend=backend,
                              block_sizes=block_sizes, interpret=interpret)
  x = x + _dense(p, "o", attended)
  y = rms_norm(x, p["mlp_norm"], c.norm_eps)
  gate, up = _denses(p, ("gate", "up"), y)
  gated = nn.silu(gate) * up  # [b, t, f]
  x = x + _dense(p, "down", gated)
  return x, (layer_kv, x if collect_hidden else None)


class Block(nn.Module):
  """One decoder layer's params (the init boxes with their logical axes) around `block`;
  scanned over the stacked layer axis."""
  config: LlamaConfig
  collect_hidden: bool = False

  @nn.compact
  def __call__(self, x, layer_kv, ctx):
    c = self.config
    d, h, kh, dq, f = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff
    dense_init = nn.initializers.lecun_normal()
    ones = nn.initializers.ones
    p = {
        "attn_norm": _param(self, "attn_norm", ones, (d,), ("embed",)),
        "q": _param(self, "q", dense_init, (d, h, dq), ("embed", "heads", "head_dim")),
        "k": _param(self, "k", dense_init, (d, kh, dq), ("embed", "kv_heads", "head_dim")),
        "v": _param(self, "v", dense_init, (d, kh, dq), ("embed", "kv_heads", "head_dim")),
        "o": _param(self, "o", nn.initializers.lecun_normal(in_axis=(0, 1), out_axis=2),
                    (h, dq, d), ("heads", "head_dim", "embed")),
        "mlp_norm": _param(self, "mlp_norm", ones, (d,), ("embed",)),
        "gate": _param(self, "gate", dense_init, (d, f), ("embed", "mlp")),
        "up": _param(self, "up", dense_init, (d, f), ("embed", "mlp")),
        "down": _param(self, "down", dense_init, (f, d), ("mlp", "embed")),
    }
    # Optional architecture params come last, so a model without them draws the same init.
    if c.qkv_bias:
      zeros = nn.initializers.zeros
      p["q_bias"] = _param(self, "q_bias", zeros, (h, dq), ("heads", "head_dim"))
      p["k_bias"] = _param(self, "k_bias", zeros, (kh, dq), ("kv_heads", "head_dim"))
      p["v_bias"] = _param(self, "v_bias", zeros, (kh, dq), ("kv_heads", "head_dim"))
    if c.qk_norm:
      p["q_norm"] = _param(self, "q_norm", ones, (dq,), ("head_dim",))
      p["k_norm"] = _param(self, "k_norm", ones, (dq,), ("head_dim",))
    return block(c, p, x, layer_kv, ctx, self.collect_hidden)


class Embedder(nn.Module):
  """Token embedding in, final norm and LM head out (tied to the embedding or not)."""
  config: LlamaConfig

  def setup(self):
    c = self.config
    # std 1/sqrt(d): tied logits come out ~N(0, 1) instead of echoing the input token.
    self.embed = _param(self, "embed", nn.initializers.normal(c.d_model ** -0.5),
                        (c.vocab_size, c.d_model), ("vocab", "embed"))
    self.final_norm = _param(self, "final_norm", nn.initializers.ones, (c.d_model,), ("embed",))
    if not c.tie_embeddings:
      self.lm_head = _param(self, "lm_head", nn.initializers.lecun_normal(),
                            (c.d_model, c.vocab_size), ("embed", "vocab"))

  def encode(self, tokens):  # [b, t] -> [b, t, d]
    return embed({"embed": self.embed}, self.config, tokens)

  def decode(self, x, logits_at, output=None):
    """x [b, t, d] -> (logits [b, n, v] float32, final-normed features [b, t, d])."""
    final = rms_norm(x, self.final_norm, self.config.norm_eps)
    head = final if logits_at is None else jnp.take_along_axis(final, logits_at[..., None], 1)
    if output is not None:
      return output(head), final
    weights = {"embed": self.embed, **({} if self.config.tie_embeddings else
                                       {"lm_head": self.lm_head})}
    return lm_head(weights, self.config, head), final

  def __call__(self, tokens):  # only used by init, to create every param
    return self.decode(self.encode(tokens), None)


def embed(params: Params, config: LlamaConfig, tokens: jax.Array) -> jax.Array:
  """Token ids [...] -> the model's input embeddings [..., d] in its compute dtype (the table
  drafters that read token embeddings share with the target)."""
  return jnp.take(params["embed"], tokens, axis=0).astype(jnp.dtype(config.runtime.dtype))


def lm_head(params: Params, config: LlamaConfig, features: jax.Array) -> jax.Array:
  """Final-normed features [..., d] -> logits [..., v] float32 with the model's output head
  (the embedding when tied): the head Medusa-style drafters share with the target."""
  if config.tie_embeddings:
    return table_dot(features, params["embed"]).astype(jnp.float32)
  return jnp.einsum("...d,dv->...v", features, params["lm_head"]).astype(jnp.float32)


def output_table(params: Params, config: LlamaConfig) -> jax.Array:
  """The output head as a table of its rows [v, d] (the embedding when tied): what drafters
  that score with the target's head gather rows of (VocabTrim) or copy (lower precision)."""
  return params["embed"] if config.tie_embeddings else params["lm_head"].T


@functools.partial(jax.jit, static_argnames="config")
def init_params(config: LlamaConfig, key: jax.Array) -> Params:
  """Random params (plain arrays, boxes removed), compiled once per config (a jitted lambda
  made per call compiled on every call: ~1 s each for a tiny model on CPU)."""
  return nn.unbox(_init_boxed(config, key))


def param_axes(config: LlamaConfig):
  """Logical axis names of every param leaf, as a PartitionSpec pytree (no allocation)."""
  return nn.get_partition_spec(
      jax.eval_shape(functools.partial(_init_boxed, config), jax.random.key(0)))


def _init_boxed(config: LlamaConfig, key: jax.Array):
  """Boxed params: per-layer Block params vmapped into a stack with a leading "layers" axis."""
  tokens = jnp.zeros((1, 1), jnp.int32)
  x = jnp.zeros((1, 1, config.d_model), jnp.dtype(config.runtime.dtype))
  ctx = (*rope_tables(config, tokens), None, jnp.ones((1, 1, 1), bool), None)
  k_top, k_layers = jax.random.split(key)
  top = Embedder(config).init(k_top, tokens)["params"]
  layers = nn.vmap(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                   in_axes=None, axis_size=config.n_layers,
                   metadata_params={nn.PARTITION_NAME: "layers"})(config).init(
                       k_layers, x, None, ctx)["params"]
  return {**top, "layers": layers}


@jax.jit  # one program: as eager slices and transposes SmolLM2's took ~2 s a call, jitted ~0.8
def unstack_layers(params: Params) -> Params:
  """Params for decoding: the layer stack split into a tuple of per-layer dicts, each dense
  weight stored as a Table of its output rows (models/tables.py).

  `forward` then runs the layers as an unrolled Python loop over separate buffers. On CPU this
  reads each weight once per step; a scan's per-layer dynamic slice is copied before every
  matmul (measured ~2x slower). As Tables the weights multiply the few rows of a decode or
  verify step fastest (the measurements in models/tables.py). Costs a longer compile and a
  transposed copy of the weights; the stacked form as loaded stays canonical (training,
  checkpoints, sharding rules).
  """
  n = jax.tree.leaves(params["layers"])[0].shape[0]
  return {**params, "layers": tuple(decoding_layer(params, i) for i in range(n))}


def decoding_layer(params: Params, i: int) -> dict:
  """Layer i's params in decoding's form (`layer_tables`), from stacked or unstacked params."""
  layers = params["layers"]
  if isinstance(layers, tuple):
    return layers[i]
  return layer_tables({name: w[i] for name, w in layers.items()})


def layer_tables(layer: dict) -> dict:
  """One decoder layer's params with each dense weight as a Table (decoding's form)."""
  return {name: (as_table(w, DENSE_IN_AXES[name]) if name in DENSE_IN_AXES else w)
          for name, w in layer.items()}


def fused_layer(layer: dict) -> dict:
  """A decoding layer (`layer_tables`) with each FUSABLE group as one table (tables.Fused)."""
  out = dict(layer)
  for names in FUSABLE:
    out["+".join(names)] = fuse([out.pop(name) for name in names])
  return out


def decoder_layers(config: LlamaConfig, layers, x, cache: KVCache | None, ctx, collect: bool,
                   layer_mask: jax.Array | None = None):
  """All decoder layers: a scan over stacked params, or a loop over a tuple of per-layer params.

  Returns the output, the updated K/V buffers (or None) and per-layer outputs (or None). The
  loop form goes with a per-layer cache, the scan form with a stacked one.
  """
  apply = lambda p, x, layer_kv: block(config, p, x, layer_kv, ctx, collect)
  if layer_mask is not None:
    if cache is not None or isinstance(layers, tuple):
      raise ValueError("layer_mask needs stacked layers and no cache (the training-path scan)")
    layer_mask = jnp.asarray(layer_mask, bool)
    if layer_mask.shape != (config.n_layers,):
      raise ValueError(f"layer_mask must have shape ({config.n_layers},), got {layer_mask.shape}")

    def masked(x, a):  # a cond, not a where: a skipped layer costs nothing
      p, keep = a
      x = jax.lax.cond(keep, lambda x: apply(p, x, None)[0], lambda x: x, x)
      return x, (x if collect else None)

    x, outs = jax.lax.scan(masked, x, (layers, layer_mask))
    return x, None, outs
  if isinstance(layers, tuple):
    if cache is not None and not cache.per_layer:
      raise ValueError("unstacked layers need a per-layer KVCache (KVCache.init(per_layer=True))")
    kvs, outs = [], []
    for i, p in enumerate(layers):
      x, (layer_kv, out) = apply(p, x, None if cache is None else (cache.k[i], cache.v[i]))
      kvs.append(layer_kv)
      outs.append(out)
    new_kv = None if cache is None else tuple(zip(*kvs))
    return x, new_kv, (jnp.stack(outs) if collect else None)
  if cache is not None and cache.per_layer:
    raise ValueError("stacked layers need a stacked KVCache (KVCache.init(per_layer=False))")
  if cache is None:
    x, (_, outs) = jax.lax.scan(lambda x, p: apply(p, x, None), x, layers)
    return x, None, outs

  def body(carry, a):  # the stacked cache rides in the carry so each layer updates it in place
    x, ks, vs = carry
    p, i = a
    x, ((k, v), out) = apply(p, x, (ks[i], vs[i]))
    return (x, ks.at[i].set(k), vs.at[i].set(v)), out

  (x, ks, vs), outs = jax.lax.scan(body, (x, cache.k, cache.v),
                                   (layers, jnp.arange(config.n_layers)))
  return x, (ks, vs), outs


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


def row_positions(batch: int, t: int) -> jax.Array:  # [b, t] int32
  """Positions 0 .. t - 1 in every row: a block of whole rows from their start."""
  return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (batch, t))


def forward(params: Params, config: LlamaConfig, tokens: jax.Array, positions: jax.Array,
            cache: KVCache | None = None, mask: jax.Array | None = None, *,
            hidden_layers: tuple[int, ...] = (-1,), logits_at: jax.Array | None = None,
            layer_mask: jax.Array | None = None, output=None):
  """Runs the model on a block of new tokens against a cache.

  tokens, positions: [b, t] int32 (positions drive RoPE). cache: KVCache or None (no prefix).
  mask: [b, t, t] bool attention among the new tokens (default causal; a tree mask for trees),
  or [b, t, u] over the last u cache slots up to the new ones (see `KVCache.attention_mask`).
  hidden_layers: static indices of hidden states to return (HF indexing: 0 embeddings, i after
  layer i, -1 / L the final-normed features that feed the LM head).
  logits_at: [b, n] int32 indices into t; logits only there (prefill needs just the last one).
  layer_mask: [l] bool, False = skip (the layer's input passes through): one compile scores any
  skip set (drafters/layer_skip_search.py). Stacked params and no cache only.
  output: final-normed features [b, n, d] -> logits [b, n, v], used instead of the model's own
  output layer (a drafter's VocabTrim, drafters/vocab_trim.py).
  Returns logits [b, n or t, v] float32, hidden [len(hidden_layers), b, t, d], and the cache
  with the block appended (lengths += t), or None when no cache was given.
  """
  b, t = tokens.shape
  mask = causal_mask(b, t) if mask is None else mask
  lengths = None if cache is None else cache.lengths
  # The kernel takes the block's own [b, t, t] mask; a wider one (a drafter feeding a tree level
  # over nodes already cached) goes through the jnp path.
  block_mask = None
  if cache is not None and config.runtime.attention_impl != "xla" and mask.shape[-1] == t:
    block_mask, mask = mask, None
  elif cache is not None:
    mask = cache.attention_mask(mask)  # [b, t, s]
  collect = any(0 < (i % (config.n_layers + 1)) < config.n_layers for i in hidden_layers)
  top = Embedder(config)
  top_params = {"params": {k: params[k] for k in ("embed", "final_norm", "lm_head")
                           if k in params}}
  embedded = top.apply(top_params, tokens, method=Embedder.encode)
  ctx = (*rope_tables(config, positions), lengths, mask, block_mask)
  x, new_kv, layer_out = decoder_layers(config, params["layers"], embedded, cache, ctx,
                                        collect, layer_mask)
  logits, final = top.apply(top_params, x, logits_at, output, method=Embedder.decode)
  hidden = _select_hidden(config, hidden_layers, embedded, layer_out, final)
  if cache is not None:
    cache = cache.replace(k=new_kv[0], v=new_kv[1], lengths=cache.lengths + t)
  return logits, hidden, cache


# Jitted forward for callers outside a jitted loop (tests, tools); static config and layers.
forward_jit = jax.jit(forward, static_argnames=("config", "hidden_layers"))
