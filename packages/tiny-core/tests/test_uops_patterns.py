"""UOp helpers, UPat matching (names, commutative operands, permutations), PatternMatcher indexing and graph_rewrite."""
from __future__ import annotations

import math

from tiny.codegen.uops import PatternMatcher, UOp, UOps, UPat, graph_rewrite
from tiny.dtype import dtypes
from tiny.ops import BinaryOps, UnaryOps
from tiny.shape.symbolic import Variable

I32, F32 = dtypes.int32, dtypes.float32


def v(name: str, dt=I32) -> UOp:
  return UOp(UOps.VAR, dt, (), name)


def test_alu_helpers_set_dtypes() -> None:
  x = v("x", F32)
  assert (x + 1).dtype == F32 and (x + 1).src[1].op is UOps.CONST and (x + 1).src[1].arg == 1.0
  assert x.lt(2).dtype == dtypes.bool and x.ne(x).dtype == dtypes.bool
  assert x.cast(I32).dtype == I32 and x.cast(I32).op is UOps.CAST
  assert x.lt(0).where(x, 0.0).arg.name == "WHERE"
  assert (x + 1).commutative() and not x.lt(1).commutative()
  vec = UOp.const(F32.vec(4), 2.0)
  assert vec.op is UOps.VECTORIZE and len(vec.src) == 4 and vec.gep(3).dtype == F32


