"""Every field of every public config refuses a wrong type, a value just past its range and an
absurd value with a ValueError that names the field and the value (core/fields.py).

BAD holds, for each field of each config, the values to try; a field missing from it fails
`test_every_field_has_bad_values`, so a new field cannot skip this test.
"""
import dataclasses
import math

import pytest

from speculax.core.sampling import SamplingConfig
from speculax.core.trees import DynamicTree, StaticTree
from speculax.decode.config import GenerateConfig, SpecConfig
from speculax.decode.goodput import Goodput
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.medusa import Medusa
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.token_recycling import TokenRecycling
from speculax.models.config import LlamaConfig, RopeScaling, Runtime, get_preset
from speculax.models.kernels.tree_attention import BlockSizes
from speculax.models.sharding import MeshConfig
from speculax.serve.online import OnlineConfig
from speculax.serve.recording import Recording
from speculax.train.distill import DistillConfig
from speculax.train.experiment import DataConfig, DistillExperiment
from speculax.train.heads import HeadsConfig
from speculax.verifiers.judge import Judge
from speculax.train.optim import OptimConfig
from speculax.verifiers.typical import Typical

TINY = get_preset("tiny")
NAN, INF = math.nan, math.inf

# One valid instance of each public config; each bad value replaces one field of it.
VALID = [SamplingConfig(), GenerateConfig(), SpecConfig(), Goodput(), Typical(), Judge((0.5, -0.5)),
         StaticTree(((0,), (1,))),
         DynamicTree(), PromptLookup(), LayerSkip((0, 1)), DraftModel(TINY), TokenRecycling(),
         Medusa(), Hydra(), Eagle(), Recording(PromptLookup()), OptimConfig(), DistillConfig(),
         HeadsConfig(Medusa()), DataConfig(), DistillExperiment("run"), OnlineConfig(),
         MeshConfig(), TINY, Runtime(), RopeScaling(), BlockSizes()]


def ints(lo):  # wrong types, the first value below the range, absurd
  return (2.5, True, "3", lo - 1, -10**12)


def numbers(boundary):
  return ("0.5", None, boundary, NAN, -INF)


BOOL = (1, "yes", None)
TREE = ("full:3,2", (0, 1), 3)  # a tree field takes a StaticTree / DynamicTree (or None)
# VocabTrim's size and the early-exit threshold, on every drafter with an output layer.
CHEAPER = {"vocab_trim": ints(0), "exit_threshold": ("0.5", 0.0, 1.0, NAN, -0.5)}
LAG = {"max_lag": ints(0) + (257,)}  # goodput's plain steps fed in one block (own forward)
LOW = {"draft_dtype": ("int4", "bf16", 8, "float32")}  # the copy an own forward's drafts read
DIVERGENCE_OPTIONS = ([("beta", 0.5)], (("beta", "high"),), "beta=0.5")

