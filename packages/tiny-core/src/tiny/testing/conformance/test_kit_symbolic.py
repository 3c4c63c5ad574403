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


def test_symbolic_reshape_roundtrip(tiny_device):
  """tinygrad's symbolic idiom: reshape to a bound Variable, compute, reshape back to the concrete size."""
  n = 4
  base = arange_np((3, n), np.float32)
  vi = Variable("k", 1, 10).bind(n)
  out = (Tensor(base, device=tiny_device).reshape(3, vi) + 1).realize()
  check(out.reshape(3, n), base + 1, dt=dtypes.float32, what="symbolic elementwise read back")


def test_symbolic_reshape_in_jit(tiny_device):
  """One TinyJit capture serves every value of the Variable a concrete tensor is reshaped to."""
  from tiny.engine.jit import TinyJit

  @TinyJit
  def step(x: Tensor) -> Tensor:
    return (x * 2 + 1).sum(1).realize()

  for n in (3, 5, 4, 7):
    base = arange_np((2, n), np.float32)
    check(step(Tensor(base, device=tiny_device).reshape(2, Variable("n", 1, 10).bind(n))), (base * 2 + 1).sum(1),
          dt=dtypes.float32, what=f"jitted symbolic reshape, n={n}")


def test_reshape_to_a_variable_bound_to_another_size_is_refused(tiny_device):
  with pytest.raises(ValueError, match="cannot reshape"):
    Tensor(arange_np((3, 4), np.float32), device=tiny_device).reshape(3, Variable("k", 1, 10).bind(5))
