"""Device meshes and the one logical-axis rules table every sharding comes from."""
from __future__ import annotations

import dataclasses

import jax
from jax.sharding import AxisType

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
class MeshConfig:
  data: int = 1
  fsdp: int = 1
  tensor: int = 1
  rules: tuple[tuple[str, str | tuple[str, ...] | None], ...] = DEFAULT_RULES

  def __post_init__(self):
    for name in MESH_AXES:
      if getattr(self, name) < 1:
        raise ValueError(f"MeshConfig.{name} must be >= 1, got {getattr(self, name)}")

  @property
  def shape(self) -> tuple[int, int, int]:
    return (self.data, self.fsdp, self.tensor)


def make_mesh(cfg: MeshConfig) -> jax.sharding.Mesh:
  """A mesh over the first data*fsdp*tensor devices, in Auto mode (XLA propagates shardings)."""
  need, have = cfg.data * cfg.fsdp * cfg.tensor, len(jax.devices())
  if need > have:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, cfg.shape))} needs {need} devices, only {have} exist")
  return jax.make_mesh(cfg.shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=jax.devices()[:need])
