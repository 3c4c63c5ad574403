"""Bandwidth-bound kernels on a 16-register AVX2 host: the opts the CPU heuristic picks, and exact results for odd sizes.

- a vector times a row-major matrix (`x @ W` with one row of x, GPT-2's decode step) gets a strip of 8 vector
  accumulators (64 lanes), so each reduce step reads 4 cache lines of a weight row instead of 1;
- a long row max (softmax's first kernel) gets 4 rows of vector accumulators, 4 independent chains in the loop;
- AVX-512 (32 registers) gets a strip of 8 zmm vectors for the first and keeps its previous choice for the second.

Opts are chosen for renderers that declare their vector shape (independent of this host) and run on the PYTHON device
against numpy; odd sizes also run end to end on CLANG and LLVM with the host's own heuristic."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, Opt, OptOps
from tiny.engine.schedule import create_schedule
from tiny.runtime.ops_python import PythonRenderer
from tiny.tensor import Tensor
from tiny.testing.ops_helper import run_kernel_on_python
from tiny_clang.testing import Avx2LikeRenderer, Avx512LikeRenderer, vector_accumulators


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape, np.float32)


def _kernel(out: Tensor, arrays: List[np.ndarray], renderer: PythonRenderer) -> Tuple[Kernel, List[np.ndarray]]:
  """The heuristic's kernel for the (single) kernel of out on renderer, and its input arrays in buffer order (matched
  by byte size, which every caller keeps distinct)."""
  sched = create_schedule([out.lazydata])
  assert len(sched) == 1, [si.ast for si in sched]
  si = sched[0]
  by_size = {a.nbytes: a for a in arrays}
  inputs = [by_size[b.nbytes] for b in si.bufs[1:]]
  return Kernel(si.ast, opts=renderer).hand_coded_optimizations(), inputs


def _matvec(kk: int, n: int, renderer: PythonRenderer, seed: int = 0) -> Tuple[Kernel, List[np.ndarray], np.ndarray]:
  xn, wn = _rand(1, kk, seed=seed), _rand(kk, n, seed=seed + 1)
  x, w = Tensor(xn, device="PYTHON").realize(), Tensor(wn, device="PYTHON").realize()
  k, inputs = _kernel(x @ w, [xn, wn], renderer)
  return k, inputs, xn.astype(np.float64) @ wn.astype(np.float64)


def _row_max(rows: int, cols: int, renderer: PythonRenderer, seed: int = 0) -> Tuple[Kernel, List[np.ndarray], np.ndarray]:
  an = _rand(rows, cols, seed=seed)
  a = Tensor(an, device="PYTHON").realize()
  k, inputs = _kernel(a.max(-1), [an], renderer)
  return k, inputs, an.max(-1)


# *** x @ W, one row of x ***

def test_avx2_matvec_strip_is_8_vectors() -> None:
  """768 x 3072 (GPT-2's MLP up-projection in decode): 64 contiguous outputs, as 4 x 16 lanes, in 8 accumulators."""
  k, _, _ = _matvec(768, 3072, Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 4)], k.applied_opts
  k.linearize()
  assert vector_accumulators(k) == [8] * 8, vector_accumulators(k)


def test_avx2_matvec_strip_narrows_to_what_divides() -> None:
  """An output width that 64 does not divide but 32 does takes 4 vectors; one that 32 does not divide is left to the
  matmul strip (2 vectors)."""
  k, _, _ = _matvec(96, 96, Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 2)], k.applied_opts
  k, _, _ = _matvec(96, 48, Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 16)], k.applied_opts


def test_avx512_matvec_strip_is_8_vectors() -> None:
  """AVX-512: 128 contiguous outputs in 8 zmm accumulators (8 cache lines of each weight row); 192 takes 4 vectors."""
  k, _, _ = _matvec(768, 3072, Avx512LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 8)], k.applied_opts
  k.linearize()
  assert vector_accumulators(k) == [16] * 8, vector_accumulators(k)
  k, _, _ = _matvec(96, 192, Avx512LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 4)], k.applied_opts


@pytest.mark.parametrize("kk, n", [(17, 128), (999, 256), (5, 192)])
def test_avx512_matvec_odd_sizes_on_python(kk: int, n: int) -> None:
  """The AVX-512 strip gives numpy's result for odd reduce lengths."""
  k, inputs, ref = _matvec(kk, n, Avx512LikeRenderer(), seed=kk + n)
  got = run_kernel_on_python(k, inputs, ref.shape)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_avx2_matmul_with_rows_is_not_a_matvec() -> None:
  """Several rows of x reuse each loaded weight vector: the register tile of the matmul heuristic, not the strip."""
  an, bn = _rand(16, 64, seed=1), _rand(64, 128, seed=2)
  a, b = Tensor(an, device="PYTHON").realize(), Tensor(bn, device="PYTHON").realize()
  k, _ = _kernel(a @ b, [an, bn], Avx2LikeRenderer())
  assert Opt(OptOps.UPCAST, 0, 4) in k.applied_opts and Opt(OptOps.SWAP, 0, 1) in k.applied_opts, k.applied_opts


