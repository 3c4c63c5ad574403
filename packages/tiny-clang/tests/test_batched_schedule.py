"""A cached schedule of several CLANG/LLVM kernels runs with one call of the pool (CPUProgram.run_batch), kernel after
kernel, with the results the one-by-one path gives (tiny.engine.realize._run_batched)."""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest

from tiny.helpers import GlobalCounters
from tiny.tensor import Tensor

from tiny_clang import runtime
from tiny_clang.settings import THREADS


@pytest.fixture(params=["CLANG", "LLVM"])
def dev(request: Any) -> str:
  from tiny.registry import Device
  if reason := Device.availability(request.param):
    pytest.skip(f"{request.param} is not available: {reason}")
  return request.param


@pytest.fixture
def batch_calls(monkeypatch: pytest.MonkeyPatch) -> List[Dict[str, Any]]:
  """Every call of CPUProgram.run_batch: how many kernels it was given and whether it ran them."""
  calls: List[Dict[str, Any]] = []
  orig = runtime.CPUProgram.run_batch

  def spy(progs: List[Any], handles: List[List[Any]]) -> bool:
    ran = orig(progs, handles)
    calls.append({"n": len(progs), "ran": ran})
    return ran
  monkeypatch.setattr(runtime.CPUProgram, "run_batch", staticmethod(spy))
  return calls


# sizes that split into two kernels (a long reduction with a factor in 8..256, see LazyBuffer.r): 255 rows of 1031 (odd
# rows, not a whole number of vectors or lines; 255 partial sums that two threads' 8 slices cannot share evenly), 27 rows
# of 7001, 220 rows of 596, and 256 rows of 1024
SIZES = [255 * 1031, 27 * 7001, 220 * 596, 1 << 18]


@pytest.mark.parametrize("n", SIZES)
def test_split_sum_runs_batched_and_matches_float64(dev: str, n: int, batch_calls: List[Dict[str, Any]]) -> None:
  rng = np.random.default_rng(n)
  x = rng.standard_normal(n).astype(np.float32)
  t = Tensor(x, device=dev).realize()
  ref = x.astype(np.float64).sum()
  for _ in range(6):   # the first runs time the kernels (their core count settles); later ones take the batch
    got = float(t.sum().numpy())
    # float32 partial sums in another order: the error bound of a pairwise-ish sum, relative to the sum of magnitudes
    assert abs(got - ref) <= 1e-5 * np.abs(x.astype(np.float64)).sum(), (got, ref)
  assert any(c["ran"] and c["n"] == 2 for c in batch_calls), batch_calls


@pytest.mark.parametrize("threads", [1, 2])
def test_split_reduces_batched_under_fixed_threads(dev: str, threads: int, batch_calls: List[Dict[str, Any]]) -> None:
  n = 143 * 2039
  x = (np.arange(n) % 97 - 48).astype(np.int32)
  f = np.random.default_rng(1).random(n, dtype=np.float32)
  with THREADS.override(threads):
    ti, tf = Tensor(x, device=dev).realize(), Tensor(f, device=dev).realize()
    for _ in range(5):
      assert int(ti.sum().numpy()) == int(x.astype(np.int64).sum())   # ints stay exact whatever the order
      assert float(tf.max().numpy()) == float(f.max())
      np.testing.assert_allclose(float(tf.mean().numpy()), f.astype(np.float64).mean(), rtol=1e-5)
  assert any(c["ran"] for c in batch_calls), batch_calls


def test_row_sums_of_a_wide_matrix_batched(dev: str, batch_calls: List[Dict[str, Any]]) -> None:
  """Few outputs and long rows: split too (two kernels), and each output keeps its own row's sum."""
  x = np.random.default_rng(2).standard_normal((3, 70000)).astype(np.float32)
  t = Tensor(x, device=dev).realize()
  for _ in range(5):
    np.testing.assert_allclose(t.sum(axis=1).numpy(), x.astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-3)
  assert any(c["ran"] for c in batch_calls), batch_calls


def test_batch_counts_every_kernel(dev: str) -> None:
  """GlobalCounters see both kernels of a batched split sum, as they do one by one."""
  t = Tensor(np.ones(255 * 1031, np.float32), device=dev).realize()
  for _ in range(5):
    t.sum().realize()
  before = GlobalCounters.kernel_count
  assert float(t.sum().numpy()) == 255 * 1031
  assert GlobalCounters.kernel_count - before == 2


def test_unsettled_kernels_are_not_batched(dev: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """A kernel whose core count is still being decided (its runs are timed, auto_threads is None) makes run_batch refuse,
  doing nothing; the one-by-one path then runs (and times) it, with the right result."""
  x = np.arange(2 * 65536, dtype=np.float32)
  t = Tensor(x, device=dev).realize()
  from tiny.engine.realize import lower_schedule_item
  for _ in range(4):
    t.sum().realize()
  eis = [lower_schedule_item(si) for si in t.sum().schedule()]
  progs = [ei.prg.clprg for ei in eis]
  handles = [[b.ensure_allocated()._buf for b in ei.bufs] for ei in eis]
  monkeypatch.setattr(progs[1], "auto_threads", None)
  partials = eis[0].bufs[0]
  partials.copyin(memoryview(np.full(partials.size, np.nan, np.float32)).cast("B"))
  assert runtime.CPUProgram.run_batch(progs, handles) is False
  assert np.isnan(np.frombuffer(partials.as_buffer(), np.float32)).all()   # the first kernel did not run either
  assert float(t.sum().numpy()) == float(x.astype(np.float64).sum())
