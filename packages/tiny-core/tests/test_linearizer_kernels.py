"""Hand-built kernel ASTs, compiled by Kernel under no opts / every single valid opt / random opt sequences, run on PYTHON, checked
against numpy. Also checks that every linearized program obeys the ordering rules."""
from __future__ import annotations

import itertools
from typing import Dict, List, Sequence, Tuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.uopgraph import verify_linearized
from tiny.dtype import dtypes
from tiny.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps
from tiny.runtime.ops_python import PythonProgram, PythonRenderer
from tiny.shape.shapetracker import ShapeTracker as ST
from tiny.testing.ops_helper import run_kernel_on_python
from tiny.shape.symbolic import Variable
from tiny.shape.view import View

F32 = dtypes.float32
rng = np.random.default_rng(0)


def ld(i: int, st: ST) -> LazyOp:
  return LazyOp(BufferOps.LOAD, (), MemBuffer(i, F32, st))


def const(v: float, st: ST) -> LazyOp:
  return LazyOp(BufferOps.CONST, (), ConstBuffer(v, F32, st))


def kernel(value: LazyOp, out_shape: Tuple[int, ...]) -> LazyOp:
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, F32, ST.from_shape(out_shape))),))


def e(op, *src: LazyOp, arg=None) -> LazyOp:
  return LazyOp(op, tuple(src), arg)


