"""Copies: numpy <-> device for every dtype, views, large buffers, and transfers between the device and PYTHON."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import ALL, QUICK, arange_np, check, data, np_dtype, quick_cases


@pytest.mark.parametrize("dt", quick_cases(ALL, lambda d: d in (dtypes.float32, dtypes.float16, dtypes.int64, dtypes.bool), ids=lambda d: d.name))
def test_roundtrip(dt, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dt)
  a = data((3, 7), dt, seed=1)
  t = Tensor(a, device=tiny_device).realize()
  assert t.device == tiny_device
  out = t.numpy()
  assert out.dtype == np_dtype(dt), f"{dt} read back as {out.dtype}"
  np.testing.assert_array_equal(out, a, err_msg=f"{dt} round trip on {tiny_device}")


@QUICK
def test_roundtrip_sizes(tiny_device):
  for n in (0, 1, 3, 64, 1000, 1 << 16):
    a = np.random.default_rng(n).integers(-(1 << 30), 1 << 30, size=n, dtype=np.int64).astype(np.int32)
    np.testing.assert_array_equal(Tensor(a, device=tiny_device).realize().numpy(), a, err_msg=f"{n} elements")


@QUICK
def test_copy_of_views(tiny_device):
  base = arange_np((4, 6), np.float32)
  t = Tensor(base, device=tiny_device).realize()
  check(t.T, base.T, what="transposed read back")
  check(t[1:3, ::2], base[1:3, ::2], what="sliced read back")
  check(t.reshape(3, 8)[2], base.reshape(3, 8)[2], what="row of a reshape read back")


@pytest.mark.parametrize("dt", quick_cases([dtypes.float32, dtypes.int8, dtypes.uint16, dtypes.int64, dtypes.bool], lambda d: d == dtypes.int8,
                                            ids=lambda d: d.name))
def test_transfer_to_and_from_python(dt, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dt)
  a = data((2, 5), dt, seed=2)
  on_python = Tensor(a, device="PYTHON")
  moved = on_python.to(tiny_device)
  assert moved.device == tiny_device
  check(moved, a, dt=dt, what="PYTHON -> device")
  back = Tensor(a, device=tiny_device).to("PYTHON")
  assert back.device == "PYTHON"
  check(back, a, dt=dt, what="device -> PYTHON")


def test_transfer_of_computed_result(tiny_device):
  a = data((3, 4), dtypes.float32, seed=3)
  t = (Tensor(a, device=tiny_device) * 3).to("PYTHON") + 1
  check(t, a * 3 + 1, what="compute on the device, then on PYTHON")
  u = (Tensor(a, device="PYTHON") - 1).to(tiny_device).sum(1)
  check(u, (a - 1).sum(1), atol=1e-6, rtol=1e-6, what="compute on PYTHON, then reduce on the device")


@QUICK
def test_assign_overwrites_buffer(tiny_device):
  a = arange_np((5,), np.float32)
  t = Tensor(a, device=tiny_device).realize()
  t.assign(t * 2 + 1).realize()
  check(t, a * 2 + 1, what="assign")
  t.assign(Tensor(np.full((5,), 7.0, np.float32), device=tiny_device)).realize()
  check(t, np.full((5,), 7.0, np.float32), what="assign a copied-in tensor")
