"""A few small programs run on the device under test and on PYTHON (tiny's reference interpreter): same results.

Integer programs must match bit for bit; float programs within a few ulps (devices may fuse or reorder)."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import arange_np, data, quick_cases


def _mlp(dev):
  x = Tensor(data((4, 6), dtypes.float32, seed=1), device=dev)
  w1, w2 = Tensor(data((6, 8), dtypes.float32, seed=2), device=dev), Tensor(data((8, 3), dtypes.float32, seed=3), device=dev)
  return (x @ w1).relu().matmul(w2).log_softmax(1)


def _int_mix(dev):
  a = Tensor(arange_np((5, 6), np.int32) - 11, device=dev)
  return ((a * 7) // 3 + (a % 5)).max(1) - (a.flip(0)[:, ::2] ^ 3).sum(0).reshape(3, 1)


def _masked(dev):
  a = Tensor(arange_np((3, 4), np.float32), device=dev)
  return a.pad(((1, 1), (2, 0))).flip(1).permute(1, 0).reshape(3, 10)[:, 1::3].exp2().sum(0)


def _conv_pool(dev):
  x = Tensor(data((1, 2, 6, 6), dtypes.float32, seed=4), device=dev)
  w = Tensor(data((2, 2, 3, 3), dtypes.float32, seed=5), device=dev)
  return x.conv2d(w, padding=1).max_pool2d(2).sigmoid()


def _cast_mix(dev):
  a = Tensor(data((3, 5), dtypes.float16, seed=6), device=dev)
  return (a.cast(dtypes.float32) * 1000).cast(dtypes.int16).cast(dtypes.uint8).cast(dtypes.int32).sum(1)


PROGRAMS = {"mlp": _mlp, "int_mix": _int_mix, "masked": _masked, "conv_pool": _conv_pool, "cast_mix": _cast_mix}
# the dtypes each program uses beyond float32/int32, so a device that lacks one skips that program (--tiny-skip-dtypes)
NEEDS = {"cast_mix": (dtypes.float16, dtypes.int16, dtypes.uint8)}


@pytest.mark.parametrize("name", quick_cases(list(PROGRAMS), lambda n: n in ("int_mix", "masked")))
def test_same_as_python(name, tiny_device, tiny_require_dtype):
  tiny_require_dtype(*NEEDS.get(name, ()))
  got, ref = PROGRAMS[name](tiny_device), PROGRAMS[name]("PYTHON")
  assert got.dtype == ref.dtype and got.shape == ref.shape
  g, r = got.numpy(), ref.numpy()
  if dtypes.is_float(ref.dtype):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, err_msg=f"{name}: {tiny_device} differs from PYTHON")
  else:
    np.testing.assert_array_equal(g, r, err_msg=f"{name}: {tiny_device} differs from PYTHON")
