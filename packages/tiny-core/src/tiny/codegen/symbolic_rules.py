"""Folding rules on the uop graph: constants, algebraic identities, index div/mod, value ranges, and the reduce
simplifications (loop collapse, index collapse, accumulator folding). `constant_folder` is the matcher every pass folds with."""
from __future__ import annotations

import functools
import math
from typing import Callable, List, Optional, Sequence, Tuple

from tiny.dtype import dtypes
from tiny.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu, is_add_identity
from tiny.codegen.uops import UOp, UOps, UPat, PatternMatcher, graph_substitute, uop_const_value

INT_DTYPES = frozenset({dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64})


def is_int(u: UOp) -> bool:
  """True for a scalar integer uop (not bool): the rules that rely on exact integer arithmetic check this."""
  return u.dtype in INT_DTYPES


def depends_on(u: UOp, r: UOp) -> bool:
  """True when u's value can change with r (for a RANGE: u uses that loop's index)."""
  if r.op is UOps.RANGE:
    return r in u.loop_ranges
  return u is r or r in u.parents


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
  if root.dtype is None or root.dtype.count > 1 or not (is_int(root) or root.dtype == dtypes.bool):
    return None
  lo, hi = root.vmin, root.vmax
  if lo == hi and isinstance(lo, (int, bool)) and not (isinstance(lo, float)):
    return UOp.const(root.dtype, lo)
  return None


def split_const(u: UOp) -> Tuple[UOp, int]:
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


def _dtype_max(x: UOp) -> float:
  """The largest value x's (int) dtype holds; unbounded for bigint (symbolic shapes)."""
  if x.dtype is None or x.dtype.scalar() == dtypes.bigint:
    return math.inf
  return dtypes.max(x.dtype.scalar())


def _may_wrap(x: UOp, terms: Sequence[UOp]) -> bool:
  """The sum x of terms may have wrapped around its unsigned dtype, so that x is not the integer sum of the terms.

  A signed sum that may overflow already shows a negative vmin (its range falls back to the dtype's, see _min_max), which
  the folds refuse; an unsigned one falls back to [0, max], which looks like any other non-negative range. A term whose
  range reaches the dtype's max may itself have wrapped (uint8 -z): refused too, as is a sum of maxima past the max."""
  if x.dtype is None or not dtypes.is_unsigned(x.dtype.scalar()):
    return False
  top = _dtype_max(x)
  return any(t.vmax >= top for t in terms) or sum(t.vmax for t in terms) > top


def _fold_div_mod(x: UOp, c: UOp, op: BinaryOps) -> Optional[UOp]:
  """(q*c + r) // c -> q + r//c and (q*c + r) % c -> r % c, for non-negative x and r (C and floor division agree there)."""
  if not isinstance(c.arg, int) or c.arg <= 0 or not is_int(x) or x.vmin < 0:
    return None
  if x.vmax < c.arg:
    return x if op is BinaryOps.MOD else x.const_like(0)
  terms = _terms(x)
  if _may_wrap(x, terms):
    return None
  quo, rem = [], []
  for t in terms:
    if (d := t.divides(c.arg)) is not None:
      quo.append(d)
    else:
      rem.append(t)
  if not quo:
    # nested division: (x // a) // b -> x // (a*b)
    if op is BinaryOps.IDIV and x.op is UOps.ALU and x.arg is BinaryOps.IDIV and x.src[1].op is UOps.CONST and x.src[0].vmin >= 0:
      # a divisor past the dtype's range (it would wrap, even to 0) leaves 0: x//a//b < 1 there
      return x.src[0] // (x.src[1].arg * c.arg) if x.src[1].arg * c.arg <= _dtype_max(x) else x.const_like(0)
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
  # a float MAX tie gives its first operand: MAX(0.0, -0.0) is 0.0, MAX(-0.0, 0.0) is -0.0, so a zero stays in place
  if root.arg is BinaryOps.MAX and c.arg == 0 and not (is_int(root) or root.dtype == dtypes.bool):
    return None
  return UOp(UOps.ALU, root.dtype, (x, c), root.arg)


