"""Realizing and jitting from several threads: each thread gets correct results, and a TinyJit's capture stays its own.

The races are made deterministic by slowing down the window in which they happened (between scheduling and running
kernels, and inside the function being captured), so these tests fail reliably without the locks.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, List

import numpy as np
import pytest

from tiny.engine import realize
from tiny.engine.jit import TinyJit
from tiny.tensor import Tensor


def _in_threads(n: int, fn: Callable[[int], Any]) -> List[Any]:
  out: List[Any] = [None] * n
  start = threading.Barrier(n)

  def run(i: int) -> None:
    start.wait()
    try:
      out[i] = fn(i)
    except Exception as e:   # reported by the test, not lost in the thread
      out[i] = e
  ths = [threading.Thread(target=run, args=(i,)) for i in range(n)]
  for t in ths:
    t.start()
  for t in ths:
    t.join(60)
  return out


def test_threads_realizing_one_lazy_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
  slow_lower = realize.lower_schedule

  def lower(schedule: Any) -> Any:
    time.sleep(0.05)   # another thread now sees the graph scheduled but not yet computed
    yield from slow_lower(schedule)
  monkeypatch.setattr(realize, "lower_schedule", lower)
  x = np.arange(64, dtype=np.float32)
  t = (Tensor(x) * 2 + 1).sum() + Tensor(x)[:5].sum()
  got = _in_threads(4, lambda i: t.numpy())
  want = (x * 2 + 1).sum() + x[:5].sum()
  for g in got:
    assert not isinstance(g, Exception), repr(g)
    np.testing.assert_allclose(g, want)


def test_first_calls_of_one_jit_from_two_threads() -> None:
  @TinyJit
  def step(x: Tensor) -> Tensor:
    y = (x * 3).realize()
    time.sleep(0.05)   # both threads inside the capture at once
    return (y + 1).sum().realize()

  def calls(i: int) -> List[float]:
    return [float(step(Tensor(np.full(8, i * 10 + k, np.float32))).numpy()) for k in range(4)]
  got = _in_threads(2, calls)
  for i, g in enumerate(got):
    assert not isinstance(g, Exception), repr(g)
    assert g == [8 * ((i * 10 + k) * 3 + 1) for k in range(4)]
  # the capture holds this function's kernels only, and keeps working afterwards
  assert step.jit_kernels <= 2
  for v in (5.0, 7.0):
    assert float(step(Tensor(np.full(8, v, np.float32))).numpy()) == 8 * (v * 3 + 1)


def test_capture_does_not_take_in_other_threads_kernels() -> None:
  @TinyJit
  def step(x: Tensor) -> Tensor:
    time.sleep(0.05)
    return (x * 2).sum().realize()

  step(Tensor(np.ones(8, np.float32)))   # warm-up call; the next one captures

  def work(i: int) -> Any:
    if i == 0:
      return float(step(Tensor(np.ones(8, np.float32))).numpy())
    # eager kernels in another thread while thread 0 captures
    return [float((Tensor(np.full(4, k, np.float32)) + k).sum().numpy()) for k in range(5)]
  got = _in_threads(2, work)
  assert got[0] == 16.0 and got[1] == [8.0 * k for k in range(5)]
  assert step.jit_kernels == 1
  assert float(step(Tensor(np.full(8, 3.0, np.float32))).numpy()) == 48.0
