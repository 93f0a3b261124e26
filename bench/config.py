"""What a benchmark runs: methods (drafters with their options) x prompt suites x batch sizes x
temperatures, on one target. A method set is a Python file defining BENCH = BenchConfig(...)
(configs/bench/*.py), so a paper table is one command:

    speculax bench --config configs/bench/drafters.py --out runs/bench

    BENCH = BenchConfig(methods=(
        method("prompt lookup", "prompt-lookup", k=4, max_ngram=4),
        method("eagle k=2", "eagle", k=2, heads="results/drafters/eagle-ttt-smollm2"),
        method("eagle + SpecDec++", "eagle", k=6, heads=..., set={"stop_threshold": 0.5}),
    ), suites=("humaneval", "chat"), batch_sizes=(1, 8), temperatures=(0.0, 1.0))

Autoregressive decoding runs in every panel (suite x batch x temperature), first and last, and
each method's speedup divides by the faster of the two: the machine's speed drifts.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
from typing import Any

from speculax.bench import suites
from speculax.core import config_files
from speculax.core.fields import Checked, field
from speculax.decode import pearl
from speculax.decode.goodput import Goodput
from speculax.drafters import registry
from speculax.models.config import PRECISIONS, AttentionImpl


@dataclasses.dataclass(frozen=True)
class Method(Checked):
  """One row of every panel: a drafter kind with its options, or autoregressive decoding."""
  name: str
  drafter: str | None = None  # a kind of drafters.registry.KINDS; None: autoregressive decoding
  k: int = field(5, ge=1)  # draft tokens per verify step (the chain length; a tree's depth cap)
  # registry.make options (heads=FOLDER, skip=(...), tree="full:3,2,1", max_ngram=4, vocab_trim=N,
  # exit_threshold=P, draft=MODEL, ...); layer skip with no skip set searches one for k on the
  # first 4 HumanEval prompts (which no suite here uses).
  options: dict[str, Any] = dataclasses.field(default_factory=dict)
  # Drafter fields replaced after it is built: what no option sets (stop_threshold=P for EAGLE's
  # SpecDec++ head, vocab_trim=0 for a drafter trained with VocabTrim on the full vocabulary).
  fields: dict[str, Any] = dataclasses.field(default_factory=dict)
  # Each batch starts from the drafter state the previous one ended with (Token Recycling's
  # adjacency matrix carried from prompt to prompt, as its paper serves).
  hot: bool = False
  # Goodput-driven draft length (decode/goodput.py): k is the most a step drafts; each step
  # picks 0..k from step costs calibrated at the panel's batch on its first prompts. True: the
  # default policy; or a Goodput of other settings (Goodput(signal=False): one pooled estimate).
  goodput: bool | Goodput = False
  # PEARL (decode/pearl.py), a draft model drafting while the target verifies: "one-device" or
  # "two-device" (None: draft then verify).
  pearl: str | None = None

  @property
  def policy(self) -> Goodput | None:
    """The goodput policy this method decodes with (None: a fixed k)."""
    return Goodput() if self.goodput is True else self.goodput or None

  def __post_init__(self):
    super().__post_init__()
    if self.drafter is None:
      if self.options or self.fields or self.goodput or self.pearl:
        raise ValueError(f"method {self.name!r}: autoregressive decoding (drafter None) takes no "
                         f"options, got {sorted({**self.options, **self.fields})}"
                         + (" and goodput=True" if self.goodput else "")
                         + (f" and pearl={self.pearl!r}" if self.pearl else ""))
    else:
      registry.get(self.drafter)  # an unknown kind fails here, naming the kinds
    if self.pearl is not None and (self.pearl not in pearl.FORMS or self.drafter != "draft-model"
                                   or self.goodput):
      raise ValueError(f"method {self.name!r}: pearl must be one of {pearl.FORMS} with the "
                       f"draft-model drafter and no goodput, got pearl={self.pearl!r}, drafter "
                       f"{self.drafter!r}, goodput={self.goodput}")


def method(name: str, drafter: str | None = None, *, k: int = 5, set: dict | None = None,
           hot: bool = False, goodput: bool | Goodput = False, pearl: str | None = None,
           **options) -> Method:
  """Method(name, drafter, k, options, fields=set, hot, goodput, pearl): options as keywords."""
  return Method(name, drafter, k, options, dict(set or {}), hot, goodput, pearl)


AUTOREGRESSIVE = Method("autoregressive")


@dataclasses.dataclass(frozen=True)
class BenchConfig(Checked):
  methods: tuple[Method, ...]  # autoregressive is added to every panel, first and last
  target: str = "smollm2-135m"  # a model preset, .gguf file or Hugging Face folder
  precision: str = "float32"  # a name of models.config.PRECISIONS
  attention: AttentionImpl = "xla"
  suites: tuple[str, ...] = ("humaneval",)  # bench/suites.py names, or prompt files
  prompts: int = field(3, ge=1)  # per suite, decoded one at a time at batch 1
  # batch b > 1 decodes b prompts at once: prompts // b batches of them (at least one)
  batch_sizes: tuple[int, ...] = field((1,), ge=1)
  # At batch b > 1: decode the suite's `prompts` b rows at a time, a finished row refilled with
  # the next prompt (continuous batching, every method AR included); False: fixed batches.
  continuous: bool = False
  temperatures: tuple[float, ...] = field((0.0,), ge=0)  # 0: greedy (greedy equality counted)
  new_tokens: int = field(48, ge=1)  # exactly this many per prompt (EOS off: speeds compare)
  # Split a step's time into the verify forward (timed outside the loop for that many tokens at
  # the panel's batch) and the rest (drafting, the loop's own work), in one-token forwards.
  step_split: bool = True
  # Rounds of every panel's methods, round-robin; a row's tokens/s is the median of its rounds
  # (each round's in tokens_per_s_rounds). Deterministic figures (tau, acceptance, tokens) come
  # from the first: the same keys give the same tokens every round.
  repeats: int = field(1, ge=1)

  def __post_init__(self):
    super().__post_init__()
    if self.precision not in PRECISIONS:
      raise ValueError(f"BenchConfig.precision must be one of {', '.join(PRECISIONS)}, got "
                       f"{self.precision!r}")
    names = [m.name for m in self.methods]
    if AUTOREGRESSIVE.name in names or len(set(names)) != len(names):
      raise ValueError(f"BenchConfig.methods must have distinct names, none "
                       f"{AUTOREGRESSIVE.name!r} (it runs in every panel): got {names}")
    if not self.suites or not self.batch_sizes or not self.temperatures:
      raise ValueError("BenchConfig needs at least one suite, batch size and temperature")
    for name in self.suites:
      suites.check_name(name)
    if self.continuous:
      if pearls := [m.name for m in self.methods if m.pearl]:
        raise ValueError(f"BenchConfig.continuous refills rows of draft-then-verify loops; PEARL "
                         f"decodes fixed batches: drop {pearls}")
      if too_few := [b for b in self.batch_sizes if 1 < b >= self.prompts]:
        raise ValueError(f"BenchConfig.continuous at batch {too_few[0]} needs more prompts than "
                         f"rows to refill them; prompts={self.prompts}")

  def only(self, names) -> BenchConfig:
    """This config with the methods named (in its own order; none named: all of them)."""
    known = [m.name for m in self.methods]
    if unknown := [n for n in names if n not in known]:
      raise ValueError(f"no methods named {unknown} in this bench config; its methods: {known}")
    return dataclasses.replace(self, methods=tuple(m for m in self.methods
                                                   if not names or m.name in names))


def sampling_name(temperature: float) -> str:
  return "greedy" if temperature == 0 else f"t={temperature:g}"


def configs_folder() -> pathlib.Path:
  """The method sets shipped with speculax (speculax/configs/bench)."""
  return pathlib.Path(importlib.util.find_spec("speculax.configs").origin).parent / "bench"


def shipped() -> list[str]:
  return config_files.shipped(configs_folder(), "BENCH")


def load_config(path: str) -> BenchConfig:
  """The BenchConfig a file (or a shipped set, by name) defines as BENCH."""
  return config_files.load(path, "BENCH", BenchConfig, configs_folder(), "bench config")
