"""Distilling a draft model from the target: one jitted step, and the loop around it.

Only the drafter's params are trained; the target enters as teacher log-probs (cached top-k,
or computed on the fly for on-policy rows). Position i of a row carries the teacher's
distribution of token i + 1, the same alignment as the student's logits.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
import optax

from speculax.core.fields import Checked, field
from speculax.models import llama
from speculax.models.config import LlamaConfig
from speculax.train import losses, teacher_law
from speculax.train.optim import OptimConfig, make_optimizer

CE = "ce"  # plain next-token cross-entropy on the (target-generated) tokens: the baseline


@dataclasses.dataclass(frozen=True)
class DistillConfig(Checked):
  divergence: losses.Divergence | Literal["ce"] = "fkl"  # "ce": on the target's tokens
  divergence_options: tuple[tuple[str, float], ...] = ()  # e.g. (("beta", 0.1),) for jsd
  batch_size: int = field(8, ge=1)
  optim: OptimConfig = OptimConfig()
  mixed_precision: bool = False  # bf16 compute, fp32 master params and optimizer state
  # Share of each batch's rows sampled by the current drafter.
  on_policy_fraction: float = field(0.0, ge=0, le=1)
  on_policy_prefix: int = field(16, ge=1)  # tokens of a data row kept as an on-policy prompt
  seed: int = field(0, ge=0)

  def __post_init__(self):
    super().__post_init__()
    if self.divergence != CE:
      self.loss_fn()  # raises ValueError naming an unknown divergence option

  def loss_fn(self):
    return teacher_law.get_divergence(self.divergence, **dict(self.divergence_options))

  def objective(self, params, config: LlamaConfig, batch, key, frozen=None):
    """(loss, metrics) of one micro-batch; see `distill_loss` (nothing frozen is read)."""
    return distill_loss(params, config, self, batch, key)

  @property
  def steps(self) -> int:
    """Micro-batches in the run: optimizer updates times accumulation."""
    return self.optim.total_steps * self.optim.accum_steps


@flax.struct.dataclass
class TrainState:
  params: Any  # the drafter's params (stacked layers), float32 master copy
  opt_state: Any
  step: jax.Array  # [] int32 micro-batches done
  key: jax.Array  # [2] uint32 raw key data (checkpoints store plain arrays)


def init_state(params, cfg: DistillConfig) -> TrainState:
  """A fresh state owning copies of params: train_step donates the state's buffers."""
  params = jax.tree.map(jnp.copy, params)
  tx = make_optimizer(cfg.optim)
  return TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32),
                    key=jax.random.key_data(jax.random.key(cfg.seed)))


def _student_logits(params, config: LlamaConfig, tokens, mixed_precision: bool):
  if mixed_precision:
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    config = config.with_runtime(dtype="bfloat16", param_dtype="bfloat16")
  positions = llama.row_positions(*tokens.shape)
  logits, _, _ = llama.forward(params, config, tokens, positions)
  return logits.astype(jnp.float32)  # [b, t, v]


def distill_loss(params, config: LlamaConfig, cfg: DistillConfig, batch, key):
  """batch: tokens [b, t], mask [b, t], teacher ids/logprobs [b, t, K] (top-k of p per position)
  or the target's exact teacher_logits [b, t, v]."""
  logits = _student_logits(params, config, batch["tokens"], cfg.mixed_precision)
  teacher = teacher_law.teacher_law(batch, config.vocab_size)  # [b, t, v] or its TopK
  mask = batch["mask"]
  if cfg.divergence == CE:
    loss = losses.cross_entropy(batch["tokens"][:, 1:], logits[:, :-1], mask[:, :-1])
  else:
    loss = cfg.loss_fn()(teacher, logits, mask, key=key)
  return loss, {"loss": loss, "acceptance": teacher_law.token_acceptance(teacher, logits, mask)}


@functools.partial(jax.jit, static_argnames=("config", "cfg"), donate_argnames=("state",))
def train_step(state: TrainState, batch, config: LlamaConfig, cfg: DistillConfig, frozen=None):
  """One micro-batch: gradients of the objective, then the optax update (which only moves the
  params every accum_steps micro-batches when accumulating).

  cfg: any frozen config with `optim` and `objective(params, config, batch, key, frozen) ->
  (loss, metrics)`: DistillConfig for draft models, train.heads.HeadsConfig for Medusa heads.
  frozen: arrays the objective reads but never trains (a head drafter's target params).
  """
  tx = make_optimizer(cfg.optim)
  key, sub = jax.random.split(jax.random.wrap_key_data(state.key))
  grads, metrics = jax.grad(cfg.objective, has_aux=True)(state.params, config, batch, sub,
                                                         frozen)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  metrics |= {"grad_norm": optax.tree.norm(grads),
              "learning_rate": cfg.optim.schedule()(state.step // cfg.optim.accum_steps)}
  return state.replace(params=optax.apply_updates(state.params, updates), opt_state=opt_state,
                       step=state.step + 1, key=jax.random.key_data(key)), metrics


@functools.partial(jax.jit, static_argnames=("config", "cfg"))
def eval_metrics(params, config: LlamaConfig, cfg, batch, frozen=None) -> dict:
  """The objective's metrics on one batch, no update (held-out evaluation)."""
  return cfg.objective(params, config, batch, jax.random.key(0), frozen)[1]


@functools.partial(jax.jit, static_argnames=("config",))
def teacher_logits(params, config: LlamaConfig, tokens) -> jax.Array:
  """The target's logits at every position of tokens [b, t] -> [b, t, v] float32."""
  return llama.forward(params, config, tokens, llama.row_positions(*tokens.shape))[0]


@functools.partial(jax.jit, static_argnames=("config", "k"))
def teacher_topk(params, config: LlamaConfig, tokens, k: int):
  """The target's top-k log-probs at every position of tokens [b, t] (on-policy rows)."""
  logprobs, ids = jax.lax.top_k(jax.nn.log_softmax(teacher_logits(params, config, tokens)), k)
  return ids.astype(jnp.int32), logprobs