@pytest.mark.parametrize("kk, n", [(17, 64), (999, 128), (5, 192), (33, 96), (7, 37)])
def test_avx2_matvec_odd_sizes_on_python(kk: int, n: int) -> None:
  """Odd reduce lengths (and an output width no strip divides) give numpy's result with the AVX2 choice."""
  k, inputs, ref = _matvec(kk, n, Avx2LikeRenderer(), seed=kk + n)
  np.testing.assert_allclose(run_kernel_on_python(k, inputs, (1, n)).reshape(1, n), ref, rtol=1e-4, atol=1e-4)


def test_avx2_matvec_with_bias_and_relu_on_python() -> None:
  """A fused epilogue (bias, relu) after the strip reduce. (gelu's exp bit casts vectors, which the PYTHON device does
  not emulate: test_host_matvec_gelu_matches_numpy runs that one on the host.)"""
  xn, wn, bn = _rand(1, 40, seed=4), _rand(40, 128, seed=5), _rand(128, seed=6)
  x, w, b = (Tensor(v, device="PYTHON").realize() for v in (xn, wn, bn))
  k, inputs = _kernel((x @ w + b).relu(), [xn, wn, bn], Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 4)], k.applied_opts
  got = run_kernel_on_python(k, inputs, (1, 128)).reshape(1, 128)
  np.testing.assert_allclose(got, np.maximum(xn.astype(np.float64) @ wn.astype(np.float64) + bn, 0), rtol=1e-4, atol=1e-4)


def _gelu(x: np.ndarray) -> np.ndarray:
  """tanh-approximated gelu, as Tensor.gelu computes it."""
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


# *** row max ***

def test_avx2_row_max_takes_4_rows() -> None:
  """A long contiguous max: 4 rows upcast, each unrolled by one vector: 4 vector accumulators."""
  k, _, _ = _row_max(256, 512, Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 8)], k.applied_opts
  k.linearize()
  assert vector_accumulators(k) == [8] * 4, vector_accumulators(k)


def test_avx512_row_max_is_unchanged() -> None:
  k, _, _ = _row_max(256, 512, Avx512LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UNROLL, 0, 16)], k.applied_opts


def test_avx2_row_max_few_rows_stays_one_row() -> None:
  """With fewer than 64 rows the rows stay the parallel axis (no row upcast)."""
  k, _, _ = _row_max(17, 512, Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UNROLL, 0, 8)], k.applied_opts


@pytest.mark.parametrize("rows, cols", [(64, 64), (68, 1000), (17, 999), (128, 40)])
def test_avx2_row_max_odd_sizes_on_python(rows: int, cols: int) -> None:
  k, inputs, ref = _row_max(rows, cols, Avx2LikeRenderer(), seed=rows + cols)
  np.testing.assert_array_equal(run_kernel_on_python(k, inputs, (rows,)).reshape(rows), ref)


def test_avx2_row_max_keeps_nans_and_infs_on_python() -> None:
  """NaN in a row wins its max, -inf rows stay -inf: the 4 accumulators keep tiny's MAX semantics."""
  an = _rand(64, 64, seed=9)
  an[3, 17], an[40, 0], an[63, 63] = np.nan, np.nan, np.nan
  an[5, :] = -np.inf
  an[6, 9] = np.inf
  a = Tensor(an, device="PYTHON").realize()
  k, inputs = _kernel(a.max(-1), [an], Avx2LikeRenderer())
  assert Opt(OptOps.UPCAST, 0, 4) in k.applied_opts, k.applied_opts
  np.testing.assert_array_equal(run_kernel_on_python(k, inputs, (64,)).reshape(64), an.max(-1))


# *** end to end on this host ***

def _host_device(device: str) -> None:
  if device == "LLVM":
    pytest.importorskip("llvmlite")


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("kk, n", [(768, 3072), (999, 1000), (17, 64), (3072, 768)])
def test_host_matvec_matches_numpy(device: str, kk: int, n: int) -> None:
  _host_device(device)
  xn, wn = _rand(1, kk, seed=kk), _rand(kk, n, seed=n)
  got = (Tensor(xn, device=device) @ Tensor(wn, device=device)).numpy()
  np.testing.assert_allclose(got, xn.astype(np.float64) @ wn.astype(np.float64), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("rows, cols", [(1000, 999), (17, 1024), (256, 512), (68, 64)])
def test_host_reductions_match_numpy(device: str, rows: int, cols: int) -> None:
  """Row max, row sum, softmax and a full sum of odd shapes."""
  _host_device(device)
  an = _rand(rows, cols, seed=rows * cols)
  a = Tensor(an, device=device)
  np.testing.assert_array_equal(a.max(-1).numpy(), an.max(-1))
  np.testing.assert_allclose(a.sum(-1).numpy(), an.astype(np.float64).sum(-1), rtol=1e-4, atol=1e-3)
  e = np.exp(an.astype(np.float64) - an.max(-1, keepdims=True))
  np.testing.assert_allclose(a.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(a.sum().numpy(), an.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_host_matvec_gelu_matches_numpy(device: str) -> None:
  """GPT-2's decode MLP kernel: x @ W + b, then gelu, fused after the strip reduce."""
  _host_device(device)
  xn, wn, bn = _rand(1, 768, seed=11), _rand(768, 3072, seed=12) * 0.05, _rand(3072, seed=13)
  got = ((Tensor(xn, device=device) @ Tensor(wn, device=device)) + Tensor(bn, device=device)).gelu().numpy()
  np.testing.assert_allclose(got, _gelu(xn.astype(np.float64) @ wn.astype(np.float64) + bn), rtol=1e-3, atol=1e-4)
