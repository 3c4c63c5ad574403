"""Symbolic shapes: a shrink by a bound Variable, the kernel taking the variable's value at launch."""
from __future__ import annotations

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.shape.symbolic import Variable
from tiny.tensor import Tensor

from ._kit import arange_np, check, quick_cases


@pytest.mark.parametrize("n", quick_cases([1, 3, 7, 10], lambda n: n == 3))
def test_shrink_by_variable_then_reduce(n, tiny_device):
  base = arange_np((3, 10), np.float32)
  vi = Variable("i", 1, 10).bind(n)
  t = Tensor(base, device=tiny_device).shrink(((0, 3), (0, vi)))
  assert t.shape[1] is vi or str(t.shape[1]) == str(vi), "the shape stays symbolic"
  check(t.sum(1), base[:, :n].sum(1), dt=dtypes.float32, what="sum over a symbolic axis")
  check((t * 2 - 1).max(1), (base[:, :n] * 2 - 1).max(1), dt=dtypes.float32, what="elementwise then max over a symbolic axis")
  check(t.sum(0).sum(), base[:, :n].sum(), dt=dtypes.float32, what="reduce the concrete axis first, then the symbolic one")


@pytest.mark.parametrize("n", quick_cases([2, 5], lambda n: n == 5))
def test_symbolic_leading_axis_and_offset(n, tiny_device):
  base = arange_np((10, 4), np.int32)
  vi = Variable("j", 1, 8).bind(n)
  t = Tensor(base, device=tiny_device)
  check(t.shrink(((0, vi), (0, 4))).sum(0), base[:n].sum(0), what="symbolic rows")
  check(t.shrink(((2, vi + 2), (1, 3))).sum(0), base[2:n + 2, 1:3].sum(0), what="symbolic rows with an offset")


@pytest.mark.xfail(reason="Tensor.reshape rejects a reshape to a bound Variable: prod((3, k=4)) != 12 as Nodes", strict=True)
def test_symbolic_reshape_roundtrip(tiny_device):
  """tinygrad's symbolic idiom: reshape to a bound Variable, compute, reshape back to the concrete size."""
  n = 4
  base = arange_np((3, n), np.float32)
  vi = Variable("k", 1, 10).bind(n)
  out = (Tensor(base, device=tiny_device).reshape(3, vi) + 1).realize()
  check(out.reshape(3, n), base + 1, dt=dtypes.float32, what="symbolic elementwise read back")
