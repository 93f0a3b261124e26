"""EAGLE (Li et al. 2024): a decoder layer (or a few) that drafts in the target's feature space.

Entry i of the drafter reads g_i, the target's feature at token i, and the embedding of
token i + 1 (the target's table, shared): x_i = W [g_i; e(x_{i+1})], then decoder layers of the
target's architecture (`draft_layers`, the paper's one by default) with their own KV cache and a
norm give a_i, the predicted feature at i + 1, whose logits through the target's output head are
the law of token i + 2. Drafting continues autoregressively on the drafter's own features: the
next entry reads (a_i, e(draft)).

- EAGLE-1: g is the final-normed feature (feature_layers (-1,)); training adds a regression of
  a_i onto the target's feature at i + 1 (feature_weight).
- EAGLE-3 (`Eagle.eagle3`): g fuses low, middle and high layer features with a learned
  projection, and training runs the drafter on its own outputs for `ttt_steps` steps
  ("training-time test"): step s's entries read step s - 1's outputs and attend to the real
  entries before their rollout started plus their own rollout's entries, as at decode time.
- EAGLE-2 dynamic trees: any decode.trees tree, grown level by level (drafters.tree_draft).
- Shallow input (`shallow_layers` L, Kangaroo's shallow sub-network, Liu et al. 2024): token
  i + 1 enters as the target's own residual after its first L layers (RMS-normed), not its
  embedding: the target's layers run on the pending token and each draft against the target's
  cache (writing the slots the verify overwrites), so the drafter reads a token already seen in
  context. The entry at P - 1 waits for the pending token's shallow feature: the drafter's cache
  then ends at P - 1 and the state keeps g at P - 1 instead of a. Chains only.
- SpecDec++ (Huang et al. 2024) adaptive length: with `stop_threshold`, an acceptance head
  predicts the chance each draft is kept: the draft's own confidence (its top probability,
  EAGLE-2's acceptance proxy) corrected by a learned linear map of a_i; a chain stops once the
  predicted chance that some draft so far is rejected passes the threshold. The verifier checks
  only those drafts, so output stays lossless whatever the head says.

The drafter's cache holds the real entries 0 .. P - 1 (P the pending token's position: entry
P - 1 pairs the target's last feature with the pending token), and its state keeps a at P - 1,
whose logits give the first draft. Drafted entries go at P, P + 1, ... and are overwritten by
the next update, which feeds the kept path's target features. Goodput's plain steps (`max_lag`)
keep their target features in a backlog instead, fed as one block before the next draft: the
cache then holds the entries before the backlog's first slot.

Dims: b batch, t time, l feature layers, d model, v vocab, s ttt steps.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from speculax.core.fields import field
from speculax.core.sampling import SamplingConfig, probs, sample, top_probability
from speculax.core.trees import Tree
from speculax.core.types import Draft, TargetView, Verified
from speculax.drafters import low_precision
from speculax.drafters.base import Drafter
from speculax.drafters.chain import exit_step
from speculax.drafters.feature_layer import (defer, init_layer, last_fed, layer_config,
                                             run_layers)
from speculax.drafters.tree_draft import grow_tree
from speculax.models import llama
from speculax.models.kvcache import KVCache
from speculax.models.tables import as_table, dense


@flax.struct.dataclass
class EagleState:
  cache: KVCache  # the draft layer's cache; lengths = P, the pending token's position (P - 1
  # with shallow_layers)
  feature: jax.Array  # [b, d] a at P - 1: its logits give the first draft (shallow_layers: g)
  # [l, b, max_lag, d] target features of the entries plain steps left unfed, from slot
  # cache.lengths on (None without max_lag)
  backlog: jax.Array | None
  config: object = flax.struct.field(pytree_node=False)  # the target's LlamaConfig (static)


@dataclasses.dataclass(frozen=True)
class Eagle(Drafter):
  name: ClassVar[str] = "eagle"
  summary: ClassVar[str] = ("an EAGLE decoder layer drafting in the target's feature space "
                            "(EAGLE-2 trees, EAGLE-3 features, SpecDec++ stop; trained)")
  trained: ClassVar[bool] = True
  feature_layers: tuple[int, ...] = (-1,)  # target hidden states fused into g (HF indexing)
  # Training rollout steps on the drafter's own features (EAGLE-3: > 1).
  ttt_steps: int = field(1, ge=1)
  feature_weight: float = field(1.0, ge=0)  # EAGLE-1 feature regression (single final feature)
  tree: Tree | None = None  # None: a chain of k drafts
  # SpecDec++: stop once P(some draft rejected) > this (an acceptance threshold in (0, 1)).
  stop_threshold: float | None = field(None, gt=0, lt=1)
  vocab_trim: int = field(0, ge=0)  # VocabTrim: the N most frequent target tokens (0: all)
  exit_threshold: float | None = field(None, gt=0, lt=1)  # Kangaroo early exit (chains)
  # Decoder layers of the drafter (params "layer", then "layer1", "layer2", ...).
  draft_layers: int = field(1, ge=1, le=8)
  max_lag: int = field(16, ge=0, le=256)  # goodput's plain steps fed in one block (Drafter)
  # Its tables (the draft layers, fc, the output rows it scores with) in this dtype when decoding
  # (drafters/low_precision.py; int8: a quarter of float32's bytes, half of bf16's); None: as
  # stored.
  draft_dtype: low_precision.DraftDtype | None = None
  # The target's first layers whose output stands for the token an entry reads (0: its
  # embedding, EAGLE's own).
  shallow_layers: int = field(0, ge=0)

  def __post_init__(self):
    super().__post_init__()
    if not self.feature_layers:
      raise ValueError("Eagle.feature_layers must name at least one target hidden state, got ()")
    if self.stop_threshold is not None and self.tree is not None:
      raise ValueError("stop_threshold (adaptive draft length) applies to chains; drop the tree")
    if self.shallow_layers and self.tree is not None:
      raise ValueError(f"shallow_layers={self.shallow_layers} drafts chains; drop the tree")

  @classmethod
  def eagle3(cls, n_layers: int, **kw) -> Eagle:
    """EAGLE-3 defaults: low, middle and high layer features, 3 training-time-test steps."""
    layers = tuple(sorted({min(2, n_layers), max(n_layers // 2, 1), max(n_layers - 3, 1)}))
    return cls(**{"feature_layers": layers, "ttt_steps": 3, "feature_weight": 0.0, **kw})

  @property
  def hidden_layers(self) -> tuple[int, ...]:
    """The fused features, then the shallow layers' output where it stands for the tokens."""
    return self.feature_layers + ((self.shallow_layers,) if self.shallow_layers else ())

  def check(self, target, params, k: int) -> None:
    for i in self.feature_layers:
      if not -(target.n_layers + 1) <= i <= target.n_layers:
        raise ValueError(f"feature layer {i} out of range for {target.n_layers} layers")
    if self.shallow_layers >= target.n_layers:
      raise ValueError(f"shallow_layers={self.shallow_layers} must be below the target's "
                       f"{target.n_layers} layers")
    super().check(target, params, k)

  def prepare(self, params, target_params, target):
    """VocabTrim's rows or, with draft_dtype, the target's output layer in it (Drafter.prepare),
    then every dense weight as a table of output rows (models/tables.py; with draft_dtype in it),
    q/k/v and gate/up as one table each (llama.fused_layer): a draft step multiplies a few rows
    with each, the product the tables (and the CPU rows kernel) run fastest, and pays per call
    as much as per byte."""
    params = super().prepare(params, target_params, target)
    dtype = self.draft_dtype
    low = (lambda layer: layer) if dtype is None else (
        lambda layer: low_precision.lowered_layer(layer, dtype))
    layers = {_layer_key(i): llama.fused_layer(low(llama.layer_tables(p)))
              for i, p in enumerate(_layers(params))}
    tables = low({key: as_table(params[key], 1) for key in ("fc", "fuse") if key in params})
    return {**params, **layers, **tables}

  def init_params(self, config, key=None) -> dict:
    """A residual identity to start from, as zero Medusa heads: fc passes g through (the
    embedding half at zero) and the layer's output projections are zero, so an untrained
    drafter's first draft is the target's own next-token guess on g. The acceptance head starts
    as the draft's confidence (a zero correction)."""
    d, n = config.d_model, len(self.feature_layers)
    keys = jax.random.split(jax.random.key(0) if key is None else key, self.draft_layers)
    params = {"fc": jnp.concatenate([jnp.eye(d), jnp.zeros((d, d))]),  # [2d, d]
              "norm": jnp.ones((d,), jnp.float32),
              "accept": {"w": jnp.zeros((d,), jnp.float32), "b": jnp.zeros((), jnp.float32)}}
    params |= {_layer_key(i): init_layer(config, keys[i]) for i in range(self.draft_layers)}
    if n > 1:
      params["fuse"] = jnp.tile(jnp.eye(d) / n, (n, 1))  # [l d, d]: the mean of the features
    return params

  def warm_params(self, saved: Drafter, params: dict, fresh: dict, target) -> dict:
    """A run may grow a saved EAGLE drafter so that it starts drafting exactly as the saved one
    does and learns only what it adds:
    - more draft layers: the saved layers come first, the new ones start as init_layer's
      identity (zero output projections) below the shared final norm;
    - fused features (EAGLE-3) from a one-feature drafter whose feature is among its own: the
      fusion starts as that feature alone;
    - shallow inputs other than the saved drafter's (shallow_layers): fc's token half starts at
      zero, as init_params' does, so the run starts drafting from g alone."""
    params = {**params, **{k: fresh[k] for k in fresh if k.startswith("layer") and k not in params}}
    if self.shallow_layers != saved.shallow_layers:
      d = params["fc"].shape[1]
      params = {**params, "fc": params["fc"].at[-d:].set(0)}  # [g; e] rows: e's zeroed
    if "fuse" in params or "fuse" not in fresh:
      return params
    layer = lambda i: i % (target.n_layers + 1)  # HF indexing: -1 is the last (final-normed)
    ours, theirs = [layer(i) for i in self.feature_layers], layer(saved.feature_layers[0])
    if theirs not in ours:
      raise ValueError(f"an EAGLE drafter of feature layer {saved.feature_layers[0]} cannot start "
                       f"a run fusing layers {self.feature_layers}: name its layer among them")
    d, i = fresh["fuse"].shape[1], ours.index(theirs)
    fuse = jnp.zeros(fresh["fuse"].shape, fresh["fuse"].dtype).at[i * d:(i + 1) * d].set(jnp.eye(d))
    return {**params, "fuse": fuse}  # [l d, d]

  def target_start(self, params: dict, target_params, config, tokens: jax.Array) -> dict:
    """The draft layers become the target's last `draft_layers` layers, read on the scale they
    were trained for: fc maps g (final-normed) back to the residual stream's size (the final
    norm's scale undone, times the median RMS of the first copied layer's input over `tokens`)
    and the drafter's norm is the target's final norm. So an untrained drafter applies the
    target's last layers once more to its last feature. Measured below init_params' identity
    after 100 and 300 updates on SmolLM2 (README, issue 18), kept as the experiment it was."""
    if tuple(self.feature_layers) != (-1,):
      raise ValueError(f"init_from='target' reads g as the final-normed feature; this drafter "
                       f"fuses feature_layers {self.feature_layers}: use (-1,)")
    n, d = self.draft_layers, config.d_model
    first = config.n_layers - n  # HF index of the first copied layer's input
    _, hidden, _ = llama.forward(target_params, config, tokens,
                                 llama.row_positions(*tokens.shape),
                                 hidden_layers=(first,))
    rms = float(jnp.median(jnp.sqrt(jnp.mean(jnp.square(hidden[0]), -1))))
    final = jnp.asarray(target_params["final_norm"], jnp.float32)  # [d]
    layers = {_layer_key(i): {k: jnp.asarray(v[first + i], jnp.float32)
                              for k, v in target_params["layers"].items()} for i in range(n)}
    return {**params, **layers, "norm": final,
            "fc": jnp.concatenate([jnp.diag(rms / final), jnp.zeros((d, d))])}  # [2d, d]

  # ----- decoding -----

  def init(self, params, view: TargetView, config, max_len: int) -> EagleState:
    """Feeds the prompt's real entries: feature i with token i + 1, up to the pending token (with
    shallow_layers to the one before it: the pending token's shallow feature comes with the
    next draft)."""
    g, h = self._inputs(params, view.prompt_hidden, config)  # [b, T, d], h None or [b, T, d]
    b, t, d = g.shape
    rows, pending = jnp.arange(b), view.lengths - 1  # [b]
    cache = KVCache.init(layer_config(config, self.draft_layers), b, max_len, per_layer=True)
    e = (_embed(view.params, config, view.history[:, 1:t + 1]) if h is None else
         jnp.concatenate([h[:, 1:], jnp.zeros_like(h[:, :1])], 1))  # token i + 1's
    a, cache = _step(params, config, g, e, llama.row_positions(b, t), cache,
                     llama.causal_mask(b, t))
    if h is not None:  # entry P - 1 waits: its pending token has no shallow feature yet
      return EagleState(cache.with_lengths(pending - 1), g[rows, pending - 1], None, config)
    backlog = (jnp.zeros((len(self.feature_layers), b, self.max_lag, d), g.dtype)
               if self.max_lag else None)
    return EagleState(cache.with_lengths(pending), a[rows, pending - 1], backlog, config)

  def propose(self, params, state: EagleState, view: TargetView, key, config, k: int,
              sampling: SamplingConfig):
    output = self.output(params, view.params, config)
    if self.tree is not None:
      logits = output(state.feature)  # [b, v]
      return self._tree(params, state, view, key, config, sampling, logits, output), state, view
    b, greedy = view.lengths.shape[0], sampling.greedy
    ones = jnp.ones((b, 1, 1), bool)
    token = self._token_input(view, config)  # (tokens [b], slots [b], target cache)
    root, feature, cache = state.cache.lengths, state.feature, state.cache  # root: [b] P
    tcache = None  # with shallow_layers: the target cache its layers write the tokens' K/V in
    if self.shallow_layers:  # entry P - 1, with the pending token's shallow feature
      root = root + 1
      e, tcache = token(view.pending, root, view.cache)
      a, cache = _step(params, config, feature[:, None], e, (root - 1)[:, None], cache, ones)
      feature = a[:, 0]
    logits = output(feature)  # [b, v]

    def draw(s, tokens, q, logits, feature, p_kept, length):  # draft s from `feature`'s logits
      tok = sample(jax.random.fold_in(key, s), logits, sampling)  # [b]
      tokens = tokens.at[:, s].set(tok)
      if not greedy:
        q = q.at[:, s].set(probs(logits, sampling))
      if self.exit_threshold is not None:  # Kangaroo: a low draft s > 0 is not proposed
        top = top_probability(logits, None if greedy else q[:, s])
        length = exit_step(length, top, s, k, self.exit_threshold)
      if self.stop_threshold is not None:  # SpecDec++: P(all drafts so far kept)
        p_kept = p_kept * jax.nn.sigmoid(_accept_logit(params, feature, logits))
        stop = (1 - p_kept > self.stop_threshold) & (length == k)
        length = jnp.where(stop, s + 1, length)
      return tokens, q, p_kept, length, tok

    def body(c):  # feeds draft s - 1 (at slot P + s), draws draft s: none after the last draft
      s, tokens, q, feature, cache, tcache, p_kept, length, tok = c
      e, tcache = token(tok, root + s, tcache)
      a, cache = _step(params, config, feature[:, None], e, (root + s - 1)[:, None], cache, ones)
      feature = a[:, 0]
      logits = output(feature)
      tokens, q, p_kept, length, tok = draw(s, tokens, q, logits, feature, p_kept, length)
      return s + 1, tokens, q, feature, cache, tcache, p_kept, length, tok

    def cond(c):
      return (c[0] < k) & jnp.any(c[-2] == k)

    q0 = None if greedy else jnp.zeros((b, k, logits.shape[-1]), jnp.float32)
    tokens, q, p_kept, length, tok = draw(0, jnp.zeros((b, k), jnp.int32), q0, logits, feature,
                                          jnp.ones((b,), jnp.float32),
                                          jnp.full((b,), k, jnp.int32))
    init = (jnp.ones((), jnp.int32), tokens, q, feature, cache, tcache, p_kept, length, tok)
    _, tokens, q, _, _, tcache, _, length, _ = jax.lax.while_loop(cond, body, init)
    adaptive = self.stop_threshold is not None or self.exit_threshold is not None
    view = view if tcache is None else view.replace(cache=tcache)
    return Draft(tokens, q, length=length if adaptive else None), state, view

  def _token_input(self, view: TargetView, config):
    """(tokens [b], their slots [b], target cache) -> (what an entry reads for them [b, 1, d],
    the target cache): their embeddings, or with shallow_layers the target's first layers run on
    them at those slots (their K/V written there; the cache's lengths unchanged)."""
    if not self.shallow_layers:
      return lambda tokens, slots, tcache: (_embed(view.params, config, tokens[:, None]), tcache)
    n = self.shallow_layers
    layers = tuple(view.params["layers"][i] for i in range(n))

    def shallow(tokens, slots, tcache):
      sub = KVCache(k=tcache.k[:n], v=tcache.v[:n], lengths=slots)
      y, sub = run_layers(layers, config, llama.embed(view.params, config, tokens[:, None]),
                          slots[:, None], sub, jnp.ones((tokens.shape[0], 1, 1), bool))
      return _normed(y, config), tcache.replace(k=sub.k + tcache.k[n:], v=sub.v + tcache.v[n:])
    return shallow

  def _inputs(self, params, f, config):
    """Target features [l (+ 1 with shallow_layers), ..., d] -> (g [..., d], the shallow layers'
    output RMS-normed [..., d] or None)."""
    n = len(self.feature_layers)
    return _fuse(params, f[:n]), _normed(f[n], config) if self.shallow_layers else None

  def _tree(self, params, state: EagleState, view, key, config, sampling, logits,
            output) -> Draft:
    """EAGLE-2: the tree grows level by level; a node's entry reads its parent's feature."""
    root = state.cache.lengths

    def feed(carry, d, level, local, mask):
      cache, parent = carry  # parent: [b, w_prev, d] features of depth d - 1
      g = jnp.take_along_axis(parent, local[..., None], 1)  # [b, w, d]
      positions = (root + d - 1)[:, None] + jnp.zeros(level.shape, jnp.int32)
      # The root has no entry of its own (entry P - 1 is real): drop its mask column.
      a, cache = _step(params, config, g, _embed(view.params, config, level), positions, cache,
                       mask[..., 1:])
      return output(a), (cache, a)

    tokens, q, parents, _, _ = grow_tree(feed, (state.cache, state.feature[:, None]),
                                         logits[:, None], key, self.tree, sampling)
    return Draft(tokens, q, parents)

  def update(self, params, state: EagleState, view: TargetView, verified: Verified) -> EagleState:
    """Feeds the kept path's real entries (target feature, next kept token) from slot P on; a
    plain step's entry (slot P - 1 now) goes to the backlog instead, with max_lag."""
    b = verified.path.shape[0]
    rows = jnp.arange(b)[:, None]
    f = verified.hidden[:, rows, verified.path]  # [l, b, m, d], m = depth + 1
    if self.shallow_layers:
      return self._feed_shallow(params, state, view, f)
    if verified.plain and self.max_lag:
      return state.replace(backlog=defer(state.backlog, f[:, :, 0], state.cache.lengths,
                                         view.lengths))
    return _feed(params, state, view, f)

  def _feed_shallow(self, params, state: EagleState, view: TargetView, f: jax.Array
                    ) -> EagleState:
    """Feeds the entries from the waiting one (slot P0 - 1) on: kept path node j's (at slot
    P0 + j) shallow feature with the target feature before it; the last kept node's feature waits
    for the new pending token (a row that did not grow keeps its own). Plain steps too: no
    backlog."""
    g, h = self._inputs(params, f, state.config)  # [b, m, d] each
    b, m = g.shape[:2]
    slots = state.cache.lengths[:, None] + jnp.arange(m)  # [b, m]
    before = jnp.concatenate([state.feature[:, None], g[:, :-1]], 1)
    _, cache = _step(params, state.config, before, h, slots, state.cache, llama.causal_mask(b, m))
    return state.replace(cache=cache.with_lengths(view.lengths - 2),
                         feature=last_fed(g, state.cache.lengths + 1, view.lengths, state.feature))

  def lag(self, state: EagleState, view: TargetView) -> jax.Array:
    return view.lengths - 1 - bool(self.shallow_layers) - state.cache.lengths

  def catch_up(self, params, state: EagleState, view: TargetView) -> EagleState:
    """Feeds the backlog's entries as one block of max_lag (those past the lag land beyond the
    new length, as a verify block's rejected entries do)."""
    return state if state.backlog is None else _feed(params, state, view, state.backlog)

  # ----- training -----

  def train_outputs(self, params, frozen, config, batch, key) -> dict:
    """Rollouts of ttt_steps steps from every position (teacher-forced tokens): step s's
    output at position i belongs to the rollout started at r = i - s + 1 and is the law of the
    token the cache's distribution at r + s is of."""
    f, tokens = batch["hidden"], batch["tokens"]  # [l (+ 1), b, t, d], [b, t]
    b, t = tokens.shape
    g, h = self._inputs(params, f, config)  # [b, t, d]
    nxt = lambda z: jnp.concatenate([z[:, 1:], z[:, -1:]], 1)  # token i + 1's (last: pad)
    e = _embed(frozen, config, nxt(tokens)) if h is None else nxt(h)  # [b, t, d]
    x1 = _entries(params, g, e)  # [b, t, d]
    xs, logits, accept, out = [x1], [], [], {}
    head = self.train_head(frozen, config)
    for s in range(1, self.ttt_steps + 1):
      x = jnp.concatenate(xs, 1)  # [b, s t, d] every step's entries so far
      positions = jnp.broadcast_to(jnp.tile(jnp.arange(t), s), (b, s * t))
      mask = jnp.broadcast_to(jnp.asarray(ttt_mask(t, s)), (b, s * t, s * t))
      y, _ = run_layers(_layers(params), config, x, positions, mask=mask)
      a = llama.rms_norm(y[:, -t:], params["norm"], config.norm_eps)  # [b, t, d] step s
      shift = lambda z: jnp.concatenate([z[:, s - 1:], jnp.zeros_like(z[:, :s - 1])], 1)
      z = head(a)  # [b, t, v] (or [b, t, n] trimmed)
      logits.append(shift(z))  # by rollout start
      accept.append(shift(_accept_logit(params, a, z)))  # [b, t]
      if s == 1 and len(self.feature_layers) == 1 and self.feature_weight:
        mask2 = batch["mask"][:, 1:] * batch["mask"][:, :-1]  # [b, t - 1]
        err = optax.huber_loss(a[:, :-1], f[0][:, 1:]).mean(-1)  # smooth L1 vs feature i + 1
        reg = (err * mask2).sum() / jnp.maximum(mask2.sum(), 1)
        out = {"aux_loss": self.feature_weight * reg, "metrics": {"feature_loss": reg}}
      g = jnp.concatenate([jnp.zeros_like(a[:, :1]), a[:, :-1]], 1)  # entry i reads a_{i-1}
      xs.append(_entries(params, g, e))
    # The acceptance head always trains (it is tiny), so one trained drafter runs with or
    # without a stop threshold.
    return out | {"logits": jnp.stack(logits, 2), "accept_logits": jnp.stack(accept, 2)}