def _where_push(w: UOp, cond: UOp, x: UOp, y: UOp, root: UOp) -> Optional[UOp]:
  # where(c, x, 0) * y -> where(c, x*y, 0): exposes masked reduces to the loop collapse
  if uop_const_value(w.src[2]) != 0 or root.dtype is None:
    return None
  # for floats 0*y is not 0 when y is inf/nan: only push finite constants
  if not (is_int(root) or root.dtype == dtypes.bool) and not (y.op is UOps.CONST and math.isfinite(y.arg)):
    return None
  # the zero times a negative y is -0.0 for floats: the product of the constants keeps that sign
  zero = w.src[2].arg * y.arg if y.op is UOps.CONST and not (is_int(root) or root.dtype == dtypes.bool) else 0
  return cond.where(x * y, root.const_like(zero))


def _cast_where(root: UOp, cond: UOp, x: UOp, z: UOp) -> Optional[UOp]:
  assert root.dtype is not None
  # the zero converted to root's dtype (a float -0.0 stays -0.0 in a float dtype, as the cast would keep it)
  return cond.where(x.cast(root.dtype), root.const_like(z.arg))


# *** packed integers: (hi * 2**k | lo) unpacked right away (threefry's uint32 pairs in a uint64) ***

def _is_pow2(v: object) -> bool:
  """v is an int 2**k with k >= 1."""
  return isinstance(v, int) and not isinstance(v, bool) and v >= 2 and v & (v - 1) == 0


def _packed_parts(pack: UOp, c: int) -> Optional[Tuple[UOp, UOp]]:
  """(hi, lo) when pack is `hi*c | lo` or `hi*c + lo` with c = 2**k, hi >= 0 and lo in [0, c): the bits of lo and of hi*c
  do not overlap, so an OR and an ADD both just place them side by side."""
  if not is_int(pack) or pack.op is not UOps.ALU or pack.arg not in (BinaryOps.OR, BinaryOps.ADD) or not _is_pow2(c):
    return None
  for m, lo in ((pack.src[0], pack.src[1]), (pack.src[1], pack.src[0])):
    # where(c, hi*2**k, 0) (a padded pack) is where(c, hi, 0) * 2**k
    if m.op is UOps.ALU and m.arg is TernaryOps.WHERE and uop_const_value(m.src[2]) == 0 and (inner := _packed_parts(m.src[1] | lo, c)) is not None \
        and inner[1] is lo:
      return m.src[0].where(inner[0], inner[0].const_like(0)), lo
    if m.op is UOps.ALU and m.arg is BinaryOps.MUL and m.src[1].op is UOps.CONST and m.src[1].arg == c and \
        is_int(m.src[0]) and m.src[0].vmin >= 0 and is_int(lo) and 0 <= lo.vmin and lo.vmax < c:
      return m.src[0], lo
  return None


def _unpack_hi(pack: UOp, c: UOp) -> Optional[UOp]:
  """(hi*c | lo) // c -> hi, when hi*c does not wrap around."""
  if (parts := _packed_parts(pack, c.arg)) is None or pack.dtype is None:
    return None
  hi = parts[0]
  return hi if hi.vmax * c.arg <= dtypes.max(pack.dtype) else None


def _unpack_lo(pack: UOp, mask: UOp) -> Optional[UOp]:
  """(hi*c | lo) & (c-1) -> lo: hi*c has no bits below c, even when it wraps around (c divides 2**bits)."""
  if not isinstance(mask.arg, int) or isinstance(mask.arg, bool) or (parts := _packed_parts(pack, mask.arg + 1)) is None:
    return None
  return parts[1]


def _mask_noop(x: UOp, mask: UOp) -> Optional[UOp]:
  """x & (2**k - 1) -> x when x is already in [0, 2**k)."""
  m = mask.arg
  if not is_int(x) or not isinstance(m, int) or isinstance(m, bool) or m < 0 or m & (m + 1) != 0:
    return None
  return x if 0 <= x.vmin and x.vmax <= m else None


