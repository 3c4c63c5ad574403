"""The eager fast path must give exactly what the full scheduler gives.

An eager op seen before (same graph structure: ops, constants, dtypes, trackers) is realized by `realize_eager` straight
from a cached kernel AST and runner, skipping the schedule, the memory plan and the ExecItem. Each test here checks the
shortcut against the full analysis (same kernel AST, same buffers) and against numpy, and that it stays out of the way
where it must not apply: unrealized intermediates that are expanded, padded or reduced, symbolic shapes, several outputs,
assigns, a TinyJit capture and stats turned off.
"""
from __future__ import annotations

import gc
from typing import Callable, Dict, Tuple

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.engine import eager_params, realize, schedule
from tiny.engine.jit import TinyJit
from tiny.helpers import Context, GlobalCounters
from tiny.lazy import lazycache
from tiny.ops import BinaryOps
from tiny.registry import Device
from tiny.shape.symbolic import Variable
from tiny.tensor import Tensor

COMPUTE = [d for d in ("CLANG", "PYTHON") if d in Device.get_available_devices()]


@pytest.fixture(params=COMPUTE)
def device(request: pytest.FixtureRequest) -> str:
  return str(request.param)


def _data(shape: Tuple[int, ...], seed: int, dtype=np.float32) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(shape) * 2).astype(dtype)


def _full_ast(t: Tensor, monkeypatch: pytest.MonkeyPatch):
  """The kernel ASTs the full analysis (no eager shortcut at all) gives for t."""
  with monkeypatch.context() as m:
    m.setattr(schedule, "_flat_item", lambda outs, seen: None)
    return [si.ast for si in t.schedule()]


