"""Batched products whose right operand reads its columns strided (attention's q @ k^T) copy it first on the CPU devices
(`Tensor._strided_columns`): the schedule, the results against numpy and torch's gradients."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.engine.schedule import create_schedule
from tiny.tensor import Tensor


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _heads(x: Tensor, h: int) -> Tensor:
  b, t, d = x.shape
  return x.reshape(b, t, h, d // h).transpose(1, 2)


def test_scores_copy_keys_with_contiguous_columns() -> None:
  """q @ k^T for 12 heads of 128 positions: k^T is copied (one more kernel), and its product's kernel reads the copy."""
  q, k = (_heads(Tensor(_rand(1, 128, 768, seed=s), device="CLANG").realize(), 12) for s in (1, 2))
  sched = create_schedule([(q @ k.transpose(-2, -1)).lazydata])
  assert len(sched) == 2
  copy_out = sched[0].outputs[0]
  assert copy_out.size == 12 * 64 * 128 and any(b is copy_out for b in sched[1].inputs)


def test_no_copy_for_contiguous_columns_or_few_rows() -> None:
  """softmax @ v reads v's columns contiguously, and one query row (decoding) is too little work: neither copies."""
  p, v = Tensor(_rand(1, 12, 128, 128, seed=3), device="CLANG").realize(), _heads(Tensor(_rand(1, 128, 768, seed=4), device="CLANG").realize(), 12)
  assert len(create_schedule([(p @ v).lazydata])) == 1
  q1, k = Tensor(_rand(1, 12, 1, 64, seed=5), device="CLANG").realize(), _heads(Tensor(_rand(1, 128, 768, seed=6), device="CLANG").realize(), 12)
  assert len(create_schedule([(q1 @ k.transpose(-2, -1)).lazydata])) == 1
  # a right operand broadcast along its columns is not materialized
  q, row = Tensor(_rand(12, 128, 64, seed=7), device="CLANG").realize(), Tensor(_rand(12, 64, 1, seed=8), device="CLANG").realize()
  assert len(create_schedule([(q @ row.expand(12, 64, 128)).lazydata])) == 1
  np.testing.assert_allclose((q @ row.expand(12, 64, 128)).numpy(), np.broadcast_to(q.numpy() @ row.numpy(), (12, 128, 128)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("shape_a,shape_b", [
  ((2, 12, 128, 64), (2, 12, 128, 64)),   # batch x heads, b given transposed below
  ((3, 96, 80), (3, 128, 80)),            # one batch dim
  ((4, 1, 128, 96), (1, 5, 128, 96)),     # broadcast batch dims on both sides
])
def test_transposed_batched_products_match_numpy(device: str, shape_a: tuple, shape_b: tuple) -> None:
  if device == "LLVM":
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
  an, bn = _rand(*shape_a, seed=7), _rand(*shape_b, seed=8)
  got = (Tensor(an, device=device) @ Tensor(bn, device=device).transpose(-2, -1)).numpy()
  np.testing.assert_allclose(got, an @ np.swapaxes(bn, -1, -2), rtol=1e-4, atol=1e-4)


def test_attention_gradients_match_torch() -> None:
  """Gradients flow through the copy of k^T: q's, k's and v's grads of a causal attention equal torch's."""
  torch = pytest.importorskip("torch", reason="torch is the reference for gradients")
  qn, kn, vn = (_rand(1, 4, 64, 32, seed=s) for s in (9, 10, 11))
  q, k, v = (Tensor(x, device="CLANG", requires_grad=True) for x in (qn, kn, vn))
  (q.scaled_dot_product_attention(k, v, is_causal=True) * 0.5).sum().backward()
  tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (qn, kn, vn))
  (torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True) * 0.5).sum().backward()
  for t, r in ((q, tq), (k, tk), (v, tv)):
    assert t.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-4, atol=1e-4)
