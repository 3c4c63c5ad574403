"""The lowerer: global/local dims as SPECIALs (merged to 3 dims) or loops, gated loads for masked views, DEFINE_VARs for symbolic
shapes, and linearizer scoping of loops and accumulators."""
from __future__ import annotations

import numpy as np

from tiny.codegen.kernel import Kernel
from tiny.codegen.lowerer import get_grouped_dims, lazyop_to_uop
from tiny.codegen.uopgraph import UOpGraph, linearize_sink, verify_linearized
from tiny.codegen.uops import UOp, UOps
from tiny.dtype import dtypes
from tiny.ops import BinaryOps, BufferOps, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps
from tiny.runtime.ops_python import PythonProgram, PythonRenderer
from tiny.shape.shapetracker import ShapeTracker as ST
from tiny.shape.symbolic import Variable

F32, I32 = dtypes.float32, dtypes.int32


def _ld(i, st):
  return LazyOp(BufferOps.LOAD, (), MemBuffer(i, F32, st))


def _k(value, out_shape, ki=None):
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, F32, ST.from_shape(out_shape))),), ki)


class NoLocal(PythonRenderer):
  has_local = False
  has_shared = False


def _eval(u: UOp, env):
  from tiny.ops import exec_alu
  if u.op is UOps.CONST:
    return u.arg
  if u.op is UOps.SPECIAL:
    return env[u.arg[1]]
  return exec_alu(u.arg, u.dtype, [_eval(s, env) for s in u.src])


def test_grouped_dims_cover_every_index_once() -> None:
  from itertools import product
  sizes = [2, 3, 4, 5]
  idxs, specials = get_grouped_dims("gidx", 0, sizes, 3)
  seen = set()
  for vals in product(*[range(s.arg[2]) for s in specials]):
    env = {s.arg[1]: v for s, v in zip(specials, vals)}
    t = tuple(_eval(i, env) for i in idxs)
    assert all(0 <= a < s for a, s in zip(t, sizes))
    seen.add(t)
  assert len(seen) == 2 * 3 * 4 * 5


def test_specials_or_loops() -> None:
  s = ST.from_shape((4, 6))
  ast = _k(LazyOp(BinaryOps.ADD, (_ld(1, s), _ld(1, s))), (4, 6))
  sink = lazyop_to_uop(ast, PythonRenderer())
  assert any(u.op is UOps.SPECIAL and u.arg[1].startswith("gidx") for u in sink.sparents)
  sink = lazyop_to_uop(ast, NoLocal())
  assert not any(u.op is UOps.SPECIAL for u in sink.sparents)
  assert sum(u.op is UOps.RANGE and u.arg[1] is False for u in sink.sparents) == 2
  uops = UOpGraph(sink, NoLocal()).linearize().uops
  verify_linearized(uops)
  # the whole body sits inside the two loops
  assert uops.index(next(u for u in uops if u.op is UOps.STORE)) > max(i for i, u in enumerate(uops) if u.op is UOps.RANGE)


def test_local_dims_become_lidx() -> None:
  s = ST.from_shape((4, 6))
  ast = _k(LazyOp(BinaryOps.ADD, (_ld(1, s), _ld(1, s))), (4, 6), KernelInfo(local_dims=1))
  sink = lazyop_to_uop(ast, PythonRenderer())
  names = {u.arg[1]: u.arg[2] for u in sink.sparents if u.op is UOps.SPECIAL}
  assert names == {"gidx0": 4, "lidx0": 6}
  sink = lazyop_to_uop(LazyOp(MetaOps.KERNEL, ast.src, KernelInfo(dont_use_locals=True)), PythonRenderer())
  assert {u.arg[1] for u in sink.sparents if u.op is UOps.SPECIAL} == {"idx0", "idx1"}


def test_masked_view_gives_gated_load() -> None:
  s = ST.from_shape((3, 4)).pad(((1, 0), (0, 2)))
  sink = lazyop_to_uop(_k(_ld(1, s), (4, 6)), PythonRenderer())
  loads = [u for u in sink.sparents if u.op is UOps.LOAD]
  assert len(loads) == 1 and len(loads[0].src) == 4 and loads[0].src[2].dtype == dtypes.bool and loads[0].src[3].arg == 0.0


