"""Device meshes and the one logical-axis rules table every sharding comes from."""
from __future__ import annotations

import dataclasses
import math

import jax
from jax.sharding import AxisType

from core.fields import Checked, field

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
  """A mesh over the first data*fsdp*tensor devices, in Auto mode (XLA propagates shardings)."""
  need, have = cfg.data * cfg.fsdp * cfg.tensor, len(jax.devices())
  if need > have:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, cfg.shape))} needs {need} devices, only {have} exist")
  return jax.make_mesh(cfg.shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=jax.devices()[:need])
