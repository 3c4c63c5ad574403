"""Large padded conv inputs on the CPU devices are copied into a zero-padded buffer first: when, and exact results."""
from __future__ import annotations

from typing import Tuple, Union

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.engine.schedule import create_schedule
from tiny.tensor import Tensor
from tiny_clang.conv_padding import pads_conv_input


def test_pads_conv_input_decisions() -> None:
  """Float images whose padded rows hold 4 vectors or more (3 with AVX-512); not small images, ints, or a CPU without
  vectors."""
  assert pads_conv_input(32, (58, 58), dtypes.float32)
  assert pads_conv_input(32, (3, 32), dtypes.float32)
  assert not pads_conv_input(32, (30, 30), dtypes.float32)      # MNIST-sized: keeps the view
  assert pads_conv_input(64, (58, 58), dtypes.float32)          # AVX-512: 3 vectors are 48 floats
  assert not pads_conv_input(64, (30, 47), dtypes.float32)
  assert not pads_conv_input(64, (32, 32), dtypes.float32)      # MNIST's 28² with padding 2 keeps the view
  assert pads_conv_input(32, (18,), dtypes.float64)
  assert not pads_conv_input(32, (58, 58), dtypes.int32)
  assert not pads_conv_input(0, (58, 58), dtypes.float32)


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("hw, padding", [((40, 40), 1), ((9, 36), (2, 1)), ((33, 31), 2), ((20, 20), 1)])
def test_padded_conv_matches_torch(device: str, hw: Tuple[int, int], padding: Union[int, Tuple[int, int]]) -> None:
  """Forward and both gradients equal torch's, copied (wide rows) or read through the view (narrow ones)."""
  torch = pytest.importorskip("torch", reason="torch is the reference for conv2d")
  xn, wn = _rand(2, 3, *hw, seed=hw[0]), _rand(4, 3, 3, 3, seed=hw[1])
  x, w = Tensor(xn, device=device, requires_grad=True), Tensor(wn, device=device, requires_grad=True)
  out = x.conv2d(w, padding=padding)
  (out.relu() * 0.5).sum().backward()
  tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  tout = torch.nn.functional.conv2d(tx, tw, padding=padding)
  (tout.relu() * 0.5).sum().backward()
  np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-4, atol=1e-4)
  assert x.grad is not None and w.grad is not None
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_wide_padded_input_is_copied_once() -> None:
  """On CLANG a wide padded input costs one extra copy kernel; a narrow one is read through the view (one kernel)."""
  from tiny_clang.renderer import host_simd_bytes
  # "wide" is 4 host vectors per padded row (32 floats) with AVX2, 3 (48 floats) with AVX-512
  row = (3 if host_simd_bytes() >= 64 else 4) * host_simd_bytes() // 4
  w = Tensor.rand(4, 3, 3, 3, device="CLANG").realize()
  wide = Tensor.rand(1, 3, 8, row, device="CLANG").realize()
  narrow = Tensor.rand(1, 3, 8, row - 4, device="CLANG").realize()
  assert len(create_schedule([wide.conv2d(w, padding=1).lazydata])) == 2
  assert len(create_schedule([narrow.conv2d(w, padding=1).lazydata])) == 1