# name -> (ast, inputs, expected output)
def _cases() -> Dict[str, Tuple[LazyOp, List[np.ndarray], np.ndarray]]:
  cases = {}
  a, b = rng.random((4, 6), dtype=np.float32), rng.random((4, 6), dtype=np.float32)
  s46 = ST.from_shape((4, 6))
  cases["elementwise"] = (kernel(e(BinaryOps.MUL, e(BinaryOps.ADD, ld(1, s46), ld(2, s46)), ld(1, s46)), (4, 6)), [a, b], (a + b) * a)
  v = rng.random((6,), dtype=np.float32)
  sb = ST.from_shape((6,)).reshape((1, 6)).expand((4, 6))
  cases["broadcast"] = (kernel(e(BinaryOps.MAX, ld(1, s46), ld(2, sb)), (4, 6)), [a, v], np.maximum(a, v[None]))
  x = rng.random((6, 8), dtype=np.float32) - 0.5
  s68 = ST.from_shape((6, 8))
  cases["reduce_axis0"] = (kernel(e(ReduceOps.SUM, ld(1, s68), arg=(0,)), (1, 8)), [x], x.sum(0, keepdims=True))
  cases["reduce_axis1"] = (kernel(e(ReduceOps.MAX, ld(1, s68), arg=(1,)), (6, 1)), [x], x.max(1, keepdims=True))
  cases["reduce_all"] = (kernel(e(ReduceOps.SUM, ld(1, s68), arg=(0, 1)), (1, 1)), [x], x.sum(keepdims=True))
  cases["two_reduces"] = (kernel(e(BinaryOps.ADD, e(ReduceOps.SUM, ld(1, s68), arg=(1,)), e(ReduceOps.MAX, ld(1, s68), arg=(1,))), (6, 1)),
                          [x], x.sum(1, keepdims=True) + x.max(1, keepdims=True))
  # sum over k of (max over j of x[j, k]): a reduce inside a reduce
  y = rng.random((4, 3, 5), dtype=np.float32)
  s435 = ST.from_shape((4, 3, 5))
  inner = e(ReduceOps.MAX, ld(1, s435), arg=(1,))
  cases["nested_reduce"] = (kernel(e(ReduceOps.SUM, inner, arg=(2,)), (4, 1, 1)), [y], y.max(1, keepdims=True).sum(2, keepdims=True))
  sp = ST.from_shape((6, 8)).pad(((1, 2), (0, 3)))
  cases["masked_pad"] = (kernel(e(BinaryOps.ADD, ld(1, sp), const(1.0, ST.from_shape((9, 11)))), (9, 11)), [x], np.pad(x, ((1, 2), (0, 3))) + 1)
  # exp2 is unsafe to pad (exp2(0) = 1): the padded zeros count
  cases["pad_reduce"] = (kernel(e(ReduceOps.SUM, e(UnaryOps.EXP2, ld(1, sp)), arg=(1,)), (9, 1)), [x],
                         np.exp2(np.pad(x, ((1, 2), (0, 3)))).sum(1, keepdims=True).astype(np.float32))
  ss = ST.from_shape((6, 8)).shrink(((1, 5), (2, 7)))
  cases["masked_shrink"] = (kernel(e(UnaryOps.NEG, ld(1, ss)), (4, 5)), [x], -x[1:5, 2:7])
  n = 12
  star = ST((View.create((2 * n - 1,), (0,), 0, ((n - 1, 2 * n - 1),)), View.create((n, n), (1, 1), 0, None)))
  cases["arange"] = (kernel(e(ReduceOps.SUM, const(1.0, star), arg=(1,)), (n, 1)), [], np.arange(1, n + 1, dtype=np.float32)[:, None])
  ma, mb = rng.random((8, 12), dtype=np.float32), rng.random((12, 4), dtype=np.float32)
  sa = ST.from_shape((8, 12)).reshape((8, 1, 12)).expand((8, 4, 12))
  smb = ST.from_shape((12, 4)).permute((1, 0)).reshape((1, 4, 12)).expand((8, 4, 12))
  cases["matmul"] = (kernel(e(ReduceOps.SUM, e(BinaryOps.MUL, ld(1, sa), ld(2, smb)), arg=(2,)), (8, 4, 1)), [ma, mb], (ma @ mb)[:, :, None])
  # conv: out[o, y, x] = sum_{c, ky, kx} img[c, y+ky, x+kx] * w[o, c, ky, kx]
  C, H, W, O, K = 2, 5, 6, 3, 3
  img, w = rng.random((C, H, W), dtype=np.float32), rng.random((O, C, K, K), dtype=np.float32)
  OH, OW = H - K + 1, W - K + 1
  simg = ST((View.create((O, OH, OW, C, K, K), (0, W, 1, H * W, W, 1), 0, None),))
  sw = ST((View.create((O, OH, OW, C, K, K), (C * K * K, 0, 0, K * K, K, 1), 0, None),))
  ref = np.zeros((O, OH, OW), np.float32)
  for o, yy, xx in itertools.product(range(O), range(OH), range(OW)):
    ref[o, yy, xx] = (img[:, yy:yy + K, xx:xx + K] * w[o]).sum()
  cases["conv"] = (kernel(e(ReduceOps.SUM, e(BinaryOps.MUL, ld(1, simg), ld(2, sw)), arg=(3, 4, 5)), (O, OH, OW, 1, 1, 1)), [img, w],
                   ref[:, :, :, None, None, None])
  cases["where_cast"] = (kernel(e(TernaryOps.WHERE, e(BinaryOps.CMPLT, ld(1, s46), ld(2, s46)), e(UnaryOps.CAST, e(UnaryOps.CAST, ld(1, s46),
                                                                                                              arg=dtypes.int32), arg=F32),
                                  ld(2, s46)), (4, 6)), [a * 10, b * 10], np.where(a * 10 < b * 10, np.trunc(a * 10), b * 10))
  return cases


CASES = _cases()


run_kernel = run_kernel_on_python


def check_case(name: str, opts: Sequence[Opt], renderer=None) -> Kernel:
  ast, inputs, ref = CASES[name]
  k = Kernel(ast, opts=renderer or PythonRenderer())
  for o in opts:
    k.apply_opt(o)
  out = run_kernel(k, inputs, ref.shape)
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f"{name} with {opts}")
  return k


