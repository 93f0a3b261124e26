"""Device meshes, the one logical-axis rules table every sharding comes from, and placing params,
caches and batches on a mesh by their logical axis names."""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from speculax.core.fields import Checked, field
from speculax.models import distributed, llama
from speculax.models.config import LlamaConfig
from speculax.models.kvcache import CACHE_AXES, KVCache

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis name (on params, cache and activations) -> mesh axes.
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("cache_seq", None),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig(Checked):
  data: int = field(1, ge=1)
  fsdp: int = field(1, ge=1)
  tensor: int = field(1, ge=1)
  rules: tuple[tuple[str, str | tuple[str, ...] | None], ...] = DEFAULT_RULES

  @property
  def shape(self) -> tuple[int, int, int]:
    return (self.data, self.fsdp, self.tensor)

  def check_batch(self, size: int, what: str) -> None:
    """The rules split the batch over the mesh axes `batch` maps to: it must divide evenly."""
    axes = dict(self.rules).get("batch")
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    ways = math.prod(getattr(self, n) for n in names)
    if size % ways:
      raise ValueError(f"{what} {size} does not split over the mesh's batch axes "
                       f"{' x '.join(f'{n}={getattr(self, n)}' for n in names)} ({ways} ways); "
                       f"use a multiple of {ways} or another mesh")


def make_mesh(cfg: MeshConfig) -> jax.sharding.Mesh:
  """A mesh over the first data*fsdp*tensor devices, in Auto mode (XLA propagates shardings).

  jax.devices() is global: in a multi-process run (models/distributed.py) the mesh spans every
  process, in jax.make_mesh's order, which keeps each process's devices together along the
  leading (batch) axes. It must then use every device: a process left out of the mesh would
  hold no shard of anything and stall its peers' collectives.
  """
  need, have = cfg.data * cfg.fsdp * cfg.tensor, len(jax.devices())
  if need > have:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, cfg.shape))} needs {need} devices, only {have} exist")
  if jax.process_count() > 1 and need != have:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, cfg.shape))} uses {need} of the {have} devices of "
                     f"{jax.process_count()} processes; a multi-process mesh must use all {have}")
  return jax.make_mesh(cfg.shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=jax.devices()[:need])


def _place(tree, logical_specs, mesh, rules, what: str):
  """Puts every leaf (the same value in every process) on the sharding its logical spec maps to,
  after a divisibility check."""
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
    return distributed.put_global(x, sharding)

  return jax.tree_util.tree_map_with_path(put, tree, shardings)


def shard_params(params: llama.Params, config: LlamaConfig, mesh, rules) -> llama.Params:
  return _place(params, llama.param_axes(config), mesh, rules, "param")


def shard_cache(cache: KVCache, mesh, rules) -> KVCache:
  spec = P(*CACHE_AXES)
  if cache.per_layer:
    spec = tuple(P(*CACHE_AXES[1:]) for _ in cache.k)
  return _place(cache, KVCache(k=spec, v=spec, lengths=P("batch")), mesh, rules, "cache")


def batch_sharding(mesh, rules, ndim: int, axis: int = 0) -> NamedSharding:
  """Sharding of a per-sequence array (the sequences along `axis`: [b, ...] by default): batch
  over the data axes, the rest replicated."""
  return nn.logical_to_mesh_sharding(
      P(*(["batch" if i == axis else None for i in range(ndim)])), mesh, rules)
