"""Token-id prompts for the tiny test model: mixed lengths, some repeating themselves so that
prompt lookup and Token Recycling find matches."""
import numpy as np

_RNG = np.random.default_rng(0)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], list(_RNG.integers(0, 256, 17)), [9] * 5, [7],
           list(_RNG.integers(0, 256, 30)), [5, 6, 5, 6, 5, 6], list(_RNG.integers(0, 256, 3)),
           [100, 3, 99, 4, 250]]
NEW = 20  # new tokens per prompt


def cut_at_eos(tokens, eos):
  """A reference output cut after its first EOS, as a decode with eos_ids emits it."""
  ends = [i for i, t in enumerate(tokens) if t in eos]
  return tokens[:ends[0] + 1] if ends else tokens
