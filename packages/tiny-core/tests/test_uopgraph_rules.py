"""Each rewrite rule of tiny.codegen.uopgraph, and random ALU trees keeping their value through graph_rewrite."""
from __future__ import annotations

import math
from typing import Any, Dict

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tiny.codegen.transcendental import xexp2, xlog2, xsin
from tiny.codegen.uopgraph import constant_folder, expander, fold_vector_memory, graph_rewrite, make_reduce_lowerer, threefry2x32
from tiny.codegen.uops import PatternMatcher, UOp, UOps
from tiny.dtype import PtrDType, dtypes
from tiny.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu, threefry2x32 as threefry_ref
from tiny.shape.symbolic import Variable

I32, F32, BOOL = dtypes.int32, dtypes.float32, dtypes.bool


def evaluate(u: UOp, env: Dict[str, Any], memo: Dict[UOp, Any] | None = None) -> Any:
  """Reference interpreter for scalar uop graphs (leaves: CONST, VAR/DEFINE_VAR named in env, RANGE/SPECIAL by name)."""
  memo = {} if memo is None else memo
  if u in memo:
    return memo[u]
  if u.op is UOps.CONST:
    r = u.arg
  elif u.op in (UOps.VAR, UOps.DEFINE_VAR):
    r = env[u.arg if isinstance(u.arg, str) else u.arg.expr]
  elif u.op is UOps.SPECIAL:
    r = env[u.arg[1]]
  elif u.op is UOps.ALU:
    r = exec_alu(u.arg, u.dtype, [evaluate(s, env, memo) for s in u.src])
  elif u.op is UOps.CAST:
    r = exec_alu(UnaryOps.CAST, u.dtype, [evaluate(u.src[0], env, memo)])
  elif u.op is UOps.BITCAST:
    import struct
    v = evaluate(u.src[0], env, memo)
    r = struct.unpack(u.dtype.fmt, struct.pack(u.src[0].dtype.fmt, v))[0]
  elif u.op is UOps.VECTORIZE:
    r = tuple(evaluate(s, env, memo) for s in u.src)
  elif u.op is UOps.GEP:
    r = evaluate(u.src[0], env, memo)[u.arg]
  else:
    raise NotImplementedError(u.op)
  memo[u] = r
  return r


def var(name: str, dtype=I32) -> UOp:
  return UOp(UOps.VAR, dtype, (), name)


def dvar(name: str, lo: int, hi: int) -> UOp:
  return UOp(UOps.DEFINE_VAR, I32, (), Variable(name, lo, hi))


def rw(u: UOp) -> UOp:
  return graph_rewrite(UOp(UOps.SINK, None, (u,)), constant_folder).src[0]


def skey(u: UOp) -> Any:
  return (u.op, u.dtype, repr(u.arg), tuple(skey(s) for s in u.src))


def seq(a: UOp, b: UOp) -> bool:
  """Structural equality of two graphs."""
  return skey(a) == skey(b)


def same(a: Any, b: Any) -> bool:
  if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
    return True
  return a == b


# *** one test per rule family ***

def test_fold_constants() -> None:
  u = UOp.const(I32, 3) * UOp.const(I32, 4) + UOp.const(I32, 5)
  r = rw(u)
  assert r.op is UOps.CONST and r.arg == 17


def test_fold_constants_wraps_like_the_dtype() -> None:
  r = rw(UOp.const(dtypes.uint8, 200) + UOp.const(dtypes.uint8, 100))
  assert r.op is UOps.CONST and r.arg == 44


def test_fold_cast_of_const() -> None:
  r = rw(UOp.const(F32, -2.75).cast(I32))
  assert r.op is UOps.CONST and r.arg == -2 and r.dtype == I32


def test_cast_to_same_dtype_is_removed() -> None:
  x = var("x")
  assert seq(rw(x.cast(I32)), rw(x))


