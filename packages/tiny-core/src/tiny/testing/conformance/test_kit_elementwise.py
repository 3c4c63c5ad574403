"""Elementwise ops on every dtype, against numpy computing in the same dtype."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import ALL, FLOATS, INTS, QUICK, SIGNED, UNSIGNED, check, data, quick_cases

SHAPE = (3, 5)

# name, tiny fxn, numpy fxn, dtypes it applies to
BINARY = [
  ("add", lambda a, b: a + b, lambda a, b: a + b, FLOATS + INTS),
  ("sub", lambda a, b: a - b, lambda a, b: a - b, FLOATS + INTS),   # unsigned results wrap around, as in numpy and C
  ("mul", lambda a, b: a * b, lambda a, b: a * b, FLOATS + INTS),
  ("div", lambda a, b: a / b, lambda a, b: a / b, FLOATS),
  ("maximum", lambda a, b: a.maximum(b), np.maximum, FLOATS + INTS),
  ("minimum", lambda a, b: a.minimum(b), np.minimum, FLOATS + INTS),
  ("lt", lambda a, b: a < b, lambda a, b: a < b, ALL),
  ("eq", lambda a, b: a == b, lambda a, b: a == b, ALL),
  ("ne", lambda a, b: a != b, lambda a, b: a != b, ALL),
  ("xor", lambda a, b: a ^ b, lambda a, b: a ^ b, INTS + (dtypes.bool,)),
  ("and", lambda a, b: a & b, lambda a, b: a & b, INTS + (dtypes.bool,)),
  ("or", lambda a, b: a | b, lambda a, b: a | b, INTS + (dtypes.bool,)),
]

UNARY = [
  ("neg", lambda a: -a, lambda a: -a, FLOATS + SIGNED, {}),
  ("exp2", lambda a: a.exp2(), np.exp2, FLOATS, {}),
  ("log2", lambda a: a.log2(), np.log2, FLOATS, {"low": 0.1, "high": 4}),
  ("sqrt", lambda a: a.sqrt(), np.sqrt, FLOATS, {"low": 0.0, "high": 4}),
  ("sin", lambda a: a.sin(), np.sin, FLOATS, {"low": -4, "high": 4}),
  ("reciprocal", lambda a: a.reciprocal(), np.reciprocal, FLOATS, {"low": 0.25, "high": 4}),
  ("exp", lambda a: a.exp(), np.exp, FLOATS, {}),
  ("log", lambda a: a.log(), np.log, FLOATS, {"low": 0.1, "high": 4}),
  ("relu", lambda a: a.relu(), lambda a: np.maximum(a, 0), FLOATS, {}),
  ("abs", lambda a: a.abs(), np.abs, FLOATS + SIGNED, {}),
  ("invert", lambda a: ~a, np.invert, INTS + (dtypes.bool,), {}),
]


def _cases(table, quick):
  return [pytest.param(row, dt, id=f"{row[0]}-{dt.name}", marks=QUICK if (row[0], dt) in quick else ()) for row in table for dt in row[3]]


QUICK_BINARY = {("add", dtypes.float32), ("div", dtypes.float32), ("lt", dtypes.float32), ("mul", dtypes.int32), ("sub", dtypes.uint8),
                ("xor", dtypes.int32), ("add", dtypes.float16), ("mul", dtypes.int64)}
QUICK_UNARY = {("exp2", dtypes.float32), ("log2", dtypes.float32), ("sin", dtypes.float32), ("reciprocal", dtypes.float16), ("abs", dtypes.int32)}


@pytest.mark.parametrize("row,dt", _cases(BINARY, QUICK_BINARY))
def test_binary(row, dt, tiny_device, tiny_require_dtype):
  name, fxn, npfxn, _ = row
  tiny_require_dtype(dt)
  a, b = data(SHAPE, dt, seed=1), data(SHAPE, dt, seed=2)
  if name == "div":
    b = np.where(np.abs(b) < 0.25, 0.5, b).astype(b.dtype)
  if name in ("lt", "eq", "ne"):
    b[0] = a[0]   # ties
  want = npfxn(a, b)
  check(fxn(Tensor(a, device=tiny_device), Tensor(b, device=tiny_device)), want, dt=dtypes.bool if want.dtype == np.bool_ else dt, what=name)


@pytest.mark.parametrize("row,dt", _cases(UNARY, QUICK_UNARY))
def test_unary(row, dt, tiny_device, tiny_require_dtype):
  name, fxn, npfxn, _, kw = row
  tiny_require_dtype(dt)
  a = data(SHAPE, dt, seed=3, **kw)
  with np.errstate(all="ignore"):
    want = npfxn(a)
  check(fxn(Tensor(a, device=tiny_device)), want, dt=dt, transcendental=dtypes.is_float(dt), what=name)


@pytest.mark.parametrize("dt", quick_cases(INTS, lambda d: d == dtypes.int32, ids=lambda d: d.name))
def test_int_division_truncates(dt, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dt)
  a = data(SHAPE, dt, seed=4, low=0 if dt in UNSIGNED else -50, high=100)
  b = data(SHAPE, dt, seed=5, low=1, high=9)
  if dt in SIGNED:
    b[1] = -b[1]
  want = (np.trunc(a.astype(np.float64) / b.astype(np.float64))).astype(a.dtype)   # C semantics: round toward zero
  check(Tensor(a, device=tiny_device).idiv(Tensor(b, device=tiny_device)), want, dt=dt, what="idiv")


@pytest.mark.parametrize("dt", quick_cases(FLOATS + INTS + (dtypes.bool,), lambda d: d == dtypes.float32, ids=lambda d: d.name))
def test_where(dt, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dt)
  cond, a, b = data(SHAPE, dtypes.bool, seed=6), data(SHAPE, dt, seed=7), data(SHAPE, dt, seed=8)
  t = Tensor(cond, device=tiny_device).where(Tensor(a, device=tiny_device), Tensor(b, device=tiny_device))
  check(t, np.where(cond, a, b), dt=dt, what="where")


@pytest.mark.parametrize("dt", quick_cases(FLOATS + (dtypes.int32, dtypes.uint8), lambda d: d == dtypes.float32, ids=lambda d: d.name))
def test_fused_chain(dt, tiny_device, tiny_require_dtype):
  """Several ops and a constant in one kernel."""
  tiny_require_dtype(dt)
  a, b = data(SHAPE, dt, seed=9), data(SHAPE, dt, seed=10)
  ta, tb = Tensor(a, device=tiny_device), Tensor(b, device=tiny_device)
  out = ((ta * tb + ta) < tb + 3).where(ta, tb * 2)
  c3, c2 = np.array(3, a.dtype), np.array(2, a.dtype)
  check(out, np.where((a * b + a) < b + c3, a, b * c2), dt=dt, what="fused chain")


@pytest.mark.parametrize("dt", quick_cases(FLOATS, lambda d: d == dtypes.float32, ids=lambda d: d.name))
def test_special_float_values(dt, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dt)
  a = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e-3], dtype=dt.fmt)
  t = Tensor(a, device=tiny_device)
  with np.errstate(all="ignore"):
    check(t * 2, a * 2, dt=dt, what="mul of inf/nan")
    check(t.sqrt(), np.sqrt(a), dt=dt, transcendental=True, what="sqrt of inf/nan/negative")
    check(t.log2(), np.log2(a), dt=dt, transcendental=True, what="log2 of 0/inf/nan/negative")
    check(t.exp2(), np.exp2(a), dt=dt, transcendental=True, what="exp2 of inf/nan")
    check(t != t, a != a, dt=dtypes.bool, what="nan != nan")


def test_scalar_and_const_tensors(tiny_device):
  check(Tensor(3.5, device=tiny_device) * 2, np.float32(7.0), dt=dtypes.float32, what="0-d tensor")
  check(Tensor.full((2, 3), 7, device=tiny_device) + 1, np.full((2, 3), 8, np.int32), dt=dtypes.int32, what="full")
  check(Tensor.arange(6, device=tiny_device) * 3, np.arange(6, dtype=np.int32) * 3, dt=dtypes.int32, what="arange")


@pytest.mark.parametrize("dt", quick_cases([dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16], lambda d: d == dtypes.int8,
                                            ids=lambda d: d.name))
def test_narrow_int_results_wrap(dt, tiny_device, tiny_require_dtype):
  """A narrow int result wraps to its dtype before it feeds a division, a comparison or a max (C would promote to int)."""
  tiny_require_dtype(dt)
  info = np.iinfo(dt.fmt)
  a = np.array([info.min, info.max, info.max // 2 + 3, 7, 0], dtype=dt.fmt)
  t = Tensor(a, device=tiny_device)
  two = np.array(2, dtype=dt.fmt)
  with np.errstate(over="ignore"):
    check((t * t).idiv(3), np.trunc((a * a).astype(np.float64) / 3).astype(a.dtype), dt=dt, what="(a*a) idiv 3")
    check((t * 2) < t, (a * two) < a, dt=dtypes.bool, what="a*2 < a")
    check((t + t).maximum(t), np.maximum(a + a, a), dt=dt, what="max(a+a, a)")
    check((t - 1 + t) < 5, (a - np.array(1, dt.fmt) + a) < 5, dt=dtypes.bool, what="a-1+a < 5")
    if dt in SIGNED:
      check(t.neg().idiv(3), np.trunc((-a).astype(np.float64) / 3).astype(a.dtype), dt=dt, what="(-a) idiv 3")
