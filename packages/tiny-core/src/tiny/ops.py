"""The kernel AST (`LazyOp`), the op enums it is built from, and the scalar semantics of every ALU op.

`exec_alu` is the reference meaning of an ALU op on Python scalars: the PYTHON device runs kernels
with it and the rewrite rules fold constants with it, so both agree by construction.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import struct
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from tiny.dtype import ConstType, DType, dtypes
from tiny.helpers import dedup, prod
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import Variable, sint


class UnaryOps(Enum):
  """A -> A (CAST/BITCAST change the dtype to the one in arg)."""

  EXP2 = auto(); LOG2 = auto(); CAST = auto(); BITCAST = auto(); SIN = auto(); SQRT = auto(); NEG = auto(); RECIP = auto()  # noqa: E702


class BinaryOps(Enum):
  """A + A -> A (CMPLT/CMPNE give bool)."""

  ADD = auto(); MUL = auto(); IDIV = auto(); MAX = auto(); MOD = auto(); CMPLT = auto(); CMPNE = auto(); XOR = auto()  # noqa: E702
  SHL = auto(); SHR = auto(); OR = auto(); AND = auto(); THREEFRY = auto()  # noqa: E702


class TernaryOps(Enum):
  """A + A + A -> A (WHERE's first operand is bool)."""

  WHERE = auto(); MULACC = auto()  # noqa: E702


class ReduceOps(Enum):
  """A -> B, reducing the axes in arg."""

  SUM = auto(); MAX = auto(); WMMA = auto()  # noqa: E702


class BufferOps(Enum):
  """Leaves and roots of a kernel AST: memory access through a ShapeTracker."""

  LOAD = auto(); CONST = auto(); STORE = auto(); ARANGE = auto()  # noqa: E702


class MetaOps(Enum):
  """Schedule-level ops that are not arithmetic."""

  EMPTY = auto(); CONST = auto(); COPY = auto(); CONTIGUOUS = auto(); CUSTOM = auto(); ASSIGN = auto(); VIEW = auto(); KERNEL = auto()  # noqa: E702
  # the values 0..n-1 of a 1-D base, never stored: a kernel computes each from its position, like a constant
  ARANGE = auto()


Op = Union[UnaryOps, BinaryOps, ReduceOps, MetaOps, TernaryOps, BufferOps]

# ops whose value at 0 is not 0: a padded region must not be fused through them
UNSAFE_PAD_OPS = {UnaryOps.RECIP, UnaryOps.LOG2, UnaryOps.EXP2, BinaryOps.IDIV}


class InvalidLazyOpError(ValueError):
  """A kernel AST is malformed (shape mismatch, wrong arity, bad buffer index)."""


@dataclass(frozen=True)
class MemBuffer:
  """A buffer argument of a kernel, viewed through a ShapeTracker."""

  idx: int
  dtype: DType
  st: ShapeTracker


@dataclass(frozen=True, eq=False)
class ConstBuffer:
  """A constant (or a bound symbolic Variable) broadcast through a ShapeTracker."""

  val: Union[ConstType, Variable]
  dtype: DType
  st: ShapeTracker

  def _key(self) -> Tuple[Any, ...]:
    # floats by repr: -0.0 == 0.0 would let x*-0.0 reuse the kernel compiled for x*0.0, and NaN != NaN would never hit
    return (("f", repr(self.val)) if isinstance(self.val, float) else self.val, self.dtype, self.st)

  def __eq__(self, x: object) -> bool:
    return isinstance(x, ConstBuffer) and self._key() == x._key()

  def __hash__(self) -> int:
    return hash(self._key())


@dataclass(frozen=True)
class ArangeBuffer:
  """The positions 0..n-1 of a 1-D base of n elements, read through a ShapeTracker (0 where the view is masked).

  A kernel computes each value from its index instead of loading it, so an index comparison like `idx == arange(n)`
  stays visible to codegen (a gather's one-hot sum over n folds to one load)."""

  dtype: DType
  st: ShapeTracker


@dataclass(frozen=True)
class KernelInfo:
  """Facts about an already-optimized kernel AST, carried on the SINK."""

  local_dims: int = 0
  upcasted: int = 0
  dont_use_locals: bool = False


@dataclass(frozen=True, eq=False)
class LazyOp:
  """One node of a kernel AST. Structural equality and hashing are cached so ASTs can key caches."""

  op: Op
  src: Tuple[LazyOp, ...] = ()
  arg: Any = None

  def cached_compare(self, x: LazyOp, context: Dict[Tuple[int, int], bool]) -> bool:
    """Structural equality, memoized on node ids so shared subtrees are compared once."""
    if id(self) == id(x):
      return True
    if self.op != x.op or self.arg != x.arg or len(self.src) != len(x.src):
      return False
    if (key := (id(self), id(x))) in context:
      return context[key]
    ret = context[key] = all(a.cached_compare(b, context) for a, b in zip(self.src, x.src))
    return ret

  def __eq__(self, x: object) -> bool:
    return isinstance(x, LazyOp) and (self is x or (self.hash == x.hash and self.cached_compare(x, context={})))

  def __hash__(self) -> int:
    return self.hash

  @functools.cached_property
  def hash(self) -> int:
    return hash((self.op, self.src, self.arg))

  def __repr__(self) -> str:
    return f"LazyOp(op={self.op}, src={self.src}, arg={self.arg})"

  @functools.cached_property
  def dtype(self) -> DType:
    """The dtype this node produces."""
    if self.op in BufferOps:
      return self.arg.dtype
    if self.op in (UnaryOps.CAST, UnaryOps.BITCAST):
      return self.arg
    if self.op in (BinaryOps.CMPLT, BinaryOps.CMPNE):
      return dtypes.bool
    if self.op is MetaOps.KERNEL or not self.src:
      raise InvalidLazyOpError(f"{self.op} has no dtype")
    return self.src[-1].dtype

  @functools.cached_property
  def key(self) -> bytes:
    """A stable digest of the whole tree (for disk caches across processes)."""
    h = hashlib.sha256(str((self.op, self.arg)).encode())
    for s in self.src:
      h.update(s.key)
    return h.digest()

  @functools.cached_property
  def lazyops(self) -> List[LazyOp]:
    """All nodes of the tree, self first, each once."""
    # iterative pre-order walk: recursion with per-node lists is quadratic on big fused kernels
    order: List[LazyOp] = []
    seen: Set[int] = set()
    stack: List[LazyOp] = [self]
    while stack:
      x = stack.pop()
      if id(x) in seen:
        continue
      seen.add(id(x))
      order.append(x)
      stack.extend(reversed(x.src))
    return dedup(order)

  def vars(self) -> List[Variable]:
    """The symbolic Variables of all the ShapeTrackers and constants, sorted by name."""
    found: Set[Variable] = set()
    for x in self.lazyops:
      if x.op in BufferOps:
        found |= set(x.arg.st.vars())
        if x.op is BufferOps.CONST and isinstance(x.arg.val, Variable):
          found.add(x.arg.val)
    return sorted(found, key=lambda v: v.expr)


# *** scalar semantics ***

def _hook_overflow(dv: Any, fxn: Callable[..., Any]) -> Callable[..., Any]:
  def wfxn(*args: Any) -> Any:
    try:
      return fxn(*args)
    except OverflowError:
      return dv
  return wfxn


def _idiv(x: Any, y: Any) -> Any:
  # C semantics (truncate toward zero), made total for integers the way numpy is: x // 0 == 0, and MIN // -1 wraps
  # to MIN through the dtype's truncation. Compiled kernels match this through guard_int_division in the codegen.
  if isinstance(x, float) or isinstance(y, float):
    if y == 0:
      return x * math.inf if x != 0 else math.nan
    return math.trunc(x / y)
  if y == 0:
    return 0
  return abs(x) // abs(y) * (-1 if (x < 0) != (y < 0) else 1)


def _mod(x: Any, y: Any) -> Any:
  # C semantics (the sign of the result follows the dividend), with x % 0 == 0 for integers as numpy has it
  if isinstance(x, float) or isinstance(y, float):
    return math.fmod(x, y) if y != 0 else math.nan
  if y == 0:
    return 0
  return abs(x) % abs(y) * (-1 if x < 0 else 1)


def _recip(x: Any) -> float:
  return 1 / x if x != 0 else math.copysign(math.inf, x)


python_alu: Dict[Op, Callable[..., Any]] = {
  UnaryOps.LOG2: lambda x: math.log2(x) if x > 0 else -math.inf if x == 0 else math.nan,
  UnaryOps.EXP2: _hook_overflow(math.inf, lambda x: 2 ** x if not math.isnan(x) else math.nan),
  UnaryOps.SQRT: lambda x: math.sqrt(x) if x >= 0 else math.nan,
  UnaryOps.RECIP: _recip,
  UnaryOps.SIN: lambda x: math.sin(x) if not math.isinf(x) else math.nan,
  UnaryOps.NEG: lambda x: (not x) if isinstance(x, bool) else -x,
  UnaryOps.CAST: lambda x: x,  # the dtype's truncation does the conversion
  BinaryOps.SHR: lambda x, y: x >> y, BinaryOps.SHL: lambda x, y: x << y,
  BinaryOps.MUL: lambda x, y: x * y, BinaryOps.ADD: lambda x, y: x + y,
  BinaryOps.XOR: lambda x, y: x ^ y, BinaryOps.OR: lambda x, y: x | y, BinaryOps.AND: lambda x, y: x & y,
  BinaryOps.MAX: lambda x, y: x if x != x or x >= y else y,  # nan wins, like fmax is not: keep the first nan
  BinaryOps.CMPNE: lambda x, y: x != y, BinaryOps.CMPLT: lambda x, y: x < y,
  BinaryOps.MOD: _mod, BinaryOps.IDIV: _idiv,
  TernaryOps.MULACC: lambda x, y, z: (x * y) + z,
  TernaryOps.WHERE: lambda x, y, z: y if x else z,
}


def _fp16(x: Any) -> float:
  try:
    return struct.unpack("e", struct.pack("e", float(x)))[0]
  except OverflowError:
    return math.copysign(math.inf, x)


def _fp32(x: Any) -> float:
  # ctypes.c_float truncates instead of rounding; struct rounds to nearest even and flags overflow
  try:
    return struct.unpack("f", struct.pack("f", float(x)))[0]
  except OverflowError:
    return math.copysign(math.inf, x)


def _bf16(x: Any) -> float:
  x = float(x)
  if math.isnan(x):
    return x
  bits = struct.unpack("I", struct.pack("f", _fp32(x)))[0]
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even on the low half
  return struct.unpack("f", struct.pack("I", (bits & 0xFFFF) << 16))[0]


def _wrap(bits: int, signed: bool) -> Callable[[Any], int]:
  mask, half = (1 << bits) - 1, 1 << (bits - 1)

  def fxn(x: Any) -> int:
    v = int(x) & mask
    return v - (1 << bits) if signed and v >= half else v
  fxn.is_int = True  # type: ignore[attr-defined]
  return fxn


class _TruncateTable:
  """dtype -> function that rounds/wraps a Python value to what that dtype can hold (built on first use)."""

  def __init__(self) -> None:
    self._table: Optional[Dict[Any, Callable[[Any], Any]]] = None

  def _build(self) -> Dict[Any, Callable[[Any], Any]]:
    t: Dict[Any, Callable[[Any], Any]] = {dtypes.bool: bool, dtypes.float16: _fp16, dtypes.bfloat16: _bf16, dtypes.float32: _fp32,
                                          dtypes.float64: lambda x: ctypes.c_double(x).value}
    for dt in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64):
      t[dt] = _wrap(8 * dt.itemsize, True)
    for dt in (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64):
      t[dt] = _wrap(8 * dt.itemsize, False)
    return t

  @property
  def table(self) -> Dict[Any, Callable[[Any], Any]]:
    if self._table is None:
      self._table = self._build()
    return self._table

  def get(self, dtype: Any, default: Any = None) -> Any:
    return self.table.get(dtype, default)

  def __getitem__(self, dtype: Any) -> Callable[[Any], Any]:
    return self.table[dtype]

  def __contains__(self, dtype: Any) -> bool:
    return dtype in self.table


