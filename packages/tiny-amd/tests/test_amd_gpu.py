"""On a real AMD GPU: the op suite's kinds of kernels, copies, timing and tensor cores, against numpy.

Every test here skips (with the probe's reason) where the AMD device cannot run; CI has no AMD GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

from tiny_amd import plugin

REASON = plugin.probe()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no AMD GPU: {REASON}")


def test_elementwise_reduce_matmul() -> None:
  from tiny import Tensor
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((67, 45), np.float32), rng.standard_normal((45, 33), np.float32)
  ta, tb = Tensor(a, device="AMD"), Tensor(b, device="AMD")
  np.testing.assert_allclose((ta * 2 + 1).exp().numpy(), np.exp(a * 2 + 1), rtol=1e-5)
  np.testing.assert_allclose(ta.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ta.max().numpy(), a.max())
  np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(ta.sin().numpy(), np.sin(a), atol=1e-5)


def test_half_matmul() -> None:
  from tiny import Tensor, dtypes
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((64, 64)).astype(np.float16), rng.standard_normal((64, 64)).astype(np.float16)
  got = Tensor(a, device="AMD").matmul(Tensor(b, device="AMD"), acc_dtype=dtypes.float32).numpy()
  np.testing.assert_allclose(got, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_copies_views_and_timing() -> None:
  from tiny import Device, Tensor
  x = np.arange(1000, dtype=np.float32)
  t = Tensor(x, device="AMD")
  np.testing.assert_equal(t[100:200].numpy(), x[100:200])
  np.testing.assert_equal(t.to("PYTHON").numpy(), x)
  Device["AMD"].synchronize()
