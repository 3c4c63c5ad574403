"""How many cores CPUGraph gives each kernel it captures (THREADS=0, the default: the core count is decided per kernel)."""
from __future__ import annotations

import types
from typing import Any, List, Tuple

import numpy as np
import pytest

from tiny.engine.jit import TinyJit
from tiny.tensor import Tensor

from tiny_clang import runtime
from tiny_clang.runtime import PARALLEL_SAMPLES


@pytest.fixture(params=["CLANG", "LLVM"])
def dev(request: Any) -> str:
  from tiny.registry import Device
  if reason := Device.availability(request.param):
    pytest.skip(f"{request.param} is not available: {reason}")
  return request.param


def _each_run_takes(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
  """The kernels' own timer (runtime.time.perf_counter, read before and after each run) says every run took `seconds`."""
  t = [0.0]

  def perf_counter() -> float:
    t[0] += seconds / 2
    return t[0]
  monkeypatch.setattr(runtime, "time", types.SimpleNamespace(perf_counter=perf_counter))


def _captured(dev: str, scale: float) -> Tuple[Any, List[Any], np.ndarray]:
  """A two-kernel step captured by TinyJit (on its second call, so each kernel has been timed only twice, fewer than
  PARALLEL_SAMPLES runs): its CPUGraph, that graph's programs, and the output of a replay. `scale` makes the kernels new
  ones, which no earlier test has run (and settled) already."""
  from tiny_clang.graph import CPUGraph
  xs = np.arange(64 * 48, dtype=np.float32).reshape(64, 48) / 100

  @TinyJit
  def step(x: Tensor) -> Tensor:
    y = (x * scale + 1).relu().realize()
    return (y.sum(1) + 0.5).realize()

  out = None
  for _ in range(3):
    out = step(Tensor(xs, device=dev)).numpy()
  np.testing.assert_allclose(out, np.maximum(xs * scale + 1, 0).sum(1) + 0.5, rtol=1e-5)
  graphs = [ji.prg for ji in step.jit_cache if isinstance(ji.prg, CPUGraph)]
  assert len(graphs) == 1, [type(ji.prg).__name__ for ji in step.jit_cache]
  return graphs[0], graphs[0].progs, out


def test_graph_splits_kernels_captured_before_their_core_count_settled(monkeypatch: pytest.MonkeyPatch, dev: str) -> None:
  """Every run takes 10x the threshold (too short to settle the count at once): the graph splits each parallel kernel,
  although none has had the PARALLEL_SAMPLES runs that settle its own count (the graph used to run them on one core
  for good)."""
  assert PARALLEL_SAMPLES > 2
  monkeypatch.setattr(runtime.THREADS, "value", 0)
  monkeypatch.setattr(runtime, "num_threads", lambda: 2)
  _each_run_takes(monkeypatch, 10 * runtime.PARALLEL_MIN_SECONDS)
  graph, progs, _ = _captured(dev, 1.8125)
  assert any(p.parallel for p in progs)
  assert all(p.auto_threads is None for p in progs), "settled already: the premise of the test no longer holds"
  assert list(graph.par) == [int(bool(p.parallel)) for p in progs]


def test_graph_keeps_fast_unsettled_kernels_on_one_core(monkeypatch: pytest.MonkeyPatch, dev: str) -> None:
  """Every run takes a tenth of the threshold: nothing is split, as when the kernels' counts had settled to one core."""
  monkeypatch.setattr(runtime.THREADS, "value", 0)
  monkeypatch.setattr(runtime, "num_threads", lambda: 2)
  _each_run_takes(monkeypatch, runtime.PARALLEL_MIN_SECONDS / 10)
  graph, progs, _ = _captured(dev, 2.6875)
  assert list(graph.par) == [0] * len(progs)


def test_graph_threads_follows_settled_count_and_threads_setting(monkeypatch: pytest.MonkeyPatch, dev: str) -> None:
  """A settled kernel keeps its count; THREADS=N overrides the samples (THREADS=1 never splits)."""
  monkeypatch.setattr(runtime, "num_threads", lambda: 2)
  monkeypatch.setattr(runtime.THREADS, "value", 0)
  _, progs, _ = _captured(dev, 3.5625)
  p = next(p for p in progs if p.parallel)
  p.auto_threads, p._samples = 1, [1.0]
  assert p.graph_threads() == 1
  p.auto_threads, p._samples = None, [1.0]
  assert p.graph_threads() == 2
  p._samples = [1e-9]
  assert p.graph_threads() == 1
  monkeypatch.setattr(runtime.THREADS, "value", 1)
  p._samples = [1.0]
  assert p.graph_threads() == 1
