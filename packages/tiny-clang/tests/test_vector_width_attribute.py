"""The CLANG renderer keeps its own 512-bit vector code whole on AVX-512 hosts, and leaves plain loops to the compiler."""
from __future__ import annotations

import numpy as np

from tiny.codegen.kernel import Kernel
from tiny.engine.schedule import create_schedule
from tiny.tensor import Tensor
from tiny_clang.renderer import ClangRenderer

ATTR = "min_vector_width(512)"


def _renderer(simd_bytes: int) -> ClangRenderer:
  r = ClangRenderer()
  r.simd_bytes, r.simd_registers, r._x86 = simd_bytes, 32 if simd_bytes >= 64 else 16, True
  return r


def _src(out: Tensor, renderer: ClangRenderer) -> str:
  si = create_schedule([out.lazydata])[-1]
  return Kernel(si.ast, opts=renderer).hand_coded_optimizations().to_program().src


def test_wide_vector_kernel_gets_the_attribute() -> None:
  """16-lane float code on a 64-byte renderer is marked; the same kernel for 32-byte vectors is not."""
  a, b = Tensor.rand(64, 256, device="CLANG").realize(), Tensor.rand(64, 256, device="CLANG").realize()
  wide = _src(a * b + 1.0, _renderer(64))
  assert "tiny_float16 " in wide and f"__attribute__(({ATTR})) void " in wide, wide[:2000]
  assert ATTR not in _src(a * b + 1.0, _renderer(32))


def test_plain_sum_loop_is_left_alone() -> None:
  """A long contiguous SUM is a scalar loop the compiler vectorizes itself: no attribute (512-bit loops streamed slower)."""
  src = _src(Tensor.rand(1 << 16, device="CLANG").realize().sum(), _renderer(64))
  assert ATTR not in src, src[:2000]


def test_marked_kernels_compute_numpys_result() -> None:
  """Whatever the host, the CLANG product and elementwise kernels (marked where the host has AVX-512) match numpy."""
  rng = np.random.default_rng(0)
  an, bn = rng.standard_normal((96, 160)).astype(np.float32), rng.standard_normal((160, 256)).astype(np.float32)
  a, b = Tensor(an, device="CLANG"), Tensor(bn, device="CLANG")
  np.testing.assert_allclose((a @ b).numpy(), an @ bn, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose((a * 2.0 + 1.0).numpy(), an * 2.0 + 1.0, rtol=1e-6)
