"""Decoder layers of the target's shape over feature vectors, with their own KV cache.

The building block of drafters that attend over the target's features: Hydra++'s prefix layer
and EAGLE's draft layers. Each is a llama.Block on the jnp attention path (the drafter's cache is
small; the Pallas kernel serves the target). With Drafter.max_lag, goodput's plain steps leave
their target features in a backlog that the next catch-up feeds as one block (`defer`,
`last_fed`).

Dims: b batch, t new entries, u cache slots the mask covers, d model.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from speculax.models import llama
from speculax.models.kvcache import KVCache


def layer_config(config, n: int = 1):
  """The layers' config: n decoder layers of the target's, plain XLA attention (a KVCache of
  this config holds their buffers)."""
  return dataclasses.replace(config, n_layers=n).with_runtime(attention_impl="xla")


@functools.partial(jax.jit, static_argnums=0)  # one compile per config, not an eager op at a time
def init_layer(config, key: jax.Array) -> dict:
  """Block params with zero output projections (attention and MLP): the identity at first."""
  cfg = layer_config(config)
  x = jnp.zeros((1, 1, cfg.d_model), jnp.dtype(cfg.runtime.dtype))
  ctx = (*llama.rope_tables(cfg, jnp.zeros((1, 1), jnp.int32)), None, jnp.ones((1, 1, 1), bool),
         None)
  params = nn.unbox(llama.Block(cfg).init(key, x, None, ctx)["params"])
  return {**params, "o": jnp.zeros_like(params["o"]), "down": jnp.zeros_like(params["down"])}


def run_layers(layers: Sequence[dict], config, x: jax.Array, positions: jax.Array,
               cache: KVCache | None = None,
               mask: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
  """The layers (params of each, in order) on x [b, t, d] at positions [b, t] -> ([b, t, d],
  cache or None). The cache (per_layer, one buffer per layer) is layer_config(config, n)'s.

  mask: without a cache [b, t, t] among the entries; with one [b, t, u] over the last u slots up
  to the new entries (KVCache.attention_mask), the new entries written at cache.lengths on.
  Default causal.
  """
  cfg = layer_config(config, len(layers))
  mask = llama.causal_mask(*x.shape[:2]) if mask is None else mask
  cos, sin = llama.rope_tables(cfg, positions)
  if cache is None:
    return llama.decoder_layers(cfg, tuple(layers), x, None, (cos, sin, None, mask, None),
                                False)[0], None
  ctx = (cos, sin, cache.lengths, cache.attention_mask(mask), None)
  x, (k, v), _ = llama.decoder_layers(cfg, tuple(layers), x, cache, ctx, False)
  return x, cache.replace(k=k, v=v, lengths=cache.lengths + x.shape[1])


def defer(backlog: jax.Array, feature: jax.Array, fed: jax.Array, lengths: jax.Array) -> jax.Array:
  """The backlog [..., b, W, d] of features for slots fed [b] on, with a plain step's target
  feature [..., b, d] at its slot: the one before the pending token's (history lengths [b])."""
  rows = jnp.arange(fed.shape[0])
  return backlog.at[..., rows, lengths - 2 - fed, :].set(feature.astype(backlog.dtype))


def last_fed(out: jax.Array, fed: jax.Array, lengths: jax.Array, before: jax.Array) -> jax.Array:
  """[b, d] the output out [b, m, d] of a block fed from slot fed [b] on at its last real entry
  (the slot before the pending token's, history lengths [b]); before [b, d] where the block held
  none."""
  last = lengths - 2 - fed  # [b]
  picked = out[jnp.arange(out.shape[0]), jnp.clip(last, 0, out.shape[1] - 1)]
  return jnp.where((last >= 0)[:, None], picked, before)
