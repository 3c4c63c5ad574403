"""Rewrite rules on the UOp graph and the linearizer that turns the graph into a list.

Passes, in order (`UOpGraph.linearize`):
1. symbolic folding + the expander (EXPAND/CONTRACT disappear, every lane becomes scalar uops),
2. reduce lowering (REDUCE -> DEFINE_ACC + PHI) and folding again,
3. decompositions the renderer needs (threefry, transcendental), vector load/store folding, re-vectorizing ALU lanes
   (CPU renderers, `tiny.codegen.vectorize`), the renderer's extra rules,
4. block-structured linearization (RANGE/ENDRANGE around exactly the uops that need the loop).
"""
from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import defaultdict
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple, Union

from tiny.dtype import DType, dtypes
from tiny.helpers import DEBUG, TRANSCENDENTAL, dedup, flatten, prod
from tiny.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu
from tiny.codegen.uops import UOp, UOps, UPat, PatternMatcher, graph_rewrite, graph_substitute, uop_const_value
from tiny.codegen.vectorize import vectorize_lanes

INT_DTYPES = frozenset({dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64})


def _is_int(u: UOp) -> bool:
  return u.dtype in INT_DTYPES


def _depends_on(u: UOp, r: UOp) -> bool:
  if r.op is UOps.RANGE:
    return r in u.loop_ranges
  return u is r or r in u.parents


def all_nodes(sink: UOp) -> List[UOp]:
  """Every uop reachable from sink, sources before users (iterative: graphs can be deep)."""
  return _toposort(sink)


# *** constant folding and algebraic identities ***

def _fold_consts(root: UOp) -> Optional[UOp]:
  if root.dtype is None or root.dtype.count > 1:
    return None
  vals = [uop_const_value(s) for s in root.src]
  if any(v is None for v in vals):
    return None
  try:
    return UOp.const(root.dtype, exec_alu(root.arg, root.dtype, vals))
  except (ValueError, TypeError, ZeroDivisionError, OverflowError):
    return None


def _fold_range(root: UOp) -> Optional[UOp]:
  # an int/bool value whose range collapsed to one value is that constant
  if root.dtype is None or root.dtype.count > 1 or not (_is_int(root) or root.dtype == dtypes.bool):
    return None
  lo, hi = root.vmin, root.vmax
  if lo == hi and isinstance(lo, (int, bool)) and not (isinstance(lo, float)):
    return UOp.const(root.dtype, lo)
  return None


def _split_const(u: UOp) -> Tuple[UOp, int]:
  """u as (rest, c) with u == rest + c (c is 0 when there is no constant term)."""
  if u.op is UOps.ALU and u.arg is BinaryOps.ADD and u.src[1].op is UOps.CONST and isinstance(u.src[1].arg, int):
    return u.src[0], u.src[1].arg
  return u, 0


def _terms(u: UOp) -> List[UOp]:
  if u.op is UOps.ALU and u.arg is BinaryOps.ADD:
    return _terms(u.src[0]) + _terms(u.src[1])
  return [u]


def _sum(terms: Sequence[UOp], like: UOp) -> UOp:
  return functools.reduce(lambda a, b: a + b, terms) if terms else like.const_like(0)