def _and_where(x: UOp, cond: UOp, m: UOp) -> Optional[UOp]:
  """x & where(c, m, 0) -> where(c, x & m, 0) for ints (x & 0 is 0): lets a padded mask reach what it masks."""
  return cond.where(x & m, x.const_like(0)) if is_int(x) else None


def _cast_roundtrip(root: UOp, x: UOp) -> Optional[UOp]:
  """cast(cast(x, wide), dtype of x) -> x for ints, when the wide type holds every value of x."""
  mid = root.src[0]
  if not is_int(root) or not is_int(x) or root.dtype != x.dtype or not is_int(mid) or mid.dtype is None:
    return None
  return x if dtypes.min(mid.dtype) <= x.vmin and x.vmax <= dtypes.max(mid.dtype) else None


symbolic_rules: List[Tuple[UPat, Callable[..., Optional[UOp]]]] = [
  # constants
  (UPat(UOps.ALU, name="root", src=UPat(UOps.CONST)), _fold_consts),
  (UPat(UOps.CAST, name="root", src=(UPat(UOps.CONST, name="c"),)),
   lambda root, c: UOp.const(root.dtype, exec_alu(UnaryOps.CAST, root.dtype, [c.arg])) if root.dtype.count == 1 else None),
  (UPat(UOps.CAST, name="root", src=(UPat.var("x"),)), lambda root, x: x if x.dtype == root.dtype else None),
  # identities
  # x + 0.0 is not x for floats (-0.0 + 0.0 is +0.0): only the zeros that are ADD's identity fold (see is_add_identity)
  (UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat(UOps.CONST, 0, name="z")), lambda x, z: x if is_add_identity(z.arg, z.dtype) else None),
  (UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat(UOps.CONST, 1)), lambda x: x),
  (UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat(UOps.CONST, 0, name="z")), lambda x, z: z if is_int(x) or x.dtype == dtypes.bool else None),
  (UPat.alu(BinaryOps.IDIV, UPat.var("x"), UPat(UOps.CONST, 1)), lambda x: x),
  (UPat.alu(BinaryOps.MOD, UPat.var("x"), UPat(UOps.CONST, 1)), lambda x: x.const_like(0) if is_int(x) else None),
  # integer x // 0 == x % 0 == 0 and x % -1 == 0 (numpy's answers, see tiny.ops._idiv); x // -1 is left to guard_int_division
  (UPat.alu(BinaryOps.IDIV, UPat.var("x"), UPat(UOps.CONST, 0)), lambda x: x.const_like(0) if is_int(x) else None),
  (UPat.alu(BinaryOps.MOD, UPat.var("x"), UPat(UOps.CONST, 0)), lambda x: x.const_like(0) if is_int(x) else None),
  (UPat.alu(BinaryOps.MOD, UPat.var("x"), UPat(UOps.CONST, -1)), lambda x: x.const_like(0) if is_int(x) else None),
  (UPat.alu(UnaryOps.NEG, UPat.alu(UnaryOps.NEG, UPat.var("x"))), lambda x: x),
  (UPat.alu(BinaryOps.MAX, UPat.var("x"), UPat.var("x")), lambda x: x),
  (UPat.alu(BinaryOps.AND, UPat.var("x"), UPat.var("x")), lambda x: x),
  (UPat.alu(BinaryOps.OR, UPat.var("x"), UPat.var("x")), lambda x: x),
  (UPat.alu(BinaryOps.CMPLT, UPat.var("x"), UPat.var("x")), lambda x: UOp.const(dtypes.bool, False) if is_int(x) else None),
  (UPat.alu(BinaryOps.CMPNE, UPat.var("x"), UPat.var("x")), lambda x: UOp.const(dtypes.bool, False) if is_int(x) else None),
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
  (UPat(UOps.CAST, name="root", src=(UPat.alu(TernaryOps.WHERE, UPat.var("cond"), UPat.var("x"), UPat(UOps.CONST, 0, name="z")),)), _cast_where),
  # canonical order and chained constants
  (UPat(UOps.ALU, name="root", src=(UPat(UOps.CONST, name="c"), UPat.var("x"))), _const_right),
  (UPat.alu(BinaryOps.ADD, UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.cvar("c1")), UPat.cvar("c2"), name="root"),
   lambda root, x, c1, c2: _assoc_const(root, x, c1, c2) if is_int(x) else None),
  (UPat.alu(BinaryOps.MAX, UPat.var("x"), UPat.var("y")), lambda x, y: x if x.vmin >= y.vmax and is_int(x) else None),
  (UPat.alu(BinaryOps.MUL, UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c1")), UPat.cvar("c2"), name="root"),
   lambda root, x, c1, c2: _assoc_const(root, x, c1, c2) if is_int(x) else None),
  # move constants out of sums: (x + c) + y -> (x + y) + c
  (UPat.alu(BinaryOps.ADD, UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.cvar("c")), UPat.var("y")),
   lambda x, c, y: (x + y) + c if y.op is not UOps.CONST and is_int(x) else None),
  # (x + c1) * c2 -> x*c2 + c1*c2 (index math)
  (UPat.alu(BinaryOps.MUL, UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.cvar("c1")), UPat.cvar("c2")),
   lambda x, c1, c2: x * c2 + c1.arg * c2.arg if is_int(x) else None),
  (UPat.alu(BinaryOps.ADD, UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c1")), UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c2"))),
   lambda x, c1, c2: x * (c1.arg + c2.arg) if is_int(x) else None),
  (UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.alu(UnaryOps.NEG, UPat.var("x"))), lambda x: x.const_like(0) if is_int(x) else None),
  # div/mod of index expressions
  (UPat.alu(BinaryOps.IDIV, UPat.var("x"), UPat.cvar("c")), lambda x, c: _fold_div_mod(x, c, BinaryOps.IDIV)),
  (UPat.alu(BinaryOps.MOD, UPat.var("x"), UPat.cvar("c")), lambda x, c: _fold_div_mod(x, c, BinaryOps.MOD)),
  # packed integers unpacked right away, and the casts and masks that become no-ops then
  (UPat.alu(BinaryOps.IDIV, UPat.var("pack"), UPat.cvar("c")), _unpack_hi),
  (UPat.alu(BinaryOps.AND, UPat.var("pack"), UPat.cvar("mask")), _unpack_lo),
  (UPat.alu(BinaryOps.AND, UPat.var("x"), UPat.cvar("mask")), _mask_noop),
  (UPat(UOps.CAST, name="root", src=(UPat(UOps.CAST, src=(UPat.var("x"),)),)), _cast_roundtrip),
  (UPat.alu(BinaryOps.AND, UPat.var("x"), UPat.alu(TernaryOps.WHERE, UPat.var("cond"), UPat.cvar("m"), UPat(UOps.CONST, 0))), _and_where),
  (UPat.alu(BinaryOps.XOR, UPat.var("x"), UPat(UOps.CONST, 0)), lambda x: x if is_int(x) else None),
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
  if not depends_on(u, r):
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
  if cond.op is not UOps.ALU or cond.arg is not BinaryOps.CMPLT or not is_int(cond.src[0]):
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


