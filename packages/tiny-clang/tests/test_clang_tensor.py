"""Real Tensor programs on CLANG and LLVM against numpy: fused elementwise, reductions, matmul, conv, dtypes, threading,
and TinyJit replaying through CPUGraph."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.helpers import Context
from tiny.tensor import Tensor

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
  with Context(THREADS=2):
    two = Tensor(a, device=dev).sum().numpy()
  with Context(THREADS=1):
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