def _fold_div_mod(x: UOp, c: UOp, op: BinaryOps) -> Optional[UOp]:
  """(q*c + r) // c -> q + r//c and (q*c + r) % c -> r % c, for non-negative x and r (C and floor division agree there)."""
  if not isinstance(c.arg, int) or c.arg <= 0 or not _is_int(x) or x.vmin < 0:
    return None
  if x.vmax < c.arg:
    return x if op is BinaryOps.MOD else x.const_like(0)
  quo, rem = [], []
  for t in _terms(x):
    if (d := t.divides(c.arg)) is not None:
      quo.append(d)
    else:
      rem.append(t)
  if not quo:
    # nested division: (x // a) // b -> x // (a*b)
    if op is BinaryOps.IDIV and x.op is UOps.ALU and x.arg is BinaryOps.IDIV and x.src[1].op is UOps.CONST and x.src[0].vmin >= 0:
      return x.src[0] // (x.src[1].arg * c.arg)
    # (x % (k*c)) % c -> x % c
    if op is BinaryOps.MOD and x.op is UOps.ALU and x.arg is BinaryOps.MOD and x.src[1].op is UOps.CONST and x.src[1].arg % c.arg == 0:
      return x.src[0] % c.arg
    return None
  r = _sum(rem, x)
  if r.vmin < 0:
    return None
  if op is BinaryOps.MOD:
    return r % c.arg if rem else x.const_like(0)
  return _sum(quo, x) + (r // c.arg) if rem else _sum(quo, x)


def _assoc_const(root: UOp, x: UOp, c1: UOp, c2: UOp) -> Optional[UOp]:
  # (x op c1) op c2 -> x op (c1 op c2)
  if root.dtype is None or root.dtype.count > 1:
    return None
  return x.alu(root.arg, UOp.const(root.dtype, exec_alu(root.arg, root.dtype, [c1.arg, c2.arg])))


def _const_right(root: UOp, c: UOp, x: UOp) -> Optional[UOp]:
  # canonical order: constants second, so the chained-constant rules see them
  if not root.commutative() or root.src[0] is not c or x.op is UOps.CONST:
    return None
  return UOp(UOps.ALU, root.dtype, (x, c), root.arg)


def _where_push(w: UOp, cond: UOp, x: UOp, y: UOp, root: UOp) -> Optional[UOp]:
  # where(c, x, 0) * y -> where(c, x*y, 0): exposes masked reduces to the loop collapse
  if uop_const_value(w.src[2]) != 0 or root.dtype is None:
    return None
  # for floats 0*y is not 0 when y is inf/nan: only push finite constants
  if not (_is_int(root) or root.dtype == dtypes.bool) and not (y.op is UOps.CONST and math.isfinite(y.arg)):
    return None
  return cond.where(x * y, root.const_like(0))


def _cast_where(root: UOp, cond: UOp, x: UOp) -> Optional[UOp]:
  assert root.dtype is not None
  return cond.where(x.cast(root.dtype), root.const_like(0))


symbolic_rules: List[Tuple[UPat, Callable[..., Optional[UOp]]]] = [
  # constants
  (UPat(UOps.ALU, name="root", src=UPat(UOps.CONST)), _fold_consts),
  (UPat(UOps.CAST, name="root", src=(UPat(UOps.CONST, name="c"),)),
   lambda root, c: UOp.const(root.dtype, exec_alu(UnaryOps.CAST, root.dtype, [c.arg])) if root.dtype.count == 1 else None),
  (UPat(UOps.CAST, name="root", src=(UPat.var("x"),)), lambda root, x: x if x.dtype == root.dtype else None),
  # identities
  (UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat(UOps.CONST, 0)), lambda x: x),
  (UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat(UOps.CONST, 1)), lambda x: x),
  (UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat(UOps.CONST, 0, name="z")), lambda x, z: z if _is_int(x) or x.dtype == dtypes.bool else None),
  (UPat.alu(BinaryOps.IDIV, UPat.var("x"), UPat(UOps.CONST, 1)), lambda x: x),
  (UPat.alu(BinaryOps.MOD, UPat.var("x"), UPat(UOps.CONST, 1)), lambda x: x.const_like(0) if _is_int(x) else None),
  # integer x // 0 == x % 0 == 0 and x % -1 == 0 (numpy's answers, see tiny.ops._idiv); x // -1 is left to guard_int_division
  (UPat.alu(BinaryOps.IDIV, UPat.var("x"), UPat(UOps.CONST, 0)), lambda x: x.const_like(0) if _is_int(x) else None),
  (UPat.alu(BinaryOps.MOD, UPat.var("x"), UPat(UOps.CONST, 0)), lambda x: x.const_like(0) if _is_int(x) else None),
  (UPat.alu(BinaryOps.MOD, UPat.var("x"), UPat(UOps.CONST, -1)), lambda x: x.const_like(0) if _is_int(x) else None),
  (UPat.alu(UnaryOps.NEG, UPat.alu(UnaryOps.NEG, UPat.var("x"))), lambda x: x),
  (UPat.alu(BinaryOps.MAX, UPat.var("x"), UPat.var("x")), lambda x: x),
  (UPat.alu(BinaryOps.AND, UPat.var("x"), UPat.var("x")), lambda x: x),
  (UPat.alu(BinaryOps.OR, UPat.var("x"), UPat.var("x")), lambda x: x),
  (UPat.alu(BinaryOps.CMPLT, UPat.var("x"), UPat.var("x")), lambda x: UOp.const(dtypes.bool, False) if _is_int(x) else None),
  (UPat.alu(BinaryOps.CMPNE, UPat.var("x"), UPat.var("x")), lambda x: UOp.const(dtypes.bool, False) if _is_int(x) else None),
  (UPat.alu(BinaryOps.AND, UPat.var("x", dtype=dtypes.bool), UPat(UOps.CONST, True)), lambda x: x),
  (UPat.alu(BinaryOps.AND, UPat.var("x", dtype=dtypes.bool), UPat(UOps.CONST, False, name="f")), lambda x, f: f),
  (UPat.alu(BinaryOps.OR, UPat.var("x", dtype=dtypes.bool), UPat(UOps.CONST, False)), lambda x: x),
  (UPat.alu(BinaryOps.OR, UPat.var("x", dtype=dtypes.bool), UPat(UOps.CONST, True, name="t")), lambda x, t: t),
  (UPat.alu(BinaryOps.CMPNE, UPat.var("x", dtype=dtypes.bool), UPat(UOps.CONST, False)), lambda x: x),
  (UPat.alu(BinaryOps.CMPNE, UPat.alu(BinaryOps.CMPNE, UPat.var("x", dtype=dtypes.bool), UPat(UOps.CONST, True)), UPat(UOps.CONST, True)),
   lambda x: x),
  # where
  (UPat.alu(TernaryOps.WHERE, UPat(UOps.CONST, name="c"), UPat.var("x"), UPat.var("y")), lambda c, x, y: x if c.arg else y),
  (UPat.alu(TernaryOps.WHERE, UPat.var(), UPat.var("x"), UPat.var("x")), lambda x: x),
  (UPat.alu(TernaryOps.WHERE, UPat.alu(BinaryOps.CMPNE, UPat.var("c", dtype=dtypes.bool), UPat(UOps.CONST, True)), UPat.var("x"),
            UPat.var("y")), lambda c, x, y: c.where(y, x)),
  (UPat.alu(BinaryOps.MUL, UPat.alu(TernaryOps.WHERE, UPat.var("cond"), UPat.var("x"), UPat(UOps.CONST), name="w"), UPat.var("y"),
            name="root"), _where_push),
  (UPat(UOps.CAST, name="root", src=(UPat.alu(TernaryOps.WHERE, UPat.var("cond"), UPat.var("x"), UPat(UOps.CONST, 0)),)), _cast_where),
  # canonical order and chained constants
  (UPat(UOps.ALU, name="root", src=(UPat(UOps.CONST, name="c"), UPat.var("x"))), _const_right),
  (UPat.alu(BinaryOps.ADD, UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.cvar("c1")), UPat.cvar("c2"), name="root"),
   lambda root, x, c1, c2: _assoc_const(root, x, c1, c2) if _is_int(x) else None),
  (UPat.alu(BinaryOps.MAX, UPat.var("x"), UPat.var("y")), lambda x, y: x if x.vmin >= y.vmax and _is_int(x) else None),
  (UPat.alu(BinaryOps.MUL, UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c1")), UPat.cvar("c2"), name="root"),
   lambda root, x, c1, c2: _assoc_const(root, x, c1, c2) if _is_int(x) else None),
  # move constants out of sums: (x + c) + y -> (x + y) + c
  (UPat.alu(BinaryOps.ADD, UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.cvar("c")), UPat.var("y")),
   lambda x, c, y: (x + y) + c if y.op is not UOps.CONST and _is_int(x) else None),
  # (x + c1) * c2 -> x*c2 + c1*c2 (index math)
  (UPat.alu(BinaryOps.MUL, UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.cvar("c1")), UPat.cvar("c2")),
   lambda x, c1, c2: x * c2 + c1.arg * c2.arg if _is_int(x) else None),
  (UPat.alu(BinaryOps.ADD, UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c1")), UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c2"))),
   lambda x, c1, c2: x * (c1.arg + c2.arg) if _is_int(x) else None),
  (UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.alu(UnaryOps.NEG, UPat.var("x"))), lambda x: x.const_like(0) if _is_int(x) else None),
  # div/mod of index expressions
  (UPat.alu(BinaryOps.IDIV, UPat.var("x"), UPat.cvar("c")), lambda x, c: _fold_div_mod(x, c, BinaryOps.IDIV)),
  (UPat.alu(BinaryOps.MOD, UPat.var("x"), UPat.cvar("c")), lambda x, c: _fold_div_mod(x, c, BinaryOps.MOD)),
  # value ranges
  (UPat(UOps.ALU, name="root"), _fold_range),
  # a loop of one iteration is its start
  (UPat(UOps.RANGE, src=(UPat.cvar("s"), UPat.cvar("e"))), lambda s, e: s if isinstance(e.arg, int) and e.arg - s.arg == 1 else None),
  # gates that are always true
  (UPat(UOps.LOAD, src=(UPat.var("buf"), UPat.var("idx"), UPat(UOps.CONST, True), UPat.var()), allow_any_len=True, name="ld"),
   lambda buf, idx, ld: UOp(UOps.LOAD, ld.dtype, (buf, idx) + ld.src[4:]) if len(ld.src) >= 4 else None),
  (UPat(UOps.STORE, src=(UPat.var("buf"), UPat.var("idx"), UPat.var("val"), UPat(UOps.CONST, True))),
   lambda buf, idx, val: UOp(UOps.STORE, None, (buf, idx, val))),
  # stores that never happen
  (UPat(UOps.STORE, src=(UPat.var(), UPat.var(), UPat.var(), UPat(UOps.CONST, False))), lambda: UOp(UOps.NOOP)),
  (UPat(UOps.LOAD, src=(UPat.var(), UPat.var(), UPat(UOps.CONST, False), UPat.var("alt")), allow_any_len=True), lambda alt: alt),
  (UPat(UOps.SINK, name="root"), lambda root: UOp(UOps.SINK, root.dtype, tuple(x for x in root.src if x.op is not UOps.NOOP), root.arg)
   if any(x.op is UOps.NOOP for x in root.src) else None),
]


