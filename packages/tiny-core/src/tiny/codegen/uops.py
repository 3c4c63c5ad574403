"""UOps: the micro-ops a kernel is lowered to, and the contract every renderer implements.

After `UOpGraph.linearize()` a kernel is a flat list of UOps in which every source comes before its
user. Renderers (C, CUDA, HIP, Metal, LLVM, PTX) and the PYTHON interpreter consume that list. The
meaning of each op in the linearized list:

| op | dtype | src | arg |
|---|---|---|---|
| DEFINE_GLOBAL | PtrDType(elem) | () | (buffer index: int, mutable: bool) — kernel argument `data{idx}` |
| DEFINE_VAR | int32 | () | the `Variable`; kernel argument named `var.expr`, after the buffers |
| DEFINE_LOCAL | PtrDType(elem) | () | (name: str, size: int) — shared memory |
| DEFINE_ACC | dtype of the accumulator (may be a vector) | (init CONST, *RANGE uops it accumulates over) | (acc index: int,) |
| CONST | scalar dtype | () | the Python value (bool/int/float) |
| SPECIAL | int32 | () | (dim: int, name: str, size: int); name "gidx{d}" global, "lidx{d}" local, "idx{d}" global*local |
| RANGE | int32 | (start, end, [AFTER]) | (axis: int, is_reduce: bool) — opens `for (i = start; i < end; i++)` (after the AFTER) |
| ENDRANGE | None | (RANGE,) | None — closes the loop |
| IF | None | (cond, [BARRIER]) | None — opens `if (cond) {` |
| ENDIF | None | (IF,) | None |
| BARRIER | None | (STOREs to local memory,) | None — `__syncthreads()` |
| AFTER | None | (STOREs, *RANGE uops) | None — renders nothing: done once the STOREs ran in every iteration of those loops |
| LOAD | elem or vector dtype | (buf, idx) or (buf, idx, gate, alt) [+ (BARRIER,)] | None; vector dtype = contiguous vector load |
| STORE | None | (buf, idx, value) or (buf, idx, value, gate) | None |
| ALU | result dtype (bool for CMPLT/CMPNE) | operands | a UnaryOps/BinaryOps/TernaryOps member |
| CAST | target dtype | (x,) | None |
| BITCAST | target dtype | (x,) | None |
| VECTORIZE | vector dtype | scalar elements | None |
| GEP | scalar dtype | (vector,) | element index: int |
| PHI | acc dtype | (DEFINE_ACC, new value) | None — `acc = new value` inside the loop |
| WMMA | output vector dtype | (a, b, c) | (name, dims, dtype_in, dtype_out, device, threads, upcast_axes, reduce_axes, layout) |
| SINK | None | all STOREs | KernelInfo or None — only before linearization |

EXPAND, CONTRACT, REDUCE, VAR and NOOP exist only before linearization (the expander and the
reduce lowering remove them).

Ordering rules of the linearized list (codegen helper):
- Every source comes before its user, with ONE exception: a DEFINE_ACC comes *before* the RANGEs in
  its src (it is `acc = init` right before the loops it accumulates over open; the RANGEs in its src
  only say which loops those are). Render DEFINE_ACC from src[0] alone.
- A RANGE is closed by exactly one ENDRANGE; loops nest properly; a value defined inside a loop is
  only used inside that loop, except a PHI, whose value after the loop is the accumulator's final value, and an AFTER,
  which sits in the loops of its STOREs and is done, for its users, after the loops in its src have ended (a RANGE that
  takes it opens only then: the only order between a STORE and a LOAD of the same memory in another loop).
- A PHI sits inside all the loops of its DEFINE_ACC; its users outside those loops read the accumulator.
- Global/local dims are SPECIALs when the renderer has_local, else non-reduce RANGEs (axis < 1000,
  arg[1] False) that enclose the whole kernel body; reduce loops have arg[1] True.
- WMMA (from Opt(OptOps.TC)): arg = (name, dims (N, M, K), dtype_in, dtype_out, device, threads: int (lanes per
  instruction), upcast_axes ((A axes), (B axes), (C axes)), reduce_axes (), layout (the TensorCore's RegisterLayouts of
  A, B, C)). src = (A registers, B registers, accumulator) as vectors; register e of lane L holds the element the layout
  assigns to (L, e) (RegisterLayout.coords). lidx0 is the lane (a SPECIAL of size `threads`). Inside the K loop
  the WMMA's third source is the DEFINE_ACC and its PHI writes the result back (acc = wmma(a, b, acc)).
"""
from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable, Dict, Generic, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union, overload

