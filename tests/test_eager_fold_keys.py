"""The cheap dispatch of an eager scalar op (lazy.scalar_binop, the plan path of realize) against numpy.

Each test runs a loop twice or more, so the second pass goes through the cached plan, and alternates graphs that differ in
one detail (the constant folding or not, the shape, the dtype), so a check or a table keyed too coarsely gives a wrong
value or shape here.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.helpers import GlobalCounters
from tiny.tensor import Tensor


def _special_floats() -> np.ndarray:
  return np.array([-0.0, 0.0, 1.5, -2.25, np.inf, -np.inf, np.nan, 3.0], dtype=np.float32)


@pytest.mark.parametrize("val", [0.0, -0.0, 1.0, -1.0, 2.0, 0.5])
def test_float_constants_that_might_fold_match_numpy_bit_for_bit(val: float) -> None:
  a = _special_floats()
  x = Tensor(a).realize()
  for _ in range(3):   # the first pass compiles, the next ones run by plan
    for got, want in (((x + val).realize(), a + np.float32(val)), ((x * val).realize(), a * np.float32(val)),
                      ((val + x).realize(), np.float32(val) + a), ((val * x).realize(), np.float32(val) * a),
                      ((x - val).realize(), a - np.float32(val))):
      g = got.numpy()
      # the bits, so +0.0 and -0.0 differ and NaN equals NaN
      np.testing.assert_array_equal(g.view(np.int32) & 0x7FFFFFFF != 0x7FC00000, want.view(np.int32) & 0x7FFFFFFF != 0x7FC00000)
      np.testing.assert_array_equal(np.signbit(g[~np.isnan(g)]), np.signbit(want[~np.isnan(want)]))
      np.testing.assert_array_equal(g[~np.isnan(g)], want[~np.isnan(want)])


@pytest.mark.parametrize("val", [0, 1, -1, 2, -3])
def test_int_constants_that_might_fold_match_numpy(val: int) -> None:
  a = np.array([-7, 0, 3, 2**31 - 1, -(2**31), 5], dtype=np.int32)
  x = Tensor(a).realize()
  with np.errstate(over="ignore"):
    for _ in range(3):
      np.testing.assert_array_equal((x + val).realize().numpy(), a + np.int32(val))
      np.testing.assert_array_equal((x * val).realize().numpy(), a * np.int32(val))
      np.testing.assert_array_equal((val * x).realize().numpy(), np.int32(val) * a)


def test_shapes_alternating_keep_their_own_trackers() -> None:
  # the per-shape tracker table of scalar_binop: a lookup keyed on the wrong thing would give a result of the last
  # shape's tracker (wrong shape, or reading out of range)
  rng = np.random.default_rng(1)
  shapes = [(16,), (4, 4), (2, 8), (16, 1), (1, 16), (), (1,), (3, 5, 2)]
  arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
  xs = [Tensor(a).realize() for a in arrays]
  for _ in range(3):
    for s, a, x in zip(shapes, arrays, xs):
      y = (x * 1.5 + 0.25).realize()
      assert y.shape == s
      # (a kernel may fuse the multiply-add: one rounding instead of two)
      np.testing.assert_allclose(y.numpy(), a * np.float32(1.5) + np.float32(0.25), rtol=1e-6, atol=1e-7)


def test_views_of_one_buffer_alternating() -> None:
  a = np.arange(16, dtype=np.float32)
  x = Tensor(a).realize()
  for _ in range(3):
    np.testing.assert_array_equal((x.reshape(4, 4) * 2.0).realize().numpy(), a.reshape(4, 4) * 2)
    np.testing.assert_array_equal((x.reshape(4, 4).permute(1, 0) * 2.0).realize().numpy(), a.reshape(4, 4).T * 2)
    np.testing.assert_array_equal((x[2:6] * 2.0).realize().numpy(), a[2:6] * 2)
    np.testing.assert_array_equal((x * 2.0).realize().numpy(), a * 2)


def test_dtypes_alternating_on_one_shape() -> None:
  a = np.arange(8, dtype=np.float32) - 3.5
  xs = {dt: Tensor(a).cast(dt).realize() for dt in (dtypes.float32, dtypes.float16, dtypes.int32, dtypes.float64)}
  for _ in range(3):
    for dt, x in xs.items():
      y = (x * 3 + 1).realize()
      assert y.dtype == dt
      want = (a.astype(np.float64) if dt != dtypes.int32 else a.astype(np.int32)) * 3 + 1
      np.testing.assert_allclose(y.numpy().astype(np.float64), want.astype(np.float64), rtol=1e-3)


def test_counters_count_plan_runs_and_reset() -> None:
  x = Tensor(np.ones(16, dtype=np.float32)).realize()
  for _ in range(2):
    x = (x * 1.25 + 0.5).realize()
  GlobalCounters.reset()
  assert GlobalCounters.kernel_count == 0 and GlobalCounters.global_ops == 0 and GlobalCounters.mem_peak == GlobalCounters.mem_used
  for _ in range(5):
    x = (x * 1.25 + 0.5).realize()
  assert GlobalCounters.kernel_count == 5
  assert GlobalCounters.global_ops >= 5 * 2 * 16 and GlobalCounters.global_mem > 0
  want = np.float32(1)
  for _ in range(7):
    want = want * np.float32(1.25) + np.float32(0.5)
  np.testing.assert_allclose(x.numpy(), np.full(16, want), rtol=1e-6)
  assert math.isfinite(GlobalCounters.time_sum_s)


def test_every_lazybuffer_attribute_is_in_the_shared_name_list() -> None:
  # lazy._ATTRIBUTE_NAMES puts every name in the class's shared attribute table before any real LazyBuffer exists; a new
  # attribute left out of it would silently give each LazyBuffer setting it a dictionary of its own (slower, not wrong)
  import gc

  from tiny import lazy
  a = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4), requires_grad=True)
  loss = ((a @ a).relu() * 2.0 + 1.0).sum()
  loss.backward()
  b = Tensor.zeros(8).contiguous().realize()
  b.assign(b + 1.0)
  c = (b[2:6] * 3.0).contiguous()
  keep = [a.grad.realize(), b.realize(), c.realize(), a.reshape(16).pad(((1, 1),)).realize(), (b.cast(dtypes.int32) + 1).realize()]
  names = set()
  for o in gc.get_objects():
    if o.__class__ is lazy.LazyBuffer:
      names |= set(vars(o))
  assert names and names <= set(lazy._ATTRIBUTE_NAMES), sorted(names - set(lazy._ATTRIBUTE_NAMES))
  assert all(k.numpy() is not None for k in keep)
