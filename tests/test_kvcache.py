import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.models import kvcache, llama
from speculax.models.kvcache import KVCache


@pytest.mark.parametrize("t", [1, 3])
def test_write_sets_only_the_block_and_drops_slots_past_the_buffer(t):
  buf = jax.random.normal(jax.random.key(0), (3, 2, 8, 4))  # [b, k, s, q]
  new = jax.random.normal(jax.random.key(1), (3, t, 2, 4))  # [b, t, k, q]
  lengths = jnp.array([0, 3, 8 - t + 1])  # row 2's last slot falls past the buffer
  got = np.asarray(kvcache.write(buf, new, lengths))
  want = np.array(buf)
  for b, n in enumerate(lengths.tolist()):
    for i in range(t):
      if n + i < 8:
        want[b, :, n + i] = new[b, i]
  np.testing.assert_array_equal(got, want)


def test_one_token_decode_step_updates_the_cache_in_place(tiny):
  """A jitted batch-1 decode step copies no K/V buffer: XLA:CPU copied every layer's buffers
  four times per step around a one-index scatter (kvcache.write's docstring)."""
  cfg, params = tiny
  params = llama.unstack_layers(params)
  cache = KVCache.init(cfg, 1, 40, per_layer=True).with_lengths(jnp.array([5]))

  def steps(params, cache):
    def body(i, c):
      tok = jnp.zeros((1, 1), jnp.int32) + i
      return llama.forward(params, cfg, tok, c.lengths[:, None], c)[2]
    return jax.lax.fori_loop(0, 3, body, cache)

  hlo = jax.jit(steps, donate_argnums=1).lower(params, cache).compile().as_text()
  shape = ",".join(map(str, cache.k[0].shape))
  copies = re.findall(rf"= f32\[{shape}\]\S* copy\(", hlo)
  assert not copies, f"{len(copies)} copies of a [{shape}] cache buffer in the decode step"