# *** reduce simplifications: loop collapse (arange) and accumulator folding ***

def _linear_in(u: UOp, r: UOp) -> Optional[Tuple[int, UOp]]:
  """u == k*r + rest with rest independent of r, or None."""
  if not _depends_on(u, r):
    return 0, u
  if u is r:
    return 1, u.const_like(0)
  if u.op is UOps.ALU:
    if u.arg is BinaryOps.ADD:
      a, b = _linear_in(u.src[0], r), _linear_in(u.src[1], r)
      if a is not None and b is not None:
        return a[0] + b[0], a[1] + b[1]
    elif u.arg is BinaryOps.MUL and u.src[1].op is UOps.CONST and isinstance(u.src[1].arg, int):
      if (a := _linear_in(u.src[0], r)) is not None:
        return a[0] * u.src[1].arg, a[1] * u.src[1].arg
    elif u.arg is UnaryOps.NEG:
      if (a := _linear_in(u.src[0], r)) is not None:
        return -a[0], -a[1]
  return None


def _bounds_from_cond(cond: UOp, r: UOp) -> Optional[Tuple[List[UOp], List[UOp]]]:
  """cond over r as lower bounds L (r >= l) and upper bounds U (r < u), or None when it is not of that form."""
  if cond.op is UOps.ALU and cond.arg is BinaryOps.AND:
    a, b = _bounds_from_cond(cond.src[0], r), _bounds_from_cond(cond.src[1], r)
    return (a[0] + b[0], a[1] + b[1]) if a is not None and b is not None else None
  negate = False
  if cond.op is UOps.ALU and cond.arg is BinaryOps.CMPNE and cond.src[1].op is UOps.CONST and cond.src[1].arg is True:
    cond, negate = cond.src[0], True
  if cond.op is not UOps.ALU or cond.arg is not BinaryOps.CMPLT or not _is_int(cond.src[0]):
    return None
  # a < b  <=>  k*r + rest < 0 with rest = (a - b) without r
  la, lb = _linear_in(cond.src[0], r), _linear_in(cond.src[1], r)
  if la is None or lb is None:
    return None
  k, rest = la[0] - lb[0], la[1] - lb[1]
  if k == 1:    # r < -rest            (negated: r >= -rest)
    return ([-rest], []) if negate else ([], [-rest])
  if k == -1:   # r > rest, r >= rest+1 (negated: r < rest+1)
    return ([], [rest + 1]) if negate else ([rest + 1], [])
  return None


def _loop_collapse(red: UOp) -> Optional[UOp]:
  """sum over r of where(cond(r), x, 0) with x independent of r and cond a box in r -> x * (number of r in the box)."""
  if red.arg is not BinaryOps.ADD or red.dtype is None:
    return None
  val, ranges = red.src[0], list(red.src[1:])
  for r in ranges:
    if val.op is UOps.ALU and val.arg is TernaryOps.WHERE and uop_const_value(val.src[2]) == 0 and not _depends_on(val.src[1], r):
      bounds = _bounds_from_cond(val.src[0], r)
      if bounds is None:
        continue
      lo = functools.reduce(lambda a, b: a.max(b), bounds[0], r.src[0])
      hi = functools.reduce(lambda a, b: a.min(b), bounds[1], r.src[1])
      cnt = (hi - lo).max(0)
      new_val = val.src[1] * cnt.cast(red.dtype)
      if not (_is_int(red) or (val.src[1].op is UOps.CONST and math.isfinite(val.src[1].arg))):
        # an empty box sums to 0, but inf/NaN * 0 is NaN
        new_val = cnt.lt(1).where(red.const_like(0), new_val)
      rest = [x for x in ranges if x is not r]
      return UOp(UOps.REDUCE, red.dtype, (new_val, *rest), red.arg) if rest else new_val
  return None


def _range_size(rs: Sequence[UOp]) -> UOp:
  return functools.reduce(lambda a, b: a * b, [r.src[1] - r.src[0] for r in rs])