from tiny.dtype import ConstType, DType, dtypes
from tiny.ops import BinaryOps, TernaryOps, UnaryOps

# deep expression chains (unrolled reduces) recurse once per node
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))


class UOps(Enum):
  """Kinds of micro-op; the declaration order is the tie-break order of the linearizer's toposort."""

  SINK = auto(); VAR = auto(); EXPAND = auto(); CONTRACT = auto()  # noqa: E702
  DEFINE_GLOBAL = auto(); DEFINE_VAR = auto(); DEFINE_LOCAL = auto(); DEFINE_ACC = auto()  # noqa: E702
  CONST = auto(); SPECIAL = auto()  # noqa: E702
  NOOP = auto(); GEP = auto()  # noqa: E702
  CAST = auto(); BITCAST = auto(); VECTORIZE = auto()  # noqa: E702
  ALU = auto(); REDUCE = auto(); WMMA = auto()  # noqa: E702
  LOAD = auto(); STORE = auto(); PHI = auto()  # noqa: E702
  BARRIER = auto(); IF = auto(); RANGE = auto()  # noqa: E702
  ENDRANGE = auto(); ENDIF = auto()  # noqa: E702
  AFTER = auto()

  # members are singletons compared by identity: hash them by identity too (in C) instead of Enum's Python-level hash of the
  # name, which the pattern matcher's dict lookups used to call about a million times per compiled model
  __hash__ = object.__hash__


_T = TypeVar("_T")


class _memo(Generic[_T]):
  """functools.cached_property without its lock: up to Python 3.11 every first access takes one lock shared by all
  instances, a cost paid for each of the ~25k uops whose value range or parents a first call computes. A uop never
  changes, so two threads computing the same value at once would store equal values."""

  def __init__(self, fn: Callable[[Any], _T]) -> None:
    self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

  def __set_name__(self, owner: Any, name: str) -> None:
    self.name = name

  @overload
  def __get__(self, obj: None, owner: Any = None) -> _memo[_T]: ...
  @overload
  def __get__(self, obj: object, owner: Any = None) -> _T: ...

  def __get__(self, obj: Any, owner: Any = None) -> Any:
    if obj is None:
      return self
    # a non-data descriptor: once the value is in the instance dict, attribute lookups find it there without calling this
    ret = obj.__dict__[self.name] = self.fn(obj)
    return ret


COMMUTATIVE = {BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.CMPNE, BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR}
# ALU args are Op enum members (process-lifetime singletons), so their ids are stable keys that hash without a Python call
_COMMUTATIVE_IDS = frozenset(id(x) for x in COMMUTATIVE)
_CONST_CONV: Dict[DType, Callable[[Any], Any]] = {**{d: int for d in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8,
                                                                     dtypes.uint16, dtypes.uint32, dtypes.uint64)},
                                                  **{d: float for d in (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)},
                                                  dtypes.bool: bool}


def _is_int_like(dt: Optional[DType]) -> bool:
  return dt is not None and (dtypes.is_int(dt) or dt.scalar() == dtypes.bool)


