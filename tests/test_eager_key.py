"""The structural ids of eager graphs (tiny.eager_key) and the scalar fast path of Tensor + - * (lazy.scalar_binop).

realize finds an eager op's kernel by the id its top node got when it was built. An id that is too coarse would run a
cached kernel of another graph: each test here builds graphs that differ in one detail (a constant's value or sign, a
dtype, a view, which buffer is read, an intermediate realized since) right after each other and checks the values
against numpy, bit for bit where the kernel is the same expression.
"""
from __future__ import annotations

import math
from typing import List

import numpy as np
import pytest

from tiny import eager_key
from tiny.dtype import dtypes
from tiny.engine import eager_params, schedule
from tiny.helpers import GlobalCounters
from tiny.tensor import Tensor


def _t(a: np.ndarray) -> Tensor:
  return Tensor(a).realize()


def _data(n: int = 16, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@pytest.fixture(autouse=True)
def _fresh_tables(monkeypatch: pytest.MonkeyPatch) -> None:
  # what the worker's earlier tests left must not decide how a first realize here goes: the id table is cleared when
  # full, which could land between two nodes of one graph, and an eager loop of the same structure with other constants
  # leaves a shared kernel (tiny.engine.eager_params) that runs a first graph without remembering it by id. Ids are
  # never reused and the shared kernels are a cache, so fresh tables are safe
  monkeypatch.setattr(eager_key, "_ids", {})
  for name in ("_first_seen", "_kernels", "_param_ids"):
    monkeypatch.setattr(eager_params, name, {})


def _no_walk(monkeypatch: pytest.MonkeyPatch) -> None:
  """Make the structural walk fail: a realize that needs it did not find its kernel by id."""
  def boom(out):
    raise AssertionError("eager graph walked: the id path missed")
  monkeypatch.setattr(schedule, "_eager_graph", boom)


def test_chain_runs_by_id_and_matches_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
  a = _data()
  x = _t(a)
  (x * 1.0001 + 0.0001).realize()   # first time: compiled through the scheduler, remembered by id
  y, want = x, a
  with monkeypatch.context() as m:
    _no_walk(m)
    for _ in range(20):
      y = (y * 1.0001 + 0.0001).realize()
      want = want * np.float32(1.0001) + np.float32(0.0001)
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("vals", [(2.0, 3.0), (0.0, -0.0), (-0.0, 0.0), (float("nan"), 2.0), (float("inf"), float("-inf")),
                                  (1e-45, 0.0), (2, 2.5)])
def test_constant_values_never_share_a_kernel(vals: tuple) -> None:
  a = np.array([-2.0, -0.0, 0.0, 1.5, np.inf, -np.inf, np.nan, 3.0], dtype=np.float32)
  x = _t(a)
  for _ in range(2):   # the second round runs from the caches
    for v in vals:
      got = (x * v).realize().numpy()
      want = a * np.float32(v)
      assert got.tobytes() == want.tobytes(), (v, got, want)
      got = (x + v).realize().numpy()
      want = a + np.float32(v)
      assert got.tobytes() == want.tobytes(), (v, got, want)


def test_dtype_and_shape_are_in_the_id() -> None:
  for _ in range(2):
    for dt, npdt in ((dtypes.float32, np.float32), (dtypes.float16, np.float16), (dtypes.int32, np.int32)):
      for n in (4, 16, 5):
        a = (np.arange(n) - 2).astype(npdt)
        got = (Tensor(a, dtype=dt).realize() * 3 + 2).realize().numpy()
        assert got.dtype == npdt and np.array_equal(got, a * npdt(3) + npdt(2)), (dt, n, got)


def test_int_wraps_like_c() -> None:
  a = np.array([2**31 - 1, -5, 7], dtype=np.int32)
  for _ in range(2):
    got = (_t(a) + 2**32 + 1).realize().numpy()
    assert np.array_equal(got, a + np.int32(1))


def test_views_are_in_the_id() -> None:
  a = _data(12).reshape(3, 4)
  x = _t(a)
  for _ in range(2):
    np.testing.assert_array_equal((x * 2.0 + 1.0).realize().numpy(), a * np.float32(2) + np.float32(1))
    np.testing.assert_array_equal((x.T * 2.0 + 1.0).realize().numpy(), a.T * np.float32(2) + np.float32(1))
    np.testing.assert_array_equal((x[1:] * 2.0 + 1.0).realize().numpy(), a[1:] * np.float32(2) + np.float32(1))
    np.testing.assert_array_equal((x.flip(1) * 2.0 + 1.0).realize().numpy(), a[:, ::-1] * np.float32(2) + np.float32(1))


def test_which_buffer_is_read_is_in_the_id() -> None:
  a, b = _data(seed=1), _data(seed=2)
  x, y = _t(a), _t(b)
  for _ in range(2):
    # the same shape of graph, reading x twice or x and then y: a key without the buffer positions mixes them up
    np.testing.assert_allclose(((x * 2.0) + x).realize().numpy(), a * np.float32(2) + a, rtol=1e-6)
    np.testing.assert_allclose(((x * 2.0) + y).realize().numpy(), a * np.float32(2) + b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(((y * 2.0) + x).realize().numpy(), b * np.float32(2) + a, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal((x * 2.0 * y).realize().numpy(), a * np.float32(2) * b)
    np.testing.assert_array_equal((y * 2.0 * x).realize().numpy(), b * np.float32(2) * a)


def test_reversed_operands() -> None:
  a = _data()
  x = _t(a)
  for _ in range(2):
    # (a multiply-add may be one fused rounding in the kernel)
    np.testing.assert_allclose((2.5 * x + 1.0).realize().numpy(), np.float32(2.5) * a + np.float32(1), rtol=1e-6)
    np.testing.assert_allclose((1.0 + x * 2.5).realize().numpy(), np.float32(1) + a * np.float32(2.5), rtol=1e-6)
    np.testing.assert_array_equal((2.5 * x).realize().numpy(), np.float32(2.5) * a)
    np.testing.assert_array_equal((1.0 + x).realize().numpy(), np.float32(1) + a)
    np.testing.assert_array_equal((2.5 - x).realize().numpy(), np.float32(2.5) - a)


def test_intermediate_realized_after_the_id_was_made() -> None:
  a = _data()
  x = _t(a)
  for _ in range(2):
    (x * 3.0 + 1.0).realize()   # the structure of b's graph, with its intermediate inlined, is cached
  for _ in range(3):
    mid = x * 3.0
    b = mid + 1.0
    before = eager_key.known(b.lazydata)
    assert before is not None and before[1] == (x.lazydata.base,)
    mid.realize()   # now b reads a realized buffer: b's id from before must not be used
    assert eager_key.known(b.lazydata) is None
    np.testing.assert_array_equal(b.numpy(), a * np.float32(3) + np.float32(1))
    np.testing.assert_array_equal(mid.numpy(), a * np.float32(3))


def test_intermediate_forced_to_realize_after_the_id_was_made() -> None:
  a = _data()
  x = _t(a)
  for _ in range(2):
    (x * 3.0 + 1.0).realize()
  mid = x * 3.0
  b = mid + 1.0
  mid.contiguous()   # marks mid forced_realize: b's graph is two kernels now
  assert eager_key.known(b.lazydata) is None
  k0 = GlobalCounters.kernel_count
  np.testing.assert_array_equal(b.numpy(), a * np.float32(3) + np.float32(1))
  assert mid.lazydata.base.realized is not None and GlobalCounters.kernel_count - k0 >= 2
  np.testing.assert_array_equal(mid.numpy(), a * np.float32(3))


def test_assign_in_an_eager_loop() -> None:
  a = _data()
  x = _t(a.copy())
  want = a.copy()
  for _ in range(5):
    x.assign(x * 0.5 + 1.0).realize()
    want = want * np.float32(0.5) + np.float32(1)
  np.testing.assert_array_equal(x.numpy(), want)


def test_read_after_assign_sees_the_old_values() -> None:
  a = _data()
  x = _t(a.copy())
  for _ in range(3):
    old = x * 2.0 + 1.0   # made from x's contents before the assign
    x.assign(x * 0.0 + 5.0)
    x.realize()
    np.testing.assert_array_equal(x.numpy(), np.full(16, 5, np.float32))
    np.testing.assert_array_equal(old.numpy(), a * np.float32(2) + np.float32(1))
    x.assign(Tensor(a.copy())).realize()


def test_folds_still_apply() -> None:
  x = _t(_data())
  for t in (x + -0.0, x * 1.0, -0.0 + x, 1 * x):
    assert t.lazydata is x.lazydata
  # x + 0.0 is no fold for floats: it turns -0.0 into +0.0 (IEEE, numpy)
  assert (x + 0.0).lazydata is not x.lazydata and (0 + x).lazydata is not x.lazydata
  assert (x * -1.0).lazydata.base.op.name == "NEG"


def test_autograd_through_scalar_ops() -> None:
  a = _data()
  x = Tensor(a, requires_grad=True)
  y = (x * 3.0 + 1.0) * x
  y.sum().backward()
  assert x.grad is not None
  np.testing.assert_allclose(x.grad.numpy(), 6 * a + 1, rtol=1e-6)
  # a result of a tensor that needs no gradient has none, and keeps requires_grad as the general path sets it
  for rg in (None, False):
    z = Tensor(a, requires_grad=rg) * 2.0
    assert z.requires_grad is rg and z._ctx is None


def test_metadata_names_the_op() -> None:
  x = _t(_data())
  t = x * 2.0 + 1.0
  names: List[str] = [m.name for m in t.schedule()[0].metadata]
  assert "__mul__" in names and "__add__" in names


def test_realized_result_does_not_hold_its_inputs() -> None:
  import gc
  import weakref
  x = _t(_data())
  (x * 2.0 + 1.0).realize()
  y = _t(_data(seed=3))
  ref = weakref.ref(y.lazydata)
  z = (y * 2.0 + 1.0).realize()
  del y
  gc.collect()
  assert ref() is None, "a realized result keeps its input alive"
  assert math.isfinite(float(z.numpy()[0]))


def test_contiguous_reads_key_by_shape_and_other_views_by_tracker(monkeypatch: pytest.MonkeyPatch) -> None:
  """A realized x read through a contiguous tracker keys by its shape (whatever tracker object it is): a whole base, the
  head of a larger base, a result; a strided or offset read of the same shape must get an id of its own. Bit for bit
  what the full path (no eager ids) gives, and close to numpy (the kernel may fuse the multiply-add)."""
  from tiny.engine import realize
  big = np.random.default_rng(3).standard_normal(32).astype(np.float32)
  b = _t(big)
  whole = _t(big[:16].copy())
  reads = [("whole", whole, big[:16]), ("head", b.shrink(((0, 16),)), big[:16]), ("tail", b.shrink(((16, 32),)), big[16:]),
           ("strided", b.reshape(16, 2)[:, 1], big.reshape(16, 2)[:, 1]), ("result", (whole * 2.0).realize(), big[:16] * 2)]
  with monkeypatch.context() as m:
    m.setattr(realize, "realize_eager", lambda lb: False)
    full = {name: (x * 1.25 + 0.5).realize().numpy() for name, x, _ in reads}
  for _ in range(3):
    for name, x, a in reads:
      got = (x * 1.25 + 0.5).realize().numpy()
      assert got.tobytes() == full[name].tobytes(), name
      np.testing.assert_allclose(got, a * np.float32(1.25) + np.float32(0.5), rtol=1e-6, err_msg=name)
