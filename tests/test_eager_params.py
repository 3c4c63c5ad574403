"""Eager scalar ops whose constant changes every call share one kernel (tiny.engine.eager_params).

Each test counts the kernels built (get_kernel calls) and compares every result bit for bit with the kernel that bakes
the constant in (the shared kernel turned off), and with numpy where one rounding gives the exact answer.
"""
from __future__ import annotations

from typing import Callable, Iterator, List

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.engine import eager_params, realize
from tiny.tensor import Tensor


@pytest.fixture
def kernels_built(monkeypatch: pytest.MonkeyPatch) -> Iterator[List[int]]:
  count = [0]
  orig = realize.get_kernel

  def counting(*args, **kwargs):
    count[0] += 1
    return orig(*args, **kwargs)
  monkeypatch.setattr(realize, "get_kernel", counting)
  eager_params._first_seen.clear()
  eager_params._kernels.clear()
  eager_params._param_ids.clear()
  yield count


def _x(n: int = 16, seed: int = 0, dtype=np.float32) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(n).astype(dtype)).realize()


def _baked(fn: Callable[[float], Tensor], v: float, monkeypatch: pytest.MonkeyPatch) -> bytes:
  with monkeypatch.context() as m:
    m.setattr(eager_params, "try_run", lambda out: False)
    return fn(v).realize().numpy().tobytes()


LRS = [0.001 * (i + 1) + 1e-7 * i for i in range(20)]


def test_twenty_learning_rates_two_kernels(kernels_built: List[int]) -> None:
  x = _x()
  a = x.numpy()
  for lr in LRS:
    got = (x * lr).realize().numpy()
    assert got.tobytes() == (a * np.float32(lr)).tobytes(), lr
  assert kernels_built[0] <= 2


def test_a_repeated_constant_gets_its_own_kernel_found_by_id(kernels_built: List[int], monkeypatch: pytest.MonkeyPatch) -> None:
  # after other values made the shared kernel, a loop with one fixed constant walked its graph and filled constant
  # buffers on every call: from the value's second call on it bakes it in once, and later calls find it by the id
  from tiny.engine import schedule
  x = _x()
  for v in (2.0, 3.0, 4.0):
    (x * v + 1.5).realize()
  walks = []
  orig = schedule._eager_graph
  monkeypatch.setattr(schedule, "_eager_graph", lambda out: (walks.append(out), orig(out))[1])
  y, want = x, x.numpy()
  for i in range(8):
    y = (y * 1.0001 + 0.0001).realize()
    want = want * np.float32(1.0001) + np.float32(0.0001)
    if i == 2:
      walked = len(walks)
  assert len(walks) == walked, "calls after the value repeated still walked the graph"
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)   # (a kernel may fuse the multiply-add: one rounding)


@pytest.mark.parametrize("name", ["mul add", "reversed", "three ops", "float64", "view"])
def test_shared_kernel_is_bit_exact(name: str, kernels_built: List[int], monkeypatch: pytest.MonkeyPatch) -> None:
  x = _x(12, dtype=np.float64 if name == "float64" else np.float32)
  fns = {
    "mul add": lambda v: x * v + 0.5,
    "reversed": lambda v: v * x + v,
    "three ops": lambda v: (x + v) * 1.5 + v,
    "float64": lambda v: x * v + v,
    "view": lambda v: x.reshape(3, 4).T * v + 0.25,
  }
  fn = fns[name]
  got = [fn(v).realize().numpy().tobytes() for v in LRS]
  built = kernels_built[0]
  want = [_baked(fn, v, monkeypatch) for v in LRS]
  assert got == want
  assert built <= 2, built


def test_structures_do_not_share(kernels_built: List[int]) -> None:
  x = _x()
  a = x.numpy()
  for v in LRS[:6]:
    # mul vs add, and a different view, of the same buffer: each structure gets its own kernels
    assert (x * v).realize().numpy().tobytes() == (a * np.float32(v)).tobytes()
    assert (x + v).realize().numpy().tobytes() == (a + np.float32(v)).tobytes()
    assert (x[::2] * v).realize().numpy().tobytes() == (a[::2] * np.float32(v)).tobytes()
    assert (x.flip(0) * v).realize().numpy().tobytes() == (a[::-1] * np.float32(v)).tobytes()
  assert kernels_built[0] <= 8


def test_other_buffers_and_devices_of_a_structure() -> None:
  # the shared kernel reads whichever buffer the chain starts from
  xs = [_x(seed=s) for s in range(4)]
  for i, v in enumerate(LRS[:8]):
    x = xs[i % 4]
    assert (x * v).realize().numpy().tobytes() == (x.numpy() * np.float32(v)).tobytes()


@pytest.mark.parametrize("v", [1 + 2 ** -24, float("nan"), float("inf"), -float("inf"), 1e300, 3.4028235677973366e38])
def test_values_left_baked(v: float, kernels_built: List[int], monkeypatch: pytest.MonkeyPatch) -> None:
  # a float32 midpoint (the C literal rounds its decimal, not the double), NaN, infinities and overflowing values keep
  # the baked kernel: the results are what it gives
  x = Tensor(np.array([1.0, -2.0, 0.5, 3.0, 0.0, -0.0], np.float32)).realize()
  fn: Callable[[float], Tensor] = lambda c: x * c
  for w in (0.25, 0.75):   # the structure has a shared kernel by now
    (x * w).realize()
  assert fn(v).realize().numpy().tobytes() == _baked(fn, v, monkeypatch)
  assert not eager_params._exact(v, dtypes.float32)


def test_exact_check() -> None:
  assert eager_params._exact(0.1, dtypes.float32) and eager_params._exact(1.0001, dtypes.float32)
  assert not eager_params._exact(1 + 2 ** -24, dtypes.float32)   # the midpoint of 1.0 and the next float32
  assert eager_params._exact(1 + 2 ** -24, dtypes.float64)
  assert not eager_params._exact(2, dtypes.float32)   # ints are not passed
  assert not eager_params._exact(0.5, dtypes.float16)


def test_intermediate_realized_falls_back(kernels_built: List[int]) -> None:
  x = _x()
  a = x.numpy()
  for v in LRS[:3]:
    (x * v + 1.0).realize()
  mid = x * 0.125
  out = mid + 1.0
  mid.realize()   # out's graph is one op on mid's buffer now
  np.testing.assert_array_equal(out.realize().numpy(), a * np.float32(0.125) + np.float32(1))


def test_assign_with_changing_values() -> None:
  a = np.random.default_rng(5).standard_normal(16).astype(np.float32)
  x = Tensor(a.copy()).realize()
  want = a.copy()
  for v in LRS[:8]:
    old = x * v + 1.0   # made from x's contents before the assign
    x.assign(x * (1 - v)).realize()
    np.testing.assert_allclose(old.realize().numpy(), want * np.float32(v) + np.float32(1), rtol=1e-6)
    want = want * np.float32(1 - v)
    assert x.numpy().tobytes() == want.tobytes()
