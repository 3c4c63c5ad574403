"""The CPU heuristic's tile for a large image's 3x3 conv on AVX-512 (the bench's b32 64->64 on 56² images), and its result.

A 56-pixel output row is 3 full zmm vectors and a half one. Read from an unpadded buffer (the CPU renderers copy such
inputs into a zero-padded one first, see tiny_clang.conv_padding) the row is tiled whole times 4 output channels (16
accumulators); read through a padded view it keeps the 8-lane strip. The AVX2 tiles are pinned in test_conv_tiles.py."""
from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, OptOps
from tiny.engine.schedule import create_schedule
from tiny.tensor import Tensor
from tiny.testing.ops_helper import run_kernel_on_python
from tiny_clang.testing import Avx2LikeRenderer, Avx512LikeRenderer


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape, np.float32)


def _conv_ref(xn: np.ndarray, wn: np.ndarray) -> np.ndarray:
  kh, kw = wn.shape[2:]
  oh, ow = xn.shape[2] - kh + 1, xn.shape[3] - kw + 1
  return sum(np.einsum("bchw,oc->bohw", xn[:, :, ky:ky + oh, kx:kx + ow], wn[:, :, ky, kx]) for ky in range(kh) for kx in range(kw))


def _tiled(si: Any, renderer: Any) -> Tuple[Kernel, List[Tuple[int, int]]]:
  """The kernel with the heuristic's opts for renderer, and its upcasts as (size of the axis when applied, amount)."""
  probe = Kernel(si.ast, opts=renderer)
  probe.hand_coded_optimizations()
  kern, ups = Kernel(si.ast, opts=renderer), []
  for o in probe.applied_opts:
    if o.op is OptOps.UPCAST:
      ups.append((kern.full_shape[o.axis], o.amt))
    kern.apply_opt(o)
  return kern, ups


def _conv_schedule(xn: np.ndarray, wn: np.ndarray, padding: int) -> Any:
  x, w = Tensor(xn, device="PYTHON").realize(), Tensor(wn, device="PYTHON").realize()
  return create_schedule([x.conv2d(w, padding=padding).lazydata])[-1]


@pytest.mark.parametrize("seed", [1, 2])
def test_unpadded_56_pixel_row_is_tiled_whole(seed: int) -> None:
  """An unpadded 58-wide input (56 output pixels): the row whole (14 x 4 lanes, vectorized as 16+16+16+8) x 4 channels,
  one output row, and the result equals numpy's."""
  xn, wn = _rand(1, 8, 4, 58, seed=seed), _rand(8, 8, 3, 3, seed=seed + 10)
  si = _conv_schedule(xn, wn, 0)
  kern, ups = _tiled(si, Avx512LikeRenderer())
  assert ups == [(56, 14), (4, 4), (8, 4)], kern.applied_opts
  ref = _conv_ref(xn, wn)
  got = run_kernel_on_python(kern, [next(a for a in (xn, wn) if a.nbytes == si.bufs[i].nbytes) for i in (1, 2)], ref.shape)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_padded_view_and_avx2_keep_their_tiles() -> None:
  """Through a padded view (no copy on the PYTHON device) AVX-512 keeps the 8-pixel strip x 16 channels; AVX2's tile
  for the unpadded input is unchanged (8 pixels x 2 rows x 4 channels)."""
  xn, wn = _rand(1, 16, 4, 56, seed=3), _rand(16, 16, 3, 3, seed=4)
  _, ups = _tiled(_conv_schedule(xn, wn, 1), Avx512LikeRenderer())
  assert ups[0] == (56, 8), ups
  xn = _rand(1, 8, 4, 58, seed=5)
  _, ups = _tiled(_conv_schedule(xn, _rand(8, 8, 3, 3, seed=6), 0), Avx2LikeRenderer())
  assert ups == [(56, 8), (2, 2), (8, 4)], ups


