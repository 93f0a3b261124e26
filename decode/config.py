"""Settings of a decode run: autoregressive (GenerateConfig) and speculative (SpecConfig)."""
from __future__ import annotations

import dataclasses

import jax

from speculax.core.fields import Checked, field
from speculax.core.sampling import SamplingConfig
from speculax.decode.goodput import Goodput
from speculax.verifiers.judge import Judge
from speculax.verifiers.typical import Typical


@dataclasses.dataclass(frozen=True)
class GenerateConfig(Checked):
  max_new_tokens: int = field(128, ge=1)
  sampling: SamplingConfig = SamplingConfig()
  eos_ids: tuple[int, ...] = field((), ge=0)
  # Prompts are right-padded to a multiple of this: one compile per bucket.
  prompt_bucket: int = field(64, ge=1)

  def check_vocab(self, vocab_size: int) -> None:
    """Host-side, once the model is known: top_k and the EOS ids must fit its vocabulary."""
    self.sampling.check_vocab(vocab_size)
    bad = [i for i in self.eos_ids if i >= vocab_size]
    if bad:
      raise ValueError(f"eos_ids {self.eos_ids} name id {bad[0]}, outside the vocabulary "
                       f"[0, {vocab_size})")


@dataclasses.dataclass(frozen=True)
class SpecConfig(GenerateConfig):
  """GenerateConfig plus the number of draft tokens per verify step."""
  k: int = field(5, ge=1)
  # Goodput-driven draft length (decode/goodput.py): each step drafts the k' in 0..k with the
  # most expected tokens per second, by this policy and the step costs the run is given (data,
  # not config: decode/calibrate.py measures them); None: always k.
  goodput: Goodput | None = None
  # LOSSY, off by default, chains only: a rule that keeps drafts the lossless rule may reject:
  # Medusa's typical acceptance (verifiers/typical.py; greedy output is unchanged) or a judge
  # head on the target's features (verifiers/judge.py; greedy output changes where it fires).
  lossy: Typical | Judge | None = None


# Pytrees whose one data field is the sampling config (its temperature and top-p value: leaves,
# core/sampling.py) and the rest their structure: the decode loops take a config as an argument
# and compile once for every sampled temperature, where a static one compiled for each.
for _cls in (GenerateConfig, SpecConfig):
  jax.tree_util.register_dataclass(
      _cls, data_fields=["sampling"],
      meta_fields=[f.name for f in dataclasses.fields(_cls) if f.name != "sampling"])