truncate = _TruncateTable()


def _ident(x: Any) -> Any:
  return x


def is_add_identity(c: Any, dtype: DType) -> bool:
  """True when x + c == x for every x of dtype, bit for bit: a zero of an int or bool dtype, but of a float dtype only
  -0.0 (IEEE gives -0.0 + 0.0 == +0.0, so x + 0.0 turns a negative zero positive; x + -0.0 keeps every x, NaN and
  infinities included)."""
  if dtypes.is_float(dtype.scalar()):
    return c == 0 and math.copysign(1.0, float(c)) < 0
  return c == 0


def exec_alu(op: Op, dtype: DType, operands: Union[List[Any], Tuple[Any, ...]]) -> Any:
  """Apply op to Python scalars with C-like semantics and truncate the result to dtype."""
  if op is BinaryOps.THREEFRY:
    return threefry2x32(operands[0], operands[1])
  if dtype.count > 1:
    raise TypeError(f"exec_alu works on scalars, got vector dtype {dtype}")
  fxn = python_alu.get(op)
  if fxn is None:
    raise ValueError(f"{op} is not an ALU op")
  ret = fxn(*operands)
  conv = truncate.get(dtype, _ident)
  if getattr(conv, "is_int", False) and isinstance(ret, float) and not math.isfinite(ret):
    return 0  # an integer divided by zero: undefined in C, 0 here
  return conv(ret)


