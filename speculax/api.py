"""The short API for notebooks and launch scripts: load a model, generate, speculate, and train
a drafter on any corpus of texts. Each call builds the configs the layers below take (and
checks them), so everything here is also reachable piece by piece.

    import speculax as sx
    model = sx.load("smollm2-135m")
    out = sx.generate(model, ["Write a haiku about JAX."], max_new_tokens=64)
    out = sx.speculate(model, ["..."], "prompt-lookup", k=5)
    eagle = sx.train_drafter(model, sx.drafters.Eagle(), corpus=texts, steps=100)
    out = sx.speculate(model, ["..."], eagle, k=4)
"""
from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import jax
import numpy as np

from speculax.core.sampling import SamplingConfig
from speculax.decode.calibrate import calibrate
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.generate import generate as _generate
from speculax.decode.goodput import Goodput
from speculax.decode.metrics import DecodeOutput
from speculax.decode.pearl import draft_device, pearl_generate
from speculax.decode.speculative import speculative_generate
from speculax.drafters import registry
from speculax.drafters.base import Drafter
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.registry import LoadedDrafter
from speculax.models.load import LoadedModel
from speculax.models.load import load as _load
from speculax.models.sharding import MeshConfig
from speculax.train import corpus as corpus_lib
from speculax.train import data, experiment
from speculax.train.distill import DistillConfig
from speculax.train.heads import HeadsConfig
from speculax.train.optim import OptimConfig
from speculax.verifiers.judge import Judge
from speculax.verifiers.typical import Typical

Prompts = str | Sequence[str] | Sequence[Sequence[int]]


def load(name_or_path: str, *, dtype: str = "float32", compute_dtype: str = "float32",
         cache_dtype: str | None = None, attention_impl: str = "xla") -> LoadedModel:
  """A model with its tokenizer: a preset name ("smollm2-135m"), a .gguf file or a Hugging
  Face folder. `dtype`: the weights' ("bfloat16" halves what a decode step reads; speculative
  output stays identical to `generate`'s as in float32); `compute_dtype`, `cache_dtype` (None:
  compute_dtype): activations and KV cache, where bf16 rounds a verify forward and a one-token
  step differently, so speculative greedy output can part from `generate`'s on a near tie
  (README "bf16"). Logits and sampling are float32 always. `attention_impl`: "xla" or a Pallas
  kernel ("pallas" picks the platform's backend)."""
  return _load(name_or_path, dtype=dtype, compute_dtype=compute_dtype, cache_dtype=cache_dtype,
               attention_impl=attention_impl)


def generate(model: LoadedModel, prompts: Prompts, *, max_new_tokens: int = 128,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, chat: bool = True,
             stop_at_eos: bool = True, seed: int = 0, mesh: MeshConfig | None = None,
             warmup: bool = True, rows: int | None = None) -> DecodeOutput:
  """Autoregressive decoding of texts (wrapped in the chat template unless chat=False) or
  token-id lists; `out.texts` holds the decoded new tokens. Temperature 0 is greedy.
  warmup: compile first and report it apart (`out.compile_s`), so the timings measure decoding
  alone; with False one call compiles and decodes, and `summary()` says the timings include it.
  rows: continuous batching, the prompts decoded `rows` at a time, each finished row refilled
  with the next prompt; None: all prompts as one batch."""
  ids = _token_ids(model, prompts, chat)
  gen = GenerateConfig(**_settings(model, max_new_tokens, temperature, top_k, top_p,
                                   stop_at_eos))
  out = _generate(model.params, model.config, ids, gen, jax.random.key(seed), mesh, warmup, rows)
  return _with_texts(model, out)


