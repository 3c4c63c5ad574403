"""Packed-panel matmul on the CPU devices: when `Tensor.dot` repacks b, the tile the packed kernel gets, exact results.

The decisions are checked on renderers that declare their vector shape (independent of this host) and the kernels run
on the PYTHON device against numpy; the end-to-end products and gradients run on CLANG and LLVM against numpy/torch."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, Opt, OptOps
from tiny.dtype import dtypes
from tiny.engine.schedule import create_schedule
from tiny.tensor import Tensor
from tiny.testing.ops_helper import run_kernel_on_python
from tiny_clang.matmul_panels import panel_width
from tiny_clang.testing import Avx2LikeRenderer, Avx512LikeRenderer


def _rand(*shape: int, seed: int, dtype: type = np.float32) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_panel_width_decisions() -> None:
  """Two vectors of columns for big float products; nothing for small, skinny, odd-width or integer ones."""
  assert panel_width(32, 1024, 1024, 1024, dtypes.float32) == 16
  assert panel_width(64, 1024, 1024, 1024, dtypes.float32) == 32
  assert panel_width(32, 1024, 1024, 1024, dtypes.float64) == 8
  assert panel_width(32, 1, 768, 2304, dtypes.float32) == 0        # a matrix-vector product streams b once anyway
  assert panel_width(32, 64, 64, 64, dtypes.float32) == 0          # too little work to pay for the copy
  assert panel_width(32, 1024, 1024, 1000, dtypes.float32) == 0    # n not a multiple of the panel
  assert panel_width(32, 1024, 1024, 1024, dtypes.int32) == 0
  assert panel_width(0, 1024, 1024, 1024, dtypes.float32) == 0     # no vector unit declared


def _packed_kernel(m: int, kk: int, n: int, width: int, renderer: object) -> Tuple[Kernel, List[np.ndarray], np.ndarray]:
  """The optimized product kernel of a (m, kk) @ (kk, n) matmul whose b was packed into width-column panels."""
  an, bn = _rand(m, kk, seed=m), _rand(kk, n, seed=n)
  a, b = Tensor(an, device="PYTHON").realize(), Tensor(bn, device="PYTHON").realize()
  panels = b.reshape(kk, n // width, width).permute(1, 0, 2).contiguous().realize()
  out = (a.reshape(m, 1, 1, kk) * panels.permute(0, 2, 1)).sum(-1).reshape(m, n)
  si = create_schedule([out.lazydata])[-1]
  pn = bn.reshape(kk, n // width, width).transpose(1, 0, 2).copy()
  inputs = [an if si.bufs[i].nbytes == an.nbytes else pn for i in (1, 2)]
  return Kernel(si.ast, opts=renderer).hand_coded_optimizations(), inputs, an @ bn


def test_avx2_panel_tile() -> None:
  """AVX2: 16 columns x 4 rows (8 vector accumulators), rows blocked so 512 KB of a's rows stay beside a panel."""
  k, inputs, ref = _packed_kernel(256, 512, 64, 16, Avx2LikeRenderer())
  # 512 KB / (512 floats * 4 bytes) = 256 rows per block, capped by m: 256 // 4 = 64 row tiles in one block
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 0, 4)], k.applied_opts
  k, inputs, ref = _packed_kernel(32, 16384, 32, 16, Avx2LikeRenderer())
  # 512 KB / 64 KB per row = 8 rows = 2 row tiles per block
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.BLOCK, 0, 2)], k.applied_opts


def test_avx512_panel_tile() -> None:
  """AVX-512: 32 columns (two steps of 16) x 8 rows."""
  k, _, _ = _packed_kernel(64, 128, 64, 32, Avx512LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.UPCAST, 0, 8)], k.applied_opts