@dataclass(frozen=True, eq=False)
class UOp:
  """One node of the kernel graph. Identity-compared; structural dedup happens in graph_rewrite."""

  op: UOps
  dtype: Optional[DType] = None
  src: Tuple[UOp, ...] = tuple()
  arg: Any = None

  # a first call builds ~100k uops: filling the instance dict directly costs half of the frozen dataclass __init__, which
  # goes through object.__setattr__ once per field. The fields stay read-only: setting one still raises.
  def __init__(self, op: UOps, dtype: Optional[DType] = None, src: Tuple[UOp, ...] = (), arg: Any = None) -> None:
    d = self.__dict__
    d["op"] = op
    d["dtype"] = dtype
    d["src"] = src
    d["arg"] = arg

  # *** construction helpers ***

  @staticmethod
  def const(dtype: DType, b: Any) -> UOp:
    """A constant of dtype (a VECTORIZE of equal scalars for a vector dtype)."""
    if dtype.count > 1:
      s = UOp.const(dtype.scalar(), b)
      return UOp(UOps.VECTORIZE, dtype, (s,) * dtype.count)
    conv = _CONST_CONV.get(dtype)
    if conv is not None and type(b) in (int, float, bool):
      return UOp(UOps.CONST, dtype, (), conv(b))
    return UOp(UOps.CONST, dtype, (), dtypes.as_const(b, dtype))

  def const_like(self, b: Any) -> UOp:
    """A constant with this uop's dtype."""
    assert self.dtype is not None
    return UOp.const(self.dtype, b)

  def cast(self, dtype: DType) -> UOp:
    return UOp(UOps.CAST, dtype, (self,))

  def bitcast(self, dtype: DType) -> UOp:
    return UOp(UOps.BITCAST, dtype, (self,))

  def gep(self, i: int) -> UOp:
    assert self.dtype is not None
    return UOp(UOps.GEP, self.dtype.scalar(), (self,), i)

  def alu(self, arg: Union[UnaryOps, BinaryOps, TernaryOps], *src: UOp) -> UOp:
    """An ALU op with self as the first operand; comparisons give bool (vectors of bool for vectors)."""
    out = self.dtype
    if arg in (BinaryOps.CMPLT, BinaryOps.CMPNE):
      out = dtypes.bool if self.dtype is None or self.dtype.count == 1 else dtypes.bool.vec(self.dtype.count)
    elif arg is TernaryOps.WHERE:
      out = src[-1].dtype
    return UOp(UOps.ALU, out, (self,) + src, arg)

  def _c(self, x: Any) -> UOp:
    return x if isinstance(x, UOp) else self.const_like(x)

  def __add__(self, x: Any) -> UOp: return self.alu(BinaryOps.ADD, self._c(x))  # noqa: E704
  def __radd__(self, x: Any) -> UOp: return self._c(x).alu(BinaryOps.ADD, self)  # noqa: E704
  def __sub__(self, x: Any) -> UOp: return self.alu(BinaryOps.ADD, -self._c(x))  # noqa: E704
  def __rsub__(self, x: Any) -> UOp: return self._c(x).alu(BinaryOps.ADD, -self)  # noqa: E704
  def __mul__(self, x: Any) -> UOp: return self.alu(BinaryOps.MUL, self._c(x))  # noqa: E704
  def __rmul__(self, x: Any) -> UOp: return self._c(x).alu(BinaryOps.MUL, self)  # noqa: E704
  def __neg__(self) -> UOp: return self.alu(UnaryOps.NEG)  # noqa: E704
  def __floordiv__(self, x: Any) -> UOp: return self.alu(BinaryOps.IDIV, self._c(x))  # noqa: E704
  def __mod__(self, x: Any) -> UOp: return self.alu(BinaryOps.MOD, self._c(x))  # noqa: E704
  def __truediv__(self, x: Any) -> UOp: return self.alu(BinaryOps.MUL, self._c(x).alu(UnaryOps.RECIP))  # noqa: E704
  def __xor__(self, x: Any) -> UOp: return self.alu(BinaryOps.XOR, self._c(x))  # noqa: E704
  def __and__(self, x: Any) -> UOp: return self.alu(BinaryOps.AND, self._c(x))  # noqa: E704
  def __or__(self, x: Any) -> UOp: return self.alu(BinaryOps.OR, self._c(x))  # noqa: E704
  def lt(self, x: Any) -> UOp: return self.alu(BinaryOps.CMPLT, self._c(x))  # noqa: E704
  def ne(self, x: Any) -> UOp: return self.alu(BinaryOps.CMPNE, self._c(x))  # noqa: E704
  def eq(self, x: Any) -> UOp: return self.ne(x).ne(True)  # noqa: E704
  def ge(self, x: Any) -> UOp: return self.lt(x).ne(True)  # noqa: E704
  def max(self, x: Any) -> UOp: return self.alu(BinaryOps.MAX, self._c(x))  # noqa: E704
  def min(self, x: Any) -> UOp: return -((-self).max(-self._c(x)))  # noqa: E704
  def recip(self) -> UOp: return self.alu(UnaryOps.RECIP)  # noqa: E704

  def where(self, x: Any, y: Any) -> UOp:
    """self ? x : y."""
    xx = x if isinstance(x, UOp) else (y.const_like(x) if isinstance(y, UOp) else None)
    yy = y if isinstance(y, UOp) else (xx.const_like(y) if xx is not None else None)
    if xx is None or yy is None:
      raise TypeError("where needs at least one UOp branch")
    return self.alu(TernaryOps.WHERE, xx, yy)

  # *** inspection ***

  def commutative(self) -> bool:
    """True for ALU ops whose two operands may be swapped."""
    return self.op is UOps.ALU and id(self.arg) in _COMMUTATIVE_IDS

  @_memo
  def parents(self) -> Dict[UOp, None]:
    """All transitive sources (ordered set)."""
    ret: Dict[UOp, None] = {}
    for s in self.src:
      ret.update(s.parents)
      ret[s] = None
    return ret

  @_memo
  def loop_ranges(self) -> frozenset:
    """The RANGE uops this uop depends on (small sets, so this stays linear on big graphs)."""
    ret: frozenset = frozenset((self,)) if self.op is UOps.RANGE else frozenset()
    for s in self.src:
      ret = ret | s.loop_ranges
    return ret

  @property
  def sparents(self) -> Dict[UOp, None]:
    """parents plus self."""
    return {**self.parents, self: None}

  def vars(self) -> List[Any]:
    """The Variables of the DEFINE_VARs under this uop, sorted by name."""
    return sorted({x.arg for x in self.sparents if x.op is UOps.DEFINE_VAR}, key=lambda v: v.expr)

  def __repr__(self) -> str:
    return pretty_uop(self)

  def __getstate__(self) -> Dict[str, Any]:
    # the rewrite memos (`_fix`, `_sfix`) hold rule functions, which need not pickle; they are only shortcuts
    return {k: v for k, v in self.__dict__.items() if k not in ("_fix", "_sfix")}

  # *** value ranges, for folding ***

  @_memo
  def _min_max(self) -> Tuple[Any, Any]:
    return _min_max(self)

  @property
  def vmin(self) -> Any:
    """A lower bound of every value this uop takes (-inf/dtype min when unknown)."""
    return self._min_max[0]

  @property
  def vmax(self) -> Any:
    """An upper bound of every value this uop takes."""
    return self._min_max[1]

  def divides(self, v: int) -> Optional[UOp]:
    """self // v when that is exact by construction (every term a multiple of v), else None."""
    if v == 1:
      return self
    if self.op is UOps.CONST:
      return self.const_like(self.arg // v) if isinstance(self.arg, int) and self.arg % v == 0 else None
    if self.op is UOps.ALU:
      if self.arg is BinaryOps.ADD:
        d0, d1 = self.src[0].divides(v), self.src[1].divides(v)
        return d0 + d1 if d0 is not None and d1 is not None else None
      if self.arg is BinaryOps.MUL:
        if (d0 := self.src[0].divides(v)) is not None:
          return d0 * self.src[1]
        if (d1 := self.src[1].divides(v)) is not None:
          return self.src[0] * d1
    return None


def _dt_range(dt: Optional[DType]) -> Tuple[Any, Any]:
  if dt is None:
    return -math.inf, math.inf
  s = dt.scalar()
  if s == dtypes.bool:
    return False, True
  if dtypes.is_int(s) and s != dtypes.bigint:
    return dtypes.min(s), dtypes.max(s)
  return -math.inf, math.inf


def _trunc_div(x: int, d: int) -> int:
  """x / d rounded toward zero (C), for d > 0."""
  return x // d if x >= 0 else -(-x // d)


def _min_max(u: UOp) -> Tuple[Any, Any]:
  full = _dt_range(u.dtype)
  if u.dtype is not None and u.dtype.count > 1:
    return full
  if u.op is UOps.CONST:
    return (u.arg, u.arg) if isinstance(u.arg, (int, float)) else full
  if not _is_int_like(u.dtype) and u.dtype != dtypes.bigint:
    return full
  if u.op is UOps.SPECIAL:
    return (0, u.arg[2] - 1) if isinstance(u.arg[2], int) else (0, full[1])
  if u.op is UOps.RANGE:
    return u.src[0].vmin, u.src[1].vmax - 1
  if u.op is UOps.DEFINE_VAR:
    lo, hi = getattr(u.arg, "min", full[0]), getattr(u.arg, "max", full[1])
    return (lo if isinstance(lo, int) else full[0]), (hi if isinstance(hi, int) else full[1])
  if u.op is UOps.CAST and u.src[0].dtype is not None and _is_int_like(u.src[0].dtype):
    lo, hi = u.src[0].vmin, u.src[0].vmax
    return (lo, hi) if full[0] <= lo and hi <= full[1] else full
  if u.op is not UOps.ALU:
    return full
  a = u.src[0]
  ret = full
  if u.arg is BinaryOps.ADD:
    ret = (a.vmin + u.src[1].vmin, a.vmax + u.src[1].vmax)
  elif u.arg is BinaryOps.MUL:
    b = u.src[1]
    prods = [x * y for x in (a.vmin, a.vmax) for y in (b.vmin, b.vmax) if not (math.isinf(x) or math.isinf(y))]
    if len(prods) == 4:
      ret = (min(prods), max(prods))
  elif u.arg is UnaryOps.NEG and u.dtype != dtypes.bool:
    ret = (-a.vmax, -a.vmin)
  elif u.arg is BinaryOps.MAX:
    ret = (max(a.vmin, u.src[1].vmin), max(a.vmax, u.src[1].vmax))
  elif u.arg is BinaryOps.MOD and (b := u.src[1]).op is UOps.CONST and isinstance(b.arg, int) and b.arg > 0:
    ret = (0 if a.vmin >= 0 else -(b.arg - 1), b.arg - 1 if a.vmax > 0 else 0)
    if 0 <= a.vmin and a.vmax < b.arg:
      ret = (a.vmin, a.vmax)
  elif u.arg is BinaryOps.IDIV and (b := u.src[1]).op is UOps.CONST and isinstance(b.arg, int) and b.arg > 0 and not math.isinf(a.vmin) \
      and not math.isinf(a.vmax):
    # exact integer truncation: int(a / b) rounds through a float and is wrong past 2**53
    ret = (_trunc_div(int(a.vmin), b.arg), _trunc_div(int(a.vmax), b.arg))
  elif u.arg is BinaryOps.CMPLT:
    b = u.src[1]
    ret = (True, True) if a.vmax < b.vmin else (False, False) if a.vmin >= b.vmax else (False, True)
  elif u.arg is BinaryOps.CMPNE:
    b = u.src[1]
    ret = (True, True) if a.vmax < b.vmin or a.vmin > b.vmax else \
      (False, False) if a.vmin == a.vmax == b.vmin == b.vmax else (False, True)
  elif u.arg is TernaryOps.WHERE:
    ret = (min(u.src[1].vmin, u.src[2].vmin), max(u.src[1].vmax, u.src[2].vmax))
  elif u.arg is BinaryOps.AND and u.dtype == dtypes.bool:
    ret = (bool(a.vmin and u.src[1].vmin), bool(a.vmax and u.src[1].vmax))
  if full[0] <= ret[0] and ret[1] <= full[1]:
    return ret
  return full


def pretty_uop(u: UOp, depth: int = 0, max_depth: int = 3) -> str:
  """A short readable rendering of a uop and its sources."""
  arg = u.arg.name if isinstance(u.arg, Enum) else u.arg
  if max_depth <= 0 or not u.src:
    srcs = f"<{len(u.src)} src>" if u.src else "()"
  else:
    srcs = "(" + ", ".join(pretty_uop(s, depth + 1, max_depth - 1) for s in u.src) + ")"
  return f"UOp({u.op.name}, {u.dtype}, {srcs}, {arg!r})"


# *** pattern matching ***

class UPat:
  """A pattern over uops.

  op/dtype: one value or a set of them (None matches anything); arg: compared with ==, None matches anything;
  src: None (anything), a tuple of UPats (in order; both orders for a commutative ALU with two sources),
  a list of UPats (any permutation), or a single UPat every source must match; name binds the matched uop
  (a name used twice must bind the same uop); allow_any_len lets a tuple src match a prefix of the sources;
  any_src_op (one op or a set) requires at least one source with such an op: a rule that only acts on some sources says
  so here, and is then never even tried on the many uops without one (the matcher's candidate lists filter on it)."""

  __slots__ = ("op", "dtype", "arg", "src", "name", "allow_any_len", "any_src_op", "_compiled")

  def __init__(self, op: Any = None, arg: Any = None, src: Any = None, name: Optional[str] = None, dtype: Any = None,
               allow_any_len: bool = False, any_src_op: Any = None) -> None:
    self.op: Optional[Tuple[UOps, ...]] = None if op is None else (tuple(op) if isinstance(op, (set, tuple, list, frozenset)) else (op,))
    self.dtype: Optional[Tuple[DType, ...]] = None if dtype is None else \
      (tuple(dtype) if isinstance(dtype, (set, tuple, list, frozenset)) else (dtype,))
    self.arg, self.src, self.name, self.allow_any_len = arg, src, name, allow_any_len
    self.any_src_op: Optional[Tuple[UOps, ...]] = None if any_src_op is None else \
      (tuple(any_src_op) if isinstance(any_src_op, (set, tuple, list, frozenset)) else (any_src_op,))
    self._compiled: Optional[Callable[[UOp], List[Dict[str, UOp]]]] = None

  def match(self, u: UOp) -> List[Dict[str, UOp]]:
    """Every way u matches this pattern, as dicts of bound names (what `_match(u, self, {})` gives), by code generated
    for this pattern on first use (see tiny.codegen.upat_compile): a pattern must not be changed after its first match."""
    if (fn := self._compiled) is None:
      from tiny.codegen.upat_compile import compile_upat
      fn = self._compiled = compile_upat(self)
    return fn(u)

  @staticmethod
  def var(name: Optional[str] = None, dtype: Any = None) -> UPat:
    """Any uop."""
    return UPat(name=name, dtype=dtype)

  @staticmethod
  def cvar(name: Optional[str] = None, dtype: Any = None) -> UPat:
    """Any CONST."""
    return UPat(UOps.CONST, name=name, dtype=dtype)

  @staticmethod
  def alu(arg: Any, *src: UPat, name: Optional[str] = None, dtype: Any = None) -> UPat:
    return UPat(UOps.ALU, arg, tuple(src), name=name, dtype=dtype)

  def __repr__(self) -> str:
    return f"UPat({self.op}, {self.arg}, name={self.name!r}, src={self.src})"


def _arg_eq(a: Any, b: Any) -> bool:
  if isinstance(b, float) and math.isnan(b):
    return isinstance(a, float) and math.isnan(a)
  if type(a) is bool or type(b) is bool:
    return type(a) is type(b) and a == b
  try:
    return bool(a == b)
  except Exception:  # noqa: BLE001 - symbolic args may not compare to plain values
    return False


def _match(u: UOp, pat: UPat, store: Dict[str, UOp]) -> List[Dict[str, UOp]]:
  if pat.name is not None and (prev := store.get(pat.name)) is not None:
    return [store] if prev is u else []
  if pat.op is not None and u.op not in pat.op:
    return []
  if pat.dtype is not None and u.dtype not in pat.dtype:
    return []
  if pat.arg is not None and not _arg_eq(u.arg, pat.arg):
    return []
  if pat.any_src_op is not None and not any(s.op in pat.any_src_op for s in u.src):
    return []
  if pat.name is not None:
    store = {**store, pat.name: u}
  if pat.src is None:
    return [store]
  if isinstance(pat.src, UPat):
    stores = [store]
    for s in u.src:
      stores = [ns for st in stores for ns in _match(s, pat.src, st)]
      if not stores:
        break
    return stores
  psrc = pat.src
  if len(u.src) != len(psrc) and not (pat.allow_any_len and len(u.src) >= len(psrc)):
    return []
  if isinstance(psrc, list):
    orders: Iterable[Sequence[UPat]] = itertools.permutations(psrc)
  elif len(psrc) == 2 and u.commutative():
    orders = (psrc, (psrc[1], psrc[0]))
  else:
    orders = (psrc,)
  res: List[Dict[str, UOp]] = []
  for order in orders:
    stores = [store]
    for s, p in zip(u.src, order):
      stores = [ns for st in stores for ns in _match(s, p, st)]
      if not stores:
        break
    res.extend(stores)
  return res


def _ops_may_match(u: UOp, pat: UPat) -> bool:
  """A cheap necessary condition for _match that looks only at the ops of u and of its direct sources (and whether u
  commutes), so its answer can be cached per (op, arg, source ops) of u."""
  if pat.any_src_op is not None and not any(s.op in pat.any_src_op for s in u.src):
    return False
  psrc = pat.src
  if psrc is None or isinstance(psrc, list):
    return True
  if isinstance(psrc, UPat):
    return psrc.op is None or all(s.op in psrc.op for s in u.src)
  if len(u.src) != len(psrc) and not (pat.allow_any_len and len(u.src) >= len(psrc)):
    return False
  if all(p.op is None or s.op in p.op for s, p in zip(u.src, psrc)):
    return True
  return len(psrc) == 2 and u.commutative() and all(p.op is None or s.op in p.op for s, p in zip((u.src[1], u.src[0]), psrc))


Rule = Tuple[UPat, Callable[..., Optional[UOp]]]


class PatternMatcher:
  """An ordered list of (UPat, fxn) rules; fxn(**bound_names) returns a replacement uop or None.

  Rules are indexed by op (and by ALU arg when the pattern names one), so each uop is only tried against
  the rules that could match it; among those, the first rule (in list order) that returns a uop wins.
  A rule must be a pure function of the uops it matched: graph_rewrite never tries a rule again on a uop it already
  left unchanged (see `graph_rewrite`)."""

  def __init__(self, patterns: List[Rule]) -> None:
    self.patterns = list(patterns)
    # the rules as one object: graph_rewrite marks the uops that are fixpoints of all of them with it
    self.rules: Tuple[Rule, ...] = tuple(self.patterns)
    self._by_key: Dict[Any, List[Tuple[int, UPat, Callable[..., Optional[UOp]]]]] = {}
    for i, (p, fxn) in enumerate(self.patterns):
      if p.op is None:
        raise ValueError(f"a rule's root pattern must name its op(s): {p}")
      for o in p.op:
        key = (o, p.arg) if o is UOps.ALU and p.arg is not None else (o, None)
        self._by_key.setdefault(key, []).append((i, p, fxn))
    self._cands: Dict[Any, List[Rule]] = {}
    # rule sets of earlier passes -> this matcher's candidates minus those rules (see rewrite's `known`); the rule set is
    # held in the value, so its id cannot be reused while it is a key
    self._beyond: Dict[int, Tuple[Tuple[Rule, ...], Dict[Any, List[Rule]]]] = {}

  def __add__(self, other: PatternMatcher) -> PatternMatcher:
    return PatternMatcher(self.patterns + other.patterns)

  @staticmethod
  def _key(u: UOp) -> Any:
    # an ALU is keyed by its arg, an enum member: by id, which hashes in C (and never equals a UOps key). The ops of the
    # sources are part of the key: the candidates are only the rules whose pattern fits them (see _ops_may_match)
    return ((id(u.arg) if isinstance(u.arg, Enum) else (u.op, u.arg)) if u.op is UOps.ALU else u.op, tuple([s.op for s in u.src]))

  def _candidates(self, u: UOp, key: Any = None) -> List[Rule]:
    if (ret := self._cands.get(key := self._key(u) if key is None else key)) is None:
      found = self._by_key.get((u.op, None), []) + (self._by_key.get((u.op, u.arg), []) if u.op is UOps.ALU else [])
      ret = self._cands[key] = [(p, f) for _, p, f in sorted(found, key=lambda x: x[0]) if _ops_may_match(u, p)]
    return ret

  def _candidates_beyond(self, u: UOp, known: Tuple[Rule, ...]) -> List[Rule]:
    """The candidates for u that are not rules of `known` (u is a fixpoint of those)."""
    ent = self._beyond.get(id(known))
    if ent is None or ent[0] is not known:
      if len(self._beyond) >= 16:   # a long-lived matcher sees a new rule set per kernel: start over now and then
        self._beyond.clear()
      ent = self._beyond[id(known)] = (known, {})
    if (ret := ent[1].get(key := self._key(u))) is None:
      tried = {(id(p), id(f)) for p, f in known}
      ret = ent[1][key] = [(p, f) for p, f in self._candidates(u, key) if (id(p), id(f)) not in tried]
    return ret

  def rewrite(self, u: UOp, known: Optional[Tuple[Rule, ...]] = None) -> Optional[UOp]:
    """The first replacement a rule gives for u (not recursive), or None. `known`: rules u is known to be a fixpoint
    of (they gave None for this very uop before), which are not tried again."""
    for p, fxn in (self._candidates(u) if known is None else self._candidates_beyond(u, known)):
      for store in (p._compiled or p.match)(u):
        if (ret := fxn(**store)) is not None:
          return ret
    return None


def graph_rewrite(sink: UOp, pm: PatternMatcher) -> UOp:
  """Rewrite bottom-up with pm until no rule applies anywhere; structurally identical nodes become one uop.

  A uop left unchanged is a fixpoint of every rule of pm; it remembers that (`_fix`), so a later pass over the same
  uop skips the rules it shares with this one: the passes of a kernel re-run the symbolic rules over graphs that mostly
  came through the previous pass untouched."""
  rules = pm.rules
  if (whole := sink.__dict__.get("_sfix")) is not None and (whole is rules or _is_subset(rules, whole)):
    return sink   # the output of a pass with these rules and more: nothing to do, and nothing left to merge
  canon: Dict[Any, UOp] = {}
  done: Dict[UOp, UOp] = {}

  def rw(n: UOp) -> UOp:
    if (r := done.get(n)) is not None:
      return r
    # the hottest loop of codegen: builtins (map, tuple ==) instead of generators. UOps compare by identity, so
    # `new_src == n.src` is "every source is the same object"
    new_src = tuple([rw(s) for s in n.src])
    arg = n.arg
    # floats by repr (keeps -0.0 apart from 0.0 and lets nan dedup), bools apart from the ints 0 and 1; inline, not a
    # helper call, because this runs for every node of every rewrite
    key: Any = (n.op, n.dtype, tuple(map(id, new_src)),
                ("f", repr(arg)) if isinstance(arg, float) else ("b", arg) if isinstance(arg, bool) else arg)
    try:
      # the lookup is the hashability test too: a tuple does not keep its hash, so a separate hash() computed it twice
      c = canon.get(key)
    except TypeError:
      key = c = None
    if c is not None:
      done[n] = c
      return c
    nn = n if new_src == n.src else UOp(n.op, n.dtype, new_src, n.arg)
    known = nn.__dict__.get("_fix")
    if (rep := None if known is rules else pm.rewrite(nn, known)) is not None:
      ret = rw(rep)
    else:
      ret = nn
      nn.__dict__["_fix"] = rules
      if key is not None:
        canon[key] = nn
      done[nn] = nn
    done[n] = ret
    return ret
  ret = rw(sink)
  ret.__dict__["_sfix"] = rules   # every uop under it is a fixpoint of rules, and no two of them are alike
  return ret


def _is_subset(rules: Tuple[Rule, ...], of: Tuple[Rule, ...]) -> bool:
  have = {(id(p), id(f)) for p, f in of}
  return all((id(p), id(f)) in have for p, f in rules)


def graph_substitute(sink: UOp, replace: Dict[UOp, UOp]) -> UOp:
  """sink with every uop in `replace` swapped for its replacement (itself substituted in turn), by identity: no
  structural merging and no rules, unlike graph_rewrite. NOOP sources of the SINK or an AFTER are dropped."""
  done: Dict[UOp, UOp] = {}

  def sub(u: UOp) -> UOp:
    if (r := done.get(u)) is not None:
      return r
    if (rep := replace.get(u)) is not None:
      ret = sub(rep)
    else:
      # list comprehensions and tuple == (UOps compare by identity): this visits every uop of the kernel
      new_src = tuple([sub(x) for x in u.src])
      if u.op in (UOps.SINK, UOps.AFTER):
        new_src = tuple([x for x in new_src if x.op is not UOps.NOOP])
      ret = u if new_src == u.src else UOp(u.op, u.dtype, new_src, u.arg)
    done[u] = ret
    return ret
  return sub(sink)


def uop_const_value(u: UOp) -> Optional[ConstType]:
  """The constant value of a CONST uop (or a VECTORIZE of one repeated CONST), else None."""
  if u.op is UOps.CONST:
    return u.arg
  if u.op is UOps.VECTORIZE and u.src and all(s is u.src[0] for s in u.src) and u.src[0].op is UOps.CONST:
    return u.src[0].arg
  return None