def _acc_fold(red: UOp) -> Optional[UOp]:
  """Pull loop-invariant work out of a reduce: sum of c -> c*n, sum of (x + c) -> sum(x) + c*n, max of c -> c."""
  if red.dtype is None or len(red.src) < 2:
    return None
  val, ranges = red.src[0], red.src[1:]
  if not any(_depends_on(val, r) for r in ranges):
    if red.arg is BinaryOps.MAX:
      return val
    if red.arg is BinaryOps.ADD:
      return val * _range_size(ranges).cast(red.dtype)
  if red.arg is BinaryOps.ADD and val.op is UOps.ALU and val.arg is BinaryOps.ADD:
    for a, b in ((val.src[0], val.src[1]), (val.src[1], val.src[0])):
      if not any(_depends_on(b, r) for r in ranges):
        return UOp(UOps.REDUCE, red.dtype, (a, *ranges), red.arg) + b * _range_size(ranges).cast(red.dtype)
  # drop loops the value does not depend on (sum multiplies by their size)
  used = [r for r in ranges if _depends_on(val, r)]
  if len(used) != len(ranges):
    unused = [r for r in ranges if r not in used]
    inner = UOp(UOps.REDUCE, red.dtype, (val, *used), red.arg) if used else val
    return inner * _range_size(unused).cast(red.dtype) if red.arg is BinaryOps.ADD else inner
  return None


reduce_rules: List[Tuple[UPat, Callable[..., Optional[UOp]]]] = [
  (UPat(UOps.REDUCE, name="red", src=(UPat.var(),), allow_any_len=True),
   lambda red: UOp(UOps.REDUCE, red.dtype, (red.src[0],) + tuple(x for x in red.src[1:] if x.op is UOps.RANGE), red.arg)
   if any(x.op is not UOps.RANGE for x in red.src[1:]) else None),
  (UPat(UOps.REDUCE, name="red", src=(UPat.var(),)), lambda red: red.src[0]),
  (UPat(UOps.REDUCE, name="red"), _loop_collapse),
  (UPat(UOps.REDUCE, name="red"), _acc_fold),
]

constant_folder = PatternMatcher(symbolic_rules + reduce_rules)


# *** the expander: EXPAND/CONTRACT -> scalar lanes ***

def _expand_idx(args: Tuple[Tuple[int, int], ...], rpk: Dict[int, int]) -> int:
  idx, mul = 0, 1
  for axis, m in args[::-1]:
    idx += rpk[axis] * mul
    mul *= m
  return idx


def _choices(args: Tuple[Tuple[int, int], ...]) -> List[Dict[int, int]]:
  return [dict(x) for x in itertools.product(*[[(axis, i) for i in range(m)] for axis, m in args])]


def do_expand(root: UOp) -> Optional[UOp]:
  """An op with EXPAND sources becomes an EXPAND of one op per lane."""
  expands = [x for x in root.src if x.op is UOps.EXPAND]
  if not expands:
    return None
  if root.op is UOps.DEFINE_ACC:
    return None
  args = tuple(sorted(dedup(flatten([x.arg for x in expands]))))
  lanes = []
  for rpk in _choices(args):
    lanes.append(UOp(root.op, root.dtype, tuple(s.src[_expand_idx(s.arg, rpk)] if s.op is UOps.EXPAND else s for s in root.src), root.arg))
  return UOp(UOps.EXPAND, root.dtype, tuple(lanes), args)


def do_contract(con: UOp) -> Optional[UOp]:
  """CONTRACT gathers the lanes of some expand axes into a vector."""
  ex = con.src[0]
  assert con.dtype is not None
  if ex.op is not UOps.EXPAND:
    return UOp(UOps.VECTORIZE, con.dtype, (ex,) * con.dtype.count)
  missing = [a for a in con.arg if a not in ex.arg]
  if missing:
    # the source does not vary along these axes: expand it to them first
    full = tuple(sorted(ex.arg + tuple(missing)))
    lanes = tuple(ex.src[_expand_idx(ex.arg, rpk)] for rpk in _choices(full))
    ex = UOp(UOps.EXPAND, ex.dtype, lanes, full)
  rest = tuple(x for x in ex.arg if x not in con.arg)
  out = []
  for rpk in _choices(rest):
    out.append(UOp(UOps.VECTORIZE, con.dtype, tuple(ex.src[_expand_idx(ex.arg, {**rpk, **lrpk})] for lrpk in _choices(con.arg))))
  return UOp(UOps.EXPAND, con.dtype, tuple(out), rest)


def _merge_nested_expand(root: UOp) -> Optional[UOp]:
  """An EXPAND whose lanes are themselves EXPANDs becomes one EXPAND over both sets of axes."""
  if not any(x.op is UOps.EXPAND for x in root.src):
    return None
  inner = tuple(sorted(dedup(flatten([x.arg for x in root.src if x.op is UOps.EXPAND]))))
  args = tuple(sorted(dedup(root.arg + inner)))
  lanes = []
  for rpk in _choices(args):
    x = root.src[_expand_idx(root.arg, rpk)]
    lanes.append(x.src[_expand_idx(x.arg, rpk)] if x.op is UOps.EXPAND else x)
  return UOp(UOps.EXPAND, root.dtype, tuple(lanes), args)


def _flatten_expand_src(root: UOp) -> Optional[UOp]:
  if not any(x.op is UOps.EXPAND for x in root.src):
    return None
  return UOp(root.op, root.dtype, tuple(flatten([x.src if x.op is UOps.EXPAND else (x,) for x in root.src])), root.arg)


def _gep_vectorize(g: UOp, vec: UOp) -> UOp:
  return vec.src[g.arg]


def _vectorize_of_geps(root: UOp) -> Optional[UOp]:
  x = root.src[0].src[0]
  if x.dtype != root.dtype or not all(s.op is UOps.GEP and s.src[0] is x and s.arg == i for i, s in enumerate(root.src)):
    return None
  return x


expander = PatternMatcher([
  (UPat({UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.WMMA, UOps.LOAD, UOps.STORE, UOps.VECTORIZE, UOps.REDUCE, UOps.BARRIER},
        name="root", src=None), lambda root: do_expand(root) if root.op is not UOps.BARRIER else _flatten_expand_src(root)),
  (UPat(UOps.CONTRACT, name="con"), do_contract),
  (UPat(UOps.EXPAND, name="ex"), lambda ex: ex.src[0] if ex.arg == () else _merge_nested_expand(ex)),
  (UPat(UOps.SINK, name="root"), _flatten_expand_src),
  (UPat(UOps.GEP, name="g", src=(UPat(UOps.VECTORIZE, name="vec"),)), _gep_vectorize),
  (UPat(UOps.VECTORIZE, name="root", src=UPat(UOps.GEP)), _vectorize_of_geps),
])


