"""Placing params, caches and batches on a mesh from logical axis names and a rules table."""
from __future__ import annotations

import jax
import flax.linen as nn
from jax.sharding import NamedSharding, PartitionSpec as P

from configs.models import LlamaConfig
from models import llama
from models.kvcache import CACHE_AXES, KVCache


def _place(tree, logical_specs, mesh, rules, what: str):
  """device_put every leaf with the sharding its logical spec maps to, after a divisibility check."""
  shardings = nn.logical_to_mesh_sharding(logical_specs, mesh, rules)

  def put(path, x, sharding):
    for dim, axes in zip(x.shape, sharding.spec):
      names = () if axes is None else (axes,) if isinstance(axes, str) else axes
      size = 1
      for n in names:
        size *= mesh.shape[n]
      if dim % size:
        raise ValueError(f"{what} leaf {jax.tree_util.keystr(path)} of shape {x.shape}: dim {dim} is "
                         f"not divisible by mesh axes {names} of size {size}; change the mesh or the rules")
    return jax.device_put(x, sharding)

  return jax.tree_util.tree_map_with_path(put, tree, shardings)


def shard_params(params: llama.Params, config: LlamaConfig, mesh, rules) -> llama.Params:
  return _place(params, llama.param_axes(config), mesh, rules, "param")


def shard_cache(cache: KVCache, mesh, rules) -> KVCache:
  spec = P(*CACHE_AXES)
  if cache.per_layer:
    spec = tuple(P(*CACHE_AXES[1:]) for _ in cache.k)
  return _place(cache, KVCache(k=spec, v=spec, lengths=P("batch")), mesh, rules, "cache")


def batch_sharding(mesh, rules, ndim: int) -> NamedSharding:
  """Sharding of a per-sequence array [b, ...]: batch over the data axes, the rest replicated."""
  return nn.logical_to_mesh_sharding(P("batch", *([None] * (ndim - 1))), mesh, rules)
