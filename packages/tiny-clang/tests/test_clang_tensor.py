"""Real Tensor programs on CLANG and LLVM against numpy: fused elementwise, reductions, matmul, conv, dtypes, threading,
and TinyJit replaying through CPUGraph."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.helpers import prod
from tiny.tensor import Tensor

from tiny_clang.settings import THREADS

DEVICES = ["CLANG", "LLVM"]


@pytest.fixture(params=DEVICES)
def dev(request: Any) -> str:
  from tiny.registry import Device
  if reason := Device.availability(request.param):
    pytest.skip(f"{request.param} is not available: {reason}")
  return request.param


rng = np.random.default_rng(0)


def test_elementwise_fused(dev: str) -> None:
  a, b = rng.standard_normal((33, 65)).astype(np.float32), rng.standard_normal((33, 65)).astype(np.float32)
  out = ((Tensor(a, device=dev) * 2 + Tensor(b, device=dev)).relu() - Tensor(b, device=dev).exp()).numpy()
  np.testing.assert_allclose(out, np.maximum(a * 2 + b, 0) - np.exp(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_sum_and_max(dev: str, axis: Any) -> None:
  a = rng.standard_normal((70, 130)).astype(np.float32)
  np.testing.assert_allclose(Tensor(a, device=dev).sum(axis).numpy(), a.sum(axis), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(Tensor(a, device=dev).max(axis).numpy(), a.max(axis))


def test_big_sum_is_split_and_threaded(dev: str) -> None:
  a = rng.standard_normal(1 << 20).astype(np.float32)
  with THREADS.override(2):
    two = Tensor(a, device=dev).sum().numpy()
  with THREADS.override(1):
    one = Tensor(a, device=dev).sum().numpy()
  np.testing.assert_allclose(two, a.astype(np.float64).sum(), rtol=1e-4)
  assert two == one, "splitting loops across cores must not change the arithmetic"


@pytest.mark.parametrize("shape", [(64, 64, 64), (17, 33, 9), (1, 100, 1)])
def test_matmul(dev: str, shape: Any) -> None:
  m, k, n = shape
  a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
  np.testing.assert_allclose((Tensor(a, device=dev) @ Tensor(b, device=dev)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


def test_conv2d(dev: str) -> None:
  torch = pytest.importorskip("torch")
  x, w = rng.standard_normal((2, 3, 12, 12)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
  np.testing.assert_allclose(Tensor(x, device=dev).conv2d(Tensor(w, device=dev), padding=1).numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt,npdt", [(dtypes.float16, np.float16), (dtypes.int32, np.int32), (dtypes.uint8, np.uint8), (dtypes.float64, np.float64)])
def test_dtypes(dev: str, dt: Any, npdt: Any) -> None:
  a = (rng.standard_normal((5, 40)) * 10).astype(npdt)
  t = Tensor(a, device=dev)
  np.testing.assert_allclose((t + t).numpy(), a + a, rtol=1e-3)
  np.testing.assert_allclose(t.cast(dtypes.float32).sum(1).numpy(), a.astype(np.float32).sum(1), rtol=1e-3, atol=1e-3)


def test_bfloat16_roundtrip(dev: str) -> None:
  a = rng.standard_normal(64).astype(np.float32)
  out = (Tensor(a, device=dev).cast(dtypes.bfloat16) * 2).cast(dtypes.float32).numpy()
  u = a.view(np.uint32).astype(np.uint64)
  bf = ((((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)).view(np.float32)
  np.testing.assert_array_equal(out, bf * 2)


def test_jit_replays_through_cpu_graph(dev: str) -> None:
  from tiny.engine.jit import TinyJit
  from tiny_clang.graph import CPUGraph
  w = Tensor(rng.standard_normal((32, 32)).astype(np.float32), device=dev).realize()

  @TinyJit
  def step(x: Tensor) -> Tensor:
    return ((x @ w).relu() + 1).sum(1).realize()

  for i in range(5):
    xs = rng.standard_normal((8, 32)).astype(np.float32)
    out = step(Tensor(xs, device=dev)).numpy()
    np.testing.assert_allclose(out, (np.maximum(xs @ w.numpy(), 0) + 1).sum(1), rtol=1e-4, atol=1e-4)
  graphs = [ji.prg for ji in step.jit_cache if isinstance(ji.prg, CPUGraph)]
  assert len(graphs) == 1 and len(graphs[0].jit_cache) >= 2, [type(ji.prg).__name__ for ji in step.jit_cache]


def _matmul_source(dev: str, a: Tensor, b: Tensor) -> str:
  from tiny.engine.realize import get_kernel
  from tiny.registry import Device
  si = (a @ b).schedule()[-1]
  return get_kernel(Device[dev].renderer, si.ast).to_program().src


def test_matmul_register_tile_is_vector_code(dev: str) -> None:
  """The CPU heuristic's matmul tile accumulates in vectors as wide as the host's SIMD registers (the C/LLVM source says so)."""
  from tiny_clang.renderer import host_simd_bytes
  lanes = host_simd_bytes() // 4
  a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 128)).astype(np.float32)
  src = _matmul_source(dev, Tensor(a, device=dev), Tensor(b, device=dev))  # (scheduling only: these inputs are never loaded)
  ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
  if dev == "CLANG":
    assert f"tiny_float{lanes} acc0 = " in src and "float acc0 = " not in src, src[:2000]
  else:
    assert f"alloca <{lanes} x float>" in src and f"fmul contract <{lanes} x float>" in src, src[:2000]
  np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["batched", "bias_relu", "odd", "transposed_b", "int32", "float64", "narrow"])
def test_matmul_variants(dev: str, case: str) -> None:
  """Shapes and epilogues around the vectorized matmul tile, against numpy."""
  if case == "batched":
    a, b = rng.standard_normal((3, 40, 48)).astype(np.float32), rng.standard_normal((3, 48, 64)).astype(np.float32)
    np.testing.assert_allclose((Tensor(a, device=dev) @ Tensor(b, device=dev)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
  elif case == "bias_relu":
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((32, 80), (80, 96), (96,)))
    out = (Tensor(a, device=dev) @ Tensor(b, device=dev) + Tensor(c, device=dev)).relu().numpy()
    np.testing.assert_allclose(out, np.maximum(a @ b + c, 0), rtol=1e-4, atol=1e-4)
  elif case == "odd":
    a, b = rng.standard_normal((33, 17)).astype(np.float32), rng.standard_normal((17, 45)).astype(np.float32)
    np.testing.assert_allclose((Tensor(a, device=dev) @ Tensor(b, device=dev)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
  elif case == "transposed_b":
    a, b = rng.standard_normal((48, 64)).astype(np.float32), rng.standard_normal((96, 64)).astype(np.float32)
    np.testing.assert_allclose((Tensor(a, device=dev) @ Tensor(b, device=dev).T).numpy(), a @ b.T, rtol=1e-4, atol=1e-4)
  elif case == "int32":
    a, b = rng.integers(-9, 9, (16, 24)).astype(np.int32), rng.integers(-9, 9, (24, 64)).astype(np.int32)
    np.testing.assert_equal((Tensor(a, device=dev) @ Tensor(b, device=dev)).numpy(), a @ b)
  elif case == "float64":
    a, b = rng.standard_normal((16, 24)), rng.standard_normal((24, 32))
    np.testing.assert_allclose((Tensor(a, device=dev) @ Tensor(b, device=dev)).numpy(), a @ b, rtol=1e-10)
  else:  # an output narrower than a vector: two rows share one vector store
    a, b = rng.standard_normal((64, 40)).astype(np.float32), rng.standard_normal((40, 8)).astype(np.float32)
    np.testing.assert_allclose((Tensor(a, device=dev) @ Tensor(b, device=dev)).numpy(), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("npdt", [np.float32, np.float64])
def test_row_max_with_nan_and_inf_matches_numpy(dev: str, npdt: Any) -> None:
  """Row maxes run as vector accumulators (a vector compare-and-blend on CLANG): NaN wins, infinities and all -inf rows
  come out as numpy says."""
  x = (rng.random((32, 512)) - 0.5).astype(npdt)
  x[3, 17], x[5, 100], x[7, :], x[9, 300], x[9, 301] = np.nan, np.inf, -np.inf, np.nan, np.inf
  np.testing.assert_array_equal(Tensor(x, device=dev).max(1).numpy(), x.max(1))
  np.testing.assert_array_equal(Tensor(x, device=dev).max(0).numpy(), x.max(0))


@pytest.mark.parametrize("shape", [(2, 8, 16, 16, 16, 1), (1, 4, 24, 40, 8, 2), (3, 3, 9, 9, 8, 1)])
def test_padded_conv_uses_gated_vector_loads(dev: str, shape: Any, monkeypatch: pytest.MonkeyPatch) -> None:
  """A padded conv's input rows are read as whole vectors where every lane is inside the image and lane by lane at the
  borders; results match torch, including at the borders."""
  torch = pytest.importorskip("torch")
  from tiny.engine.realize import get_kernel
  from tiny.registry import Device
  # read through the padded view even where the renderer would copy a wide image into a padded buffer first
  monkeypatch.setattr(type(Device[dev].renderer), "pads_conv_input", lambda self, spatial, dtype: False)
  b, c, h, w_, o, pad = shape
  x, w = rng.standard_normal((b, c, h, w_)).astype(np.float32), rng.standard_normal((o, c, 3, 3)).astype(np.float32)
  si = Tensor(x, device=dev).conv2d(Tensor(w, device=dev), padding=pad).schedule()[-1]
  src = get_kernel(Device[dev].renderer, si.ast).to_program().src
  if w_ % 8 == 0:
    assert ("?(*((tiny_float" in src) if dev == "CLANG" else ("insertelement" in src and "lda" in src), src[:3000]
  ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=pad).numpy()
  out = Tensor(x, device=dev).conv2d(Tensor(w, device=dev), padding=pad).numpy()
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hw,k", [(24, 5), (12, 3), (28, 5), (13, 3)])
def test_small_conv_rows_are_tiled_whole(dev: str, hw: int, k: int) -> None:
  """A conv whose output rows are short (20, 10, 24 pixels; 11 has no tile) gets the whole row as its vector strip
  (a full vector plus a partial one); results match torch."""
  torch = pytest.importorskip("torch")
  x, w = rng.standard_normal((4, 8, hw, hw)).astype(np.float32), rng.standard_normal((16, 8, k, k)).astype(np.float32)
  ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w)).numpy()
  np.testing.assert_allclose(Tensor(x, device=dev).conv2d(Tensor(w, device=dev)).numpy(), ref, rtol=1e-4, atol=1e-4)
  from tiny.codegen.kernel import Kernel
  from tiny.registry import Device
  from tiny_clang.renderer import host_simd_bytes
  si = Tensor(x, device=dev).conv2d(Tensor(w, device=dev)).schedule()[-1]
  kern = Kernel(si.ast, opts=Device[dev].renderer).hand_coded_optimizations()
  ow, up = hw - k + 1, prod(kern.full_shape[kern.shape_len - kern.upcasted:])
  if 8 < ow <= 2 * host_simd_bytes() // 4 and ow != 11:
    # the strip is the whole row, times a power of two of output channels
    assert up % ow == 0 and up // ow in (1, 2, 4, 8, 16), kern.applied_opts


def test_exp_kernel_is_vector_code_to_the_end(dev: str) -> None:
  """exp's clamps, polynomial and exponent-field scaling (bit casts, integer shifts) all stay in vector registers: no
  lane is bitcast or clamped on its own, and the values still match numpy."""
  from tiny.engine.realize import get_kernel
  from tiny.registry import Device
  from tiny_clang.renderer import host_simd_bytes
  lanes = host_simd_bytes() // 4
  x = rng.standard_normal(64 * lanes).astype(np.float32) * 30
  # scheduling only: schedule() hands the kernels to the caller, so these tensors are never computed
  src = get_kernel(Device[dev].renderer, Tensor(x, device=dev).exp().schedule()[-1].ast).to_program().src
  t = Tensor(x, device=dev)
  if dev == "CLANG":
    assert f"tiny_int{lanes} cast" in src and "float precast" not in src and "?(-104.0f)" not in src, src[:3000]
  else:
    assert f"bitcast <{lanes} x float>" in src and f"ashr <{lanes} x i32>" in src, src[:3000]
  with np.errstate(over="ignore"):   # float64 results past float32's range round to inf, as tiny's do
    want = np.exp(x.astype(np.float64)).astype(np.float32)
  np.testing.assert_allclose(t.exp().numpy(), want, rtol=3e-7)