# *** reduce lowering: REDUCE -> DEFINE_ACC + PHI ***

def _identity(op: BinaryOps, dtype: DType) -> Any:
  if op is BinaryOps.ADD:
    return 0
  if op is BinaryOps.MAX:
    return dtypes.min(dtype.scalar())
  raise ValueError(f"no identity for {op}")


def _is_zero(u: UOp) -> bool:
  return uop_const_value(u) == 0 or (u.op is UOps.VECTORIZE and all(uop_const_value(s) == 0 for s in u.src))


def make_reduce_lowerer() -> PatternMatcher:
  """A matcher that lowers each REDUCE to an accumulator; numbering is per linearization."""
  counter = itertools.count()

  def lower(red: UOp) -> UOp:
    assert red.dtype is not None
    acc = UOp(UOps.DEFINE_ACC, red.dtype, (UOp.const(red.dtype.scalar(), _identity(red.arg, red.dtype)),) + red.src[1:], (next(counter),))
    v = red.src[0]
    if v.op is UOps.WMMA and red.arg is BinaryOps.ADD and _is_zero(v.src[2]):
      # a tensor core adds into its C operand: accumulate in place
      return UOp(UOps.PHI, red.dtype, (acc, UOp(UOps.WMMA, v.dtype, (v.src[0], v.src[1], acc), v.arg)))
    return UOp(UOps.PHI, red.dtype, (acc, acc.alu(red.arg, v)))
  return PatternMatcher([(UPat(UOps.REDUCE, name="red"), lower)])


# *** threefry ***