def threefry2x32(x: int, key: int) -> int:
  """Threefry-2x32 with 20 rounds: x and key are uint64 holding two uint32 words each (low word first)."""
  m = 0xFFFFFFFF
  rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
  x0, x1 = x & m, (x >> 32) & m
  k0, k1 = key & m, (key >> 32) & m
  ks = (k1, k0 ^ k1 ^ 0x1BD11BDA, k0)
  xr = [(x0 + ks[-1]) & m, (x1 + ks[0]) & m]
  for i in range(5):
    for r in rotations[i % 2]:
      xr[0] = (xr[0] + xr[1]) & m
      xr[1] = (((xr[1] << r) | (xr[1] >> (32 - r))) & m) ^ xr[0]
    xr = [(xr[0] + ks[i % 3]) & m, (xr[1] + ks[(i + 1) % 3] + i + 1) & m]
  return (xr[1] << 32) | xr[0]


# *** AST checks and estimates ***

def elementwise_shape(shapes: Sequence[Tuple[sint, ...]]) -> Tuple[sint, ...]:
  """The shape an elementwise op computes over: its sources' shape, or, when a source is a reduce's result read along the
  axes it reduced (size 1 there, only in a row kernel), the shape of the source with the fewest such 1s."""
  return max(shapes, key=lambda s: sum(not (isinstance(d, int) and d == 1) for d in s))