def ttt_mask(t: int, s: int) -> np.ndarray:
  """[s t, s t] bool: which entries step s_q at position i sees during training-time test.

  Its rollout started at r = i - s_q + 1: it sees step 1's (real) entries at positions <= r and
  its own rollout's entries of steps 2 .. s_q, which sit at positions i - (s_q - s_k).
  """
  sq, i = np.divmod(np.arange(s * t), t)  # step - 1 and position of each row / column
  sq, i = sq[:, None] + 1, i[:, None]
  sk, j = sq.T, i.T
  real = (sk == 1) & (j <= i - sq + 1)
  own = (sk >= 2) & (sk <= sq) & (j == i - (sq - sk))
  return real | own


def _feed(params, state: EagleState, view: TargetView, f: jax.Array) -> EagleState:
  """Feeds real entries from slot P0 = state.cache.lengths on: target features f [l, b, m, d]
  at slots P0 .. P0 + m - 1, each with the history token after it; the cache ends at the
  pending token's slot and the state's feature is a at the last real entry (kept where none
  was fed)."""
  root = state.cache.lengths  # [b] P0
  b, m = f.shape[1:3]
  rows = jnp.arange(b)[:, None]
  slots = root[:, None] + jnp.arange(m)  # [b, m]
  nxt = view.history[rows, jnp.minimum(slots + 1, view.history.shape[1] - 1)]  # [b, m]
  a, cache = _step(params, state.config, _fuse(params, f), _embed(view.params, state.config, nxt),
                   slots, state.cache, llama.causal_mask(b, m))
  return state.replace(cache=cache.with_lengths(view.lengths - 1),
                       feature=last_fed(a, root, view.lengths, state.feature))


