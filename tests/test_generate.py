import jax
import jax.numpy as jnp
import pytest

from speculax.core.sampling import SamplingConfig
from speculax.decode.config import GenerateConfig
from speculax.decode.generate import generate
from speculax.models import llama
from speculax.models.sharding import MeshConfig

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12, 13], [42] * 20, [7], [100, 3, 99, 4, 250]]


def _greedy_by_recompute(params, cfg, prompt, n):
  """Reference: no cache, the whole sequence re-run for every new token.

  The sequence is right-padded to one fixed length (causal attention never looks right), so the
  reference compiles once.
  """
  seq, width = list(prompt), len(prompt) + n
  for _ in range(n):
    padded = jnp.array([seq + [0] * (width - len(seq))])
    logits, _, _ = llama.forward_jit(params, cfg, padded, jnp.arange(width)[None])
    seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
  return seq[len(prompt):]


def test_greedy_matches_full_recompute(tiny):
  cfg, params = tiny
  out = generate(params, cfg, [PROMPTS[1]], GenerateConfig(max_new_tokens=10))
  assert out.tokens[0] == _greedy_by_recompute(params, cfg, PROMPTS[1], 10)
  assert out.forwards == 10  # one prefill + 9 single-token steps


def test_batch_of_mixed_lengths_equals_each_prompt_alone(tiny):
  cfg, params = tiny
  gen = GenerateConfig(max_new_tokens=12)
  batched = generate(params, cfg, PROMPTS, gen).tokens
  alone = [generate(params, cfg, [p], gen).tokens[0] for p in PROMPTS]
  assert batched == alone
  assert len({tuple(t) for t in batched}) > 1  # outputs depend on the prompt


def test_eos_stops_each_sequence_on_its_own(tiny):
  cfg, params = tiny
  free = generate(params, cfg, PROMPTS[:2], GenerateConfig(max_new_tokens=12)).tokens
  eos = free[0][3]  # a token the first prompt emits at step 4
  stopped = generate(params, cfg, PROMPTS[:2], GenerateConfig(max_new_tokens=12, eos_ids=(eos,)))
  for full, cut in zip(free, stopped.tokens):
    expect = full[:full.index(eos) + 1] if eos in full else full
    assert cut == expect
  assert len(stopped.tokens[0]) == free[0].index(eos) + 1 <= 4


def test_top_k_one_is_greedy_and_sampling_depends_on_key(tiny):
  cfg, params = tiny
  greedy = generate(params, cfg, PROMPTS[:2], GenerateConfig(max_new_tokens=8)).tokens
  topk1 = generate(params, cfg, PROMPTS[:2], GenerateConfig(
      max_new_tokens=8, sampling=SamplingConfig(temperature=1.0, top_k=1)), jax.random.key(3)).tokens
  assert topk1 == greedy
  hot = GenerateConfig(max_new_tokens=8, sampling=SamplingConfig(temperature=1.5))
  a = generate(params, cfg, PROMPTS[:2], hot, jax.random.key(1)).tokens
  b = generate(params, cfg, PROMPTS[:2], hot, jax.random.key(2)).tokens
  assert a != b and a == generate(params, cfg, PROMPTS[:2], hot, jax.random.key(1)).tokens


@pytest.mark.parametrize("mesh", [MeshConfig(data=4, tensor=2), MeshConfig(data=2, fsdp=2, tensor=2)])
def test_sharded_generate_equals_unsharded(tiny, mesh):
  cfg, params = tiny
  prompts = (PROMPTS * 2)[:8]
  gen = GenerateConfig(max_new_tokens=10)
  assert (generate(params, cfg, prompts, gen, mesh=mesh).tokens
          == generate(params, cfg, prompts, gen).tokens)


def test_sharded_params_really_are_split(tiny):
  from speculax.models import sharding
  from speculax.models.sharding import make_mesh
  cfg, params = tiny
  mesh_cfg = MeshConfig(data=4, tensor=2)
  placed = sharding.shard_params(params, cfg, make_mesh(mesh_cfg), mesh_cfg.rules)
  q = placed["layers"]["q"]  # [l, d, h, q] with heads over the 2-way tensor axis
  assert q.sharding.shard_shape(q.shape) == (2, 64, 2, 16)


@pytest.mark.parametrize("bad, match", [
    (dict(prompts=[[]]), "prompt 0 is empty"),
    (dict(prompts=[]), "non-empty list"),
    (dict(prompts=[[1, 2, 256]]), "token id 256 outside the vocabulary"),
    (dict(prompts=[[1, -1]]), "token id -1 outside"),
    (dict(prompts=["hello"]), "tokenize it first"),
    (dict(gen=GenerateConfig(max_new_tokens=250)), "exceeds the model's max_seq_len 256"),
    (dict(gen=GenerateConfig(sampling=SamplingConfig(temperature=1.0, top_k=300))), "top_k=300"),
])
def test_bad_generate_input(tiny, bad, match):
  cfg, params = tiny
  args = dict(prompts=[[1, 2, 3, 4, 5, 6, 7, 8]], gen=GenerateConfig(max_new_tokens=4)) | bad
  with pytest.raises((ValueError, TypeError), match=match):
    generate(params, cfg, args["prompts"], args["gen"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-0.5), "temperature must be a finite number >= 0, got -0.5"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), r"SamplingConfig.top_p must be a finite number > 0 and <= 1, got 0.0"),
    (dict(top_p=1.5), "got 1.5"),
    (dict(top_k=-1), "SamplingConfig.top_k must be an int >= 0, got -1"),
])
def test_bad_sampling_settings(kwargs, match):
  with pytest.raises(ValueError, match=match):
    SamplingConfig(**kwargs)


def test_bad_mesh():
  from speculax.models.sharding import make_mesh
  with pytest.raises(ValueError, match="needs 16 devices, only 8"):
    make_mesh(MeshConfig(data=8, tensor=2))


def test_indivisible_shard_names_the_leaf():
  from speculax.models import sharding
  from speculax.models.config import LlamaConfig
  from speculax.models.sharding import make_mesh
  cfg = LlamaConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=3, n_kv_heads=1, head_dim=8,
                    d_ff=64, max_seq_len=32)
  params = llama.init_params(cfg, jax.random.key(0))
  mesh_cfg = MeshConfig(tensor=2)
  with pytest.raises(ValueError, match=r"param leaf \['layers'\]\['k'\] of shape \(1, 32, 1, 8\): dim 1 is not divisible"):
    sharding.shard_params(params, cfg, make_mesh(mesh_cfg), mesh_cfg.rules)


def test_timings_say_whether_compiling_is_in_them(tiny):
  """With warmup the compile time is measured apart; without, summary() says the timings hold
  it (never a silent 0.0 s)."""
  cfg, params = tiny
  gen = GenerateConfig(max_new_tokens=3)
  cold = generate(params, cfg, [[9, 8, 7]], gen)
  warm = generate(params, cfg, [[9, 8, 7]], gen, warmup=True)
  assert cold.compile_s is None and "timings include compiling" in cold.summary()
  assert cold.metrics()["compile_s"] is None and warm.tokens == cold.tokens
  assert warm.compile_s > 0 and f"compile {warm.compile_s:.1f} s not counted" in warm.summary()