def sum_result(op: BinaryOps, v: UOp) -> UOp:
  """v as the value of a reduce (op) once its loops are gone: for a float sum, numpy and torch start a sum at +0.0, so a sum of only
  -0.0 is +0.0, while v (the one element, a constant times a count, the lanes added up) keeps -0.0. Adding +0.0 at the
  end gives the same bits as starting from it in every other case (a sum is -0.0 only when every term is), and costs
  one add per output, not one per element. Reduces that keep a loop need nothing: their accumulator starts at +0.0."""
  if op is not BinaryOps.ADD or v.dtype is None or not dtypes.is_float(v.dtype.scalar()) or _never_neg_zero(v):
    return v
  return v + v.const_like(0.0)


def _never_neg_zero(v: UOp) -> bool:
  # a result that cannot be -0.0: a nonzero or +0.0 constant, or already a sum with a +0.0 constant (x + 0.0)
  if v.op is UOps.CONST:
    assert v.dtype is not None
    return not is_add_identity(v.arg, v.dtype)   # (the one float constant that is ADD's identity is -0.0)
  return v.op is UOps.ALU and v.arg is BinaryOps.ADD and any(s.op is UOps.CONST and _never_neg_zero(s) and s.arg == 0 for s in v.src)


def _loop_collapse(red: UOp) -> Optional[UOp]:
  """sum over r of where(cond(r), x, 0) with x independent of r and cond a box in r -> x * (number of r in the box)."""
  if red.arg is not BinaryOps.ADD or red.dtype is None:
    return None
  val, ranges = red.src[0], list(red.src[1:])
  for r in ranges:
    if val.op is UOps.ALU and val.arg is TernaryOps.WHERE and uop_const_value(val.src[2]) == 0 and not depends_on(val.src[1], r):
      bounds = _bounds_from_cond(val.src[0], r)
      if bounds is None:
        continue
      lo = functools.reduce(lambda a, b: a.max(b), bounds[0], r.src[0])
      hi = functools.reduce(lambda a, b: a.min(b), bounds[1], r.src[1])
      cnt = (hi - lo).max(0)
      new_val = val.src[1] * cnt.cast(red.dtype)
      if not (is_int(red) or (val.src[1].op is UOps.CONST and math.isfinite(val.src[1].arg))):
        # an empty box sums to 0, but inf/NaN * 0 is NaN
        new_val = cnt.lt(1).where(red.const_like(0), new_val)
      rest = [x for x in ranges if x is not r]
      return UOp(UOps.REDUCE, red.dtype, (new_val, *rest), red.arg) if rest else sum_result(red.arg, new_val)
  return None


