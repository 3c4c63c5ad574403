"""exp2, log2 and sin from +, *, comparisons and bit casts, for renderers whose targets lack them.

Each function takes a float uop and returns a uop graph of the same dtype; float16/bfloat16 are computed in float32.
Accuracy is a few ulp over the normal range; special values (inf, nan, 0, negatives for log2) follow IEEE libm.
"""
from __future__ import annotations

import math
from typing import List, Tuple

from tiny.dtype import DType, dtypes
from tiny.codegen.uops import UOp

# (mantissa bits, exponent bias, same-size int dtype)
_FLOAT_INFO = {dtypes.float32: (23, 127, dtypes.int32), dtypes.float64: (52, 1023, dtypes.int64)}


def _horner(x: UOp, coeffs: List[float]) -> UOp:
  """coeffs[0] + coeffs[1]*x + ... by Horner's rule."""
  acc = x.const_like(coeffs[-1])
  for c in reversed(coeffs[:-1]):
    acc = acc * x + c
  return acc


def _upcast(d: UOp) -> Tuple[UOp, DType]:
  assert d.dtype is not None
  return (d.cast(dtypes.float32), d.dtype) if d.dtype in (dtypes.float16, dtypes.bfloat16) else (d, d.dtype)


def _floor_int(x: UOp, it: DType) -> UOp:
  """floor(x) as an int (x must be in the int's range)."""
  t = x.cast(it)
  return t - x.lt(t.cast(x.dtype)).cast(it)  # type: ignore[arg-type]


def _pow2(k: UOp, dt: DType) -> UOp:
  """2**k for an int k in the normal exponent range, built from the exponent bits."""
  mant, bias, it = _FLOAT_INFO[dt]
  return ((k + bias) * (1 << mant)).bitcast(dt)


def xexp2(d: UOp) -> UOp:
  """2**d."""
  x, out = _upcast(d)
  dt = x.dtype
  assert dt is not None
  mant, bias, it = _FLOAT_INFO[dt]
  hi, lo = (bias + 1, -(bias + mant)) if dt == dtypes.float32 else (bias + 1, -(bias + mant))
  xc = x.max(float(lo - 1)).min(float(hi))
  q = _floor_int(xc + 0.5, it)
  f = xc - q.cast(dt)  # in [-0.5, 0.5]
  n = 10 if dt == dtypes.float32 else 16
  poly = _horner(f * math.log(2), [1 / math.factorial(i) for i in range(n)])
  h = q // 2
  ret = poly * _pow2(h, dt) * _pow2(q - h, dt)
  ret = x.lt(float(hi)).where(ret, x.const_like(math.inf))
  ret = x.lt(float(lo - 1)).where(x.const_like(0.0), ret)
  ret = x.ne(x).where(x, ret)
  return ret.cast(out) if out != dt else ret


def xlog2(d: UOp) -> UOp:
  """log2(d)."""
  x, out = _upcast(d)
  dt = x.dtype
  assert dt is not None
  mant, bias, it = _FLOAT_INFO[dt]
  tiny_normal = 2.0 ** (1 - bias)
  denorm = x.lt(tiny_normal)
  xs = denorm.where(x * float(2 ** 64), x)
  bits = xs.bitcast(it)
  e = (bits // (1 << mant)) & ((1 << (8 if dt == dtypes.float32 else 11)) - 1)
  e = e - bias - denorm.where(e.const_like(64), e.const_like(0))
  m = ((bits & ((1 << mant) - 1)) | (bias << mant)).bitcast(dt)  # mantissa in [1, 2)
  big = x.const_like(math.sqrt(2)).lt(m)
  m = big.where(m * 0.5, m)
  e = e + big.cast(it)
  t = (m - 1.0) / (m + 1.0)
  t2 = t * t
  n = 6 if dt == dtypes.float32 else 11
  ln_m = t * _horner(t2, [2.0 / (2 * i + 1) for i in range(n)])
  ret = e.cast(dt) + ln_m * (1 / math.log(2))
  ret = x.ne(math.inf).where(ret, x)
  ret = x.ne(0.0).where(ret, x.const_like(-math.inf))
  ret = x.lt(0.0).where(x.const_like(math.nan), ret)
  ret = x.ne(x).where(x, ret)
  return ret.cast(out) if out != dt else ret


# pi split so that q*PI_A is exact for the q we reduce with (Cody-Waite)
_PI_SPLIT = {dtypes.float32: (3.1414794921875, 0.00011315941810607910156, 1.9841872589410058936e-09, 1.2154201256553420762e-10),
             dtypes.float64: (3.1415926218032836914, 3.1786509424591713469e-08, 1.2246467864107188502e-16, 1.2736634327021899816e-24)}


def xsin(d: UOp) -> UOp:
  """sin(d)."""
  x, out = _upcast(d)
  dt = x.dtype
  assert dt is not None
  q = _floor_int(x * (1 / math.pi) + 0.5, dtypes.int64)
  qf = q.cast(dt)
  r = x
  for p in _PI_SPLIT[dt]:
    r = r - qf * p
  r2 = r * r
  n = 8 if dt == dtypes.float32 else 13
  s = r * _horner(r2, [(-1) ** i / math.factorial(2 * i + 1) for i in range(n)])
  s = (q & 1).ne(0).where(-s, s)
  ax = x.max(-x)
  s = ax.ne(math.inf).where(s, x.const_like(math.nan))
  s = x.ne(x).where(x, s)
  return s.cast(out) if out != dt else s