def _embed(frozen, config, tokens):
  """The target's embeddings of tokens [...] -> [..., d] float32: what EAGLE's entries read."""
  return llama.embed(frozen, config, tokens).astype(jnp.float32)


def _normed(h, config):
  """The shallow layers' output [..., d] RMS-normed (no scale): what an entry reads for a token
  with shallow_layers."""
  return llama.rms_norm(h.astype(jnp.float32), jnp.ones(h.shape[-1], jnp.float32),
                        config.norm_eps)


def _entries(params, g, e):
  """x = W [g; e]: g [b, t, d] and what the entry reads for token i + 1, e [b, t, d] ->
  [b, t, d]."""
  return dense(jnp.concatenate([g, e], -1), params["fc"], 1)


def _step(params, config, g, e, positions, cache: KVCache, new_mask):
  """Appends entries (g [b, t, d], e [b, t, d]) at positions to the draft cache; returns the
  drafter's features a [b, t, d] and the cache. new_mask [b, t, u] as KVCache.attention_mask."""
  y, cache = run_layers(_layers(params), config, _entries(params, g, e), positions, cache,
                        new_mask)
  return llama.rms_norm(y, params["norm"], config.norm_eps), cache


def _layer_key(i: int) -> str:
  return "layer" if i == 0 else f"layer{i}"


