"""Eager plans: realize_eager runs an eager op whose structural id it has seen before straight from a plan (runner,
argument sources, settings it was chosen under), and a CPU kernel through its direct call (the kernel function on the
buffers, one core). Each test compares against the full path (realize_eager off) bit for bit, or checks that a plan
made under other settings, devices or core counts is not used.

Each test has a shape of its own: a structure that another test ran with other constants runs through the kernel that
reads its constants from buffers (eager_params), which has no plan.
"""
from __future__ import annotations

from typing import Callable, List

import numpy as np
import pytest

from tiny.engine import realize
from tiny.helpers import Context, GlobalCounters
from tiny.lazy import LazyBuffer
from tiny.registry import Device
from tiny.tensor import Tensor

CPU = [d for d in ("CLANG", "LLVM") if d in Device.get_available_devices()]


@pytest.fixture(params=CPU)
def device(request: pytest.FixtureRequest) -> str:
  return str(request.param)


def _loop(x: Tensor, n: int, step: Callable[[Tensor], Tensor]) -> np.ndarray:
  y = x
  for _ in range(n):
    y = step(y).realize()
  return y.numpy()


def _without_eager(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], np.ndarray]) -> np.ndarray:
  with monkeypatch.context() as m:
    m.setattr(realize, "realize_eager", lambda lb: False)
    return fn()


def _plan_of(t: Tensor) -> realize._EagerPlan:
  ek = t.lazydata.base._ekey
  assert ek is not None, "a scalar op on a realized tensor has an id"
  return realize._plans[ek[1]]


def test_plan_matches_the_full_path_bit_for_bit(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
  a = np.random.default_rng(0).standard_normal(37).astype(np.float32)
  x = Tensor(a, device=device).realize()

  def steps() -> np.ndarray:
    return _loop(x, 30, lambda y: (y * 1.0001 + 0.0001) * -0.75 + 3.0)

  fast, full = steps(), _without_eager(monkeypatch, steps)
  assert fast.tobytes() == full.tobytes()
  assert _plan_of((x * 1.0001 + 0.0001) * -0.75 + 3.0).dname == device


def test_plan_counts_kernels_and_ops(device: str) -> None:
  x = Tensor(np.arange(21, dtype=np.float32), device=device).realize()
  _loop(x, 3, lambda y: y * 2.0 + 1.0)
  GlobalCounters.reset()
  _loop(x, 5, lambda y: y * 2.0 + 1.0)
  plan = _plan_of(x * 2.0 + 1.0)
  assert GlobalCounters.kernel_count == 5
  assert GlobalCounters.global_ops == 5 * plan.ops and plan.ops > 0
  assert GlobalCounters.global_mem == 5 * plan.mem and plan.mem > 0


def test_cpu_kernels_run_through_the_direct_call(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
  from tiny_clang.settings import THREADS
  x = Tensor(np.ones(27, dtype=np.float32), device=device).realize()
  _loop(x, 3, lambda y: y * 3.0)
  plan = _plan_of(x * 3.0)
  assert plan.direct is not None
  calls: List[int] = []
  monkeypatch.setattr(type(plan.runner), "__call__", lambda *a, **k: calls.append(1))
  # one core for sure (a first run slowed down by a busy machine may have made the kernel parallel)
  with THREADS.override(1):
    out = _loop(x, 4, lambda y: y * 3.0)
  assert not calls, "the runner (argument array, pool) was used instead of the direct call"
  np.testing.assert_array_equal(out, np.full(27, 81.0, np.float32))


def test_several_threads_go_through_the_pool(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
  from tiny_clang.settings import THREADS
  a = np.random.default_rng(1).standard_normal(4099).astype(np.float32)
  x = Tensor(a, device=device).realize()
  ref = _loop(x, 3, lambda y: y * 0.5 + 0.25)
  plan = _plan_of(x * 0.5 + 0.25)
  if not plan.runner.clprg.parallel:
    pytest.skip("the kernel has no parallel loop here")
  used: List[int] = []
  prog = plan.runner.clprg
  real = prog.pool.run1
  with THREADS.override(2):
    assert not prog.direct(*[b._buf for b in (x.lazydata.buffer, x.lazydata.buffer)])
    with monkeypatch.context() as m:
      m.setattr(prog.pool, "run1", lambda *args: used.append(args[3]) or real(*args))
      out = _loop(x, 3, lambda y: y * 0.5 + 0.25)
  assert used and all(t == 2 for t in used)
  assert out.tobytes() == ref.tobytes()


def test_settings_and_devices_do_not_share_a_plan(monkeypatch: pytest.MonkeyPatch) -> None:
  if len(CPU) < 2:
    pytest.skip("needs CLANG and LLVM")
  a = np.random.default_rng(2).standard_normal(29).astype(np.float32)
  xs = {d: Tensor(a, device=d).realize() for d in CPU}
  seen = set()
  for d in CPU + CPU:   # one id (the structure is the same), two devices in turn
    out = _loop(xs[d], 2, lambda y: y * 1.5 + 2.0)
    assert out.tobytes() == _without_eager(monkeypatch, lambda: _loop(xs[d], 2, lambda y: y * 1.5 + 2.0)).tobytes()
    seen.add(_plan_of(xs[d] * 1.5 + 2.0).runner.dname)
  assert seen == set(CPU)
  x = xs[CPU[0]]
  runners = []
  for noopt in (0, 1, 0):
    with Context(NOOPT=noopt):
      _loop(x, 2, lambda y: y * 1.5 + 2.0)
      runners.append(_plan_of(x * 1.5 + 2.0).runner)
  assert runners[0] is runners[2] and runners[0] is not runners[1]


def test_a_stale_id_takes_the_full_path(device: str) -> None:
  # an intermediate that gets realized changes the graph its reader's id described: the plan must not be used
  a = np.arange(13, dtype=np.float32)
  x = Tensor(a, device=device).realize()
  _loop(x, 2, lambda y: y * 2.0 + 1.0)
  mid = x * 2.0
  top = mid + 1.0
  mid.realize()
  assert isinstance(top.lazydata, LazyBuffer)
  np.testing.assert_array_equal(top.realize().numpy(), a * 2 + 1)
  np.testing.assert_array_equal(mid.numpy(), a * 2)
