"""Drafts from a lower-precision copy of model weights (QSpec-style), for the drafters that run
a model forward of their own: layer skip (the target's kept layers) and draft models (theirs).

The copy is made once per call (`Drafter.prepare`) and read only by the drafts; the verify reads
the target's own weights, so output stays the target's. bfloat16 and float16 cast every float;
int8 quantizes each table row by row (models/tables.Q8: the row's largest magnitude at 127, a
float32 scale per row; norms and biases stay as they are), a quarter of float32's bytes. The
copy's layers hold q/k/v and gate/up as one table each (`llama.fused_layer`): a one-token draft
step pays for its calls more than for its bytes (README "Where an int8 draft's time goes").
"""
from __future__ import annotations

import functools
import typing
from typing import Literal

import jax

from speculax.core.dtypes import floats_as
from speculax.models import llama
from speculax.models.tables import Q8, Table

DraftDtype = Literal["bfloat16", "float16", "int8"]
DRAFT_DTYPES = typing.get_args(DraftDtype)
HEAD = "low_precision_head"  # the copied output layer's key in prepared params


@functools.partial(jax.jit, static_argnames=("used", "dtype"))
def copy(params, used: tuple[int, ...], dtype: str) -> dict:
  """The `used` layers of a model's params (stacked or unstacked) in decoding's form, fused, in
  dtype, as {"layers": {i: layer}} (the output layer's copy: Drafter.prepare). Jitted: eagerly,
  SmolLM2's 30 layers took 0.31-0.36 s a call, compiled 0.07-0.12 s."""
  return {"layers": {i: llama.fused_layer(lowered_layer(llama.decoding_layer(params, i), dtype))
                     for i in used}}


@functools.partial(jax.jit, static_argnames="dtype")
def lowered(table: jax.Array, dtype: str) -> jax.Array | Q8:
  """A table of output rows [v, d] in dtype (int8: a scale per row). Jitted: SmolLM2's output
  layer to int8 took ~90 ms eagerly, once per call."""
  return Q8.of(table) if dtype == "int8" else table.astype(dtype)


def lowered_layer(layer: dict, dtype: str) -> dict:
  """A decoding layer in dtype: every float cast, or in int8 its tables (norms and biases stay)."""
  if dtype != "int8":
    return floats_as(layer, dtype)
  return {name: w.replace(rows=Q8.of(w.rows)) if isinstance(w, Table) else w
          for name, w in layer.items()}
