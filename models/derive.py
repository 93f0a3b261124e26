"""Models derived from another model's weights (a draft model cut from the target)."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from speculax.models.config import LlamaConfig
from speculax.models.llama import Params


def truncated(params: Params, config: LlamaConfig, layers) -> tuple[LlamaConfig, Params]:
  """A model made of the chosen target layers (stacked params), sharing embeddings and head.

  The usual initialization for a small draft model (DistillSpec-style training starts here).
  """
  layers = tuple(layers)
  if not layers or any(not 0 <= i < config.n_layers for i in layers):
    raise ValueError(f"layers {layers} must be a non-empty subset of 0..{config.n_layers - 1}")
  if isinstance(params["layers"], tuple):
    raise ValueError("truncated() takes stacked params (as loaded), not unstacked ones")
  if layers == tuple(range(config.n_layers)):  # the whole model: itself, not a copy
    return config, params
  idx = jnp.asarray(layers)
  sub = {**params, "layers": {k: v[idx] for k, v in params["layers"].items()}}
  return dataclasses.replace(config, n_layers=len(layers)), sub