def test_symbolic_shape_uses_define_var_and_runs() -> None:
  n = Variable("n", 1, 10)
  ast = _k(LazyOp(ReduceOps.SUM, (_ld(1, ST.from_shape((n, 4))),), (0,)), (1, 4))
  k = Kernel(ast, opts=PythonRenderer())
  prg = k.to_program()
  assert [v.expr for v in prg.vars] == ["n"]
  x = np.arange(28, dtype=np.float32).reshape(7, 4)
  out, inp = memoryview(bytearray(16)).cast("f"), memoryview(bytearray(x.tobytes())).cast("f")
  gs, ls = prg.launch_dims({n: 7})
  PythonProgram(prg.name, prg.src.encode())(out, inp, global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)), vals=(7,))
  np.testing.assert_allclose(np.frombuffer(out.tobytes(), np.float32), x.sum(0))


def test_accumulator_is_defined_before_its_loop_and_read_after() -> None:
  ast = _k(LazyOp(ReduceOps.SUM, (_ld(1, ST.from_shape((4, 8))),), (1,)), (4, 1))
  k = Kernel(ast, opts=NoLocal())
  k.linearize()
  uops = k.uops.uops
  verify_linearized(uops)
  acc = next(i for i, u in enumerate(uops) if u.op is UOps.DEFINE_ACC)
  red_loop = next(i for i, u in enumerate(uops) if u.op is UOps.RANGE and u.arg[1])
  glob_loop = next(i for i, u in enumerate(uops) if u.op is UOps.RANGE and not u.arg[1])
  end = next(i for i, u in enumerate(uops) if u.op is UOps.ENDRANGE and u.src[0] is uops[red_loop])
  store = next(i for i, u in enumerate(uops) if u.op is UOps.STORE)
  phi = next(i for i, u in enumerate(uops) if u.op is UOps.PHI)
  # the accumulator resets for every output (inside the global loop) before the reduce loop opens; the PHI is in the loop
  assert glob_loop < acc < red_loop < phi < end < store


def test_nested_reduce_loops_nest() -> None:
  s = ST.from_shape((3, 4, 5))
  inner = LazyOp(ReduceOps.MAX, (_ld(1, s),), (1,))
  ast = _k(LazyOp(ReduceOps.SUM, (inner,), (2,)), (3, 1, 1))
  k = Kernel(ast, opts=PythonRenderer())
  k.linearize()
  uops = k.uops.uops
  verify_linearized(uops)
  depth, max_depth = 0, 0
  for u in uops:
    depth += (u.op is UOps.RANGE) - (u.op is UOps.ENDRANGE)
    max_depth = max(max_depth, depth)
  assert max_depth == 2 and sum(u.op is UOps.DEFINE_ACC for u in uops) == 2


def test_verify_linearized_catches_bad_orders() -> None:
  import pytest
  r = UOp(UOps.RANGE, I32, (UOp.const(I32, 0), UOp.const(I32, 4)), (1000, True))
  x = r * 2
  good = linearize_sink(UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (UOp(UOps.DEFINE_GLOBAL, dtypes.int32, (), (0, True)), r, x)),)))
  verify_linearized(good)
  end = next(u for u in good if u.op is UOps.ENDRANGE)
  bad = [u for u in good if u is not end]
  with pytest.raises(AssertionError):
    verify_linearized(bad)
  with pytest.raises(AssertionError):
    verify_linearized(bad[::-1])


def test_after_opens_a_loop_only_once_the_stores_of_another_loop_ran() -> None:
  # the second loop reads nothing of the first (a row kernel's store loop whose value folded to a constant), yet it
  # overwrites what the first stored: only the AFTER in its RANGE's src puts it after the first loop has ended
  buf = UOp(UOps.DEFINE_GLOBAL, dtypes.float32, (), (0, True))
  c0, c4 = UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 4)
  r1 = UOp(UOps.RANGE, dtypes.int32, (c0, c4), (1001, True))
  first = UOp(UOps.STORE, None, (buf, r1, UOp.const(dtypes.float32, 1.0)))
  r2 = UOp(UOps.RANGE, dtypes.int32, (c0, c4, UOp(UOps.AFTER, None, (first, r1))), (2001, True))
  second = UOp(UOps.STORE, None, (buf, r2, UOp.const(dtypes.float32, 2.0)))
  uops = linearize_sink(UOp(UOps.SINK, None, (second,)))
  verify_linearized(uops)
  pos = {u: i for i, u in enumerate(uops)}
  end1 = next(i for i, u in enumerate(uops) if u.op is UOps.ENDRANGE and u.src[0] is r1)
  assert pos[first] < end1 < pos[r2] < pos[second]
  # and the PYTHON emulator, which runs the list in order, ends with the second loop's values
  from tiny.runtime.ops_python import serialize_uops
  out = memoryview(bytearray(16)).cast("B")
  PythonProgram("after", serialize_uops(uops).encode())(out)
  np.testing.assert_array_equal(np.frombuffer(out.tobytes(), np.float32), [2.0] * 4)
