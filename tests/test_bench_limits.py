"""bench/limits.py measures this machine's FMA peak and stream bandwidth; bench/run.py reports rows as a share of them."""
from __future__ import annotations

import os
import shutil
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import limits  # noqa: E402
import run  # noqa: E402


@pytest.mark.skipif(shutil.which("clang") is None and shutil.which("cc") is None, reason="needs a C compiler to build the probe")
def test_limits_bound_what_numpy_reaches() -> None:
  # a single-thread numpy copy of 64 MiB cannot beat the measured stream copy by much, nor can the FMA peak be below
  # what a scalar loop would reach (1 GFLOP/s) or above 4 flops/cycle/lane at 6 GHz.
  # Other processes can only make the probe come out low, so the bound gets three interleaved tries (best probe
  # against best numpy copy, both wall time); a probe that is wrong stays below numpy in every try.
  a = np.ones(1 << 24, np.float32)
  b = np.empty_like(a)
  stream, copy_s = 0.0, float("inf")
  for _ in range(3):
    lim = limits.measure(1)
    assert lim is not None and lim.threads == 1 and lim.vector_bytes in (16, 32, 64)
    assert 1.0 < lim.peak_gflops < 4 * (lim.vector_bytes // 4) * 6.0
    stream, copy_s = max(stream, lim.stream_gbs), min(copy_s, min(_timed(lambda: np.copyto(b, a)) for _ in range(5)))
    if 2 * a.nbytes / copy_s / 1e9 < stream * 2:
      break
  assert 2 * a.nbytes / copy_s / 1e9 < stream * 2, f"numpy copied at {2 * a.nbytes / copy_s / 1e9:.1f} GB/s, probe {stream:.1f}"


def _timed(fn) -> float:
  st = time.perf_counter()
  fn()
  return time.perf_counter() - st


def test_rows_are_reported_as_a_share_of_their_limit() -> None:
  lim = limits.Limits(peak_gflops=200.0, stream_gbs=40.0, threads=2, vector_bytes=32)
  mk = lambda unit, value: run.Result("b", "tiny", "CLANG", 1.0, unit, value)  # noqa: E731
  assert run.of_limit(mk("GFLOP/s", 150.0), lim) == "75%"
  assert run.of_limit(mk("GB/s", 10.0), lim) == "25%"
  assert run.of_limit(mk("tok/s", 10.0), lim) == "–"
  assert run.of_limit(mk("GB/s", 10.0), None) == "–"
  assert "| 75% |" in run.to_markdown([mk("GFLOP/s", 150.0)], lim)
