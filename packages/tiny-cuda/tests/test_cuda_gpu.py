"""On a real GPU: the op suite, copies, timing, TinyJit with CUDA graphs, on CUDA and CUDA:PTX, against numpy.

Every test here skips (with the probe's reason) where the CUDA device cannot run; CI has no GPU.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tiny_cuda import plugin

REASON = plugin.probe()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA is not available here: {REASON}")

DEVICES = ["CUDA", "CUDA:PTX"]


@pytest.fixture(params=DEVICES)
def dev(request: Any) -> str:
  return request.param


def test_elementwise_reduce_matmul(dev: str) -> None:
  from tiny.tensor import Tensor
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((67, 45), np.float32), rng.standard_normal((45, 33), np.float32)
  ta, tb = Tensor(a, device=dev), Tensor(b, device=dev)
  np.testing.assert_allclose((ta * 2 + 1).exp().numpy(), np.exp(a * 2 + 1), rtol=1e-5)
  np.testing.assert_allclose(ta.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ta.max().numpy(), a.max())
  np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ta.softmax().numpy(), np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(ta.sin().numpy(), np.sin(a), atol=1e-5)


@pytest.mark.parametrize("dtype", ["half", "bfloat16"])
def test_low_precision_matmul_on_tensor_cores(dev: str, dtype: str) -> None:
  from tiny.dtype import dtypes
  from tiny.tensor import Tensor
  rng = np.random.default_rng(1)
  a, b = rng.random((128, 64), np.float32) - 0.5, rng.random((64, 96), np.float32) - 0.5
  dt = getattr(dtypes, dtype)
  ta, tb = Tensor(a, device=dev).cast(dt).realize(), Tensor(b, device=dev).cast(dt).realize()
  got = ta.matmul(tb, acc_dtype=dtypes.float32).cast(dtypes.float32).numpy()
  ra, rb = ta.cast(dtypes.float32).numpy(), tb.cast(dtypes.float32).numpy()
  np.testing.assert_allclose(got, ra @ rb, rtol=2e-2, atol=2e-2)


def test_int_bool_and_casts(dev: str) -> None:
  from tiny.dtype import dtypes
  from tiny.tensor import Tensor
  x = np.arange(-50, 50, dtype=np.int32)
  t = Tensor(x, device=dev)
  np.testing.assert_equal(((t * 7) // 3).numpy(), np.floor_divide(x * 7, 3))   # // floors, as in Python
  np.testing.assert_equal((t * 7).idiv(3).numpy(), np.trunc(x * 7 / 3).astype(np.int32))   # idiv truncates, as in C
  np.testing.assert_equal((t < 3).numpy(), x < 3)
  np.testing.assert_equal(t.cast(dtypes.int8).numpy(), x.astype(np.int8))
  np.testing.assert_equal(t.cast(dtypes.float16).numpy(), x.astype(np.float16))


def test_copies_and_transfer() -> None:
  from tiny.device import Buffer
  from tiny.dtype import dtypes
  data = np.arange(1000, dtype=np.float32)
  src = Buffer("CUDA", 1000, dtypes.float32).allocate()
  src.copyin(memoryview(data.tobytes()))
  dst = Buffer("CUDA", 1000, dtypes.float32).allocate()
  src.allocator.transfer(dst._buf, src._buf, 4000, src_dev=None, dest_dev=None)
  out = np.empty_like(data)
  dst.copyout(memoryview(out).cast("B"))
  np.testing.assert_equal(out, data)


def test_kernel_timing(dev: str) -> None:
  from tiny.engine.realize import lower_schedule
  from tiny.tensor import Tensor
  t = (Tensor.ones(1 << 20, device=dev).contiguous() * 3).sum()
  items = list(lower_schedule(t.schedule()))
  times = [ei.prg([b.ensure_allocated() for b in ei.bufs], {}, wait=True) for ei in items if hasattr(ei.prg, "p")]
  assert times and all(isinstance(x, float) and 0 < x < 1.0 for x in times)


def test_jit_uses_cuda_graph(dev: str) -> None:
  from tiny.engine.jit import TinyJit
  from tiny.tensor import Tensor
  from tiny_cuda.graph import CUDAGraph

  @TinyJit
  def step(x: Any, y: Any) -> Any:
    # two kernels (the contiguous splits them): the JIT graphs runs of two or more
    return ((x + y).relu().contiguous() * 2).sum(axis=0).realize()
  rng = np.random.default_rng(2)
  for _ in range(4):
    a, b = rng.standard_normal((16, 32), np.float32), rng.standard_normal((16, 32), np.float32)
    np.testing.assert_allclose(step(Tensor(a, device=dev), Tensor(b, device=dev)).numpy(), (np.maximum(a + b, 0) * 2).sum(0), rtol=1e-5)
  assert any(isinstance(ji.prg, CUDAGraph) for ji in step.jit_cache)


def test_symbolic_shapes(dev: str) -> None:
  from tiny.shape.symbolic import Variable
  from tiny.tensor import Tensor
  a = np.random.default_rng(3).standard_normal((40, 8), np.float32)
  t = Tensor(a, device=dev)
  v = Variable("n", 1, 40)
  for n in (3, 17, 40):
    got = (t.shrink(((0, v.bind(n)), None)) * 2).sum(axis=0).numpy()
    np.testing.assert_allclose(got, (a[:n] * 2).sum(0), rtol=1e-5, atol=1e-5)
