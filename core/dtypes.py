"""The floating-point leaves of a pytree (params, or their ShapeDtypeStructs): cast them all to
one dtype, or read the narrowest they hold. Integer leaves (token ids, a frequency order) pass
through untouched."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _floating(x) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def floats_as(tree, dtype):
  """Every floating leaf (arrays or ShapeDtypeStructs) in `dtype`; others as they are."""
  def cast(x):
    if not _floating(x):
      return x
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, dtype)
    return x.astype(dtype)
  return jax.tree.map(cast, tree)


def narrowest_float(tree):
  """The narrowest dtype of the tree's floating leaves (None: it has none)."""
  found = [jnp.dtype(x.dtype) for x in jax.tree.leaves(tree) if _floating(x)]
  return min(found, key=lambda d: d.itemsize) if found else None
