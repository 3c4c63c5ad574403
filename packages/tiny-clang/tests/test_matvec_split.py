"""Vector-matrix products split along the reduce on the CPU devices (tiny_clang.matvec_split): when `Tensor.dot` splits,
the two kernels it then schedules, and results against numpy on CLANG and LLVM."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.helpers import GlobalCounters
from tiny.tensor import Tensor
from tiny_clang.matvec_split import split_block


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_split_block_decisions() -> None:
  """Blocks of 32 rows (16, 8 where 32 leaves too few blocks) for one row times a big float32 matrix; nothing else."""
  assert split_block(64, 1, 768, 3072, dtypes.float32) == 32      # GPT-2's mlp up-projection
  assert split_block(64, 1, 3072, 768, dtypes.float32) == 32      # and down-projection
  assert split_block(32, 1, 768, 768, dtypes.float32) == 32       # 2.25 MiB
  assert split_block(64, 1, 128, 4096, dtypes.float32) == 16      # 4 blocks of 32 are too few to share out
  assert split_block(64, 1, 512, 512, dtypes.float32) == 0        # 1 MiB: stays in L2
  assert split_block(64, 2, 768, 3072, dtypes.float32) == 0       # two rows of x reuse each strip of W
  assert split_block(64, 1, 768, 3000, dtypes.float32) == 0       # columns not a whole number of strips
  assert split_block(64, 1, 770, 3072, dtypes.float32) == 0       # no block size divides k
  assert split_block(64, 1, 768, 3072, dtypes.float16) == 0
  assert split_block(0, 1, 768, 3072, dtypes.float32) == 0        # no vector unit declared


def _kernels(out: Tensor) -> int:
  """Realize out (its inputs already realized) and count the kernels that took."""
  before = GlobalCounters.kernel_count
  out.realize()
  return GlobalCounters.kernel_count - before


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_matvec_split_matches_numpy(device: str) -> None:
  """x @ W + b (and gelu of it) with one row of x and a 768 x 1024 W (3 MiB): a partial-sum kernel and a kernel that adds
  the partials (bias and gelu fused into it), equal to numpy's product."""
  xn, wn, bn = _rand(1, 1, 768, seed=1), _rand(768, 1024, seed=2), _rand(1024, seed=3)
  x, w, b = (Tensor(a, device=device).realize() for a in (xn, wn, bn))
  out = x @ w + b
  assert _kernels(out) == 2
  np.testing.assert_allclose(out.numpy(), xn @ wn + bn, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose((x @ w).gelu().numpy(), Tensor(xn @ wn, device=device).gelu().numpy(), rtol=1e-4, atol=1e-4)
  # a 1-D vector on the left too
  assert _kernels(x.reshape(768) @ w) == 2
  np.testing.assert_allclose((x.reshape(768) @ w).numpy(), xn.reshape(768) @ wn, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_matvec_not_split(device: str) -> None:
  """Two rows of x, W read through its transpose (x @ W.T walks W's rows already) and small W keep one kernel."""
  wn = _rand(768, 1024, seed=4)
  w = Tensor(wn, device=device).realize()
  x2 = Tensor(_rand(2, 768, seed=5), device=device).realize()
  assert _kernels(x2 @ w) == 1
  xt = Tensor(_rand(1, 1024, seed=6), device=device).realize()
  out = xt @ w.T
  assert _kernels(out) == 1
  np.testing.assert_allclose(out.numpy(), xt.numpy() @ wn.T, rtol=1e-4, atol=1e-4)
  small = Tensor(_rand(256, 512, seed=7), device=device).realize()
  assert _kernels(Tensor(_rand(1, 256, seed=8), device=device).realize() @ small) == 1


def test_matvec_split_gradients() -> None:
  """Gradients through the split product are numpy's: x.grad = g @ W.T, W.grad = x.T @ g."""
  xn, wn = _rand(1, 768, seed=11), _rand(768, 1024, seed=12)
  x = Tensor(xn, device="CLANG", requires_grad=True)
  w = Tensor(wn, device="CLANG", requires_grad=True)
  (x @ w).sum().backward()
  assert x.grad is not None and w.grad is not None
  np.testing.assert_allclose(x.grad.numpy(), np.ones((1, 1024), np.float32) @ wn.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.grad.numpy(), xn.T @ np.ones((1, 1024), np.float32), rtol=1e-5, atol=1e-5)


def test_matvec_split_follows_weight_updates() -> None:
  """The split reads W afresh each call: an in-place update of W between two products shows in the second."""
  wn = _rand(768, 1024, seed=9)
  x = Tensor(_rand(1, 768, seed=10), device="CLANG").realize()
  w = Tensor(wn, device="CLANG").realize()
  first = (x @ w).numpy()
  w.assign(w * 2).realize()
  np.testing.assert_allclose((x @ w).numpy(), 2 * first, rtol=1e-5, atol=1e-5)
