"""The matmul register tile the CPU heuristic picks on a 16-register AVX2 host, and exact matmul results for odd sizes.

On AVX2 (16 ymm registers of 8 fp32 lanes) a matmul gets 4 rows x 2 vectors = 8 vector accumulators (half the register
file, leaving room for the 2 loaded vectors and the broadcast), column blocks outermost; AVX-512 (32 zmm registers) keeps
its 8 rows x 2 vectors. Measured on a 2-core AVX2 EPYC, one thread, kernel GFLOP/s (DEBUG=2): the 8-row tile (16
accumulators, spilled) halves the speed of a 1008² matmul (~33 vs ~70), so the 4-row tile stays. Opts are chosen for
renderers that declare their registers (independent of this host) and run on the PYTHON device; the odd sizes run end
to end on CLANG and LLVM with the host's own heuristic."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, Opt, OptOps
from tiny.helpers import Context
from tiny.engine.schedule import create_schedule
from tiny.runtime.ops_python import PythonRenderer
from tiny.tensor import Tensor
from tiny.testing.ops_helper import run_kernel_on_python
from tiny_clang.testing import Avx2LikeRenderer, Avx512LikeRenderer, vector_accumulators


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape, np.float32)


def _matmul_kernel(m: int, kk: int, n: int, renderer: PythonRenderer, seed: int = 0) -> Tuple[Kernel, List[np.ndarray], np.ndarray]:
  """The optimized kernel of a (m, kk) @ (kk, n) matmul for renderer, its input arrays in buffer order, and numpy's result."""
  an, bn = _rand(m, kk, seed=seed), _rand(kk, n, seed=seed + 1)
  a, b = Tensor(an, device="PYTHON").realize(), Tensor(bn, device="PYTHON").realize()
  si = create_schedule([(a @ b).lazydata])[-1]
  # (the inputs have different sizes whenever m != n, which every caller keeps)
  inputs = [an if si.bufs[i].nbytes == an.nbytes else bn for i in (1, 2)]
  return Kernel(si.ast, opts=renderer).hand_coded_optimizations(), inputs, an @ bn


def test_avx2_matmul_tile_is_4_rows_by_2_vectors() -> None:
  """A square power-of-two matmul on AVX2: 16 columns (2 vectors) x 4 rows, column blocks outside row blocks."""
  k, _, _ = _matmul_kernel(1024, 1024, 512, Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.SWAP, 0, 1)], k.applied_opts


def test_avx512_matmul_tile_is_unchanged() -> None:
  """AVX-512 keeps its own tile: 32 columns (2 vectors) x 8 rows, column blocks outermost."""
  k, _, _ = _matmul_kernel(1024, 1024, 512, Avx512LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UPCAST, 0, 8),
                            Opt(OptOps.SWAP, 0, 1)], k.applied_opts


@pytest.mark.parametrize("m, kk, n", [(32, 24, 64), (12, 37, 48), (8, 5, 16)])
def test_avx2_matmul_accumulators_fit_half_the_registers(m: int, kk: int, n: int) -> None:
  """The AVX2 tile holds 8 full-width vector accumulators (16 registers: half for accumulators) and is exact."""
  k, inputs, ref = _matmul_kernel(m, kk, n, Avx2LikeRenderer(), seed=m + kk)
  got = run_kernel_on_python(k, inputs, (m, n)).reshape(m, n)
  assert vector_accumulators(k) == [8] * 8, vector_accumulators(k)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, kk, n", [(9, 13, 37), (6, 7, 20), (3, 40, 24)])
def test_avx2_matmul_odd_sizes_on_python(m: int, kk: int, n: int) -> None:
  """Odd and short sizes with the AVX2 heuristic (partial vectors, no row tile) still give numpy's result."""
  k, inputs, ref = _matmul_kernel(m, kk, n, Avx2LikeRenderer(), seed=3 * m + n)
  np.testing.assert_allclose(run_kernel_on_python(k, inputs, (m, n)).reshape(m, n), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("m, kk, n", [(1000, 999, 37), (37, 999, 1000), (1008, 64, 1024)])
def test_host_matmul_odd_sizes_match_numpy(device: str, m: int, kk: int, n: int) -> None:
  """Matmuls of odd sizes compiled for this host (its own vector width and register count) match numpy."""
  if device == "LLVM":
    pytest.importorskip("llvmlite")
  an, bn = _rand(m, kk, seed=m), _rand(kk, n, seed=n)
  got = (Tensor(an, device=device) @ Tensor(bn, device=device)).numpy()
  np.testing.assert_allclose(got, an.astype(np.float64) @ bn.astype(np.float64), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("renderer, amt", [(Avx2LikeRenderer(), 8), (Avx512LikeRenderer(), 16)])
def test_softmax_exp_div_kernel_vector_width(renderer: PythonRenderer, amt: int) -> None:
  """Softmax's elementwise exp(x - max) / sum: upcast by one full vector along the contiguous row (8 lanes on AVX2, 16
  on AVX-512), not the 4 of core's reuse step."""
  xn = _rand(4, 32, seed=7)
  out = Tensor(xn, device="PYTHON").softmax(-1)
  with Context(ROW_FUSION=0):   # the third of softmax's kernels
    si = [s for s in create_schedule([out.lazydata]) if s.ast.op.name == "KERNEL"][-1]
  k = Kernel(si.ast, opts=renderer).hand_coded_optimizations()
  assert k.reduceop is None and k.applied_opts[0] == Opt(OptOps.UPCAST, 1, amt), k.applied_opts


@pytest.mark.parametrize("renderer, amt", [(Avx2LikeRenderer(), 8), (Avx512LikeRenderer(), 16)])
def test_softmax_row_kernel_vector_width(renderer: PythonRenderer, amt: int) -> None:
  """Softmax as one row kernel: its max, sum and store loops each walk the row one full vector at a time."""
  out = Tensor(_rand(4, 64, seed=7), device="PYTHON").softmax(-1)
  (si,) = [s for s in create_schedule([out.lazydata]) if s.ast.op.name == "KERNEL"]
  k = Kernel(si.ast, opts=renderer).hand_coded_optimizations()
  assert k.row_store and k.applied_opts == [Opt(OptOps.UNROLL, 0, amt)], k.applied_opts


@pytest.mark.parametrize("shape", [(64, 4096), (7, 40), (3, 13)])
def test_host_softmax_matches_numpy(shape: Tuple[int, int]) -> None:
  """Softmax compiled for this host (on AVX2 its exp-div kernel runs 8 lanes wide) matches numpy. (The PYTHON device
  cannot run exp's vector bitcasts, so the kernel with the AVX2 opts runs here, on CLANG.)"""
  xn = _rand(*shape, seed=shape[1]) * 4
  e = np.exp(xn.astype(np.float64) - xn.max(-1, keepdims=True))
  got = Tensor(xn, device="CLANG").softmax(-1).numpy()
  np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