def candidate_opts(k: Kernel) -> List[Opt]:
  ret = [Opt(OptOps.NOLOCALS)]
  ret += [Opt(OptOps.SWAP, a, b) for a in range(k.shape_len) for b in range(a + 1, k.shape_len)]
  for op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.PADTO):
    for axis in range(k.shape_len):
      for amt in ((0, 2, 3, 4) if op is not OptOps.PADTO else (4, 8)):
        ret.append(Opt(op, axis, amt))
  return ret


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_opts(name: str) -> None:
  check_case(name, [])


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_single_valid_opt(name: str) -> None:
  ast = CASES[name][0]
  base = Kernel(ast, opts=PythonRenderer())
  tried = 0
  for opt in candidate_opts(base):
    k = base.copy()
    try:
      k.apply_opt(opt)
    except KernelOptError:
      continue
    tried += 1
    out = run_kernel(k, CASES[name][1], CASES[name][2].shape)
    np.testing.assert_allclose(out, CASES[name][2], rtol=1e-4, atol=1e-4, err_msg=f"{name} with {opt}")
  assert tried > 0


@pytest.mark.parametrize("name", ["reduce_axis1", "matmul", "conv", "arange"])
def test_hand_coded_optimizations(name: str) -> None:
  ast, inputs, ref = CASES[name]
  k = Kernel(ast, opts=PythonRenderer()).hand_coded_optimizations()
  np.testing.assert_allclose(run_kernel(k, inputs, ref.shape), ref, rtol=1e-4, atol=1e-4)


class _NoLocalRenderer(PythonRenderer):
  has_local = False
  has_shared = False
  supports_float4 = False


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_local_renderer_uses_loops(name: str) -> None:
  k = check_case(name, [], renderer=_NoLocalRenderer())
  assert k.uops is not None
  assert not any(u.op.name == "SPECIAL" for u in k.uops.uops)


@settings(deadline=None)
@given(st.sampled_from(sorted(CASES)), st.lists(st.tuples(st.integers(0, 100), st.integers(0, 1000)), min_size=1, max_size=4))
def test_random_opt_sequences(name: str, picks: List[Tuple[int, int]]) -> None:
  ast, inputs, ref = CASES[name]
  k = Kernel(ast, opts=PythonRenderer())
  applied = []
  for i, _ in picks:
    cands = candidate_opts(k)
    opt = cands[i % len(cands)]
    try:
      k.apply_opt(opt)
      applied.append(opt)
    except KernelOptError:
      pass
  np.testing.assert_allclose(run_kernel(k, inputs, ref.shape), ref, rtol=1e-4, atol=1e-4, err_msg=f"{name} with {applied}")


def test_vector_loads_are_folded() -> None:
  ast, inputs, ref = CASES["elementwise"]
  k = check_case("elementwise", [Opt(OptOps.UPCAST, 0, 4)])
  assert k.uops is not None
  assert any(u.op.name == "LOAD" and u.dtype is not None and u.dtype.count == 4 for u in k.uops.uops)
  assert any(u.op.name == "STORE" and u.src[2].dtype is not None and u.src[2].dtype.count == 4 for u in k.uops.uops)


def test_grouped_reduce_uses_local_memory_and_barrier() -> None:
  k = check_case("reduce_axis1", [Opt(OptOps.GROUPTOP, 0, 4)])
  assert k.uops is not None
  ops = [u.op.name for u in k.uops.uops]
  assert "DEFINE_LOCAL" in ops and "BARRIER" in ops


def test_arange_loop_collapses() -> None:
  k = check_case("arange", [])
  assert k.uops is not None
  assert not any(u.op.name == "RANGE" for u in k.uops.uops), "the arange reduce should fold to a closed form"


def test_two_reduces_have_separate_accumulators() -> None:
  k = check_case("two_reduces", [])
  assert k.uops is not None
  assert sum(u.op.name == "DEFINE_ACC" for u in k.uops.uops) == 2