def speculate(model: LoadedModel, prompts: Prompts,
              drafter: LoadedDrafter | Drafter | str, *, k: int = 5,
              max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
              top_p: float = 1.0, chat: bool = True, stop_at_eos: bool = True, seed: int = 0,
              mesh: MeshConfig | None = None, warmup: bool = True,
              goodput: bool | Sequence[float] = False,
              lossy: Typical | Judge | None = None, pearl: str | None = None,
              rows: int | None = None) -> DecodeOutput:
  """Speculative decoding: the same output law as `generate`, with tau and acceptance by
  position. `drafter`: a LoadedDrafter (drafters.make / drafters.load / train_drafter), a
  drafter without params, or a registry name built with its defaults ("prompt-lookup").
  warmup: as for `generate`. goodput: k is the most a step drafts, and each step drafts the
  0..k with the most expected tokens per second (SmartSpec), from step costs timed first on
  these prompts (True; the call starts from the acceptance the timing's drafts saw), or given:
  the k + 1 seconds of a step drafting 0..k that an earlier run measured (out.step_costs, for
  the same batch size and drafter), which skips the timing.
  out.k_steps counts the choices; chains only. lossy: LOSSY, a rule that keeps drafts the
  lossless rule may reject: Medusa's typical acceptance (speculax.verifiers.typical.Typical, at
  t > 0) or a judge head (speculax.verifiers.judge.Judge.load(path), greedy too): faster, not
  the target's law. pearl: "one-device" or "two-device" (PEARL: the draft model drafts while the
  target verifies, on the second device with "two-device"; a draft-model chain only).
  rows: as for `generate` (continuous batching; not with pearl)."""
  if isinstance(drafter, str):
    drafter = registry.make(drafter, model)
  elif isinstance(drafter, Drafter):
    drafter = LoadedDrafter(drafter)
  elif not isinstance(drafter, LoadedDrafter):
    raise ValueError(f"drafter must be a LoadedDrafter, a Drafter or a drafter name "
                     f"({', '.join(registry.KINDS)}), got {drafter!r}")
  ids = _token_ids(model, prompts, chat)
  costs = None if isinstance(goodput, bool) else goodput
  spec = SpecConfig(k=k, goodput=Goodput() if goodput is True or costs is not None else None,
                    lossy=lossy,
                    **_settings(model, max_new_tokens, temperature, top_k, top_p, stop_at_eos))
  if pearl is not None:
    if mesh is not None or rows is not None:
      raise ValueError(f"pearl places the draft model and the target on devices of their own "
                       f"and decodes one fixed batch; drop mesh={mesh}, rows={rows}")
    out = pearl_generate(model.params, model.config, ids, drafter.drafter, spec, drafter.params,
                         jax.random.key(seed), draft_device(pearl), warmup)
    return _with_texts(model, out)
  estimate = None
  if goodput is True:
    costs, estimate = calibrate(model.params, model.config, ids[:rows], drafter.drafter, spec,
                                drafter.params, key=jax.random.key(seed), mesh=mesh)
  out = speculative_generate(model.params, model.config, ids, drafter.drafter, spec,
                             drafter.params, jax.random.key(seed), mesh, warmup,
                             step_costs=costs, estimate=estimate, rows=rows)
  return _with_texts(model, out)


