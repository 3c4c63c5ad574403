"""Kernel opts that do not apply raise KernelOptError and leave the kernel unchanged; shape analysis of Kernel."""
from __future__ import annotations

import pytest

from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.dtype import dtypes
from tiny.helpers import ansistrip
from tiny.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from tiny.runtime.ops_python import PythonRenderer
from tiny.shape.shapetracker import ShapeTracker as ST

F32 = dtypes.float32


def _ld(i, st):
  return LazyOp(BufferOps.LOAD, (), MemBuffer(i, F32, st))


def _k(value, out_shape):
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, F32, ST.from_shape(out_shape))),))


def reduce_kernel(renderer=None) -> Kernel:
  return Kernel(_k(LazyOp(ReduceOps.SUM, (_ld(1, ST.from_shape((12, 16))),), (1,)), (12, 1)), opts=renderer or PythonRenderer())


class NoLocal(PythonRenderer):
  has_local = False
  has_shared = False


class SmallShared(PythonRenderer):
  shared_max = 16


@pytest.mark.parametrize("opt,renderer", [
  (Opt(OptOps.UPCAST, 0, 5), None),          # 12 is not divisible by 5
  (Opt(OptOps.UPCAST, 1, 4), None),          # axis 1 is the reduce axis
  (Opt(OptOps.UPCAST, 7, 2), None),          # no such axis
  (Opt(OptOps.UPCAST, 0, 1), None),          # amount must be > 1
  (Opt(OptOps.UPCAST, -1, 2), None),
  (Opt(OptOps.UNROLL, 1, 2), None),          # only one reduce axis (UNROLL counts from the first reduce)
  (Opt(OptOps.UNROLL, 0, 64), None),         # 16 % 64
  (Opt(OptOps.LOCAL, 1, 2), None),           # LOCAL is for global axes
  (Opt(OptOps.LOCAL, 0, 2), NoLocal()),      # renderer without locals
  (Opt(OptOps.GROUP, 0, 4), NoLocal()),
  (Opt(OptOps.GROUPTOP, 0, 16), SmallShared()),
  (Opt(OptOps.GROUP, 1, 2), None),           # no second reduce axis
  (Opt(OptOps.NOLOCALS), NoLocal()),
  (Opt(OptOps.PADTO, 0, 64), None),          # more than quadruple the work
  (Opt(OptOps.UPCASTMID, 0, 4), None),       # image kernels only
  (Opt(OptOps.TC, 0, 0), None),              # PYTHON (not emulating) has no tensor cores
])
def test_invalid_opts_raise(opt, renderer) -> None:
  k = reduce_kernel(renderer)
  before = (k.full_shape, k.sts[:], k.upcasted, k.local_dims, k.group_for_reduces, k.dont_use_locals)
  with pytest.raises(KernelOptError):
    k.apply_opt(opt)
  assert (k.full_shape, k.sts, k.upcasted, k.local_dims, k.group_for_reduces, k.dont_use_locals) == before
  assert k.applied_opts == []


def test_opts_after_nolocals_and_unsafe_pad() -> None:
  k = reduce_kernel()
  k.apply_opt(Opt(OptOps.NOLOCALS))
  with pytest.raises(KernelOptError):
    k.apply_opt(Opt(OptOps.LOCAL, 0, 2))
  with pytest.raises(KernelOptError):
    k.apply_opt(Opt(OptOps.NOLOCALS))
  # padding a reduce through exp2 would add exp2(0) = 1 per padded element
  ld = _ld(1, ST.from_shape((12, 15)))
  k2 = Kernel(_k(LazyOp(ReduceOps.SUM, (LazyOp(UnaryOps.EXP2, (ld,)),), (1,)), (12, 1)), opts=PythonRenderer())
  with pytest.raises(KernelOptError):
    k2.apply_opt(Opt(OptOps.PADTO, 1, 16))
  k3 = Kernel(_k(LazyOp(ReduceOps.MAX, (ld,), (1,)), (12, 1)), opts=PythonRenderer())
  with pytest.raises(KernelOptError):
    k3.apply_opt(Opt(OptOps.PADTO, 1, 16))


def test_shape_analysis_moves_reduce_last_and_merges_dims() -> None:
  # reduce over axis 0 of (6, 4, 5): the kernel sees (20 merged outputs, 6 reduce)
  ast = _k(LazyOp(ReduceOps.SUM, (_ld(1, ST.from_shape((6, 4, 5))),), (0,)), (1, 4, 5))
  k = Kernel(ast, opts=PythonRenderer())
  assert k.full_shape == (20, 6) and k.output_shape == (20, 1)
  assert k.first_reduce == 1 and k.shape_len == 2
  k.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  k.apply_opt(Opt(OptOps.UNROLL, 0, 2))
  k.apply_opt(Opt(OptOps.LOCAL, 0, 5))
  assert k.full_shape == (1, 5, 3, 4, 2) or k.full_shape == (5, 3, 4, 2)
  assert k.upcasted == 2 and k.local_dims == 1
  assert ansistrip(k.colored_shape()).split() == [str(s) for s in k.full_shape]
  assert k.colors()[-2:] == ["yellow", "magenta"]
  assert k.name.startswith("r") and k.function_name.isidentifier()


def test_elementwise_kernel_merges_to_one_dim() -> None:
  s = ST.from_shape((3, 4, 5))
  k = Kernel(_k(LazyOp(BinaryOps.ADD, (_ld(1, s), _ld(2, s))), (3, 4, 5)), opts=PythonRenderer())
  assert k.full_shape == (60,) and k.reduceop is None and k.name.startswith("E")


def test_copy_is_independent() -> None:
  k = reduce_kernel()
  k2 = k.copy()
  k2.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  assert k.upcasted == 0 and k2.upcasted == 1 and k.applied_opts == []