OPS: Dict[str, Tuple[Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
  "mul const": (lambda x, y: x * 1.0001, lambda a, b: a * np.float32(1.0001)),
  "const first": (lambda x, y: 2.5 - x, lambda a, b: np.float32(2.5) - a),
  "add": (lambda x, y: x + y, lambda a, b: a + b),
  "same input twice": (lambda x, y: x * x, lambda a, b: a * a),
  "permuted input": (lambda x, y: x.T * y.T, lambda a, b: (a * b).T),
  "shrunk input": (lambda x, y: x[1:3] + y[2:4], lambda a, b: a[1:3] + b[2:4]),
  "exp chain": (lambda x, y: x.exp(), lambda a, b: np.exp(a)),
  "where": (lambda x, y: (x < y).where(x, y * 2), lambda a, b: np.where(a < b, a, b * 2)),
  "sum": (lambda x, y: (x * y).sum(1), lambda a, b: (a * b).sum(1)),
  "cast": (lambda x, y: (x * 3).cast(dtypes.int32), lambda a, b: (a * 3).astype(np.int32)),
  "arange": (lambda x, y: x - Tensor.arange(30, device=x.device).reshape(5, 6).cast(dtypes.float32),
             lambda a, b: a - np.arange(30, dtype=np.float32).reshape(5, 6)),
  "arange step": (lambda x, y: y * Tensor.arange(3, 63, 2, device=x.device).reshape(6, 5).T,
                  lambda a, b: b * np.arange(3, 63, 2).reshape(6, 5).T.astype(np.float32)),
}


@pytest.mark.parametrize("name", list(OPS))
def test_fast_path_matches_full_analysis_and_numpy(name: str, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
  f, ref = OPS[name]
  # this checks the kernel with the constants baked in: an earlier test may have run "mul const"'s structure with other
  # constants, which makes it run the shared kernel of tests/test_eager_params.py instead
  monkeypatch.setattr(eager_params, "try_run", lambda out: False)
  a, b = _data((5, 6), 1), _data((5, 6), 2)
  x, y = Tensor(a, device=device).realize(), Tensor(b, device=device).realize()
  first = f(x, y).realize()   # a new structure: the full path runs and remembers it
  # the same op on new buffers of the same layout (equal LazyBuffers would be deduplicated to the realized one)
  x, y = Tensor(a, device=device).realize(), Tensor(b, device=device).realize()
  t = f(x, y)
  hit = schedule.eager_kernel(t.lazydata.base)
  assert hit is not None, "a structure scheduled before must take the fast path"
  # (on a third pair: scheduling without running would leave t's LazyBuffer marked as computed)
  assert [hit[0]] == _full_ast(f(Tensor(a, device=device).realize(), Tensor(b, device=device).realize()), monkeypatch)
  assert {id(b.buffer) for b in hit[1]} <= {id(x.lazydata.base.buffer), id(y.lazydata.base.buffer)}
  assert realize.realize_eager(t.lazydata)
  for got in (first, t):
    np.testing.assert_allclose(got.numpy(), ref(a, b), rtol=1e-5, atol=1e-5)


def test_loop_reuses_kernel_with_new_buffers(device: str) -> None:
  a = _data((4, 4), 3)
  x, want = Tensor(a, device=device).realize(), a.copy()
  GlobalCounters.reset()
  for _ in range(20):
    x = (x * 1.5 + 0.25).realize()
    want = want * np.float32(1.5) + np.float32(0.25)
  assert GlobalCounters.kernel_count == 20
  np.testing.assert_allclose(x.numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_dtypes_do_not_share_a_fast_kernel(dtype, device: str) -> None:
  a = (_data((3, 4), 4) * 3).astype(dtype)
  outs = []
  for dt in (np.float32, dtype, np.float32, dtype):
    x = Tensor(a.astype(dt), device=device).realize()
    outs.append(((x * 3) + 1).realize().numpy())
    np.testing.assert_allclose(outs[-1], a.astype(dt) * dt(3) + dt(1), rtol=1e-3)
    assert outs[-1].dtype == dt


def test_constants_and_signed_zero_do_not_share_a_fast_kernel(device: str) -> None:
  a = _data((8,), 5)
  x = Tensor(a, device=device).realize()
  for c in (2.0, 3.0, -0.0, 0.0, 2.0, -0.0):
    for _ in range(2):
      got = (x * c).realize().numpy()
      np.testing.assert_array_equal(np.signbit(got), np.signbit(a * np.float32(c)))
      np.testing.assert_allclose(got, a * np.float32(c))


def test_unrealized_intermediates_take_the_full_path(monkeypatch: pytest.MonkeyPatch) -> None:
  # an expanded, padded or reduced intermediate changes what gets a kernel: never the one-kernel shortcut
  a, b = _data((5, 6), 6), _data((5, 6), 7)
  cases = [
    (lambda x, y: (x[:, :1] * 2 + 1).expand(5, 6) * y, (a[:, :1] * 2 + 1) * b),
    (lambda x, y: (x + 1).pad(((1, 1), (0, 0))).exp(), np.exp(np.pad(a + 1, ((1, 1), (0, 0))))),
    (lambda x, y: x.sum(1, keepdim=True) + x, a.sum(1, keepdims=True) + a),
    (lambda x, y: (x * 2).contiguous() + y, a * 2 + b),
  ]
  for f, want in cases:
    for _ in range(2):
      t = f(Tensor(a).realize(), Tensor(b).realize())
      assert schedule.eager_kernel(t.lazydata.base) is None
      fast = [si.ast for si in f(Tensor(a).realize(), Tensor(b).realize()).schedule()]
      assert fast == _full_ast(f(Tensor(a).realize(), Tensor(b).realize()), monkeypatch)
      np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-5)


def test_symbolic_shapes_are_never_cached() -> None:
  a = _data((10,), 8)
  x = Tensor(a).realize()
  for n in (3, 5, 3, 7):
    v = Variable("n", 1, 10).bind(n)
    for _ in range(2):
      t = x.shrink(((0, v),)) * 2
      assert schedule.eager_kernel(t.lazydata.base) is None
      got = np.frombuffer(t.realize().lazydata.base.buffer.as_buffer(), np.float32)[:n]
      np.testing.assert_allclose(got, a[:n] * 2, rtol=1e-6)


def test_several_outputs_and_assign_take_the_full_path() -> None:
  a, b = _data((6,), 9), _data((6,), 10)
  x, y = Tensor(a).realize(), Tensor(b).realize()
  for _ in range(2):
    p, q = x * y, x + y
    p.realize(q)
    np.testing.assert_allclose(p.numpy(), a * b, rtol=1e-6)
    np.testing.assert_allclose(q.numpy(), a + b, rtol=1e-6)
  t = Tensor(a.copy()).realize()
  for i in range(3):
    old = t * 2          # reads t before the assign: must see the old contents
    t.assign(t + 1).realize()
    np.testing.assert_allclose(old.numpy(), (a + i) * 2, rtol=1e-6)
  np.testing.assert_allclose(t.numpy(), a + 3, rtol=1e-6)


def test_inputs_on_another_device_raise_as_before() -> None:
  if not {"PYTHON", "CLANG"} <= set(Device.get_available_devices()):
    pytest.skip("needs CLANG and PYTHON")
  a = _data((4,), 11)
  x = Tensor(a, device="CLANG").realize()
  (x + Tensor(a, device="CLANG")).realize()   # the same structure on one device, so the fast path knows it
  for _ in range(2):
    y = Tensor(a, device="PYTHON").realize()
    mixed = Tensor(x.lazydata.e(BinaryOps.ADD, y.lazydata))
    with pytest.raises(RuntimeError, match="one device"):
      mixed.realize()


def test_jit_capture_still_sees_every_kernel() -> None:
  @TinyJit
  def step(x: Tensor) -> Tensor:
    return (x * 2 + 1).realize()

  for i in range(5):
    a = _data((8,), 20 + i)
    np.testing.assert_allclose(step(Tensor(a).realize()).numpy(), a * 2 + 1, rtol=1e-6)
  assert step.jit_cache, "the capture recorded no kernel"


def test_no_stats_takes_the_full_path() -> None:
  a = _data((8,), 12)
  x = Tensor(a).realize()
  (x * 4).realize()
  GlobalCounters.reset()
  t = (x * 4).realize(do_update_stats=False)
  assert GlobalCounters.kernel_count == 0
  np.testing.assert_allclose(t.numpy(), a * 4, rtol=1e-6)


def test_noopt_switch_gets_its_own_runner() -> None:
  a = _data((16, 16), 13)
  x = Tensor(a).realize()
  runners = []
  for noopt in (0, 1, 0):
    with Context(NOOPT=noopt):
      for _ in range(2):
        t = (x * 3 - 1)
        t.realize()
        np.testing.assert_allclose(t.numpy(), a * 3 - 1, rtol=1e-5)
      hit = schedule.eager_kernel((x * 3 - 1).lazydata.base)
      assert hit is not None
      runners.append(realize._runner_for("CLANG" if "CLANG" in COMPUTE else COMPUTE[0], hit[0])[0])
  assert runners[0] is runners[2] and runners[0] is not runners[1]


def test_lazy_cache_forgets_dead_buffers() -> None:
  x = Tensor(_data((8,), 14)).realize()
  for _ in range(5):
    x = (x * 1.5).realize()
  gc.collect()
  n = len(lazycache)
  for _ in range(50):
    x = (x * 1.5).exp().realize()
  gc.collect()
  assert len(lazycache) <= n + 10


def test_intermediates_share_memory_without_buffers_up_front() -> None:
  # bases make their Buffer on first use; the memory planner still sees the private intermediates of a schedule
  a = _data((64,), 15)
  x = Tensor(a).realize()
  t = ((x.sum(0, keepdim=True) + x).sum(0, keepdim=True) + x).sum()
  const = x.lazydata.const(2.0)
  assert not hasattr(const.base, "_buffer"), "a constant got a Buffer it never needs"
  got = t.numpy()
  s1 = a.sum() + a
  np.testing.assert_allclose(got, (s1.sum() + a).sum(), rtol=1e-4)


def test_layouts_of_one_structure_do_not_share_a_fast_kernel(device: str) -> None:
  # the same ops on inputs read through different views (transposed, flipped, padded, broadcast) of one output shape
  a, b = _data((4, 4), 16), _data((4, 4), 17)
  views = [
    (lambda t: t, lambda n: n),
    (lambda t: t.T, lambda n: n.T),
    (lambda t: t.flip(0), lambda n: n[::-1]),
    (lambda t: t[:3].pad(((1, 0), (0, 0))), lambda n: np.pad(n[:3], ((1, 0), (0, 0)))),
    (lambda t: t[:, :1].expand(4, 4), lambda n: np.broadcast_to(n[:, :1], (4, 4))),
  ]
  for _ in range(2):
    for vx, nx in views:
      for vy, ny in views:
        x, y = Tensor(a, device=device).realize(), Tensor(b, device=device).realize()
        np.testing.assert_allclose((vx(x) * 2 + vy(y)).realize().numpy(), nx(a) * 2 + ny(b), rtol=1e-6)