def _conjuncts(cond: UOp) -> List[UOp]:
  if cond.op is UOps.ALU and cond.arg is BinaryOps.AND:
    return _conjuncts(cond.src[0]) + _conjuncts(cond.src[1])
  return [cond]


def _widened(u: UOp) -> UOp:
  """u without an int32 -> wider int cast: an index (a position) keeps its value, and equality with a wide e stays exact
  (for uint32 modulo 2**32, where subtracting the rest from e wraps the same way)."""
  if u.op is UOps.CAST and u.src[0].dtype == dtypes.int32 and u.dtype in (dtypes.int64, dtypes.uint64, dtypes.uint32):
    return u.src[0]
  return u


def _equal_to_range(c: UOp, r: UOp) -> Optional[UOp]:
  """e when c is `a != b` with a - b == ±(r - e) and e independent of r (a split reduce compares r + 1733*g), in the
  dtype of the comparison, else None."""
  if c.op is not UOps.ALU or c.arg is not BinaryOps.CMPNE or not is_int(c.src[0]) or (wide := c.src[0].dtype) is None:
    return None
  la, lb = _linear_in(_widened(c.src[0]), r), _linear_in(_widened(c.src[1]), r)
  if la is None or lb is None or abs(la[0] - lb[0]) != 1:
    return None
  ra, rb = (x[1] if x[1].dtype == wide else x[1].cast(wide) for x in (la, lb))
  # a - b = k*r + (ra - rb) = 0  <=>  r = -(ra - rb) / k
  return rb - ra if la[0] - lb[0] == 1 else ra - rb


