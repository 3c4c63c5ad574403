"""Casts between dtypes (value conversion) and bitcasts (reinterpreting the bits), against numpy's astype and view."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import ALL, FLOATS, INTS, QUICK, check, np_dtype, quick_cases


def _source_values(dt):
  """Values of dt whose conversion to every dtype in ALL is defined in C and numpy (no out-of-range float->int)."""
  if dt == dtypes.bool:
    return np.array([True, False, True, True, False, False])
  if dtypes.is_float(dt):
    return np.array([0.0, 1.0, 2.75, 7.5, 100.25, 0.5], dtype=np_dtype(dt))
  return np.array([0, 1, 2, 7, 100, 127], dtype=np_dtype(dt))


QUICK_CASTS = {(dtypes.float32, dtypes.int8), (dtypes.int32, dtypes.float32), (dtypes.float16, dtypes.float32), (dtypes.float32, dtypes.float16),
               (dtypes.bool, dtypes.float32), (dtypes.uint8, dtypes.int64), (dtypes.float64, dtypes.uint32)}
CASTS = [pytest.param(a, b, id=f"{a.name}->{b.name}", marks=QUICK if (a, b) in QUICK_CASTS else ()) for a in ALL for b in ALL if a != b]


@pytest.mark.parametrize("src,dst", CASTS)
def test_cast(src, dst, tiny_device, tiny_require_dtype):
  tiny_require_dtype(src, dst)
  a = _source_values(src)
  check(Tensor(a, device=tiny_device).cast(dst), a.astype(np_dtype(dst)), dt=dst, atol=0, rtol=0, what=f"cast {src}->{dst}")


@pytest.mark.parametrize("dst", quick_cases([dtypes.int8, dtypes.int32, dtypes.int64], lambda d: d == dtypes.int32, ids=lambda d: d.name))
def test_cast_float_to_int_truncates(dst, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dst)
  a = np.array([-2.75, -1.5, -0.5, 0.5, 1.5, 2.99, -100.9, 100.9], dtype=np.float32)
  check(Tensor(a, device=tiny_device).cast(dst), np.trunc(a).astype(np_dtype(dst)), dt=dst, what="float->int rounds toward zero")


@pytest.mark.parametrize("src,dst", quick_cases([(dtypes.int32, dtypes.int8), (dtypes.int32, dtypes.uint8), (dtypes.int64, dtypes.int32),
                                                 (dtypes.uint32, dtypes.uint16), (dtypes.int16, dtypes.uint16)],
                                                lambda c: c == (dtypes.int32, dtypes.int8), ids=lambda c: f"{c[0]}-{c[1]}", unpack=True))
def test_cast_int_narrowing_wraps(src, dst, tiny_device, tiny_require_dtype):
  tiny_require_dtype(src, dst)
  a = np.array([-300, -129, -1, 0, 255, 256, 1000, 70000], dtype=np.int64).astype(np_dtype(src))
  check(Tensor(a, device=tiny_device).cast(dst), a.astype(np_dtype(dst)), dt=dst, what="narrowing int cast keeps the low bits")


def test_cast_to_bool_is_nonzero(tiny_device):
  a = np.array([0.0, -0.0, 0.25, -3.0, np.inf, np.nan], dtype=np.float32)
  check(Tensor(a, device=tiny_device).cast(dtypes.bool), a.astype(np.bool_), dt=dtypes.bool, what="float->bool")
  i = np.array([0, 1, -1, 256, 2], dtype=np.int32)
  check(Tensor(i, device=tiny_device).cast(dtypes.bool), i.astype(np.bool_), dt=dtypes.bool, what="int->bool (256 is true)")


def test_cast_inside_kernel(tiny_device):
  """A cast between two ops of one kernel, and an int->float->int round trip."""
  a = np.array([1, 2, 3, 250], dtype=np.uint8)
  t = Tensor(a, device=tiny_device)
  check((t.cast(dtypes.float32) / 2).cast(dtypes.int32), (a.astype(np.float32) / 2).astype(np.int32), dt=dtypes.int32, what="cast chain")
  check(t + 10, a + np.uint8(10), dt=dtypes.uint8, what="uint8 overflow wraps")


BITCASTS = [(dtypes.float32, dtypes.int32), (dtypes.float32, dtypes.uint32), (dtypes.int32, dtypes.float32), (dtypes.uint32, dtypes.int32),
            (dtypes.float16, dtypes.int16), (dtypes.uint16, dtypes.float16), (dtypes.int8, dtypes.uint8), (dtypes.uint8, dtypes.int8),
            (dtypes.float64, dtypes.int64), (dtypes.int64, dtypes.float64), (dtypes.uint64, dtypes.int64)]


@pytest.mark.parametrize("src,dst", quick_cases(BITCASTS, lambda c: c in ((dtypes.float32, dtypes.int32), (dtypes.uint16, dtypes.float16)),
                                                ids=lambda c: f"{c[0].name}->{c[1].name}", unpack=True))
def test_bitcast(src, dst, tiny_device, tiny_require_dtype):
  tiny_require_dtype(src, dst)
  if src in FLOATS:
    a = np.array([0.0, -0.0, 1.0, -2.5, 3.1415926, 1e-3, np.inf, -np.inf], dtype=np_dtype(src))
  else:
    info = np.iinfo(np_dtype(src))
    a = np.array([0, 1, -1 if info.min < 0 else 2, info.min, info.max, 12345 % (int(info.max) + 1), 7, 100], dtype=np_dtype(src))
  if dst in FLOATS:   # NaN payloads need not survive a device's float registers: keep to non-NaN bit patterns
    a = a[~np.isnan(a.view(np_dtype(dst)))]
  want = a.view(np_dtype(dst))
  got = Tensor(a, device=tiny_device).bitcast(dst)
  assert got.dtype == dst
  out = got.numpy()
  np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8), err_msg=f"bitcast {src}->{dst} on {tiny_device}: bits differ")


@pytest.mark.parametrize("dt", [d for d in INTS if d.itemsize == 4] + [dtypes.float32], ids=lambda d: d.name)
def test_bitcast_of_computed_value(dt, tiny_device, tiny_require_dtype):
  """The bitcast of a value computed in the same kernel (not a load), so the device must reinterpret a register."""
  tiny_require_dtype(dt)
  a = np.array([1.0, 2.0, -3.0, 0.5], dtype=np.float32)
  got = (Tensor(a, device=tiny_device) * 2).bitcast(dt)
  np.testing.assert_array_equal(got.numpy().view(np.uint8), (a * 2).view(np_dtype(dt)).view(np.uint8), err_msg="bitcast of a computed value")
