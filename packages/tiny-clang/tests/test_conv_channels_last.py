"""Conv gradients with the channels innermost on the CPU devices (`Renderer.conv_channels_last`): when, the layout
they take, and results equal to torch's."""
from __future__ import annotations

from typing import Tuple

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor
from tiny_clang.conv_channels_last import conv_channels_last


def test_conv_channels_last_decisions() -> None:
  """float32 channels that fill whole vectors, rows that do not; nothing else."""
  assert conv_channels_last(64, 32, (20, 20), dtypes.float32)        # AVX-512: 2 vectors of channels, 20-pixel rows
  assert conv_channels_last(64, 64, (6, 6), dtypes.float32)
  assert not conv_channels_last(64, 32, (32, 32), dtypes.float32)    # the rows are whole vectors already
  assert not conv_channels_last(64, 24, (20, 20), dtypes.float32)    # 24 channels are 1.5 vectors
  assert not conv_channels_last(64, 1, (24, 24), dtypes.float32)     # MNIST's first conv
  assert conv_channels_last(32, 8, (10,), dtypes.float32)            # AVX2: 8 lanes
  assert not conv_channels_last(32, 8, (16,), dtypes.float32)
  assert not conv_channels_last(64, 32, (20, 20), dtypes.float16)
  assert not conv_channels_last(64, 32, (20, 20), dtypes.int32)
  assert not conv_channels_last(0, 32, (20, 20), dtypes.float32)


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _lanes() -> int:
  from tiny_clang.renderer import host_simd_bytes
  return max(1, host_simd_bytes() // 4)


def _device_ok(device: str) -> None:
  if device == "CLANG":
    from tiny_clang.compiler import find_cc
    if find_cc() is None:
      pytest.skip("no C compiler (clang/cc/gcc) on this machine")
  else:
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")


def _reduced_shape(t: Tensor) -> Tuple[int, ...]:
  """The shape of the buffer t is a view of, without its ones."""
  return tuple(s for s in t.lazydata.base.shape if s != 1)


def test_gradients_are_reduced_channels_last() -> None:
  """The weight gradient of a conv whose input channels fill vectors is a (cout, cin, *k) view of a (cout, *k, cin)
  reduce and the input gradient a (bs, cin, *in) view of a (bs, *in, cin) one, while the rows are not whole vectors;
  rows of whole vectors keep channels-first."""
  c = _lanes()
  x = Tensor(_rand(2, c, 7, 7, seed=1), device="CLANG", requires_grad=True)
  w = Tensor(_rand(4, c, 3, 3, seed=2), device="CLANG", requires_grad=True)
  x.conv2d(w).sum().backward()
  assert w.grad is not None and x.grad is not None
  assert _reduced_shape(w.grad) == (4, 3, 3, c)
  assert _reduced_shape(x.grad) == (2, 7, 7, c)
  x = Tensor(_rand(2, c, c + 2, c, seed=1), device="CLANG", requires_grad=True)   # 3x3 outputs of c-pixel rows, inputs of c
  w = Tensor(_rand(4, c, 3, 1, seed=2), device="CLANG", requires_grad=True)
  x.conv2d(w).sum().backward()
  assert w.grad is not None and x.grad is not None
  assert _reduced_shape(w.grad) == (4, c, 3)
  assert _reduced_shape(x.grad) == (2, c, c + 2, c)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("shape", [
  (4, 2, 3, 5, 12, 0),     # 5x5, (batch, channel multiples, cout, kernel, size, padding)
  (3, 1, 5, 3, 10, 1),     # 3x3 padded, cout not a multiple of the vector
  (2, 2, 3, 3, 7, 2),      # padding 2 of a 3x3: the input gradient's transposed conv pads by 0
  (24, 1, 2, 5, 24, 0),    # 24 images of 20x20 outputs: the weight gradient sums two groups of images
])
def test_channels_last_conv_matches_torch(device: str, shape: Tuple[int, ...]) -> None:
  """Forward and both gradients (through a relu) equal torch's on shapes that take the channels-last gradients."""
  torch = pytest.importorskip("torch", reason="torch is the reference for conv2d")
  _device_ok(device)
  bs, mult, cout, k, size, pad = shape
  cin = mult * _lanes()
  xn, wn, rn = _rand(bs, cin, size, size, seed=size), _rand(cout, cin, k, k, seed=k) * 0.2, _rand(cout, seed=3)
  x, w = Tensor(xn, device=device, requires_grad=True), Tensor(wn, device=device, requires_grad=True)
  out = x.conv2d(w, padding=pad)
  (out.relu() * Tensor(rn, device=device).reshape(1, cout, 1, 1)).sum().backward()
  tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  tout = torch.nn.functional.conv2d(tx, tw, padding=pad)
  (tout.relu() * torch.tensor(rn).reshape(1, cout, 1, 1)).sum().backward()
  assert x.grad is not None and w.grad is not None
  np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_channels_last_conv1d_matches_torch(device: str) -> None:
  """A 1-d conv takes the same path (one spatial axis)."""
  torch = pytest.importorskip("torch", reason="torch is the reference for conv1d")
  _device_ok(device)
  cin = _lanes()
  xn, wn = _rand(3, cin, 13, seed=5), _rand(6, cin, 4, seed=6)
  x, w = Tensor(xn, device=device, requires_grad=True), Tensor(wn, device=device, requires_grad=True)
  (x.conv2d(w, padding=1).square()).sum().backward()
  tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  torch.nn.functional.conv1d(tx, tw, padding=1).square().sum().backward()
  assert x.grad is not None and w.grad is not None
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