def test_symbolic_loop_bound_is_computed_before_its_loop() -> None:
  # a global loop that runs to `v+1`: the ALU for the bound must come before the RANGE on a renderer that emits loops
  v = Variable("v", 1, 10)
  x = rng.random((4, 11), dtype=np.float32)
  sin = ST.from_shape((4, 11)).shrink(((0, 4), (0, v + 1)))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (e(BinaryOps.MUL, ld(1, sin), const(2.0, ST.from_shape((4, v + 1)))),),
                                       MemBuffer(0, F32, ST.from_shape((4, v + 1)))),))
  k = Kernel(ast, opts=_NoLocalRenderer())
  prg = k.to_program()
  assert k.uops is not None
  verify_linearized(k.uops.uops)
  pos = {u: i for i, u in enumerate(k.uops.uops)}
  assert all(pos[s] < pos[u] for u in k.uops.uops if u.op.name == "RANGE" for s in u.src)
  n = 4
  out = memoryview(bytearray(4 * (n + 1) * 4)).cast("f")
  gs, ls = prg.launch_dims({v: n})
  PythonProgram(prg.name, prg.src.encode() if isinstance(prg.src, str) else prg.src)(
    out, memoryview(bytearray(x.tobytes())).cast("f"), global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)), vals=(n,))
  np.testing.assert_allclose(np.frombuffer(out.tobytes(), np.float32).reshape(4, n + 1), x[:, :n + 1] * 2)


def _run_symbolic(k: Kernel, inputs: Sequence[np.ndarray], out_size: int, var_vals: Dict[Variable, int]) -> np.ndarray:
  prg = k.to_program()
  assert k.uops is not None
  verify_linearized(k.uops.uops)
  mvs = [memoryview(bytearray(out_size * 4)).cast("f")] + [memoryview(bytearray(np.ascontiguousarray(x, np.float32).tobytes())).cast("f")
                                                           for x in inputs]
  gs, ls = prg.launch_dims(var_vals)
  PythonProgram(prg.name, prg.src.encode() if isinstance(prg.src, str) else prg.src)(
    *mvs, global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)), vals=tuple(var_vals[x] for x in prg.vars))
  return np.frombuffer(mvs[0].tobytes(), np.float32)


@pytest.mark.parametrize("renderer", [PythonRenderer, _NoLocalRenderer])
def test_hand_coded_optimizations_symbolic_length(renderer) -> None:
  # scores[h, t] = sum_d w[h, d] * a[t, d] for t < v (a KV cache of 256 slots): `a` broadcasts along h while the output's stride
  # along h is the symbolic `v`, which the upcast ranking used to sum as a bool
  v, H, T, D = Variable("t", 1, 256), 12, 256, 16
  w, a = rng.random((H, D), dtype=np.float32), rng.random((T, D), dtype=np.float32)
  sw = ST.from_shape((H, D)).reshape((H, 1, D)).expand((H, v, D))
  sa = ST.from_shape((T, D)).shrink(((0, v), (0, D))).reshape((1, v, D)).expand((H, v, D))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (e(ReduceOps.SUM, e(BinaryOps.MUL, ld(1, sw), ld(2, sa)), arg=(2,)),),
                                       MemBuffer(0, F32, ST.from_shape((H, v, 1)))),))
  k = Kernel(ast, opts=renderer()).hand_coded_optimizations()
  assert k.applied_opts, "the heuristic should still optimize the integer axes"
  for n in (5, 37):
    out = _run_symbolic(k, [w, a], H * n, {v: n})
    np.testing.assert_allclose(out.reshape(H, n), w @ a[:n].T, rtol=1e-4, atol=1e-4)


# *** a device's own heuristic (Renderer.hand_coded_optimizations) ***

class _HookRenderer(_NoLocalRenderer):
  """A third-party loop renderer with its own heuristic: records the kernels it is asked about and applies `opts` to them."""

  def __init__(self, opts: Sequence[Opt], decide: bool = True) -> None:
    self.my_opts, self.decide = list(opts), decide
    self.seen: List[Kernel] = []

  def hand_coded_optimizations(self, k: Kernel) -> bool:
    self.seen.append(k)
    k.apply_opts(self.my_opts)
    return self.decide


def test_device_heuristic_hook_chooses_the_opts() -> None:
  """A renderer's hook is asked first; when it says it chose, its opts are the kernel's, core adds none, and the result runs."""
  r = _HookRenderer([Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 3)])
  k = Kernel(CASES["matmul"][0], opts=r).hand_coded_optimizations()
  assert r.seen == [k] and k.applied_opts == r.my_opts, k.applied_opts
  check_case("matmul", r.my_opts, renderer=r)


