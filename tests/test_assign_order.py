"""A lazy result made before an in-place assign sees the old contents, as the same code run eagerly (numpy, torch) does.

The lazy graph of `b = t * 2` reads t's buffer; if `t.assign(...)` is realized first and b only afterwards, b used to be
computed from the new contents. Each case runs the same steps on numpy arrays as the reference.
"""
from __future__ import annotations

import numpy as np
import pytest

from tiny import Device, Tensor
from tiny.helpers import GlobalCounters

DEVICES = [d for d in Device.get_available_devices() if d in ("CLANG", "LLVM", "PYTHON")]


@pytest.mark.parametrize("device", DEVICES)
def test_read_before_realized_assign(device: str) -> None:
  t = Tensor([1.0, 2.0, 3.0], device=device).realize()
  b = t * 2
  t.assign(t + 100).realize()
  np.testing.assert_array_equal(b.numpy(), [2.0, 4.0, 6.0])
  np.testing.assert_array_equal(t.numpy(), [101.0, 102.0, 103.0])


@pytest.mark.parametrize("device", DEVICES)
def test_chain_and_views_of_old_contents(device: str) -> None:
  ref = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor(ref.copy(), device=device).realize()
  a = t.permute(1, 0)[1:3] + 1        # a view of t, then an op: reads the old contents
  s = (a * 3).sum()                   # and something built on that
  m = t.max(axis=1)
  t.assign(Tensor(np.ones((3, 4), np.float32), device=device)).realize()
  np.testing.assert_array_equal(a.numpy(), ref.T[1:3] + 1)
  assert s.item() == pytest.approx(float(((ref.T[1:3] + 1) * 3).sum()))
  np.testing.assert_array_equal(m.numpy(), ref.max(axis=1))


@pytest.mark.parametrize("device", DEVICES)
def test_reads_after_assign_see_new_contents(device: str) -> None:
  t = Tensor([1.0, 2.0], device=device).realize()
  before = t * 1.5
  t.assign(Tensor([5.0, 6.0], device=device))
  after = t * 1.5                     # made after the assign: the new contents, realized or not
  np.testing.assert_array_equal(after.numpy(), [7.5, 9.0])
  np.testing.assert_array_equal(before.numpy(), [1.5, 3.0])


@pytest.mark.parametrize("device", DEVICES)
def test_two_assigns_in_a_row(device: str) -> None:
  t = Tensor([1.0, 2.0], device=device).realize()
  first = t * 10
  t.assign(t + 1).realize()
  second = t * 10
  t.assign(t + 1).realize()
  np.testing.assert_array_equal(first.numpy(), [10.0, 20.0])
  np.testing.assert_array_equal(second.numpy(), [20.0, 30.0])
  np.testing.assert_array_equal(t.numpy(), [3.0, 4.0])


def test_dropped_readers_cost_nothing() -> None:
  # readers that no longer exist must not be computed: a loop of reads and assigns runs one kernel per assign
  t = Tensor.zeros(16, device="PYTHON").contiguous().realize()
  for _ in range(3):
    _ = (t * 3).sum()
  del _
  GlobalCounters.reset()
  t.assign(t + 1).realize()
  assert GlobalCounters.kernel_count == 1
  np.testing.assert_array_equal(t.numpy(), np.ones(16, np.float32))