BAD = {
    SamplingConfig: {"temperature": numbers(-1e-9), "top_k": ints(0),
                     "top_p": ("0.9", 0.0, 1.0000001, NAN)},
    GenerateConfig: {"max_new_tokens": ints(1), "sampling": ("greedy", None, 0.7),
                     "eos_ids": ([2], (-1,), (2.0,)), "prompt_bucket": ints(1)},
    # and GenerateConfig's fields, inherited (goodput's step costs: test_goodput.py)
    SpecConfig: {"k": ints(1), "goodput": ("fast", 3, (1.0, 2.0)),
                 "lossy": ("typical", 0.09, (0.09, 0.3))},
    Judge: {"weights": ([0.5], (NAN,), ("0.5",), 0.5), "bias": ("0", None, NAN, INF),
            "threshold": numbers(0.0) + (1.0,)},
    Typical: {"posterior_threshold": numbers(0.0) + (1.0,),
              "posterior_alpha": numbers(0.0) + (1.0,)},
    Goodput: {"decay": numbers(0.0) + (1.0,), "prior": numbers(0.0),
              "prior_acceptance": numbers(0.0) + (1.5,), "probe_every": ints(1),
              "probe_backoff": ints(1) + (17,), "probe_every_max": ints(1) + (2 << 20,),
              "signal": BOOL,
              "margin": numbers(-1e-9), "answer_bins": ([16], (0,), (16, 8), (8, 8), (2.5,)),
              "lead": ("0.5", -1e-9, NAN, -INF, INF),  # None: every row alike
              "loop": (1, "", "switches", None), "start": (True, "", "calibrated", None)},
    StaticTree: {"choices": ("0,1", ((-1,),), (), ((0,), (0, 2.5)))},
    DynamicTree: {"width": ints(1), "depth": ints(1), "children": ints(1)},
    PromptLookup: {"max_ngram": ints(1), "min_ngram": ints(1) + (4,)},  # 4 > max_ngram 3
    LayerSkip: {"keep": ([0], (-1,), (0.5,)), "tree": TREE, **CHEAPER,
                "alternatives": ([(0,)], ((-1,),), ((0.5,),), (0, 1)), "verify_cost": numbers(0.0),
                **LOW},
    DraftModel: {"config": (None, "tiny", 3), "tree": TREE, **CHEAPER, **LAG, **LOW},
    TokenRecycling: {"tree": (None, DynamicTree(), "template")},
    Medusa: {"n_heads": ints(1), "tree": TREE + (DynamicTree(),), **CHEAPER},  # static trees only
    Hydra: {"n_heads": ints(1), "tree": TREE, "prefix_attention": BOOL, "mlp_layers": ints(1),
            **CHEAPER, **LAG},
    Eagle: {"feature_layers": ([-1], (), ("last",)), "ttt_steps": ints(1),
            "feature_weight": numbers(-0.1), "tree": TREE,
            "stop_threshold": ("0.5", 0.0, 1.0, NAN), "draft_layers": ints(1) + (9,),
            "shallow_layers": ints(0),
            **CHEAPER, **LAG, **LOW},
    Recording: {"drafter": (None, "prompt-lookup", 3), "top_k": ints(1),
                "all_positions": BOOL},
    OptimConfig: {"learning_rate": numbers(0.0), "warmup_steps": ints(0) + (200,),
                  "total_steps": ints(1), "weight_decay": numbers(-1e-9),
                  "grad_clip": numbers(-1e-9), "accum_steps": ints(1), "decay": BOOL},
    DistillConfig: {"divergence": (1, "", "kl"), "divergence_options": DIVERGENCE_OPTIONS,
                    "batch_size": ints(1), "optim": ("adamw", None, 3e-4),
                    "mixed_precision": BOOL, "on_policy_fraction": ("half", -0.01, 1.01, NAN),
                    "on_policy_prefix": ints(1), "seed": ints(0)},
    HeadsConfig: {"drafter": (None, PromptLookup(), "medusa"), "divergence": (1, "ce", "kl"),
                  "divergence_options": DIVERGENCE_OPTIONS,
                  "acceptance_weight": numbers(-1e-9), "depth_decay": numbers(0.0) + (1.01,),
                  "batch_size": ints(1), "optim": ("adamw", None, 3e-4), "seed": ints(0)},
    DataConfig: {"files": ints(1), "seq_len": ints(2), "rows": ints(1), "heldout_rows": ints(1),
                 "heldout_fraction": ("0.1", 0.0, 1.0, NAN), "top_k": ints(1),
                 "corpus": (1, "", "chat"), "prompts": ints(1), "prompts_file": (1, b"p", ["p"]),
                 "everyday_chat": ints(0) + (True, 1000),
                 "answer_tokens": ints(1), "temperatures": ((-0.5,), 1.0, ("1",)),
                 "generate_batch": ints(1), "code_fraction": ("0.2", -0.1, 1.5, NAN),
                 "learn": ("prompts", 1, None), "answers_dir": (1, b"p", ["p"]),
                 "heldout_teacher": ("topk", 1, None)},
    DistillExperiment: {"name": (None, "", 3), "target": (None, "", 3),
                        "draft_layers": ([0, 6], (-1,), (0.5,)),
                        "data": ("stdlib", None, {"rows": 8}),
                        "distill": ("fkl", None, OptimConfig()), "out_dir": (None, "", 3),
                        "teacher_dir": ("", " ", 3), "init_from": ("", " ", 3),
                        "checkpoint_every": ints(1),
                        "keep": ints(1), "log_every": ints(1), "eval_every": ints(1),
                        "mesh": ("2,2,2", (2, 2, 2), 4)},
    OnlineConfig: {"divergence": (1, "", "kl"), "divergence_options": DIVERGENCE_OPTIONS,
                   "update_every": ints(1), "min_positions": ints(1), "steps": ints(1),
                   "batch_size": ints(1), "learning_rate": numbers(0.0),
                   "buffer_size": ints(1), "buffer_policy": (1, "", "lru"),
                   "seq_len": ints(2), "top_k": ints(1), "all_positions": BOOL,
                   "heldout_every": ints(0) + (1,), "heldout_size": ints(1),
                   "rollback_tolerance": numbers(-1e-9), "seed": ints(0)},
    MeshConfig: {"data": ints(1), "fsdp": ints(1), "tensor": ints(1),
                 "rules": ("rules", [("batch", "data")], ((1, 2),))},
    LlamaConfig: {**{name: ints(1) for name in ("vocab_size", "d_model", "n_layers", "n_heads",
                                                "n_kv_heads", "head_dim", "d_ff", "max_seq_len")},
                  "rope_theta": numbers(0.0), "rope_scaling": ("llama3", 8.0, {}),
                  "norm_eps": numbers(0.0), "tie_embeddings": BOOL,
                  "qkv_bias": BOOL, "qk_norm": BOOL,
                  "runtime": ("bfloat16", None, {"dtype": "bfloat16"})},
    Runtime: {"dtype": (32, "", "float8"), "param_dtype": (32, "", "bf16"),
              "cache_dtype": (32, "", "bf16"),
              "attention_impl": (1, "", "flash"), "attention_block_kv": ints(1)},
    RopeScaling: {"factor": numbers(0.0), "low_freq_factor": numbers(0.0),
                  "high_freq_factor": numbers(0.0), "original_max_position": ints(1)},
    BlockSizes: {"block_kv": ints(1), "kv_splits": ints(0)},
}