def verify_lazyop(ast: LazyOp) -> Dict[LazyOp, ShapeTracker]:
  """Check that a kernel AST is well formed and return the ShapeTracker each node computes over.

  Raises InvalidLazyOpError when a store is not at the root, buffer indices are not 0.. in order, elementwise
  sources disagree on shape, or a reduce does not turn its axes into 1s."""
  stores = ast.src if ast.op is MetaOps.KERNEL else (ast,)
  if not stores or any(x.op is not BufferOps.STORE for x in stores):
    raise InvalidLazyOpError(f"a kernel is a KERNEL of STOREs, got {ast.op} with {[x.op for x in stores]}")
  sts: Dict[LazyOp, ShapeTracker] = {}

  def dfs(op: LazyOp) -> ShapeTracker:
    if op in sts:
      return sts[op]
    if op.op is MetaOps.KERNEL or (op.op is BufferOps.STORE and op not in stores):
      raise InvalidLazyOpError(f"{op.op} found inside a kernel AST")
    src_sts = [dfs(x) for x in op.src]
    if op.op in ReduceOps:
      if len(op.src) != 1 or not isinstance(op.arg, tuple):
        raise InvalidLazyOpError(f"{op.op} takes one source and a tuple of axes, got {len(op.src)} sources and {op.arg!r}")
      shp = src_sts[0].shape
      if any(not isinstance(a, int) or a < 0 or a >= len(shp) for a in op.arg):
        raise InvalidLazyOpError(f"reduce axes {op.arg} out of range for shape {shp}")
      st = ShapeTracker.from_shape(tuple(1 if i in op.arg else s for i, s in enumerate(shp)))
    elif op.op in BufferOps:
      if not isinstance(op.arg, (MemBuffer, ConstBuffer, ArangeBuffer)) or \
          isinstance(op.arg, ArangeBuffer) != (op.op is BufferOps.ARANGE):
        raise InvalidLazyOpError(f"{op.op} needs a MemBuffer/ConstBuffer (ARANGE: an ArangeBuffer) arg, got {op.arg!r}")
      st = op.arg.st
      if op.op is BufferOps.STORE:
        if len(op.src) != 1:
          raise InvalidLazyOpError("STORE takes exactly one source")
        if src_sts[0].shape != st.shape:
          raise InvalidLazyOpError(f"STORE of shape {src_sts[0].shape} into view of shape {st.shape}")
      elif op.src:
        raise InvalidLazyOpError(f"{op.op} takes no sources")
    else:
      arities: Dict[Any, int] = {**{o: 1 for o in UnaryOps}, **{o: 2 for o in BinaryOps}, **{o: 3 for o in TernaryOps}}
      arity = arities.get(op.op)
      if arity is None or len(op.src) != arity:
        raise InvalidLazyOpError(f"{op.op} takes {arity} sources, got {len(op.src)}")
      st = ShapeTracker.from_shape(elementwise_shape([s.shape for s in src_sts]))
      for x, s in zip(op.src, src_sts):
        # a reduce's result may be read along the axes it reduced (a row kernel: x - x.max(1) with the max inlined)
        if s.shape != st.shape and (not any(y.op in ReduceOps for y in x.lazyops) or
                                    any(a != b and not (isinstance(a, int) and a == 1) for a, b in zip(s.shape, st.shape))):
          raise InvalidLazyOpError(f"{op.op} sources have different shapes {[s.shape for s in src_sts]}")
      if all(s.shape == st.shape for s in src_sts):
        st = src_sts[0]
    sts[op] = st
    return st

  for i, out in enumerate(stores):
    if out.arg.idx != i:
      raise InvalidLazyOpError(f"store {i} writes buffer {out.arg.idx}: outputs must be buffers 0..{len(stores) - 1} in order")
    if out.arg.st.size != stores[-1].arg.st.size:
      raise InvalidLazyOpError("all outputs of a kernel must have the same size")
    dfs(out)
  return sts


