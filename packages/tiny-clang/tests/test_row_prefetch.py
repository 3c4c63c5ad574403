"""Row kernels prefetch the next row (tiny_clang.row_prefetch) on CLANG and LLVM.

The source tests check which accesses prefetch and how far ahead (one row of the input in the exp loop, one row of the
output with write intent where it is first written); the end-to-end tests check that results do not change with the
prefetches on, against numpy, for softmax, log_softmax and layernorm at sizes that do and do not take them."""
from __future__ import annotations

import re
from typing import Any, Iterator, List

import numpy as np
import pytest

from tiny.device import Device
from tiny.engine.realize import get_runner, run_schedule
from tiny.engine.schedule import create_schedule
from tiny.ops import MetaOps
from tiny.tensor import Tensor
from tiny_clang.row_prefetch import MAX_DISTANCE_BYTES, row_prefetches

rng = np.random.default_rng(0)


@pytest.fixture(params=["CLANG", "LLVM"])
def dev(request: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
  name = request.param
  if name == "LLVM":
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
  if Device[name].renderer.simd_bytes < 64:
    pytest.skip("whole-line (64-byte) vector accesses only: hosts with 512-bit vectors")
  # a plain attribute of the renderer: part of its cache key, so no program compiled the other way is reused
  monkeypatch.setattr(Device[name].renderer, "row_prefetch", True)
  yield name


def _sources(out: Tensor, dev: str) -> List[str]:
  """Run out's schedule; the sources of its kernels."""
  sched = create_schedule([out.lazydata])
  srcs = [get_runner(dev, si.ast).p.src for si in sched if si.ast.op is MetaOps.KERNEL]
  run_schedule(sched)
  return srcs


def _row_prefetches(src: str, dev: str) -> List[tuple]:
  """(distance, write) of each next-row prefetch in a kernel's source."""
  if dev == "CLANG":
    return [(int(d), rw == "1") for d, rw in re.findall(r"__builtin_prefetch\(\(.*?\)\+(\d+)\), ([01]), 2\)", src)]
  return [(int(d), rw == "1") for d, rw in re.findall(r"i64 (\d+)\n\s*call void @llvm.prefetch.p0\(ptr %\w+, i32 ([01]), i32 2, i32 1\)", src)]


def test_softmax_prefetches_next_row_of_input_and_output(dev: str) -> None:
  x = rng.standard_normal((64, 1024)).astype(np.float32)
  out = Tensor(x, device=dev).softmax(-1)
  srcs = _sources(out, dev)
  assert len(srcs) == 1, "softmax is one row kernel"
  pf = _row_prefetches(srcs[0], dev)
  row = 1024 * 4
  # the exp loop reads 4 lines of the input and keeps 4 lines of exp in the output per step (upcast 4 x 16 floats)
  assert sorted(pf) == sorted([(row, False)] * (len(pf) // 2) + [(row, True)] * (len(pf) // 2)) and len(pf) >= 2, pf
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_row_prefetch_off_renders_none(dev: str, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(Device[dev].renderer, "row_prefetch", False)
  x = rng.standard_normal((16, 512)).astype(np.float32)
  out = Tensor(x, device=dev).softmax(-1)
  srcs = _sources(out, dev)
  assert all(not _row_prefetches(s, dev) for s in srcs)


@pytest.mark.parametrize("shape", [(8, 256), (3, 5, 320), (7, 33), (2, 1000), (5, 4096)])
def test_results_with_prefetch_match_numpy(dev: str, shape: tuple) -> None:
  x = (rng.standard_normal(shape) * 10).astype(np.float32)
  x.reshape(-1)[::7] = -np.inf   # masked entries, as attention's
  t = Tensor(x, device=dev)
  e = np.exp(x - x.max(-1, keepdims=True))
  np.testing.assert_allclose(t.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
  lse = np.log(e.sum(-1, keepdims=True)) + x.max(-1, keepdims=True)
  np.testing.assert_allclose(t.log_softmax(-1).numpy(), x - lse, rtol=1e-5, atol=1e-5)
  y = rng.standard_normal(shape).astype(np.float32)
  ln = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(Tensor(y, device=dev).layernorm(-1).numpy(), ln, rtol=1e-4, atol=1e-4)


def test_plain_reduce_and_elementwise_get_no_row_prefetch(dev: str) -> None:
  x = rng.standard_normal((256, 1024)).astype(np.float32)
  s = Tensor(x, device=dev).sum(-1)
  srcs = _sources(s, dev)
  assert all(not _row_prefetches(src, dev) for src in srcs)
  np.testing.assert_allclose(s.numpy(), x.sum(-1), rtol=1e-4, atol=1e-3)
  y = Tensor(x, device=dev).exp() * 2
  assert all(not _row_prefetches(src, dev) for src in _sources(y, dev))


def test_distance_is_capped_and_positive() -> None:
  assert row_prefetches([], True) == {}
  assert MAX_DISTANCE_BYTES >= 64 * 1024 * 4, "the largest row a row kernel takes is prefetched"


def test_index_evaluation_has_the_kernels_integer_semantics() -> None:
  # the index evaluator uses core's exec_alu (through tiny.backend): C's truncating division and remainder, int32
  # wrapping, comparisons as 0/1; a division by zero or a float has no value
  from tiny.backend import BinaryOps, TernaryOps, UOp, UOps, dtypes
  from tiny_clang import row_prefetch
  r = UOp(UOps.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 8)), (0, False))

  def ev(u: UOp, at: int) -> Any:
    return row_prefetch._eval_index(u, {r: at}, {})
  c = lambda v: UOp.const(dtypes.int32, v)  # noqa: E731
  neg = r * c(-7)
  assert [ev(neg.alu(BinaryOps.IDIV, c(2)), i) for i in (0, 1, 3)] == [0, -3, -10]   # truncates toward zero
  assert [ev(neg.alu(BinaryOps.MOD, c(4)), i) for i in (1, 3)] == [-3, -1]            # the sign of the dividend
  assert ev(r * c(1 << 30), 4) == 0                                                  # int32 wraps as in the kernel
  assert ev(r.alu(BinaryOps.CMPLT, c(3)), 2) == 1 and ev(r.alu(BinaryOps.CMPLT, c(3)), 5) == 0
  assert ev(r.alu(BinaryOps.CMPLT, c(3)).alu(TernaryOps.WHERE, r, c(-1)), 2) == 2
  assert ev(r.alu(BinaryOps.IDIV, r), 0) is None
  assert ev(UOp.const(dtypes.float32, 1.5), 0) is None
  assert not hasattr(row_prefetch, "_INT_OPS"), "the ops come from core's exec_alu, not a copy of their semantics"