def test_device_heuristic_hook_can_leave_the_kernel_to_core() -> None:
  """A hook that declines (False) leaves core's heuristic to carry on from where the hook left the kernel."""
  plain = Kernel(CASES["matmul"][0], opts=_NoLocalRenderer()).hand_coded_optimizations().applied_opts
  assert Kernel(CASES["matmul"][0], opts=_HookRenderer([], decide=False)).hand_coded_optimizations().applied_opts == plain
  k = Kernel(CASES["matmul"][0], opts=_HookRenderer([Opt(OptOps.UPCAST, 0, 2)], decide=False)).hand_coded_optimizations()
  assert k.applied_opts[0] == Opt(OptOps.UPCAST, 0, 2) and len(k.applied_opts) > 1, k.applied_opts


def test_core_heuristic_is_device_neutral() -> None:
  """Without a hook, core's heuristic ignores the vector width and register count a renderer declares (those are for the
  device's own heuristic): a loop renderer gets the same opts with or without them, for every case and a real matmul."""
  from tiny.engine.schedule import create_schedule
  from tiny.tensor import Tensor

  class Wide(_NoLocalRenderer):
    supports_float4 = True
    simd_bytes, simd_registers = 64, 32
  a, b = Tensor.empty(64, 48, device="PYTHON"), Tensor.empty(48, 64, device="PYTHON")
  asts = [c[0] for c in CASES.values()] + [create_schedule([(a @ b).lazydata])[-1].ast]
  for ast in asts:
    assert Kernel(ast, opts=Wide()).hand_coded_optimizations().applied_opts == \
      Kernel(ast, opts=_NoLocalRenderer()).hand_coded_optimizations().applied_opts
  # the generic choice for a 64x64 matmul: upcast both output axes by 4, unroll the reduce by 4
  mm = Kernel(asts[-1], opts=Wide()).hand_coded_optimizations()
  assert mm.applied_opts == [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4)], mm.applied_opts


# *** re-vectorizing lanes (Renderer.simd_bytes) and the SWAP opt ***

class _SimdRenderer(_NoLocalRenderer):
  """A loop-based renderer that asks for 64-byte vector ALU ops (the PYTHON device runs vector uops lane by lane)."""
  supports_float4 = True
  simd_bytes = 64


def _vector_alu_ops(k: Kernel) -> List[str]:
  assert k.uops is not None
  return [f"{u.op.name}:{u.arg.name if u.op.name == 'ALU' else ''}" for u in k.uops.uops
          if u.op.name in ("ALU", "PHI", "DEFINE_ACC") and u.dtype is not None and u.dtype.count > 1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_simd_renderer_keeps_every_case_correct(name: str) -> None:
  check_case(name, [])
  ast = CASES[name][0]
  k = Kernel(ast, opts=_SimdRenderer()).hand_coded_optimizations()
  np.testing.assert_allclose(run_kernel(k, CASES[name][1], CASES[name][2].shape), CASES[name][2], rtol=1e-4, atol=1e-4,
                             err_msg=f"{name} with {k.applied_opts}")


def test_simd_matmul_accumulates_in_vectors() -> None:
  # the 4 columns of an output row are one vector, fed by a broadcast of A and a vector load of B
  k = check_case("matmul", [Opt(OptOps.UPCAST, 1, 4)], renderer=_SimdRenderer())
  ops = _vector_alu_ops(k)
  assert ops.count("DEFINE_ACC:") == 1 and ops.count("PHI:") == 1, ops
  assert "ALU:MUL" in ops and "ALU:ADD" in ops, ops
  scalar_accs = [u for u in k.uops.uops if u.op.name == "DEFINE_ACC" and u.dtype is not None and u.dtype.count == 1]
  assert not scalar_accs


def test_without_simd_bytes_lanes_stay_scalar() -> None:
  k = check_case("matmul", [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 2)], renderer=_NoLocalRenderer())
  assert not _vector_alu_ops(k)