def _relu_weight_gradient(device: str, xn: np.ndarray, wn: np.ndarray, rn: np.ndarray) -> Tuple[Any, Any]:
  x = Tensor(xn, device=device, requires_grad=True).realize()
  w = Tensor(wn, device=device, requires_grad=True).realize()
  (x.conv2d(w).relu() * Tensor(rn, device=device).realize()).sum().backward()
  assert w.grad is not None
  return x, w


def test_relu_weight_gradient_gets_the_window_tile() -> None:
  """The weight gradient of relu(conv(x, w)) reads the output gradient twice (itself and the relu's mask): AVX-512 gives
  it the plain product's tile, all 5 kernel rows x 4 output channels over the 20-pixel row unrolled whole; AVX2 keeps
  the generic tile."""
  xn, wn, rn = _rand(4, 8, 24, 24, seed=7), _rand(8, 8, 5, 5, seed=8), _rand(4, 8, 20, 20, seed=9)
  _, w = _relu_weight_gradient("PYTHON", xn, wn, rn)
  assert w.grad is not None
  si = [s for s in create_schedule([w.grad.lazydata]) if s.ast.op.name == "KERNEL"][-1]
  kern, ups = _tiled(si, Avx512LikeRenderer())
  assert ups == [(5, 5), (8, 4)], kern.applied_opts
  assert kern.applied_opts[-1].op is OptOps.UNROLL and kern.applied_opts[-1].amt == 20, kern.applied_opts
  _, ups2 = _tiled(si, Avx2LikeRenderer())
  assert ups2 != ups


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_relu_conv_gradients_match_torch(device: str) -> None:
  torch = pytest.importorskip("torch")
  if device == "LLVM":
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
  xn, wn, rn = _rand(4, 8, 24, 24, seed=10), _rand(8, 8, 5, 5, seed=11), _rand(4, 8, 20, 20, seed=12)
  x, w = _relu_weight_gradient(device, xn, wn, rn)
  tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  (torch.nn.functional.conv2d(tx, tw).relu() * torch.tensor(rn)).sum().backward()
  assert x.grad is not None and w.grad is not None
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("size, kernel, want", [
  (24, 5, [(20, 10), (2, 2), (20, 4), (8, 4)]),   # 20 pixels x 4 rows = 5 full vectors, x 4 channels
  (8, 3, [(6, 6), (6, 3), (16, 8)]),               # 6 pixels x 3 rows = 16 + 2 lanes, x 8 channels
  (10, 3, [(8, 8), (8, 2), (16, 16)]),             # 8 pixels x 2 rows = 1 vector, x 16 channels
])
def test_short_rows_are_stacked_into_full_vectors(size: int, kernel: int, want: List[Tuple[int, int]]) -> None:
  """A small unpadded image's short output rows (MNIST's convs) are stacked a few rows high, so one channel's rows
  fill whole zmm vectors instead of a partial one each; the result equals numpy's. AVX2 keeps its tile."""
  oc = want[-1][0]
  xn, wn = _rand(2, 4, size, size, seed=size), _rand(oc, 4, kernel, kernel, seed=size + 1)
  si = _conv_schedule(xn, wn, 0)
  kern, ups = _tiled(si, Avx512LikeRenderer())
  assert ups == want, kern.applied_opts
  ref = _conv_ref(xn, wn)
  got = run_kernel_on_python(kern, [next(a for a in (xn, wn) if a.nbytes == si.bufs[i].nbytes) for i in (1, 2)], ref.shape)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
  _, ups2 = _tiled(si, Avx2LikeRenderer())
  assert ups2 != ups


def test_ten_pixel_rows_are_not_stacked() -> None:
  """Two 10-pixel rows would leave a 4-lane piece (16 + 4): the row stays alone (8 + 2 lanes) x 8 channels."""
  xn, wn = _rand(1, 4, 12, 12, seed=21), _rand(16, 4, 3, 3, seed=22)
  _, ups = _tiled(_conv_schedule(xn, wn, 0), Avx512LikeRenderer())
  assert ups == [(10, 10), (16, 8)], ups
