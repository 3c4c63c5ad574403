"""A dot product over long contiguous rows (`x @ W.T`, one row of x, W far larger than the caches) prefetches its rows
ahead (tiny_clang.row_stream_prefetch) on CLANG and LLVM; results stay numpy's."""
from __future__ import annotations

import re
from typing import Any, Iterator

import numpy as np
import pytest

from tiny.device import Device
from tiny.engine.realize import get_runner, run_schedule
from tiny.engine.schedule import create_schedule
from tiny.ops import MetaOps
from tiny.tensor import Tensor


@pytest.fixture(params=["CLANG", "LLVM"])
def dev(request: Any) -> Iterator[str]:
  name = request.param
  if name == "LLVM":
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
  if Device[name].renderer.stream_prefetch_bytes <= 0:
    pytest.skip("the renderer prefetches no streams on this host (x86 with AVX-512 only)")
  yield name


def _product(dev: str, rows: int, seed: int) -> tuple:
  """(source of the product kernel, tiny's result, numpy's) for (1, 768) @ (rows, 768).T."""
  rng = np.random.default_rng(seed)
  xn, wn = rng.standard_normal((1, 768)).astype(np.float32), rng.standard_normal((rows, 768)).astype(np.float32)
  out = Tensor(xn, device=dev) @ Tensor(wn, device=dev).T
  sched = create_schedule([out.lazydata])
  src = get_runner(dev, [si for si in sched if si.ast.op is MetaOps.KERNEL][-1].ast).p.src
  run_schedule(sched)
  return src, out.numpy(), xn.astype(np.float64) @ wn.T.astype(np.float64)


def _prefetches(src: str, dev: str) -> int:
  if dev == "CLANG":
    return len(re.findall(r"__builtin_prefetch\(\(const void\*\)\(\(__UINTPTR_TYPE__\)\(data\d\+.*?\)\+\d+\)\)", src))
  return len(re.findall(r"call void @llvm.prefetch.p0\(ptr %\w+, i32 0, i32 3, i32 1\)", src))


def test_long_rows_one_at_a_time_prefetch(dev: str) -> None:
  """6151 rows (no small factor: one output at a time, each row walked whole) of 3 KB, 18.9 MB: the row loads prefetch."""
  src, got, ref = _product(dev, 6151, 0)
  assert _prefetches(src, dev) == 1, src
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1031, 8192])
def test_no_prefetch_small_or_side_by_side(dev: str, rows: int) -> None:
  """3 MB of rows stays under MIN_BYTES; 8192 rows are tiled several outputs at a time (rows walked side by side, which
  the hardware prefetchers follow): no prefetch either way, same results."""
  src, got, ref = _product(dev, rows, 1)
  assert _prefetches(src, dev) == 0, src
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