@dataclass
class FlopCounter:
  """Running estimate while walking an AST: current shape, flops so far, bytes touched per buffer."""

  shape: Tuple[sint, ...]
  flops: sint
  mem: Dict[int, int]

  @property
  def mem_estimate(self) -> sint:
    return sum(self.mem.values())

  def consume_flops(self) -> sint:
    """Hand over the flops counted so far (so shared subtrees are not counted twice)."""
    self.flops, ret = 0, self.flops
    return ret


def get_lazyop_info(ast: LazyOp) -> FlopCounter:
  """Estimate the flops and memory traffic of an AST (KERNEL roots sum their stores)."""
  cache: Dict[LazyOp, FlopCounter] = {}

  def run(op: LazyOp) -> FlopCounter:
    if op in cache:
      return cache[op]
    srcs = [run(x) for x in op.src]
    if op.op is MetaOps.KERNEL:
      ret = FlopCounter((), sum(s.consume_flops() for s in srcs), {k: v for s in srcs for k, v in s.mem.items()})
    elif op.op is BufferOps.LOAD:
      ret = FlopCounter(op.arg.st.shape, 0, {op.arg.idx: op.arg.dtype.itemsize * op.arg.st.real_size()})
    elif op.op in (BufferOps.CONST, BufferOps.ARANGE):
      ret = FlopCounter(op.arg.st.shape, 0, {})
    elif op.op is BufferOps.STORE:
      s = srcs[0]
      ret = FlopCounter(op.arg.st.shape, s.consume_flops(), {**s.mem, op.arg.idx: op.arg.dtype.itemsize * op.arg.st.real_size()})
    elif op.op in ReduceOps:
      s = srcs[0]
      ret = FlopCounter(tuple(1 if i in op.arg else d for i, d in enumerate(s.shape)), s.consume_flops() + prod(s.shape), s.mem)
    else:
      cost = 0 if op.op in (UnaryOps.CAST, UnaryOps.BITCAST) else (2 if op.op is TernaryOps.MULACC else 1)
      shape = elementwise_shape([s.shape for s in srcs])
      ret = FlopCounter(shape, sum(s.consume_flops() for s in srcs) + cost * prod(shape),
                        {k: v for s in srcs for k, v in s.mem.items()})
    cache[op] = ret
    return ret
  return run(ast)