def _index_collapse(red: UOp) -> Optional[UOp]:
  """sum over r of where(r == e, x(r), 0) with e independent of r -> where(e in r's range, x(e), 0): the one-hot sum
  that a gather (`x[idx]`, compared with an arange) lowers to reads one element instead of all of r's range.

  x reads at r's start where e is out of range, so any e reads a valid address and gives 0, as the sum did."""
  if red.arg is not BinaryOps.ADD or red.dtype is None:
    return None
  val, ranges = red.src[0], list(red.src[1:])
  if val.op is not UOps.ALU or val.arg is not TernaryOps.WHERE:
    return None
  for r in ranges:
    e: Optional[UOp] = None
    if uop_const_value(val.src[2]) == 0:
      # where(c1 & (r == e) & c2, x, 0)
      conds, x, zero = _conjuncts(val.src[0]), val.src[1], val.src[2]
      for i, c in enumerate(conds):
        if c.op is UOps.ALU and c.arg is BinaryOps.CMPNE and uop_const_value(c.src[1]) is True and \
            (e := _equal_to_range(c.src[0], r)) is not None:
          rest = conds[:i] + conds[i + 1:]
          break
    elif uop_const_value(val.src[1]) == 0:
      # where(r != e, 0, x)
      x, zero, rest = val.src[2], val.src[1], []
      e = _equal_to_range(val.src[0], r)
    if e is None or e.dtype is None:
      continue
    lo, hi = r.src[0], r.src[1]
    if e.dtype != r.dtype:
      lo, hi = lo.cast(e.dtype), hi.cast(e.dtype)
    inside = e.lt(hi) if dtypes.is_unsigned(e.dtype) and uop_const_value(lo) == 0 else e.lt(lo).ne(True) & e.lt(hi)
    at = inside.where(e, lo)
    at = at if at.dtype == r.dtype or r.dtype is None else at.cast(r.dtype)
    inside = functools.reduce(lambda a, b: a & b, [graph_substitute(c, {r: at}) for c in rest], inside)
    new_val = inside.where(graph_substitute(x, {r: at}), zero)
    others = [q for q in ranges if q is not r]
    # no +0.0 (sum_result) here: this one-hot sum is how Tensor indexing gathers, and a gather copies the element,
    # -0.0 included, as torch's indexing does (numpy's sum of the one-hot terms would give +0.0)
    return UOp(UOps.REDUCE, red.dtype, (new_val, *others), red.arg) if others else new_val
  return None


def _range_size(rs: Sequence[UOp]) -> UOp:
  return functools.reduce(lambda a, b: a * b, [r.src[1] - r.src[0] for r in rs])


def _acc_fold(red: UOp) -> Optional[UOp]:
  """Pull loop-invariant work out of a reduce: sum of c -> c*n, sum of (x + c) -> sum(x) + c*n, max of c -> c."""
  if red.dtype is None or len(red.src) < 2:
    return None
  val, ranges = red.src[0], red.src[1:]
  if not any(depends_on(val, r) for r in ranges):
    if red.arg is BinaryOps.MAX:
      return val
    if red.arg is BinaryOps.ADD:
      return sum_result(red.arg, val * _range_size(ranges).cast(red.dtype))
  if red.arg is BinaryOps.ADD and val.op is UOps.ALU and val.arg is BinaryOps.ADD:
    for a, b in ((val.src[0], val.src[1]), (val.src[1], val.src[0])):
      if not any(depends_on(b, r) for r in ranges):
        return UOp(UOps.REDUCE, red.dtype, (a, *ranges), red.arg) + b * _range_size(ranges).cast(red.dtype)
  # drop loops the value does not depend on (sum multiplies by their size)
  used = [r for r in ranges if depends_on(val, r)]
  if len(used) != len(ranges):
    unused = [r for r in ranges if r not in used]
    inner = UOp(UOps.REDUCE, red.dtype, (val, *used), red.arg) if used else val
    return inner * _range_size(unused).cast(red.dtype) if red.arg is BinaryOps.ADD else inner
  return None


reduce_rules: List[Tuple[UPat, Callable[..., Optional[UOp]]]] = [
  (UPat(UOps.REDUCE, name="red", src=(UPat.var(),), allow_any_len=True),
   lambda red: UOp(UOps.REDUCE, red.dtype, (red.src[0],) + tuple(x for x in red.src[1:] if x.op is UOps.RANGE), red.arg)
   if any(x.op is not UOps.RANGE for x in red.src[1:]) else None),
  (UPat(UOps.REDUCE, name="red", src=(UPat.var(),)), lambda red: sum_result(red.arg, red.src[0])),
  (UPat(UOps.REDUCE, name="red"), _loop_collapse),
  (UPat(UOps.REDUCE, name="red"), _index_collapse),
  (UPat(UOps.REDUCE, name="red"), _acc_fold),
]

constant_folder = PatternMatcher(symbolic_rules + reduce_rules)