def threefry2x32(x: UOp, key: UOp) -> UOp:
  """Threefry-2x32 (20 rounds) on uint64 inputs, in uint32 arithmetic."""
  u32, u64 = dtypes.uint32, dtypes.uint64
  lo = lambda v: (v & 0xFFFFFFFF).cast(u32)  # noqa: E731
  hi = lambda v: ((v // (1 << 32)) & 0xFFFFFFFF).cast(u32)  # noqa: E731
  x0, x1, k0, k1 = lo(x), hi(x), lo(key), hi(key)
  ks = [k1, k0 ^ k1 ^ 0x1BD11BDA, k0]
  xr = [x0 + ks[-1], x1 + ks[0]]
  rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
  for i in range(5):
    for r in rotations[i % 2]:
      xr[0] = xr[0] + xr[1]
      rot = (xr[1] * (1 << r)) | (xr[1] // (1 << (32 - r)))  # MUL/IDIV by powers of two: shifts every renderer has
      xr[1] = rot ^ xr[0]
    xr = [xr[0] + ks[i % 3], xr[1] + ks[(i + 1) % 3] + (i + 1)]
  return (xr[1].cast(u64) * (1 << 32)) | xr[0].cast(u64)


decomp_rules: List[Tuple[UPat, Callable[..., Optional[UOp]]]] = [
  (UPat.alu(BinaryOps.THREEFRY, UPat.var("x"), UPat.var("key")), threefry2x32),
]


# *** total integer division ***

def _safe_divisor(x: UOp, y: UOp, scalar: DType) -> Tuple[UOp, Optional[UOp]]:
  """(divisor that cannot trap, `y != 0` or None when y cannot be 0); the divisor is y itself when y is already safe."""
  maybe_zero = y.vmin <= 0 <= y.vmax
  # only MIN / -1 overflows: unsigned dtypes and dividends that cannot be MIN need no test
  maybe_overflow = not dtypes.is_unsigned(scalar) and y.vmin <= -1 <= y.vmax and x.vmin <= dtypes.min(scalar)
  nonzero = y.ne(0) if maybe_zero else None
  no_overflow: Optional[UOp] = None
  if maybe_overflow:
    # the graph is already folded: leave out the half of the test a constant operand decides
    lo = dtypes.min(scalar)
    no_overflow = x.ne(lo) if y.vmin == y.vmax == -1 else y.ne(-1) if x.vmin == x.vmax == lo else y.ne(-1) | x.ne(lo)
  conds = [c for c in (nonzero, no_overflow) if c is not None]
  if not conds:
    return y, None
  return functools.reduce(lambda a, b: a & b, conds).where(y, 1), nonzero


def guard_int_division(sink: UOp) -> UOp:
  """Make every integer IDIV/MOD safe to run natively while giving tiny's defined results (`tiny.ops._idiv`):
  x // 0 == x % 0 == 0, MIN // -1 == MIN and MIN % -1 == 0, on every renderer.

  C and LLVM make x/0 and MIN/-1 undefined (x86 traps with SIGFPE) and GPUs return arbitrary values, so the divisor is
  swapped for 1 where it is 0, or -1 with a MIN dividend (MIN/1 is the wrapped answer; x%1 is 0), and a zero divisor
  selects 0 for the quotient. It runs once on the final graph, here rather than in each renderer, so C, LLVM IR, PTX and
  the PYTHON interpreter all execute the same guarded graph. Divisors whose value range excludes the bad values (every
  constant other than 0 and -1, loop-index math) are left alone, so index division stays a plain division.
  """
  replace: Dict[UOp, UOp] = {}
  divisors: Dict[Tuple[UOp, UOp], Tuple[UOp, Optional[UOp]]] = {}
  for u in _toposort(sink):
    if u.op is not UOps.ALU or u.arg not in (BinaryOps.IDIV, BinaryOps.MOD) or u.dtype is None:
      continue
    x, y = u.src
    if u.dtype.scalar() == dtypes.bool:
      # x // True == x and x // False == 0, x % y == 0: no division needed at all
      replace[u] = x & y if u.arg is BinaryOps.IDIV else u.const_like(False)
      continue
    if u.dtype.scalar() not in INT_DTYPES:
      continue
    if (x, y) not in divisors:
      # x // y and x % y of the same operands share one guarded divisor, so C compilers still emit a single division
      divisors[(x, y)] = _safe_divisor(x, y, u.dtype.scalar())
    d, nonzero = divisors[(x, y)]
    if d is y:
      continue
    res = x.alu(u.arg, d)
    replace[u] = nonzero.where(res, 0) if u.arg is BinaryOps.IDIV and nonzero is not None else res
  return graph_substitute(sink, replace) if replace else sink


def transcendental_matcher(opts: Any) -> Optional[PatternMatcher]:
  """Polynomial exp2/log2/sin for renderers whose code_for_op lacks them (TRANSCENDENTAL>=2 forces them)."""
  from tiny.codegen.transcendental import xexp2, xlog2, xsin
  code = getattr(opts, "code_for_op", None) or {}
  force = TRANSCENDENTAL >= 2
  rules: List[Tuple[UPat, Callable[..., Optional[UOp]]]] = []
  floats = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
  for op, fxn in ((UnaryOps.EXP2, xexp2), (UnaryOps.LOG2, xlog2), (UnaryOps.SIN, xsin)):
    # an empty table means an interpreter that runs every op itself (PYTHON)
    if force or (opts is not None and code and op not in code):
      rules.append((UPat.alu(op, UPat.var("d", dtype=floats)), fxn))
  return PatternMatcher(rules) if rules else None


# *** vector load/store folding ***

def _base_offset(idx: UOp) -> Tuple[UOp, int]:
  if idx.op is UOps.CONST and isinstance(idx.arg, int):
    return idx.const_like(0), idx.arg
  return _split_const(idx)


VECTOR_SIZES = (8, 4, 2)


def _vector_sizes(dtype: DType, simd_bytes: int = 0) -> Tuple[int, ...]:
  if dtype.scalar() in (dtypes.float16, dtypes.bfloat16):
    return (8, 4, 2)
  # a renderer that re-vectorizes ALU ops (simd_bytes) takes loads and stores as wide as its registers
  widest = max(4, simd_bytes // dtype.scalar().itemsize)
  return tuple(s for s in (16, 8, 4, 2) if s <= widest)


def fold_vector_memory(sink: UOp, opts: Any) -> UOp:
  """Consecutive aligned scalar LOADs/STOREs of float buffers become one vector LOAD/STORE (+ GEPs)."""
  if opts is None or not getattr(opts, "supports_float4", False):
    return sink
  # loads first: rewriting them rebuilds the stores that use them
  simd = int(getattr(opts, "simd_bytes", 0) or 0)
  return _fold_vector_memory(_fold_vector_memory(sink, UOps.LOAD, simd), UOps.STORE, simd)


def _fold_vector_memory(sink: UOp, kind: UOps, simd_bytes: int = 0) -> UOp:
  loads: Dict[Any, Dict[int, UOp]] = defaultdict(dict)
  stores: Dict[Any, Dict[int, UOp]] = defaultdict(dict)
  for u in all_nodes(sink):
    if u.op is not kind or u.src[0].op not in (UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL):
      continue
    elem = u.dtype if u.op is UOps.LOAD else u.src[2].dtype
    if elem is None or elem.count != 1 or not dtypes.is_float(elem):
      continue
    base, off = _base_offset(u.src[1])
    if u.op is UOps.LOAD and len(u.src) == 2:
      loads[(u.src[0], base, elem, False)].setdefault(off, u)
    elif u.op is UOps.LOAD and simd_bytes and len(u.src) == 4 and u.src[2].op is not UOps.BARRIER:
      # a CPU folds gated loads too: see the gated vector load below
      loads[(u.src[0], base, elem, True)].setdefault(off, u)
    elif u.op is UOps.STORE and len(u.src) == 3:
      stores[(u.src[0], base, elem, False)][off] = u
  replace: Dict[UOp, UOp] = {}
  for groups, is_load in ((loads, True), (stores, False)):
    for (buf, base, elem, gated), by_off in groups.items():
      used: Set[int] = set()
      for off in sorted(by_off):
        if off in used:
          continue
        for sz in _vector_sizes(elem, simd_bytes):
          offs = list(range(off, off + sz))
          # GPUs need vectors aligned to their size; a CPU (simd_bytes) loads and stores at any element offset
          aligned = simd_bytes > 0 or (off % sz == 0 and base.divides(sz) is not None)
          if not aligned or any(o not in by_off or o in used for o in offs):
            continue
          members = [by_off[o] for o in offs]
          vidx = members[0].src[1]
          if is_load and gated:
            # all lanes valid: one vector load; otherwise each lane's own gated load, evaluated only then (the
            # renderer inlines the alternative), so no lane is ever read out of its bounds
            gates = dedup([m.src[2] for m in members])
            gate = functools.reduce(lambda a, b: a.alu(BinaryOps.AND, b), gates)
            # (copies of the lanes: the originals are what gets replaced by this load's GEPs)
            lanes = tuple(UOp(m.op, m.dtype, m.src, m.arg) for m in members)
            vl = UOp(UOps.LOAD, elem.vec(sz), (buf, vidx, gate, UOp(UOps.VECTORIZE, elem.vec(sz), lanes)))
            for i, m in enumerate(members):
              replace[m] = vl.gep(i)
          elif is_load:
            vl = UOp(UOps.LOAD, elem.vec(sz), (buf, vidx))
            for i, m in enumerate(members):
              replace[m] = vl.gep(i)
          else:
            vs = UOp(UOps.STORE, None, (buf, vidx, UOp(UOps.VECTORIZE, elem.vec(sz), tuple(m.src[2] for m in members))))
            replace[members[0]] = vs
            for m in members[1:]:
              replace[m] = UOp(UOps.NOOP)
          used.update(offs)
          break
  if not replace:
    return sink
  # a plain substitution: graph_rewrite would merge a gated load's lane copies with the very lanes being replaced
  return graph_substitute(sink, replace)


# *** linearization ***

def _toposort(sink: UOp) -> List[UOp]:
  order: List[UOp] = []
  seen: Set[UOp] = set()
  stack: List[Tuple[UOp, bool]] = [(sink, False)]
  while stack:
    u, expanded = stack.pop()
    if expanded:
      order.append(u)
      continue
    if u in seen:
      continue
    seen.add(u)
    stack.append((u, True))
    for s in reversed(u.src):
      if s not in seen:
        stack.append((s, False))
  return order


_TOP_OPS = {UOps.DEFINE_GLOBAL: 0, UOps.DEFINE_VAR: 1, UOps.DEFINE_LOCAL: 2, UOps.SPECIAL: 3, UOps.CONST: 4}


class LinearizeError(RuntimeError):
  """The graph's loops cannot be nested consistently (an internal codegen bug)."""


def linearize_sink(sink: UOp) -> List[UOp]:
  """Order the graph into a list with RANGE/ENDRANGE around exactly the uops that must be in each loop."""
  nodes = [u for u in _toposort(sink) if u.op is not UOps.SINK]
  topo_idx = {u: i for i, u in enumerate(nodes)}
  acc_ranges: Dict[UOp, FrozenSet[UOp]] = {u: frozenset(s for s in u.src[1:] if s.op is UOps.RANGE) for u in nodes if u.op is UOps.DEFINE_ACC}
  phis: Dict[UOp, List[UOp]] = defaultdict(list)
  for u in nodes:
    if u.op is UOps.PHI:
      phis[u.src[0]].append(u)
  range_accs: Dict[UOp, List[UOp]] = defaultdict(list)
  # the loops of one accumulator nest in the order of its src
  range_outer: Dict[UOp, FrozenSet[UOp]] = defaultdict(frozenset)
  for a in acc_ranges:
    rs = [s for s in a.src[1:] if s.op is UOps.RANGE]
    for i, r in enumerate(rs):
      range_accs[r].append(a)
      range_outer[r] = range_outer[r] | frozenset(rs[:i])
  glob = sorted([u for u in nodes if u.op is UOps.RANGE and not u.arg[1]], key=lambda r: (r.arg[0], topo_idx[r]))
  gset = frozenset(glob)
  empty: FrozenSet[UOp] = frozenset()
  # the bounds of the global loops (e.g. `v+1` for a symbolic size) are computed before the outermost loop opens
  bounds: Set[UOp] = set()
  stack = [s for r in glob for s in r.src]
  while stack:
    if (x := stack.pop()) not in bounds:
      bounds.add(x)
      stack.extend(x.src)
  acc_outer: Dict[UOp, FrozenSet[UOp]] = {a: gset for a in acc_ranges}
  place: Dict[UOp, FrozenSet[UOp]] = {}
  export: Dict[UOp, FrozenSet[UOp]] = {}
  for _ in range(len(acc_ranges) + 2):
    for u in nodes:
      srcs_export = empty.union(*[export[s] for s in u.src]) if u.src else empty
      if u.op in _TOP_OPS:
        p = e = empty
      elif u in bounds:
        p = e = srcs_export
      elif u.op is UOps.RANGE:
        if not u.arg[1]:
          p = frozenset(glob[:glob.index(u) + 1])
        else:
          p = srcs_export | gset | range_outer[u] | empty.union(*[acc_outer[a] for a in range_accs[u]]) | {u}
        e = p
      elif u.op is UOps.DEFINE_ACC:
        p = acc_outer[u] | gset
        e = p | acc_ranges[u]
      elif u.op is UOps.PHI:
        p = srcs_export | gset | acc_ranges[u.src[0]]
        e = p - acc_ranges[u.src[0]]
      else:
        p = e = srcs_export | gset
      place[u], export[u] = p, e
    new_outer = {a: empty.union(*[export[ph] for ph in phis[a]]) | gset for a in acc_ranges}
    if new_outer == acc_outer:
      break
    acc_outer = new_outer
  loops = [u for u in nodes if u.op is UOps.RANGE]
  depth = {r: len(place[r]) for r in loops}

  def innermost(s: FrozenSet[UOp]) -> Optional[UOp]:
    return max(s, key=lambda r: (depth[r], topo_idx[r])) if s else None

  parent: Dict[UOp, Optional[UOp]] = {}
  for r in loops:
    parent[r] = pr = innermost(place[r] - {r})
    if place[r] - {r} != (place[pr] if pr is not None else empty):
      raise LinearizeError(f"loop {r.arg} cannot be nested: {sorted(x.arg for x in place[r])}")
  block: Dict[UOp, Optional[UOp]] = {}
  for u in nodes:
    if u.op is UOps.RANGE:
      block[u] = parent[u]
      continue
    b = innermost(place[u])
    if place[u] != (place[b] if b is not None else empty):
      raise LinearizeError(f"{u.op} needs loops {sorted(x.arg for x in place[u])} that do not nest")
    block[u] = b
  children: Dict[Optional[UOp], List[UOp]] = defaultdict(list)
  for u in nodes:
    children[block[u]].append(u)

  def top_of(u: UOp, b: Optional[UOp]) -> Optional[UOp]:
    # the member of block b that contains u (u itself, or the child loop of b that u is inside of); None if u is outside b
    x: Optional[UOp] = u
    while x is not None and block[x] is not b:
      x = block[x]
      if x is None and b is not None:
        return None
    return x

  out: List[UOp] = []

  def emit(b: Optional[UOp]) -> None:
    members = children[b]
    mset = set(members)
    deps: Dict[UOp, Set[UOp]] = {m: set() for m in members}
    users: Dict[UOp, List[UOp]] = defaultdict(list)
    subtree_cache: Dict[UOp, List[UOp]] = {}

    def subtree(r: UOp) -> List[UOp]:
      if r not in subtree_cache:
        subtree_cache[r] = [r] + flatten([subtree(c) if c.op is UOps.RANGE else [c] for c in children[r]])
      return subtree_cache[r]
    for m in members:
      body = subtree(m) if m.op is UOps.RANGE else [m]
      for u in body:
        for s in u.src:
          if u.op is UOps.DEFINE_ACC and s.op is UOps.RANGE:
            continue
          t = top_of(s, b)
          if t is not None and t is not m and t in mset:
            deps[m].add(t)
    for m, ds in deps.items():
      for d in ds:
        users[d].append(m)
    indeg = {m: len(deps[m]) for m in members}

    def prio(m: UOp) -> Tuple[int, int, int]:
      cls = _TOP_OPS.get(m.op, 9)
      return (cls, m.arg[0] if m.op is UOps.DEFINE_GLOBAL else 0, topo_idx[m])
    heap = [(prio(m), topo_idx[m], m) for m in members if indeg[m] == 0]
    heapq.heapify(heap)
    done = 0
    while heap:
      _, _, m = heapq.heappop(heap)
      done += 1
      if m.op is UOps.RANGE:
        out.append(m)
        emit(m)
        out.append(UOp(UOps.ENDRANGE, None, (m,)))
      else:
        out.append(m)
      for x in users[m]:
        indeg[x] -= 1
        if indeg[x] == 0:
          heapq.heappush(heap, (prio(x), topo_idx[x], x))
    if done != len(members):
      raise LinearizeError("cycle while ordering a block")
  emit(None)
  return out


# *** estimates ***

def _sym(u: UOp) -> Any:
  if u.op is UOps.CONST:
    return u.arg
  if u.op is UOps.DEFINE_VAR:
    return u.arg
  if u.op is UOps.ALU and u.arg in (BinaryOps.ADD, BinaryOps.MUL):
    a, b = _sym(u.src[0]), _sym(u.src[1])
    return a + b if u.arg is BinaryOps.ADD else a * b
  if u.op is UOps.ALU and u.arg is UnaryOps.NEG:
    return -_sym(u.src[0])
  return 1


def flops_mem(uops: List[UOp], ignore_indexing: bool = False) -> Tuple[Any, Any]:
  """(flops, bytes loaded+stored) of a linearized kernel, loops multiplied in."""
  flops: Any = 0
  mem: Any = 0
  mults: Any = 1
  stack: List[Any] = []
  for u in uops:
    if u.op is UOps.RANGE:
      stack.append(mults)
      mults = mults * (_sym(u.src[1]) - _sym(u.src[0]))
    elif u.op is UOps.ENDRANGE:
      mults = stack.pop()
    elif u.op in (UOps.LOAD, UOps.STORE):
      dt = u.dtype if u.op is UOps.LOAD else u.src[2].dtype
      if dt is not None:
        mem += dt.itemsize * mults
    elif u.op is UOps.ALU and u.dtype is not None:
      if ignore_indexing and _is_int(u):
        continue
      flops += (2 if u.arg is TernaryOps.MULACC else 1) * u.dtype.count * mults
    elif u.op is UOps.WMMA:
      flops += 2 * prod(u.arg[1]) // u.arg[5] * mults
  return flops, mem


class UOpGraph:
  """A kernel's uop graph; `linearize()` rewrites it and orders it into the list renderers consume."""

  def __init__(self, sink: Union[UOp, List[UOp]], opts: Any = None) -> None:
    if isinstance(sink, UOp) and sink.op is UOps.SINK:
      self.sink = sink
    else:
      self.sink = UOp(UOps.SINK, None, tuple(sink) if isinstance(sink, (list, tuple)) else (sink,))
    self.opts = opts
    self._uops: Optional[List[UOp]] = None

  def __iter__(self) -> Iterator[UOp]:
    return iter(self.uops)

  def __getitem__(self, index: int) -> UOp:
    return self.uops[index]

  def __len__(self) -> int:
    return len(self.uops)

  @property
  def uops(self) -> List[UOp]:
    """The linearized list (linearizes on first use)."""
    if self._uops is None:
      self.linearize()
    assert self._uops is not None
    return self._uops

  def vars(self) -> List[Any]:
    return sorted([u.arg for u in self.uops if u.op is UOps.DEFINE_VAR], key=lambda v: v.expr)

  def globals(self) -> List[Tuple[int, bool]]:
    return [u.arg for u in self.uops if u.op is UOps.DEFINE_GLOBAL]

  def flops_mem(self, ignore_indexing: bool = False) -> Tuple[Any, Any]:
    return flops_mem(self.uops, ignore_indexing)

  def print(self) -> None:
    for i, u in enumerate(self.uops):
      srcs = [self.uops.index(x) if x in self.uops else "--" for x in u.src]
      arg = u.arg.name if hasattr(u.arg, "name") and not isinstance(u.arg, tuple) else u.arg
      print(f"{i:4d} {u.op.name:15s}: {str(u.dtype):25s} {str(srcs):32s} {arg}")

  def rewrite(self, extra_pm: Optional[PatternMatcher] = None) -> UOp:
    """Run the rewrite passes and return the final sink (before ordering)."""
    folder = constant_folder + extra_pm if extra_pm is not None else constant_folder
    sink = graph_rewrite(self.sink, folder + expander)
    sink = graph_rewrite(sink, folder)
    sink = graph_rewrite(sink, make_reduce_lowerer() + PatternMatcher(symbolic_rules + decomp_rules))
    if (tm := transcendental_matcher(self.opts)) is not None:
      sink = graph_rewrite(sink, tm + PatternMatcher(symbolic_rules))
    sink = guard_int_division(sink)
    sink = fold_vector_memory(sink, self.opts)
    sink = vectorize_lanes(sink, self.opts)
    if (em := getattr(self.opts, "extra_matcher", None)) is not None:
      sink = graph_rewrite(sink, em + PatternMatcher(symbolic_rules))
    if extra_pm is not None:
      sink = graph_rewrite(sink, extra_pm)
    return sink

  def linearize(self, extra_pm: Optional[PatternMatcher] = None) -> UOpGraph:
    """Rewrite and order the graph into `self.uops`."""
    sink = self.rewrite(extra_pm)
    self._uops = linearize_sink(sink)
    if DEBUG >= 5:
      self.print()
    return self


def verify_linearized(uops: Sequence[UOp]) -> None:
  """Check the ordering rules of the linearized list (raises AssertionError on the first violation)."""
  pos = {u: i for i, u in enumerate(uops)}
  open_loops: List[UOp] = []
  scope_of: Dict[UOp, Tuple[UOp, ...]] = {}
  for i, u in enumerate(uops):
    assert u.op not in (UOps.EXPAND, UOps.CONTRACT, UOps.REDUCE, UOps.SINK, UOps.VAR), f"{u.op} left after linearization"
    for s in u.src:
      if u.op is UOps.DEFINE_ACC and s.op is UOps.RANGE:
        assert s in pos and pos[s] > i, "DEFINE_ACC must come before its loops"
        continue
      assert s in pos and pos[s] < i, f"{u.op} at {i} uses {s.op} defined later or never"
      if s.op in (UOps.RANGE, UOps.IF) and u.op in (UOps.ENDRANGE, UOps.ENDIF):
        continue
      sc = scope_of[s]
      if s.op is not UOps.PHI:
        assert tuple(open_loops[:len(sc)]) == sc, f"{u.op} at {i} uses {s.op} from a closed scope"
    if u.op in (UOps.RANGE, UOps.IF):
      scope_of[u] = tuple(open_loops) + (u,)
      open_loops.append(u)
    elif u.op in (UOps.ENDRANGE, UOps.ENDIF):
      assert open_loops and open_loops[-1] is u.src[0], "END closes the wrong scope"
      open_loops.pop()
      scope_of[u] = tuple(open_loops)
    else:
      scope_of[u] = tuple(open_loops)
  assert not open_loops, "unclosed scopes"