def test_simd_lanes_read_by_scalar_code_come_from_the_vector() -> None:
  # relu after a vectorized reduce: MAX lanes are packed too (rendered lane by lane), the result still matches
  ma, mb = CASES["matmul"][1]
  sa = ST.from_shape((8, 12)).reshape((8, 1, 12)).expand((8, 4, 12))
  smb = ST.from_shape((12, 4)).permute((1, 0)).reshape((1, 4, 12)).expand((8, 4, 12))
  mm = e(ReduceOps.SUM, e(BinaryOps.MUL, ld(1, sa), ld(2, smb)), arg=(2,))
  ast = kernel(e(BinaryOps.MAX, e(BinaryOps.ADD, mm, const(-3.0, ST.from_shape((8, 4, 1)))), const(0.0, ST.from_shape((8, 4, 1)))), (8, 4, 1))
  k = Kernel(ast, opts=_SimdRenderer())
  k.apply_opts([Opt(OptOps.UPCAST, 1, 4)])
  out = run_kernel(k, [ma - 0.5, mb], (8, 4, 1))
  np.testing.assert_allclose(out[:, :, 0], np.maximum((ma - 0.5) @ mb - 3.0, 0), rtol=1e-4, atol=1e-4)
  assert "PHI:" in _vector_alu_ops(k)


def test_swap_reorders_global_loops_and_keeps_results() -> None:
  k = check_case("matmul", [Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.SWAP, 0, 1)], renderer=_NoLocalRenderer())
  assert k.full_shape[:2] == (2, 8), k.full_shape
  check_case("conv", [Opt(OptOps.SWAP, 0, 2)], renderer=_NoLocalRenderer())


@pytest.mark.parametrize("opt", [Opt(OptOps.SWAP, 1, 1), Opt(OptOps.SWAP, 1, 0), Opt(OptOps.SWAP, 0, 2), Opt(OptOps.SWAP, 0, None)])
def test_swap_rejects_anything_but_two_global_axes(opt: Opt) -> None:
  k = Kernel(CASES["matmul"][0], opts=_NoLocalRenderer())   # (8, 4, 12): two global axes and the reduce
  with pytest.raises(KernelOptError):
    k.apply_opt(opt)
  assert k.full_shape == (8, 4, 12) and not k.applied_opts


@pytest.mark.parametrize("op", [ReduceOps.MAX, ReduceOps.SUM])
def test_simd_unrolled_row_reduce_keeps_a_vector_accumulator(op: ReduceOps) -> None:
  """A row reduce unrolled by 16 accumulates 16 lanes in one vector and reduces them once after the loop; NaN and inf
  lanes give numpy's answer."""
  x = rng.random((6, 64), dtype=np.float32) - 0.5
  x[1, 5], x[2, 40], x[3, :] = np.nan, np.inf, -np.inf
  s = ST.from_shape((6, 64))
  k = Kernel(kernel(e(op, ld(1, s), arg=(1,)), (6, 1)), opts=_SimdRenderer())
  k.apply_opt(Opt(OptOps.UNROLL, 0, 16))
  out = run_kernel(k, [x], (6, 1))
  ref = (x.max if op is ReduceOps.MAX else x.sum)(1, keepdims=True)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
  accs = [u for u in k.uops.uops if u.op.name == "DEFINE_ACC"]
  assert len(accs) == 1 and accs[0].dtype is not None and accs[0].dtype.count == 16


def test_simd_gated_lanes_fold_into_one_gated_vector_load() -> None:
  """Padded loads (each lane with its own gate) become one vector load under the AND of the gates, falling back to the
  lanes' own gated loads; unaligned starts are fine on a SIMD CPU. The PYTHON device runs it and matches numpy."""
  k = check_case("masked_pad", [Opt(OptOps.UPCAST, 1, 11)], renderer=_SimdRenderer())
  vloads = [u for u in k.uops.uops if u.op.name == "LOAD" and u.dtype is not None and u.dtype.count > 1]
  assert vloads and all(len(u.src) == 4 and u.src[3].op.name == "VECTORIZE" for u in vloads), vloads
  check_case("masked_pad", [Opt(OptOps.UPCAST, 1, 11)], renderer=_NoLocalRenderer())
