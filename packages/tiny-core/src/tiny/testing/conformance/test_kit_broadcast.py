"""Broadcasting: operands of different shapes (size-1 and missing dims, 0-d, 0-size) combine like numpy."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import QUICK, check, data

PAIRS = [
  ((3, 1), (1, 4)),
  ((2, 3, 4), (4,)),
  ((2, 1, 4), (3, 1)),
  ((1,), (5,)),
  ((), (2, 3)),
  ((4, 1, 1), (1, 3, 2)),
  ((0, 3), (1, 3)),
  ((2, 0), (2, 1)),
]


@pytest.mark.parametrize("sa,sb", [pytest.param(*p, id=f"{p[0]}-{p[1]}", marks=QUICK if p in (PAIRS[2], PAIRS[6]) else ()) for p in PAIRS])
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32], ids=lambda d: d.name)
def test_broadcast_binary(sa, sb, dt, tiny_device):
  a, b = data(sa, dt, seed=1), data(sb, dt, seed=2)
  ta, tb = Tensor(a, device=tiny_device), Tensor(b, device=tiny_device)
  check(ta + tb, a + b, dt=dt, what="a + b")
  check(tb * ta, b * a, dt=dt, what="b * a")
  check(ta < tb, a < b, dt=dtypes.bool, what="a < b")


@pytest.mark.parametrize("sa,sb", [pytest.param(*p, id=f"{p[0]}-{p[1]}", marks=QUICK if p == PAIRS[5] else ()) for p in PAIRS[:6]])
def test_broadcast_where(sa, sb, tiny_device):
  a, b = data(sa, dtypes.float32, seed=3), data(sb, dtypes.float32, seed=4)
  ta, tb = Tensor(a, device=tiny_device), Tensor(b, device=tiny_device)
  check((ta > 0).where(ta, tb), np.where(a > 0, a, b), dt=dtypes.float32, what="where")


def test_broadcast_python_scalars(tiny_device):
  a = data((2, 3), dtypes.float32, seed=5)
  t = Tensor(a, device=tiny_device)
  check(2 - t, np.float32(2) - a, dt=dtypes.float32, what="2 - t")
  check(t / 4, a / np.float32(4), dt=dtypes.float32, what="t / 4")
  i = data((2, 3), dtypes.int8, seed=6)
  check(Tensor(i, device=tiny_device) * 3, i * np.int8(3), dt=dtypes.int8, what="int8 * 3 keeps int8")


def test_expand_then_op(tiny_device):
  a = data((3, 1), dtypes.float32, seed=7)
  t = Tensor(a, device=tiny_device).expand(3, 4)
  check(t + Tensor.arange(4, device=tiny_device).float(), np.broadcast_to(a, (3, 4)) + np.arange(4, dtype=np.float32), dt=dtypes.float32)
