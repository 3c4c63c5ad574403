"""matmul (vectors, matrices, batches, ints) and conv2d (padding, stride, dilation, groups, bias) against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import QUICK, check, data, quick_cases

MATMUL = [((1, 1), (1, 1)), ((3, 4), (4, 5)), ((5,), (5, 3)), ((4, 6), (6,)), ((4,), (4,)), ((2, 3, 4), (4, 2)),
          ((2, 1, 3, 4), (3, 4, 2)), ((8, 16), (16, 8)), ((3, 0), (0, 2))]


@pytest.mark.parametrize("sa,sb", quick_cases(MATMUL, lambda c: c in (((2, 1, 3, 4), (3, 4, 2)), ((3, 0), (0, 2)), ((5,), (5, 3))),
                                               ids=lambda c: f"{c[0]}-{c[1]}", unpack=True))
def test_matmul_float(sa, sb, tiny_device):
  a, b = data(sa, dtypes.float32, seed=1), data(sb, dtypes.float32, seed=2)
  check(Tensor(a, device=tiny_device) @ Tensor(b, device=tiny_device), a.astype(np.float64) @ b.astype(np.float64),
        dt=dtypes.float32, atol=1e-5, rtol=1e-5, what="matmul")


@pytest.mark.parametrize("dt", quick_cases([dtypes.int32, dtypes.float16, dtypes.float64], lambda d: d == dtypes.int32, ids=lambda d: d.name))
def test_matmul_dtypes(dt, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dt)
  a, b = data((3, 5), dt, seed=3), data((5, 4), dt, seed=4)
  want = a.astype(np.float64) @ b.astype(np.float64)
  tol = {dtypes.float16: 2e-2, dtypes.float64: 1e-10}.get(dt, 0)
  check(Tensor(a, device=tiny_device) @ Tensor(b, device=tiny_device), want, dt=dt, atol=tol, rtol=tol, what=f"{dt} matmul")


def test_matmul_of_transposed_views(tiny_device):
  a, b = data((5, 3), dtypes.float32, seed=5), data((4, 5), dtypes.float32, seed=6)
  check(Tensor(a, device=tiny_device).T @ Tensor(b, device=tiny_device).T, a.T.astype(np.float64) @ b.T.astype(np.float64),
        atol=1e-5, rtol=1e-5, what="a.T @ b.T")


def conv2d_np(x: np.ndarray, w: np.ndarray, bias=None, stride=1, padding=0, dilation=1, groups=1) -> np.ndarray:
  """Direct NCHW convolution (cross-correlation, like torch) in float64."""
  x, w = x.astype(np.float64), w.astype(np.float64)
  n, cin, _, _ = x.shape
  cout, cin_g, kh, kw = w.shape
  x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  oh = (x.shape[2] - dilation * (kh - 1) - 1) // stride + 1
  ow = (x.shape[3] - dilation * (kw - 1) - 1) // stride + 1
  out = np.zeros((n, cout, oh, ow))
  per_group = cout // groups
  for o in range(cout):
    g = o // per_group
    for i in range(oh):
      for j in range(ow):
        patch = x[:, g * cin_g:(g + 1) * cin_g, i * stride:i * stride + dilation * (kh - 1) + 1:dilation,
                  j * stride:j * stride + dilation * (kw - 1) + 1:dilation]
        out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
  if bias is not None:
    out += bias.astype(np.float64).reshape(1, -1, 1, 1)
  return out


CONV = [
  # (x shape, w shape, kwargs)
  ((1, 1, 4, 4), (1, 1, 3, 3), {}),
  ((2, 2, 5, 5), (3, 2, 3, 3), {"padding": 1}),
  ((1, 2, 7, 6), (2, 2, 3, 2), {"stride": 2}),
  ((1, 1, 7, 7), (2, 1, 3, 3), {"dilation": 2}),
  ((1, 4, 5, 5), (4, 2, 3, 3), {"groups": 2, "padding": 1}),
  ((2, 3, 4, 4), (2, 3, 1, 1), {"bias": True}),
]


@pytest.mark.parametrize("xs,ws,kw", quick_cases(CONV, lambda c: c[2] in ({"padding": 1}, {"groups": 2, "padding": 1}),
                                                  ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}", unpack=True))
def test_conv2d(xs, ws, kw, tiny_device):
  kw = dict(kw)
  x, w = data(xs, dtypes.float32, seed=7), data(ws, dtypes.float32, seed=8)
  bias = data((ws[0],), dtypes.float32, seed=9) if kw.pop("bias", False) else None
  tb = Tensor(bias, device=tiny_device) if bias is not None else None
  out = Tensor(x, device=tiny_device).conv2d(Tensor(w, device=tiny_device), tb, **kw)
  check(out, conv2d_np(x, w, bias, **kw), dt=dtypes.float32, atol=1e-5, rtol=1e-5, what="conv2d")


@QUICK
def test_max_pool2d(tiny_device):
  x = data((1, 2, 6, 6), dtypes.float32, seed=10)
  want = x.reshape(1, 2, 3, 2, 3, 2).max(axis=(3, 5))
  check(Tensor(x, device=tiny_device).max_pool2d(2), want, what="max_pool2d")