def test_value_ranges() -> None:
  g = UOp(UOps.SPECIAL, I32, (), (0, "gidx0", 16))
  r = UOp(UOps.RANGE, I32, (UOp.const(I32, 2), UOp.const(I32, 10)), (1000, True))
  dv = UOp(UOps.DEFINE_VAR, I32, (), Variable("n", 3, 30))
  assert (g.vmin, g.vmax) == (0, 15)
  assert (r.vmin, r.vmax) == (2, 9)
  assert (dv.vmin, dv.vmax) == (3, 30)
  e = g * 4 + r
  assert (e.vmin, e.vmax) == (2, 69)
  assert ((g % 4).vmin, (g % 4).vmax) == (0, 3)
  assert ((g // 4).vmin, (g // 4).vmax) == (0, 3)
  assert ((-g).vmin, (-g).vmax) == (-15, 0)
  assert g.lt(16).vmin is True and g.lt(0).vmax is False
  x = v("x", F32)
  assert x.vmin == -math.inf and x.vmax == math.inf


def test_vars_and_repr() -> None:
  a, b = Variable("b", 1, 4), Variable("a", 1, 4)
  u = UOp(UOps.DEFINE_VAR, I32, (), a) + UOp(UOps.DEFINE_VAR, I32, (), b)
  assert [x.expr for x in u.vars()] == ["a", "b"]
  assert "ALU" in repr(u) and "ADD" in repr(u)


def test_upat_binds_names_and_requires_same_uop_for_repeated_name() -> None:
  x, y = v("x"), v("y")
  pat = UPat(UOps.ALU, BinaryOps.ADD, (UPat.var("a"), UPat.var("a")))
  pm = PatternMatcher([(pat, lambda a: a * 2)])
  assert pm.rewrite(x + x) is not None
  assert pm.rewrite(x + y) is None


def test_commutative_matching_tries_both_orders() -> None:
  x = v("x")
  pm = PatternMatcher([(UPat.alu(BinaryOps.MUL, UPat.var("a"), UPat.cvar("c")), lambda a, c: a)])
  assert pm.rewrite(x * 3) is x
  assert pm.rewrite(UOp.const(I32, 3).alu(BinaryOps.MUL, x)) is x
  # not for non-commutative ops
  pm2 = PatternMatcher([(UPat.alu(BinaryOps.CMPLT, UPat.var("a"), UPat.cvar("c")), lambda a, c: a)])
  assert pm2.rewrite(x.lt(3)) is x
  assert pm2.rewrite(UOp.const(I32, 3).lt(x)) is None


def test_list_src_matches_any_permutation_and_single_upat_all() -> None:
  x = v("x", F32)
  three = UOp(UOps.ALU, F32, (x, UOp.const(F32, 1.0), UOp.const(dtypes.bool, True)), "FAKE")
  pm = PatternMatcher([(UPat(UOps.ALU, src=[UPat(UOps.CONST, dtype=dtypes.bool, name="b"), UPat.var("a"), UPat.cvar("c", dtype=F32)]),
                        lambda b, a, c: a)])
  assert pm.rewrite(three) is x
  allc = PatternMatcher([(UPat(UOps.ALU, name="r", src=UPat(UOps.CONST)), lambda r: r.src[0])])
  assert allc.rewrite(UOp.const(I32, 1) + UOp.const(I32, 2)) is not None
  assert allc.rewrite(x + 1.0) is None


def test_dtype_and_arg_filters_and_any_len() -> None:
  x = v("x", F32)
  pm = PatternMatcher([(UPat(UOps.ALU, UnaryOps.NEG, dtype=I32, name="n"), lambda n: n.src[0])])
  assert pm.rewrite(-x) is None and pm.rewrite(-v("y")) is not None
  pm2 = PatternMatcher([(UPat(UOps.SINK, src=(UPat.var("a"),), allow_any_len=True), lambda a: a)])
  assert pm2.rewrite(UOp(UOps.SINK, None, (x, x, x))) is x
  assert pm2.rewrite(UOp(UOps.SINK, None, ())) is None


def test_first_matching_rule_wins_and_arg_index() -> None:
  x = v("x")
  pm = PatternMatcher([
    (UPat(UOps.ALU, name="r"), lambda r: None),             # generic, declines
    (UPat.alu(BinaryOps.ADD, UPat.var("a"), UPat.var()), lambda a: UOp.const(I32, 1)),
    (UPat(UOps.ALU, name="r"), lambda r: UOp.const(I32, 2)),
  ])
  assert pm.rewrite(x + x).arg == 1
  assert pm.rewrite(x * x).arg == 2


def test_graph_rewrite_reaches_fixed_point_and_dedups() -> None:
  x = v("x")
  # (x + 0) appears twice as different objects: after rewriting they are one node
  a, b = (x + 0) * 2, (x + 0) * 2
  pm = PatternMatcher([(UPat.alu(BinaryOps.ADD, UPat.var("a"), UPat(UOps.CONST, 0)), lambda a: a)])
  sink = graph_rewrite(UOp(UOps.SINK, None, (a, b)), pm)
  assert sink.src[0] is sink.src[1] and sink.src[0].src[0] is x
  # chains rewrite until nothing applies: ((x+0)+0)+0 -> x
  deep = x
  for _ in range(500):
    deep = deep + 0
  assert graph_rewrite(UOp(UOps.SINK, None, (deep,)), pm).src[0] is x


def test_graph_rewrite_is_fast_on_wide_graphs() -> None:
  import time
  from tiny.codegen.uopgraph import constant_folder
  xs = [v(f"x{i}") for i in range(200)]
  tot = xs[0]
  for i, x in enumerate(xs[1:]):
    tot = tot + (x * (i % 3) + 0) * 1
  st = time.process_time()  # CPU time, so a loaded machine does not fail it
  graph_rewrite(UOp(UOps.SINK, None, (tot,)), constant_folder)
  assert time.process_time() - st < 2.0


def test_uop_fields_are_read_only_and_copyable() -> None:
  # UOp fills its fields itself (faster than the frozen dataclass __init__): still frozen, replace() and pickle still work
  import dataclasses
  import pickle
  x = UOp(UOps.ALU, F32, (v("a", F32), v("b", F32)), BinaryOps.ADD)
  try:
    x.op = UOps.CONST   # type: ignore[misc]
    raise AssertionError("a UOp field could be set")
  except dataclasses.FrozenInstanceError:
    pass
  y = dataclasses.replace(x, arg=BinaryOps.MUL)
  assert y.op is UOps.ALU and y.dtype == F32 and y.src is x.src and y.arg is BinaryOps.MUL
  z = pickle.loads(pickle.dumps(x))
  assert z.op is UOps.ALU and z.arg is BinaryOps.ADD and [s.arg for s in z.src] == ["a", "b"]
  assert UOp(UOps.SINK).src == () and UOp(UOps.SINK).dtype is None and UOp(UOps.SINK).arg is None


def test_graph_rewrite_keeps_uops_with_unhashable_args_apart() -> None:
  # an arg that cannot be hashed keeps its uop out of the structural merge instead of failing the rewrite
  a, b = UOp(UOps.NOOP, I32, (), [1]), UOp(UOps.NOOP, I32, (), [1])
  c, d = UOp(UOps.NOOP, I32, (), (1,)), UOp(UOps.NOOP, I32, (), (1,))
  out = graph_rewrite(UOp(UOps.SINK, None, (a, b, c, d)), PatternMatcher([]))
  assert out.src[0] is not out.src[1] and out.src[0].arg == [1] and out.src[2] is out.src[3]
