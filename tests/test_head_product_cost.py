"""research/head_product_cost.py times the gradient it means to: the scoring product's."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculax.research import head_product_cost


def test_the_feature_gradient_is_the_cross_entropys():
  """(softmax(h w^T) - onehot(target)) w / n, written out, for float32 rows; bf16 rows near it."""
  kh, kw = jax.random.split(jax.random.key(1))
  h = jax.random.normal(kh, (6, 4), jnp.float32)
  w = jax.random.normal(kw, (10, 4), jnp.float32)
  target = jnp.array([0, 3, 9, 2, 2, 7])
  probs = jax.nn.softmax(np.asarray(h) @ np.asarray(w).T, axis=-1)
  expected = (np.asarray(probs) - np.eye(10)[np.asarray(target)]) @ np.asarray(w) / 6
  np.testing.assert_allclose(head_product_cost.feature_grad(h, w, target), expected, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(head_product_cost.feature_grad(h, w.astype(jnp.bfloat16), target),
                             expected, atol=0.05)


def test_every_dtype_and_row_count_is_timed_and_written(tmp_path, capsys):
  result = head_product_cost.main(["--positions", "16", "--d-model", "8", "--rows", "32", "64",
                                   "--repeats", "2", "--out", str(tmp_path)])
  runs = json.loads((tmp_path / "head_product_cost.json").read_text())["runs"]
  assert runs == result["runs"]
  assert [(r["dtype"], r["rows"]) for r in runs] == [
      ("float32", 32), ("float32", 64), ("bfloat16", 32), ("bfloat16", 64)]
  for r in runs:
    assert r["seconds"] > 0
    assert r["gflop_per_s"] == pytest.approx(4 * 16 * 8 * r["rows"] / r["seconds"] / 1e9)
  assert "GFLOP/s" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--rows", "--positions", "--d-model", "--repeats"])
def test_a_size_below_one_is_refused_by_name(flag, capsys):
  with pytest.raises(SystemExit):
    head_product_cost.main([flag, "0"])
  assert f"{flag} must be at least 1; got" in capsys.readouterr().err
