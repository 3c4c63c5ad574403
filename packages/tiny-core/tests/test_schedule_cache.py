"""The schedule cache: a multi-kernel graph of a structure scheduled before reuses that schedule on its own buffers.

Every test checks the values against numpy, and that the cache was (or was not) used, by its counters."""
import contextlib
from typing import Callable, Iterator, List

import numpy as np
import pytest

from tiny.engine import schedule
from tiny.engine.jit import TinyJit
from tiny.helpers import Context
from tiny.ops import BufferOps, MetaOps
from tiny.registry import Device
from tiny.shape.symbolic import Variable
from tiny.tensor import Tensor

COMPUTE = [d for d in ("CLANG", "PYTHON") if d in Device.get_available_devices()]


@pytest.fixture(params=COMPUTE)
def device(request: pytest.FixtureRequest) -> str:
  return str(request.param)


def _data(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class _Counts:
  """Cache hits and stores inside `with counts.counting():` blocks (realizing the inputs copies them: not counted)."""

  def __init__(self) -> None:
    self.hits = self.stores = 0

  @contextlib.contextmanager
  def counting(self) -> Iterator[None]:
    h, s = schedule.schedule_cache_stats.hits, schedule.schedule_cache_stats.stores
    try:
      yield
    finally:
      self.hits += schedule.schedule_cache_stats.hits - h
      self.stores += schedule.schedule_cache_stats.stores - s


def _full_schedule(build: Callable[[], List[Tensor]], monkeypatch: pytest.MonkeyPatch):
  """The schedule the full analysis gives, with the cache out of the way."""
  with monkeypatch.context() as m:
    m.setattr(schedule, "_graph_structure", lambda outs: None)
    outs = build()
    return outs[0].schedule(*outs[1:])


def _close(t: Tensor, ref: np.ndarray) -> None:
  np.testing.assert_allclose(t.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_second_graph_of_a_structure_hits_with_new_buffers(device: str) -> None:
  a, b = _data(6, 5, seed=1), _data(6, 5, seed=2)
  x, y = Tensor(a, device=device).realize(), Tensor(b, device=device).realize()
  n = _Counts()
  with n.counting():
    first = (x.sum(1, keepdim=True) + x).realize()
  assert (n.stores, n.hits) == (1, 0)
  _close(first, a.sum(1, keepdims=True) + a)
  # same structure on another input: the cached schedule, bound to y's buffer
  with n.counting():
    second = (y.sum(1, keepdim=True) + y).realize()
  assert (n.stores, n.hits) == (1, 1)
  _close(second, b.sum(1, keepdims=True) + b)
  # and on x again: nothing of y's binding stays behind
  with n.counting():
    third = (x.sum(1, keepdim=True) + x).realize()
  assert (n.stores, n.hits) == (1, 2)
  _close(third, a.sum(1, keepdims=True) + a)
  _close(second, b.sum(1, keepdims=True) + b)


def test_cached_schedule_equals_the_full_analysis(monkeypatch: pytest.MonkeyPatch) -> None:
  a, b = _data(8, 4, seed=3), _data(8, 4, seed=4)
  x, y = Tensor(a).realize(), Tensor(b).realize()

  def build() -> List[Tensor]:
    return [(x * y).sum(0, keepdim=True).exp() * y + x.max()]

  build()[0].realize()
  n = _Counts()
  with n.counting():
    cached = build()[0].schedule()
  assert n.hits == 1 and len(cached) >= 2
  full = _full_schedule(build, monkeypatch)
  assert [si.ast for si in cached] == [si.ast for si in full]
  assert [len(si.bufs) for si in cached] == [len(si.bufs) for si in full]
  assert [[b.size for b in si.bufs] for si in cached] == [[b.size for b in si.bufs] for si in full]
  _close(build()[0], np.exp((a * b).sum(0, keepdims=True)) * b + a.max())


def test_same_leaf_twice_and_two_leaves_are_other_structures() -> None:
  a, b = _data(5, 7, seed=5), _data(5, 7, seed=6)
  x, y = Tensor(a).realize(), Tensor(b).realize()
  n = _Counts()
  with n.counting():
    once = (x.sum(1, keepdim=True) + x).realize()
    # x's reduce added to y is not the graph above (which reads one buffer twice): a schedule of its own
    mixed = (x.sum(1, keepdim=True) + y).realize()
  assert (n.stores, n.hits) == (2, 0)
  with n.counting():
    swapped = (y.sum(1, keepdim=True) + x).realize()
  assert (n.stores, n.hits) == (2, 1)
  _close(once, a.sum(1, keepdims=True) + a)
  _close(mixed, a.sum(1, keepdims=True) + b)
  _close(swapped, b.sum(1, keepdims=True) + a)


def test_a_changed_shape_or_constant_is_another_structure() -> None:
  n = _Counts()
  for shape in [(4, 5), (6, 3), (4, 5)]:
    a = _data(*shape, seed=sum(shape))
    x = Tensor(a).realize()
    with n.counting():
      out = (x.sum(1, keepdim=True) * 3 + x).realize()
    _close(out, a.sum(1, keepdims=True) * 3 + a)
  assert (n.stores, n.hits) == (2, 1)
  # another constant: another kernel, not the cached one with 3
  with n.counting():
    out = (x.sum(1, keepdim=True) * 4 + x).realize()
  assert (n.stores, n.hits) == (3, 1)
  _close(out, a.sum(1, keepdims=True) * 4 + a)
  # -0.0 and 0.0 are equal, but not the same kernel
  for c in [0.0, -0.0, 0.0, -0.0]:
    out = ((x.sum(1, keepdim=True) + x).contiguous() * c).realize()
    np.testing.assert_array_equal(np.signbit(out.numpy()), np.signbit((a.sum(1, keepdims=True) + a) * np.float32(c)))


def test_split_reduce_of_a_long_vector() -> None:
  if "CLANG" not in COMPUTE:
    pytest.skip("needs CLANG")
  n = _Counts()
  for seed in range(3):
    # 256 rows of 259: a length no other test sums (a structure another test scheduled first would make the first call a hit)
    a = _data(256 * 259, seed=seed)
    x = Tensor(a, device="CLANG").realize()
    with n.counting():
      assert len(x.sum().schedule()) == 2, "the reduce is split in two kernels"
      out = x.sum().realize()
    np.testing.assert_allclose(out.numpy(), a.sum(dtype=np.float64), rtol=1e-4)
  assert (n.stores, n.hits) == (1, 5)


def test_assign_in_place_updates_repeat_from_the_cache(device: str) -> None:
  w0, g = _data(4, 6, seed=10), _data(4, 6, seed=11)
  w, x = Tensor(w0.copy(), device=device).realize(), Tensor(g, device=device).realize()
  ref = w0.copy()
  n = _Counts()
  for _ in range(4):
    # a reduce kernel that reads w, then the assign's kernel that overwrites it: the read must run first
    with n.counting():
      w.assign(w - w.mean(1, keepdim=True) * 0.5 + x).realize()
    ref = ref - ref.mean(1, keepdims=True) * np.float32(0.5) + g
    _close(w, ref)
  assert (n.stores, n.hits) == (1, 3)


def test_read_of_the_old_contents_outside_the_graph_is_kept() -> None:
  w0 = _data(3, 5, seed=12)
  w = Tensor(w0.copy()).realize()
  ref = w0.copy()
  n = _Counts()
  for _ in range(3):
    old = w * 2   # made from the contents before the assign, and not part of the assign's graph
    with n.counting():
      w.assign(w.sum(1, keepdim=True) + w).realize()
    _close(old, ref * 2)
    ref = ref.sum(1, keepdims=True) + ref
    _close(w, ref)
  assert n.hits == 0, "a graph that pulls in a stale reader is scheduled in full"
  for _ in range(3):
    with n.counting():
      w.assign(w.sum(1, keepdim=True) + w).realize()
    ref = ref.sum(1, keepdims=True) + ref
    _close(w, ref)
  assert n.hits == 2


def test_multi_output_kernel() -> None:
  n = _Counts()
  for seed in range(3):
    a = np.abs(_data(5, 8, seed=20 + seed))
    x = Tensor(a).realize()
    s = (x * 2).sum(1)
    o1, o2 = s + 1, s.sqrt()
    with n.counting():
      sched = o1.schedule(o2)
    assert any(len(si.ast.src) == 2 and all(st.op is BufferOps.STORE for st in si.ast.src) for si in sched if si.ast.op is MetaOps.KERNEL)
    s = (x * 2).sum(1)
    o1, o2 = s + 1, s.sqrt()
    with n.counting():
      Tensor.realize(o1, o2)
    _close(o1, (a * 2).sum(1) + 1)
    _close(o2, np.sqrt((a * 2).sum(1)))
  assert (n.stores, n.hits) == (1, 5)
  with Context(MULTIOUTPUT=0):
    x = Tensor(_data(5, 8, seed=30)).realize()
    s = (x * 2).sum(1)
    # the knob is part of the key: no multi-output kernel from the cache
    assert all(len(si.ast.src) == 1 for si in (s + 1).schedule(s.sqrt()) if si.ast.op is MetaOps.KERNEL)


def test_views_of_the_output_and_intermediates() -> None:
  n = _Counts()
  for seed in range(3):
    a = _data(6, 4, seed=40 + seed)
    x = Tensor(a).realize()
    with n.counting():
      out = ((x.sum(1, keepdim=True) + x).contiguous() * 2).T[1:3].realize()
    _close(out, ((a.sum(1, keepdims=True) + a) * 2).T[1:3])
  assert (n.stores, n.hits) == (1, 2)


def test_intermediates_are_fresh_buffers_each_call() -> None:
  a = _data(6, 4, seed=50)
  x = Tensor(a).realize()
  # a sum over the leading axis: a row-wise sum would become one row kernel with no intermediate (see row_fusion.py)
  scheds = [(x.sum(0, keepdim=True) + x).schedule() for _ in range(2)]
  assert [len(s) for s in scheds] == [2, 2]
  assert scheds[0][0].outputs[0] is not scheds[1][0].outputs[0], "a cached schedule writes the new graph's buffers"
  for s in scheds:
    assert s[0].outputs[0] in s[1].inputs and x.lazydata.buffer in s[1].inputs


def test_symbolic_values_are_part_of_the_key() -> None:
  full = _data(10, 3, seed=60)
  t = Tensor(full).realize()
  n = _Counts()
  for k in [3, 5, 3, 5]:
    x = t.shrink(((0, Variable("i", 1, 10).bind(k)), None))
    with n.counting():
      out = (x.sum(0, keepdim=True) + x).sum(0).realize()
    _close(out, (full[:k].sum(0, keepdims=True) + full[:k]).sum(0))
  assert (n.stores, n.hits) == (2, 2)


def test_copy_between_devices() -> None:
  if "PYTHON" not in COMPUTE or "CLANG" not in COMPUTE:
    pytest.skip("needs CLANG and PYTHON")
  n = _Counts()
  for seed in range(3):
    a = _data(4, 4, seed=70 + seed)
    x = Tensor(a, device="CLANG").realize()
    with n.counting():
      out = ((x.sum(1, keepdim=True) + x).to("PYTHON") * 2).realize()
    assert out.device == "PYTHON"
    _close(out, (a.sum(1, keepdims=True) + a) * 2)
  assert (n.stores, n.hits) == (1, 2)


def test_jit_capture_through_cached_schedules(device: str) -> None:
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    return ((x.sum(1, keepdim=True) + y) * x.max()).realize()

  warm = Tensor(_data(3, 4, seed=80), device=device).realize()
  (warm.sum(1, keepdim=True) + warm).realize()   # cache the structures the jit's graph is built of, or near them
  for i in range(5):
    a, b = _data(3, 4, seed=81 + i), _data(3, 4, seed=91 + i)
    out = step(Tensor(a, device=device).realize(), Tensor(b, device=device).realize())
    np.testing.assert_allclose(out.numpy(), (a.sum(1, keepdims=True) + b) * a.max(), rtol=1e-5, atol=1e-5)
  assert step.cnt >= 5


def test_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(schedule, "_SCHEDULES_MAX", 2)
  for k in range(2, 6):
    a = _data(k, 3, seed=k)
    x = Tensor(a).realize()
    np.testing.assert_allclose((x.sum(1, keepdim=True) + x).numpy(), a.sum(1, keepdims=True) + a, rtol=1e-5, atol=1e-5)
    assert len(schedule._schedules) <= 2


def test_memory_planner_still_shares_on_a_hit() -> None:
  a = _data(4, 4, seed=100)
  x = Tensor(a).realize()

  def build() -> Tensor:
    # a chain of realized intermediates: the first and the third live in turns, so they can share one buffer
    b1 = (x + 1).contiguous()
    b2 = (b1 * 2).contiguous()
    b3 = (b2 + 3).contiguous()
    return b3 * 4

  def sharing(sched: List) -> List[int]:
    bases = [b.base for si in sched for b in si.bufs]
    return [bases.index(b) for b in bases]

  n = _Counts()
  with n.counting():
    full, cached = build().schedule(), build().schedule()
  assert (n.stores, n.hits) == (1, 1)
  assert len(full) == 4 and sharing(cached) == sharing(full)
  assert len({si.outputs[0] for si in cached}) == 3, "the planner gave two of the four kernels one buffer"
  for _ in range(2):
    _close(build(), ((a + 1) * 2 + 3) * 4)


def test_an_intermediate_the_caller_holds_keeps_its_value() -> None:
  n = _Counts()
  for seed in range(3):
    a = _data(5, 3, seed=110 + seed)
    x = Tensor(a).realize()
    # realized by the schedule as an intermediate (it is broadcast; a sum along the rows would be inlined in a row kernel)
    s = (x * 3).sum(0, keepdim=True)
    with n.counting():
      out = (s + x).exp().realize()
    _close(out, np.exp((a * 3).sum(0, keepdims=True) + a))
    assert s.lazydata.base.realized is not None
    _close(s, (a * 3).sum(0, keepdims=True))
  assert (n.stores, n.hits) == (1, 2)