@pytest.mark.parametrize("m, kk, n, width", [(64, 40, 32, 16), (40, 36, 48, 16), (13, 20, 32, 16), (24, 16, 64, 32)])
def test_panel_kernel_exact_on_python(m: int, kk: int, n: int, width: int, monkeypatch: pytest.MonkeyPatch) -> None:
  """The tiled packed kernel (blocked or not, odd row counts) computes numpy's product."""
  # a block of a's rows this small makes the small products (which PYTHON runs quickly) blocked too
  monkeypatch.setattr("tiny_clang.matmul_panels.BLOCK_BYTES", 8 * kk * 4)
  renderer = Avx2LikeRenderer() if width == 16 else Avx512LikeRenderer()
  k, inputs, ref = _packed_kernel(m, kk, n, width, renderer)
  assert (Opt(OptOps.BLOCK, 0, 2) in k.applied_opts) == (m % 8 == 0 and m > 8 and width == 16), k.applied_opts
  got = run_kernel_on_python(k, inputs, (m, n // width, width)).reshape(m, n)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


def test_block_opt_checks_its_axis() -> None:
  """BLOCK splits a global axis by a proper divisor, and refuses anything else with a KernelOptError."""
  from tiny.codegen.kernel import KernelOptError
  k, _, _ = _packed_kernel(64, 32, 32, 16, Avx2LikeRenderer())
  for bad in (Opt(OptOps.BLOCK, 0, 5), Opt(OptOps.BLOCK, 0, 16), Opt(OptOps.BLOCK, 2, 2)):
    with pytest.raises(KernelOptError):
      k.copy().apply_opt(bad)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("shape_a, shape_b, dtype", [
  ((256, 128), (128, 256), np.float32),       # packed, one block
  ((3, 48, 256), (256, 96), np.float32),      # batch dims fold into the rows
  ((37, 300), (300, 512), np.float32),        # odd rows and reduce
  ((128, 200), (200, 128), np.float64),
  ((256, 128), (128, 250), np.float32),       # n not a multiple of the panel: not packed
])
def test_packed_matmul_matches_numpy(device: str, shape_a: Tuple[int, ...], shape_b: Tuple[int, int], dtype: type) -> None:
  """End to end on the CPU devices: a @ b equals numpy's, packed or not."""
  an, bn = _rand(*shape_a, seed=1, dtype=dtype), _rand(*shape_b, seed=2, dtype=dtype)
  got = (Tensor(an, device=device) @ Tensor(bn, device=device)).numpy()
  tol = 1e-4 if dtype is np.float32 else 1e-10
  np.testing.assert_allclose(got, an @ bn, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_packed_matmul_of_views(device: str) -> None:
  """b given as a transposed or sliced view is packed from what the view shows."""
  an, wn = _rand(64, 256, seed=3), _rand(160, 300, seed=4)
  a, w = Tensor(an, device=device), Tensor(wn, device=device)
  np.testing.assert_allclose((a @ w[:128, 10:266].T).numpy(), an @ wn[:128, 10:266].T, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose((a @ w.T[:256, :128]).numpy(), an @ wn.T[:256, :128], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_packed_matmul_gradients_match_torch(device: str) -> None:
  """Gradients flow through the packing copy: both operands' grads equal torch's."""
  torch = pytest.importorskip("torch", reason="torch is the reference for gradients")
  an, bn = _rand(64, 256, seed=5), _rand(256, 128, seed=6)
  a, b = Tensor(an, device=device, requires_grad=True), Tensor(bn, device=device, requires_grad=True)
  ((a @ b).relu() * 0.5).sum().backward()
  ta, tb = torch.tensor(an, requires_grad=True), torch.tensor(bn, requires_grad=True)
  ((ta @ tb).relu() * 0.5).sum().backward()
  assert a.grad is not None and b.grad is not None
  np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_cpu_matmul_is_packed() -> None:
  """On CLANG a big float product runs as a panel copy plus the blocked product kernel, and a small one is not packed."""
  a, b = Tensor.rand(256, 256, device="CLANG").realize(), Tensor.rand(256, 256, device="CLANG").realize()
  sched = create_schedule([(a @ b).lazydata])
  assert len(sched) == 2, [si.ast for si in sched]
  small = create_schedule([(a[:8, :8] @ b[:8, :16]).lazydata])
  assert len(small) == 1