def bad_values(cls) -> dict:
  """BAD's entries for cls and the configs it inherits fields from."""
  return {name: values for base in reversed(cls.__mro__) for name, values in
          BAD.get(base, {}).items()}


CASES = [(type(c), name, bad) for c in VALID for name, values in bad_values(type(c)).items()
         for bad in values]


def test_every_field_has_bad_values():
  assert {type(c) for c in VALID} == set(BAD)
  for config in VALID:
    fields = {f.name for f in dataclasses.fields(config)}
    assert set(bad_values(type(config))) == fields, type(config).__name__
    for name, values in bad_values(type(config)).items():
      assert len(values) >= 3, (type(config).__name__, name)


@pytest.mark.parametrize("cls, name, bad", CASES,
                         ids=[f"{c.__name__}.{n}={b!r}" for c, n, b in CASES])
def test_bad_value_names_the_field_and_the_value(cls, name, bad):
  valid = next(c for c in VALID if type(c) is cls)
  with pytest.raises(ValueError) as e:
    dataclasses.replace(valid, **{name: bad})
  message = str(e.value)
  assert f"{cls.__name__}.{name}" in message or f"{name}=" in message, message
  assert repr(bad) in message or str(bad) in message, message


def test_valid_configs_build_and_hash():
  for config in VALID:
    assert dataclasses.replace(config) == config
    hash(config)  # static jit arguments must hash