def _layers(params) -> list[dict]:
  """The draft layers' params in order: "layer", "layer1", ... (check_params holds their number
  to draft_layers)."""
  n = sum(k.startswith("layer") for k in params)
  return [params[_layer_key(i)] for i in range(n)]


def _fuse(params, f):
  """Target features [l, ..., d] -> g [..., d]: the one feature, or the learned fusion."""
  if f.shape[0] == 1:
    return f[0].astype(jnp.float32)
  return dense(jnp.concatenate(list(f), -1).astype(jnp.float32), params["fuse"], 1)


def _accept_logit(params, a, logits):
  """SpecDec++ acceptance head: the logit that the draft drawn from `logits` [..., v] (read off
  the feature a [..., d]) is kept -> [...].

  The draft's confidence logit(max q) plus a learned correction w.a + b. A head on a alone
  starts uninformed and, trained at the drafter's learning rate, stays so for long: after 160
  updates on SmolLM2 it predicted 0.50 for drafts kept 0.20 of the time (correlation 0.06),
  while the confidence alone said 0.25 (correlation 0.43). The head's loss does not reach the
  drafter's logits (stop_gradient): it learns to judge the drafts, not to change them.
  """
  conf = top_probability(jax.lax.stop_gradient(logits).astype(jnp.float32))
  prior = jax.scipy.special.logit(jnp.clip(conf, 1e-6, 1 - 1e-6))  # finite at conf 1
  return prior + a @ params["accept"]["w"] + params["accept"]["b"]