@pytest.mark.parametrize("build,expect", [
  (lambda x: x + 0, "x"), (lambda x: x * 1, "x"), (lambda x: x // 1, "x"), (lambda x: -(-x), "x"), (lambda x: x.max(x), "x"),
  (lambda x: x * 0, 0), (lambda x: x % 1, 0), (lambda x: x + (-x), 0),
])
def test_int_identities(build, expect) -> None:
  x = var("x")
  r = rw(build(x))
  if expect == "x":
    assert seq(r, rw(x))
  else:
    assert r.op is UOps.CONST and r.arg == expect


def test_float_mul_zero_is_not_folded() -> None:
  # 0 * inf is nan, so x*0 must stay for floats
  x = var("x", F32)
  r = rw(x * 0.0)
  assert r.op is UOps.ALU


def test_bool_identities() -> None:
  b = var("b", BOOL)
  assert seq(rw(b & True), rw(b))
  assert seq(rw(b | False), rw(b))
  assert rw(b & False).arg is False
  assert rw(b | True).arg is True
  assert seq(rw(b.ne(True).ne(True)), rw(b))
  assert seq(rw(b.ne(False)), rw(b))


def test_compare_with_self() -> None:
  x = var("x")
  assert rw(x.lt(x)).arg is False and rw(x.ne(x)).arg is False


def test_where_folds() -> None:
  x, y, c = var("x", F32), var("y", F32), var("c", BOOL)
  assert seq(rw(UOp.const(BOOL, True).where(x, y)), rw(x))
  assert seq(rw(UOp.const(BOOL, False).where(x, y)), rw(y))
  assert seq(rw(c.where(x, x)), rw(x))
  # where(!c, x, y) -> where(c, y, x)
  r = rw(c.ne(True).where(x, y))
  assert r.arg is TernaryOps.WHERE and seq(r.src[0], rw(c)) and seq(r.src[1], rw(y))


def test_constants_move_right_and_chain() -> None:
  x = var("x")
  r = rw((UOp.const(I32, 3) + x) + 4)
  assert r.arg is BinaryOps.ADD and r.src[1].op is UOps.CONST and r.src[1].arg == 7
  r = rw((x * 3) * 4)
  assert r.arg is BinaryOps.MUL and r.src[1].arg == 12


def test_distribute_const_and_combine_terms() -> None:
  x = var("x")
  r = rw((x + 2) * 3)
  env = {"x": 5}
  assert evaluate(r, env) == 21 and r.arg is BinaryOps.ADD and r.src[1].op is UOps.CONST
  r = rw(x * 3 + x * 5)
  assert r.arg is BinaryOps.MUL and r.src[1].arg == 8


def test_div_mod_of_index_expressions() -> None:
  g, l = dvar("g", 0, 99), dvar("l", 0, 3)
  idx = g * 4 + l
  assert seq(rw(idx // 4), rw(g))
  assert seq(rw(idx % 4), rw(l))
  assert rw(l // 4).arg == 0
  assert seq(rw(l % 4), rw(l))
  assert seq(rw((g // 2) // 3), rw(g // 6))
  assert seq(rw((g % 12) % 4), rw(g % 4))


def test_value_range_folds_comparisons() -> None:
  l = dvar("l", 0, 3)
  assert rw(l.lt(4)).arg is True
  assert rw(l.lt(0)).arg is False
  assert rw((l + 10).ne(2)).arg is True
  assert seq(rw(l.max(-5)), rw(l))


def test_one_iteration_range_is_its_start() -> None:
  r = UOp(UOps.RANGE, I32, (UOp.const(I32, 0), UOp.const(I32, 1)), (1000, True))
  assert rw(r + 1).arg == 1


def test_gate_true_load_and_false_store() -> None:
  buf = UOp(UOps.DEFINE_GLOBAL, PtrDType(F32), (), (0, True))
  idx = UOp.const(I32, 0)
  ld = UOp(UOps.LOAD, F32, (buf, idx, UOp.const(BOOL, True), UOp.const(F32, 0)))
  assert len(rw(ld).src) == 2
  ld0 = UOp(UOps.LOAD, F32, (buf, idx, UOp.const(BOOL, False), UOp.const(F32, 7)))
  assert rw(ld0).arg == 7.0
  st = UOp(UOps.STORE, None, (buf, idx, UOp.const(F32, 1), UOp.const(BOOL, False)))
  sink = graph_rewrite(UOp(UOps.SINK, None, (st,)), constant_folder)
  assert sink.src == ()


def _range(axis: int, n: int) -> UOp:
  return UOp(UOps.RANGE, I32, (UOp.const(I32, 0), UOp.const(I32, n)), (axis, True))


def test_loop_collapse_counts_the_box() -> None:
  # sum over r in [0, 10) of (r < g+1 ? 2.0 : 0) == 2*min(g+1, 10)
  g = dvar("g", 0, 20)
  r = _range(1000, 10)
  red = UOp(UOps.REDUCE, F32, (r.lt(g + 1).where(UOp.const(F32, 2.0), UOp.const(F32, 0.0)), r), BinaryOps.ADD)
  out = rw(red)
  assert not any(x.op is UOps.RANGE for x in out.sparents)
  for gv in range(21):
    assert evaluate(out, {"g": gv}) == 2.0 * min(gv + 1, 10)


def test_loop_collapse_with_lower_and_upper_bounds() -> None:
  g = dvar("g", 0, 20)
  r = _range(1000, 16)
  cond = r.lt(g + 3) & r.ge(g)
  red = UOp(UOps.REDUCE, I32, (cond.where(UOp.const(I32, 1), UOp.const(I32, 0)), r), BinaryOps.ADD)
  out = rw(red)
  assert not any(x.op is UOps.RANGE for x in out.sparents)
  for gv in range(21):
    assert evaluate(out, {"g": gv}) == sum(1 for i in range(16) if gv <= i < gv + 3)


def test_accumulator_folding() -> None:
  r = _range(1000, 8)
  x = var("x", F32)
  # sum of a loop-invariant value -> value * trip count
  out = rw(UOp(UOps.REDUCE, F32, (x, r), BinaryOps.ADD))
  assert not any(s.op is UOps.RANGE for s in out.sparents) and evaluate(out, {"x": 1.5}) == 12.0
  # max of a loop-invariant value is the value
  assert seq(rw(UOp(UOps.REDUCE, F32, (x, r), BinaryOps.MAX)), rw(x))
  # sum of (f(r) + c) -> sum(f(r)) + c*n
  out = rw(UOp(UOps.REDUCE, I32, (r * 2 + var("c"), r), BinaryOps.ADD))
  red = [s for s in out.sparents if s.op is UOps.REDUCE]
  assert len(red) == 1 and not any(s.op is UOps.VAR for s in red[0].sparents)


def test_expander_expand_and_contract() -> None:
  ex = UOp(UOps.EXPAND, I32, tuple(UOp.const(I32, i) for i in range(4)), ((5, 4),))
  y = ex * 3
  sink = graph_rewrite(UOp(UOps.SINK, None, (y,)), constant_folder + expander)
  assert sorted(s.arg for s in sink.src) == [0, 3, 6, 9]
  con = UOp(UOps.CONTRACT, I32.vec(4), (ex + 1,), ((5, 4),))
  sink = graph_rewrite(UOp(UOps.SINK, None, (con,)), constant_folder + expander)
  assert sink.src[0].op is UOps.VECTORIZE and [s.arg for s in sink.src[0].src] == [1, 2, 3, 4]


def test_expander_two_axes_and_partial_contract() -> None:
  a = UOp(UOps.EXPAND, I32, tuple(UOp.const(I32, i) for i in range(2)), ((1, 2),))
  b = UOp(UOps.EXPAND, I32, tuple(UOp.const(I32, 10 * i) for i in range(3)), ((2, 3),))
  con = UOp(UOps.CONTRACT, I32.vec(3), (a + b,), ((2, 3),))
  sink = graph_rewrite(UOp(UOps.SINK, None, (con,)), constant_folder + expander)
  got = sorted(tuple(s.arg for s in v.src) for v in sink.src)
  assert got == [(0, 10, 20), (1, 11, 21)]


def test_reduce_lowering_makes_acc_and_phi() -> None:
  r = _range(1000, 4)
  red = UOp(UOps.REDUCE, F32, (r.cast(F32), r), BinaryOps.MAX)
  out = graph_rewrite(UOp(UOps.SINK, None, (red,)), make_reduce_lowerer()).src[0]
  assert out.op is UOps.PHI and out.src[0].op is UOps.DEFINE_ACC
  assert out.src[0].src[0].arg == -math.inf and out.src[0].src[1] is r


def test_vector_memory_folding() -> None:
  class Opts:
    supports_float4 = True
  buf = UOp(UOps.DEFINE_GLOBAL, PtrDType(F32), (), (1, False))
  out = UOp(UOps.DEFINE_GLOBAL, PtrDType(F32), (), (0, True))
  g = UOp(UOps.SPECIAL, I32, (), (0, "gidx0", 8))
  base = g * 4
  lds = [UOp(UOps.LOAD, F32, (buf, base + i if i else base)) for i in range(4)]
  sts = [UOp(UOps.STORE, None, (out, base + i if i else base, lds[i] * 2.0)) for i in range(4)]
  sink = fold_vector_memory(graph_rewrite(UOp(UOps.SINK, None, tuple(sts)), constant_folder), Opts())
  assert len(sink.src) == 1 and sink.src[0].src[2].dtype == F32.vec(4)
  assert any(u.op is UOps.LOAD and u.dtype == F32.vec(4) for u in sink.sparents)
  # unaligned bases are left alone
  lds = [UOp(UOps.LOAD, F32, (buf, g + i if i else g)) for i in range(4)]
  sink = fold_vector_memory(graph_rewrite(UOp(UOps.SINK, None, tuple(UOp(UOps.STORE, None, (out, g, x)) for x in lds)), constant_folder), Opts())
  assert not any(u.op is UOps.LOAD and u.dtype is not None and u.dtype.count > 1 for u in sink.sparents)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_threefry_decomposition_matches_reference(x: int, key: int) -> None:
  u = threefry2x32(var("x", dtypes.uint64), var("k", dtypes.uint64))
  assert not any(s.op is UOps.ALU and s.arg is BinaryOps.THREEFRY for s in u.sparents)
  assert evaluate(u, {"x": x, "k": key}) == threefry_ref(x, key)


def test_threefry_known_answer() -> None:
  # Random123 known-answer vector for threefry2x32_20 with counter (0, 0) and key (0, 0)
  r = threefry_ref(0, 0)
  assert (r & 0xFFFFFFFF, r >> 32) == (0x6B200159, 0x99BA4EFE)


@pytest.mark.parametrize("dt,tol", [(dtypes.float32, 3e-6), (dtypes.float64, 1e-13), (dtypes.float16, 1e-3)])
def test_transcendentals_match_numpy(dt, tol) -> None:
  x = var("x", dt)
  fe, fl, fs = xexp2(x), xlog2(x), xsin(x)
  npdt = {dtypes.float32: np.float32, dtypes.float64: np.float64, dtypes.float16: np.float16}[dt]
  vals = [-200.0, -126.3, -20.5, -1.0, -0.3, 0.0, 1e-40, 1e-3, 0.5, 1.0, 1.4142, 2.0, 3.7, 17.25, 100.0, 127.9, 1e5, math.inf, -math.inf, math.nan]
  for v in vals:
    v = float(npdt(v))
    for f, ref in ((fe, np.exp2), (fl, np.log2), (fs, np.sin)):
      if f is fs and abs(v) > 1e4 and not math.isinf(v):
        continue
      with np.errstate(all="ignore"):
        want = float(npdt(ref(np.float64(v))))
      got = evaluate(f, {"x": v})
      if math.isnan(want) or math.isinf(want):
        assert same(got, want) or (math.isnan(want) and math.isnan(got)), (f, v, got, want)
      else:
        assert abs(got - want) <= tol * max(1.0, abs(want)) + (1e-7 if dt == dtypes.float16 else 0), (dt, v, got, want)


# *** random ALU trees: same value before and after rewriting ***

INT_DTS = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]
FLOAT_DTS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]


@st.composite
def alu_tree(draw, dt, depth: int = 4) -> UOp:
  is_int = dt in INT_DTS
  leaf_vals = st.integers(0, 5) if dt in (dtypes.uint8, dtypes.int8) else st.integers(-3, 9) if is_int else st.floats(-8, 8, width=16)
  if depth == 0 or draw(st.integers(0, 3)) == 0:
    k = draw(st.integers(0, 3))
    if k == 0:
      v = draw(leaf_vals)
      return UOp.const(dt, v if not is_int or not dtypes.is_unsigned(dt) else abs(v))
    if k == 1 and dt == I32:
      return dvar(draw(st.sampled_from(["a", "b"])), 0, 20)
    return var(draw(st.sampled_from(["x", "y", "z"])), dt)
  a = draw(alu_tree(dt, depth - 1))
  b = draw(alu_tree(dt, depth - 1))
  choice = draw(st.sampled_from(["add", "mul", "max", "neg", "where", "div", "mod", "xor", "cast"] if is_int else
                                ["add", "mul", "max", "neg", "where", "cast"]))
  if choice == "add":
    return a + b
  if choice == "mul":
    return a * b
  if choice == "max":
    return a.max(b)
  if choice == "neg":
    return -a
  if choice == "where":
    return a.lt(b).where(b, a + UOp.const(dt, 1))
  if choice in ("div", "mod"):
    c = UOp.const(dt, draw(st.integers(1, 6)))
    return a // c if choice == "div" else a % c
  if choice == "xor":
    return a ^ b
  other = I32 if not is_int else F32
  return a.cast(other).cast(dt)


@settings(deadline=None)
@given(st.data())
def test_random_alu_trees_keep_their_value(data) -> None:
  dt = data.draw(st.sampled_from(INT_DTS + FLOAT_DTS))
  tree = data.draw(alu_tree(dt))
  is_int = dt in INT_DTS
  vals = st.integers(0, 20) if is_int else st.floats(-16, 16, width=32)
  env = {n: data.draw(vals) for n in ("x", "y", "z")}
  env.update({"a": data.draw(st.integers(0, 20)), "b": data.draw(st.integers(0, 20))})
  if dt in (dtypes.uint8, dtypes.int8):
    env.update({n: env[n] % 6 for n in ("x", "y", "z")})
  if not is_int:
    env = {k: (exec_alu(UnaryOps.CAST, dt, [v]) if k in "xyz" else v) for k, v in env.items()}
  before = evaluate(tree, env)
  after = evaluate(rw(tree), env)
  assume(not (isinstance(before, float) and math.isnan(before) and not isinstance(after, float)))
  assert same(before, after), (tree, env, before, after)


def test_pattern_matcher_sum_is_ordered() -> None:
  pm = PatternMatcher([]) + constant_folder
  assert len(pm.patterns) == len(constant_folder.patterns)