def train_drafter(model: LoadedModel, drafter: Drafter | str, corpus: Sequence[str] = (), *,
                  prompts: Sequence[str] = (), answer_tokens: int = 192,
                  temperatures: Sequence[float] = (0.0, 1.0), steps: int = 200,
                  seq_len: int = 256, rows: int = 512, heldout_rows: int = 32,
                  batch_size: int = 8, learning_rate: float = 1e-3, divergence: str = "fkl",
                  draft_layers: Sequence[int] = (0, 6, 12, 18, 24, 29),
                  out_dir: str = "runs", name: str | None = None) -> LoadedDrafter:
  """Trains a drafter for `model` on texts and/or the model's own answers to prompts, and
  returns it ready to speculate.

  drafter: a trained kind's instance (sx.drafters.Medusa(), Hydra(...), Eagle(...), on the
  target's cached features) or "draft-model" (a cut of the target's `draft_layers`, distilled).
  corpus: texts used as they stand; prompts: answered by the model first (self-distillation,
  chat template, prompt i at temperatures[i % len], at most answer_tokens new tokens; cached in
  the run folder). Every 10th text and every 10th prompt is held out for the acceptance
  estimate; the rest are packed into rows of `seq_len` tokens (at most `rows` for training,
  `heldout_rows` held out). Runs in <out_dir>/<name> (a rerun resumes).
  """
  texts = [corpus] if isinstance(corpus, str) else list(corpus)
  asked = [prompts] if isinstance(prompts, str) else list(prompts)
  if len(texts) + len(asked) < 2 or not all(isinstance(t, str) and t.strip()
                                            for t in texts + asked):
    raise ValueError(f"corpus and prompts must hold at least 2 non-empty strings between them "
                     f"(every 10th is held out), got {len(texts)} texts and {len(asked)} prompts")
  optim = OptimConfig(learning_rate=learning_rate, warmup_steps=min(20, steps // 10),
                      total_steps=steps)
  if drafter == "draft-model":
    distill = DistillConfig(divergence=divergence, batch_size=batch_size, optim=optim)
  elif isinstance(drafter, Drafter) and drafter.trained:
    distill = HeadsConfig(drafter, divergence=divergence, batch_size=batch_size, optim=optim)
  else:
    raise ValueError(f"drafter must be a trained kind ({', '.join(registry.TRAINED)}) or "
                     f"'draft-model', got {drafter!r}")
  kind = drafter if isinstance(drafter, str) else drafter.name
  name = name or f"{kind}-{model.name.replace('/', '_') or 'model'}"
  tok = model.tokenizer
  docs = [tok.encode(t) for t in texts]
  if asked:
    docs += corpus_lib.answers(pathlib.Path(out_dir) / name / "answers", model.params,
                               model.config, tok, asked, max_new_tokens=answer_tokens,
                               temperatures=temperatures, batch_size=batch_size)
  sources = [len(texts), len(asked)]  # every 10th of each source held out
  marks = [i % 10 == 0 for n in sources for i in range(n)]
  pack = lambda held, n: data.pack_ids([d for d, h in zip(docs, marks) if h == held], seq_len,
                                       sep=tok.eos_id, max_rows=n)
  train, held = pack(False, rows), pack(True, heldout_rows)
  exp = experiment.DistillExperiment(
      name=name,
      target=model.name or "model", draft_layers=tuple(draft_layers),
      data=experiment.DataConfig(seq_len=seq_len, rows=len(train), heldout_rows=len(held)),
      distill=distill, out_dir=out_dir, checkpoint_every=max(steps // 4, 1),
      log_every=max(steps // 20, 1), eval_every=max(steps // 4, 1))
  result = experiment.run(exp, model=model, rows=(train, held))
  if result["drafter"] is not None:
    return registry.load(result["drafter"], model)
  return LoadedDrafter(DraftModel(result["draft_config"]), result["state"].params)  # unfinished


def _token_ids(model: LoadedModel, prompts: Prompts, chat: bool) -> list[list[int]]:
  """Texts (one or a list) -> token ids, through the chat template unless chat=False; lists of
  token ids pass through (checked later against the vocabulary)."""
  prompts = [prompts] if isinstance(prompts, str) else list(prompts)
  tok = model.tokenizer
  return [tok.encode(tok.chat_prompt(p) if chat else p) if isinstance(p, str) else
          np.asarray(p).tolist() for p in prompts]


def _settings(model: LoadedModel, max_new_tokens, temperature, top_k, top_p,
              stop_at_eos) -> dict:
  eos = tuple(model.tokenizer.eos_ids) if stop_at_eos else ()
  return dict(max_new_tokens=max_new_tokens, eos_ids=eos,
              sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p))


def _with_texts(model: LoadedModel, out: DecodeOutput) -> DecodeOutput:
  return dataclasses.replace(out, texts=[model.tokenizer.decode(t) for t in out.tokens])
