"""LLVMRenderer: linearized UOps to LLVM IR text, following the UOp contract in tiny.codegen.uops.

The kernel has the same shape as the C one (see tiny_clang.renderer): `@NAME(ptr data0, ..., i32 var, ..., i32 core, i32 ncores)`,
`@NAME_entry(ptr args, i32 core, i32 ncores)` and `@NAME_parallel`. Accumulators live in allocas that mem2reg turns into
registers; loop counters are phis; addresses are summed in i64 (see _Builder.widen). Fast-math: `contract` on float
arithmetic (a*b+c may become an FMA), and `reassoc` only on the additions that feed a sum accumulator, so the vectorizer
can split a reduction into lanes. No nnan/ninf/nsz.
half and bfloat16 arithmetic is done in float and rounded back after every operation (IEEE results, any LLVM target).
"""
from __future__ import annotations

import math
import struct
from typing import Any, Dict, List, Optional, Set, Tuple, Union

from tiny.backend import BinaryOps, DType, Kernel, PtrDType, Renderer, TernaryOps, UnaryOps, UOp, UOps, dtypes, lazy_gated_alternatives, \
  to_function_name

from tiny_clang.heuristics import cpu_hand_coded_optimizations
from tiny_clang.conv_padding import pads_conv_input
from tiny_clang.conv_channels_last import conv_channels_last
from tiny_clang.matmul_panels import panel_width
from tiny_clang.matvec_split import split_block
from tiny_clang.panel_prefetch import PANEL_PREFETCH, panel_prefetch
from tiny_clang.row_prefetch import ROW_PREFETCH, row_prefetches
from tiny_clang.row_stream_prefetch import row_stream_loads
from tiny_clang.streaming_stores import prefetched_loads, stream_min_bytes, stream_prefetch_bytes, streaming_stores
from tiny_clang.tile_loops import UNROLL_TILE, tile_loops
from tiny_clang.renderer import _cpu_flags, _loop_structure, _only_through, host_simd_bytes, host_simd_registers, max_const_side, \
  cpu_matcher

_SCALAR = {dtypes.bool: "i1", dtypes.int8: "i8", dtypes.uint8: "i8", dtypes.int16: "i16", dtypes.uint16: "i16", dtypes.int32: "i32",
           dtypes.uint32: "i32", dtypes.int64: "i64", dtypes.uint64: "i64", dtypes.float16: "half", dtypes.bfloat16: "bfloat",
           dtypes.float32: "float", dtypes.float64: "double"}
_INTR = {UnaryOps.SQRT: "sqrt", UnaryOps.EXP2: "exp2", UnaryOps.LOG2: "log2", UnaryOps.SIN: "sin"}
_F16 = (dtypes.float16, dtypes.bfloat16)
# index ops that have an i64 twin: `nsw` holds in i64 because the int32 index never leaves the int32 range
_WIDE_OPS = {BinaryOps.ADD: "add nsw", BinaryOps.MUL: "mul nsw"}


def _vconst(c: str, lt: str, n: int) -> str:
  """A vector constant with every lane c, written without a type prefix (it follows the type, as every operand does)."""
  return "<" + ", ".join([f"{lt} {c}"] * n) + ">"


class LLVMRenderError(RuntimeError):
  """The uop list holds something the LLVM renderer cannot express."""


def ltype(dt: DType) -> str:
  """LLVM register type of a scalar or vector dtype."""
  if isinstance(dt, PtrDType):
    return "ptr"
  if dt.count > 1:
    return f"<{dt.count} x {ltype(dt.scalar())}>"
  if dt not in _SCALAR:
    raise LLVMRenderError(f"LLVM renderer has no type for {dt}")
  return _SCALAR[dt]


def mtype(dt: DType) -> str:
  """LLVM type of an element in memory (bool is a byte there)."""
  s = dt.scalar()
  if s == dtypes.bool:
    return "i8" if dt.count == 1 else f"<{dt.count} x i8>"
  return ltype(dt)


def _is_unsigned(dt: DType) -> bool:
  return dt.scalar() in (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64, dtypes.bool)


def _bf16_bits(x: float) -> int:
  u = struct.unpack("<I", struct.pack("<f", x))[0]
  if math.isnan(x):
    return ((u >> 16) | 0x40) & 0xFFFF
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def lconst(x: Any, dt: DType) -> str:
  """LLVM literal for the scalar x in dtype dt (exact: floats are written as hex bit patterns)."""
  dt = dt.scalar()
  if dt == dtypes.bool:
    return "true" if x else "false"
  if dtypes.is_int(dt):
    bits = dt.itemsize * 8
    v = int(x) & ((1 << bits) - 1)
    return str(v - (1 << bits) if v >= 1 << (bits - 1) else v)
  if dt == dtypes.float16:
    try:
      return f"0xH{struct.unpack('<H', struct.pack('<e', float(x)))[0]:04X}"
    except OverflowError:
      return f"0xH{0x7C00 if x > 0 else 0xFC00:04X}"
  if dt == dtypes.bfloat16:
    return f"0xR{_bf16_bits(float(x)):04X}"
  if dt == dtypes.float32:
    try:
      x = struct.unpack("<f", struct.pack("<f", float(x)))[0]
    except OverflowError:
      x = math.copysign(math.inf, x)
  return f"0x{struct.unpack('<Q', struct.pack('<d', float(x)))[0]:016X}"


class LLVMRenderer(Renderer):
  """LLVM IR for the LLVM device (host CPU). No thread ids or local memory: global dims are loops."""

  device = "LLVM"
  has_local = False
  row_kernels = True   # as ClangRenderer: rows stay in cache between the passes
  has_shared = False
  global_max = None
  local_max = None
  supports_float4 = True
  # the ops this renderer spells natively (kernel opts and rewrites look at the keys)
  code_for_op = {op: (lambda *a: "") for op in (*UnaryOps, *BinaryOps, *TernaryOps) if op not in (UnaryOps.CAST, UnaryOps.BITCAST)}
  extra_matcher = cpu_matcher

  def __init__(self) -> None:
    self.simd_bytes = host_simd_bytes()
    self.simd_registers = host_simd_registers(self.simd_bytes)
    self.stream_min_bytes = stream_min_bytes(self.simd_bytes, _cpu_flags())   # tiny_clang.streaming_stores
    self.stream_prefetch_bytes = stream_prefetch_bytes(self.stream_min_bytes)
    self.row_prefetch = bool(ROW_PREFETCH)   # row kernels prefetch the next row (tiny_clang.row_prefetch)
    self.next_panel_prefetch = bool(PANEL_PREFETCH)   # packed matmuls prefetch the next panel (tiny_clang.panel_prefetch)

  def hand_coded_optimizations(self, k: Kernel) -> bool:
    """The host CPU's tiling heuristic (tiny_clang.heuristics) instead of core's device-neutral one."""
    return cpu_hand_coded_optimizations(k)

  def matmul_panel(self, m: int, k: int, n: int, dtype: DType) -> int:
    """Pack b into panels of two vectors of columns for large products (tiny_clang.matmul_panels)."""
    return panel_width(self.simd_bytes, m, k, n, dtype)

  def matvec_split(self, m: int, k: int, n: int, dtype: DType) -> int:
    """Split large vector-matrix products along the reduce (tiny_clang.matvec_split)."""
    return split_block(self.simd_bytes, m, k, n, dtype)

  def pads_conv_input(self, padded_spatial: Tuple[int, ...], dtype: DType) -> bool:
    """Copy large padded conv inputs into a zero-padded buffer (tiny_clang.conv_padding)."""
    return pads_conv_input(self.simd_bytes, padded_spatial, dtype)

  def conv_channels_last(self, channels: int, spatial: Tuple[int, ...], dtype: DType) -> bool:
    """Channels-last conv gradients when the channels fill vectors and the rows do not (tiny_clang.conv_channels_last)."""
    return conv_channels_last(self.simd_bytes, channels, spatial, dtype)

  def render(self, name: str, uops: List[UOp]) -> str:
    return _Builder(to_function_name(name), list(uops), self.stream_min_bytes, self.stream_prefetch_bytes, self.row_prefetch,
                    self.simd_bytes if self.next_panel_prefetch else 0).build()


class _Builder:
  """One render: the IR lines, the value of each uop, the current block."""

  def __init__(self, name: str, uops: List[UOp], stream_min_bytes: int = 0, prefetch_bytes: int = 0, row_prefetch: bool = False,
               simd_bytes: int = 0):
    self.name, self.uops = name, uops
    self.lines: List[str] = []
    self.allocas: List[str] = []
    self.decls: Set[str] = set()
    self.r: Dict[UOp, str] = {}
    self.acc_slot: Dict[UOp, Tuple[str, DType]] = {}
    self.cnt = 0
    self.block = "entry"
    self.loops: List[Tuple[UOp, str, int]] = []
    self.ifs: List[int] = []
    top, _, store_outside = _loop_structure(uops)
    self.split = top[0] if len(top) == 1 and not top[0].arg[1] and not store_outside else None
    self.reassoc = self._reduction_adds()
    self.index_ops = _index_values(uops)
    self.r64: Dict[UOp, str] = {}   # the i64 twin of an index add/mul, emitted right after its i32 value
    self.unroll = tile_loops(uops)   # unrolled UNROLL_TILE times (tiny_clang.tile_loops)
    self.meta: List[str] = []
    # the per-lane alternative of a gated vector load (and its lane loads) is emitted inside that load's fallback path
    self.lazy = lazy_gated_alternatives(uops)
    # non-temporal stores of large outputs (tiny_clang.streaming_stores); the metadata node they carry, once emitted
    self.streams = streaming_stores(uops, stream_min_bytes)
    self.nontemporal_md: Optional[str] = None
    # and the loads such a kernel prefetches prefetch_bytes ahead of
    self.prefetch_bytes = prefetch_bytes
    self.prefetches = prefetched_loads(uops, self.streams, prefetch_bytes) | row_stream_loads(uops, prefetch_bytes)
    # a row kernel's loads and stores that prefetch the next row: (distance in bytes, write intent)
    self.row_ahead = row_prefetches(uops, row_prefetch)
    # a packed matmul's load that prefetches the next panel (tiny_clang.panel_prefetch)
    self.panel = panel_prefetch(uops, simd_bytes, not self.prefetches and not self.row_ahead)

  # *** helpers ***

  def tmp(self) -> str:
    self.cnt += 1
    return f"%t{self.cnt}"

  def emit(self, line: str) -> None:
    self.lines.append("  " + line)

  def label(self, name: str) -> None:
    self.lines.append(f"{name}:")
    self.block = name

  def ins(self, text: str) -> str:
    v = self.tmp()
    self.emit(f"{v} = {text}")
    return v

  def val(self, u: UOp) -> str:
    """The value of u at this point of the program (accumulators are re-read from their slot)."""
    if u.op in (UOps.DEFINE_ACC, UOps.PHI):
      acc = u if u.op is UOps.DEFINE_ACC else u.src[0]
      slot, dt = self.acc_slot[acc]
      return self.ins(f"load {ltype(dt)}, ptr {slot}")
    if u not in self.r:
      raise LLVMRenderError(f"{u.op} used before it is defined")
    return self.r[u]

  def splat(self, v: str, dt: DType, count: int) -> str:
    """Broadcast scalar value v of dtype dt to a vector of count lanes."""
    one = self.ins(f"insertelement <1 x {ltype(dt)}> poison, {ltype(dt)} {v}, i32 0")
    return self.ins(f"shufflevector <1 x {ltype(dt)}> {one}, <1 x {ltype(dt)}> poison, <{count} x i32> zeroinitializer")

  def operand(self, s: UOp, want: DType) -> str:
    """Value of s as dtype `want`'s shape (scalars are splatted into vector ops)."""
    v = self.val(s)
    if want.count > 1 and s.dtype is not None and s.dtype.count == 1:
      return self.splat(v, s.dtype, want.count)
    return v

  def cast(self, v: str, frm: DType, to: DType) -> str:
    """Convert v from dtype frm to dtype to (same lane count), with C semantics."""
    n = to.count
    f, t = frm.scalar(), to.scalar()
    if f == t:
      return v
    lf, lt = ltype(frm), ltype(to)
    if t == dtypes.bool:
      zero = lconst(0, f)
      zv = _vconst(zero, ltype(f), n) if n > 1 else zero
      return self.ins(f"fcmp une {lf} {v}, {zv}" if dtypes.is_float(f) else f"icmp ne {lf} {v}, {zv}")
    if dtypes.is_float(f) and dtypes.is_float(t):
      f32 = dtypes.float32.vec(n) if n > 1 else dtypes.float32
      if dtypes.bfloat16 in (f, t) and dtypes.float32 not in (f, t):   # bfloat16 <-> anything but float: through float
        return self.cast(self.cast(v, frm, f32), f32, to)
      if dtypes.bfloat16 in (f, t):
        return self.bf16_from_f32(v, n) if t == dtypes.bfloat16 else self.bf16_to_f32(v, n)
      if f in _F16 and t in _F16:   # half <-> bfloat through float
        return self.cast(self.cast(v, frm, f32), f32, to)
      return self.ins(f"{'fpext' if t.itemsize > f.itemsize else 'fptrunc'} {lf} {v} to {lt}")
    if dtypes.bfloat16 in (f, t):
      # int/bool <-> bfloat16 through float: sitofp/fptosi on bfloat is a runtime-library call on CPUs without AVX512-BF16,
      # which the JIT cannot resolve (it crashed on AVX2); the rounding is the C renderer's (int -> float -> bfloat16)
      f32 = dtypes.float32.vec(n) if n > 1 else dtypes.float32
      return self.cast(self.cast(v, frm, f32), f32, to)
    if dtypes.is_float(f):
      return self.ins(f"{'fptoui' if _is_unsigned(t) else 'fptosi'} {lf} {v} to {lt}")
    if dtypes.is_float(t):
      return self.ins(f"{'uitofp' if _is_unsigned(f) else 'sitofp'} {lf} {v} to {lt}")
    if t.itemsize == f.itemsize and f != dtypes.bool:
      return v
    if t.itemsize > f.itemsize or f == dtypes.bool:
      return self.ins(f"{'zext' if _is_unsigned(f) else 'sext'} {lf} {v} to {lt}")
    return self.ins(f"trunc {lf} {v} to {lt}")

  def _ivec(self, bits: int, n: int) -> str:
    return f"<{n} x i{bits}>" if n > 1 else f"i{bits}"

  def _icon(self, x: int, n: int) -> str:
    return _vconst(str(x), "i32", n) if n > 1 else str(x)

  def bf16_to_f32(self, v: str, n: int) -> str:
    """bfloat16 -> float with integer ops (exact: the 16 bits become the top half of the float)."""
    b = self.ins(f"bitcast {self._ivec(16, n).replace('i16', 'bfloat')} {v} to {self._ivec(16, n)}")
    w = self.ins(f"zext {self._ivec(16, n)} {b} to {self._ivec(32, n)}")
    s = self.ins(f"shl {self._ivec(32, n)} {w}, {self._icon(16, n)}")
    return self.ins(f"bitcast {self._ivec(32, n)} {s} to {self._ivec(32, n).replace('i32', 'float')}")

  def bf16_from_f32(self, v: str, n: int) -> str:
    """float -> bfloat16, round to nearest even, NaN stays NaN: integer ops, so no runtime library call on any CPU."""
    i32, ft = self._ivec(32, n), self._ivec(32, n).replace("i32", "float")
    u = self.ins(f"bitcast {ft} {v} to {i32}")
    hi = self.ins(f"lshr {i32} {u}, {self._icon(16, n)}")
    lsb = self.ins(f"and {i32} {hi}, {self._icon(1, n)}")
    bias = self.ins(f"add {i32} {lsb}, {self._icon(0x7FFF, n)}")
    rounded = self.ins(f"lshr {i32} {self.ins(f'add {i32} {u}, {bias}')}, {self._icon(16, n)}")
    nan = self.ins(f"or {i32} {hi}, {self._icon(0x40, n)}")
    isnan = self.ins(f"fcmp uno {ft} {v}, {v}")
    sel = self.ins(f"select {self.booltype(dtypes.bool.vec(n) if n > 1 else dtypes.bool)} {isnan}, {i32} {nan}, {i32} {rounded}")
    t = self.ins(f"trunc {i32} {sel} to {self._ivec(16, n)}")
    return self.ins(f"bitcast {self._ivec(16, n)} {t} to {self._ivec(16, n).replace('i16', 'bfloat')}")

  def _reduction_adds(self) -> Set[UOp]:
    """ALU adds on the path from a PHI's value to its scalar float accumulator: these may be reassociated."""
    out: Set[UOp] = set()
    for u in self.uops:
      if u.op is not UOps.PHI:
        continue
      acc, v = u.src
      if acc.dtype is None or not dtypes.is_float(acc.dtype) or acc.dtype.scalar() in _F16 or not _only_through(v, acc, BinaryOps.ADD):
        continue
      while v is not acc and v.op is UOps.ALU:
        out.add(v)
        nxt = [s for s in v.src if s is acc or _reads_acc(s, acc)]
        v = nxt[0]
    return out

  # *** ALU ***

  def alu(self, u: UOp) -> str:
    op, dt = u.arg, u.dtype
    assert dt is not None
    n = dt.count
    in_scalar = cast_dt(u.src[1] if op is TernaryOps.WHERE else u.src[0]).scalar()
    vec = (lambda s: s.vec(n)) if n > 1 else (lambda s: s)
    xs = [self.operand(s, dt) for s in u.src]
    if in_scalar in _F16 and op is not TernaryOps.WHERE:
      # half and bfloat16: compute in float, round the result back to 16 bits
      f32 = vec(dtypes.float32)
      xs = [self.cast(x, vec(in_scalar), f32) for x in xs]
      is_cmp = dt.scalar() == dtypes.bool
      res = self._alu(op, xs, f32, dt if is_cmp else f32, u)
      return res if is_cmp else self.cast(res, f32, dt)
    return self._alu(op, xs, vec(in_scalar), dt, u)

  def _alu(self, op: Any, xs: List[str], sdt: DType, dt: DType, u: UOp) -> str:
    s = sdt.scalar()
    t = ltype(sdt)
    isf = dtypes.is_float(s)
    fm = "reassoc contract " if u in self.reassoc else "contract "
    if op is UnaryOps.NEG:
      if s == dtypes.bool:
        return self.ins(f"xor {t} {xs[0]}, {self.const_of(True, sdt)}")
      return self.ins(f"fneg {t} {xs[0]}") if isf else self.ins(f"sub {t} {self.const_of(0, sdt)}, {xs[0]}")
    if op is UnaryOps.RECIP:
      return self.ins(f"fdiv {fm}{t} {self.const_of(1.0, sdt)}, {xs[0]}")
    if op in (UnaryOps.EXP2, UnaryOps.LOG2) and s == dtypes.float32 and sdt.count > 1:
      # a vector helper in the module: the intrinsics on vectors would be one scalar libm call per lane
      from tiny_clang.vmath import exp2_llvm, log2_llvm
      self.decls.add((exp2_llvm if op is UnaryOps.EXP2 else log2_llvm)(sdt.count))
      return self.ins(f"call {t} @tiny_{_INTR[op]}_v{sdt.count}({t} {xs[0]})")
    if op in _INTR:
      name = f"llvm.{_INTR[op]}.{'v' + str(sdt.count) if sdt.count > 1 else ''}{'f32' if s == dtypes.float32 else 'f64'}"
      self.decls.add(f"declare {t} @{name}({t})")
      return self.ins(f"call {fm}{t} @{name}({t} {xs[0]})")
    if op is BinaryOps.ADD:
      return self.ins(f"fadd {fm}{t} {xs[0]}, {xs[1]}" if isf else f"{'or' if s == dtypes.bool else 'add'} {t} {xs[0]}, {xs[1]}")
    if op is BinaryOps.MUL:
      return self.ins(f"fmul {fm}{t} {xs[0]}, {xs[1]}" if isf else f"{'and' if s == dtypes.bool else 'mul'} {t} {xs[0]}, {xs[1]}")
    if op is BinaryOps.IDIV:
      return self.ins(f"{'udiv' if _is_unsigned(s) else 'sdiv'} {t} {xs[0]}, {xs[1]}" if not isf else f"fdiv {t} {xs[0]}, {xs[1]}")
    if op is BinaryOps.MOD:
      return self.ins(f"{'urem' if _is_unsigned(s) else 'srem'} {t} {xs[0]}, {xs[1]}" if not isf else f"frem {t} {xs[0]}, {xs[1]}")
    if op is BinaryOps.MAX:
      # the first operand wins ties and NaNs from either side win, as in tiny.ops.python_alu
      if isf and (side := max_const_side(u)) is not None:
        # MAX(x, c) = x < c ? c : x, MAX(c, x) = c >= x ? c : x: both keep a NaN x, as the compare is then false
        c = self.ins(f"fcmp {'olt' if side == 1 else 'oge'} {t} {xs[0]}, {xs[1]}")
        return self.ins(f"select {self.booltype(sdt)} {c}, {t} {xs[side]}, {t} {xs[1 - side]}")
      if isf:
        c = self.ins(f"or {self.booltype(sdt)} {self.ins(f'fcmp oge {t} {xs[0]}, {xs[1]}')}, {self.ins(f'fcmp uno {t} {xs[0]}, {xs[0]}')}")
      else:
        c = self.ins(f"icmp {'uge' if _is_unsigned(s) else 'sge'} {t} {xs[0]}, {xs[1]}")
      return self.ins(f"select {self.booltype(sdt)} {c}, {t} {xs[0]}, {t} {xs[1]}")
    if op is BinaryOps.CMPLT:
      return self.ins(f"fcmp olt {t} {xs[0]}, {xs[1]}" if isf else f"icmp {'ult' if _is_unsigned(s) else 'slt'} {t} {xs[0]}, {xs[1]}")
    if op is BinaryOps.CMPNE:
      return self.ins(f"fcmp une {t} {xs[0]}, {xs[1]}" if isf else f"icmp ne {t} {xs[0]}, {xs[1]}")
    if op in (BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR):
      return self.ins(f"{op.name.lower()} {t} {xs[0]}, {xs[1]}")
    if op is BinaryOps.SHL:
      return self.ins(f"shl {t} {xs[0]}, {xs[1]}")
    if op is BinaryOps.SHR:
      return self.ins(f"{'lshr' if _is_unsigned(s) else 'ashr'} {t} {xs[0]}, {xs[1]}")
    if op is TernaryOps.WHERE:
      rt = ltype(dt)
      return self.ins(f"select {self.booltype(dt)} {xs[0]}, {rt} {xs[1]}, {rt} {xs[2]}")
    if op is TernaryOps.MULACC:
      if isf:
        m = self.ins(f"fmul contract {t} {xs[0]}, {xs[1]}")
        return self.ins(f"fadd {fm}{t} {m}, {xs[2]}")
      return self.ins(f"add {t} {self.ins(f'mul {t} {xs[0]}, {xs[1]}')}, {xs[2]}")
    raise LLVMRenderError(f"LLVM renderer cannot render {op}")

  def booltype(self, dt: DType) -> str:
    return f"<{dt.count} x i1>" if dt.count > 1 else "i1"

  def const_of(self, x: Any, dt: DType) -> str:
    c = lconst(x, dt.scalar())
    return _vconst(c, ltype(dt.scalar()), dt.count) if dt.count > 1 else c

  # *** memory ***

  def wide(self, u: UOp) -> str:
    """u (an int32 index value) as an i64: its twin, a constant, or a sign extension at this point of the program."""
    if u in self.r64:
      return self.r64[u]
    if u.op is UOps.CONST:
      return str(int(u.arg))
    return self.ins(f"sext i32 {self.val(u)} to i64")

  def widen(self, u: UOp) -> None:
    """Emit the i64 twin of index add/mul u next to its i32 value.

    An i32 index is sign extended at its gep, and LLVM cannot move that extension out of the sum (instcombine turns an
    add of disjoint bits into an `or`, which drops nsw), so the reduce loop of the packed matmul recomputed and extended
    a's index every step (1 thread, 2048²: ~0.82x the C kernel). An i64 sum with nsw is affine to SCEV: the loop walks
    pointers, as clang's does. nsw is true there: each term is an int32 index value, far from the i64 range."""
    self.r64[u] = self.ins(f"{_WIDE_OPS[u.arg]} i64 {self.wide(u.src[0])}, {self.wide(u.src[1])}")

  def gep(self, buf: UOp, idx: UOp) -> str:
    assert isinstance(buf.dtype, PtrDType)
    return self.ins(f"getelementptr inbounds {mtype(buf.dtype.base)}, ptr {self.val(buf)}, i64 {self.wide(idx)}")

  def load(self, u: UOp) -> str:
    dt, buf = u.dtype, u.src[0]
    assert dt is not None and isinstance(buf.dtype, PtrDType)
    align = buf.dtype.base.scalar().itemsize
    gated = len(u.src) >= 4 and u.src[2].op is not UOps.BARRIER
    if gated and dt.count == 1:
      # branch-free: read element 0 (always in bounds) when the gate is off, then pick the alternative
      g = self.val(u.src[2])
      i = self.ins(f"select i1 {g}, i64 {self.wide(u.src[1])}, i64 0")
      p = self.ins(f"getelementptr inbounds {mtype(buf.dtype.base)}, ptr {self.val(buf)}, i64 {i}")
      v = self.from_mem(self.ins(f"load {mtype(dt)}, ptr {p}, align {align}"), dt)
      return self.ins(f"select i1 {g}, {ltype(dt)} {v}, {ltype(dt)} {self.operand(u.src[3], dt)}")
    if gated and u.src[3] in self.lazy:
      # a vector whose lanes have their own gates: the whole-vector load when every lane is valid, else each lane's
      # own gated load, computed only on that path
      n = self.tmp()[2:]
      g = self.val(u.src[2])
      self.emit(f"br i1 {g}, label %ld{n}, label %lda{n}")
      self.label(f"ld{n}")
      v = self.from_mem(self.ins(f"load {mtype(dt)}, ptr {self.gep(buf, u.src[1])}, align {align}"), dt)
      after = self.block
      self.emit(f"br label %ldj{n}")
      self.label(f"lda{n}")
      lanes = "poison"
      for k, lane in enumerate(u.src[3].src):
        lanes = self.ins(f"insertelement {ltype(dt)} {lanes}, {ltype(dt.scalar())} {self.load(lane)}, i32 {k}")
      alt_end = self.block
      self.emit(f"br label %ldj{n}")
      self.label(f"ldj{n}")
      return self.ins(f"phi {ltype(dt)} [{v}, %{after}], [{lanes}, %{alt_end}]")
    if gated:
      n = self.tmp()[2:]
      g, alt, before = self.val(u.src[2]), self.operand(u.src[3], dt), self.block
      self.emit(f"br i1 {g}, label %ld{n}, label %ldj{n}")
      self.label(f"ld{n}")
      p = self.gep(buf, u.src[1])
      v = self.from_mem(self.ins(f"load {mtype(dt)}, ptr {p}, align {align}"), dt)
      after = self.block
      self.emit(f"br label %ldj{n}")
      self.label(f"ldj{n}")
      return self.ins(f"phi {ltype(dt)} [{v}, %{after}], [{alt}, %{before}]")
    p = self.gep(buf, u.src[1])
    if u in self.prefetches:
      self.prefetch(p, self.prefetch_bytes, False, 3)   # a streaming kernel's input: into L1 (prefetcht0)
    elif u in self.row_ahead:
      self.prefetch(p, *self.row_ahead[u], 2)
    elif self.panel is not None and u is self.panel.load:
      self.panel_prefetch(p)
    return self.from_mem(self.ins(f"load {mtype(dt)}, ptr {p}, align {align}"), dt)

  def from_mem(self, v: str, dt: DType) -> str:
    if dt.scalar() == dtypes.bool:
      return self.ins(f"trunc {mtype(dt)} {v} to {ltype(dt)}")
    return v

  def store(self, u: UOp) -> None:
    buf, idx, value = u.src[:3]
    assert isinstance(buf.dtype, PtrDType) and value.dtype is not None
    vdt = value.dtype
    n = self.tmp()[2:]
    if len(u.src) > 3:
      self.emit(f"br i1 {self.val(u.src[3])}, label %st{n}, label %stj{n}")
      self.label(f"st{n}")
    v = self.val(value)
    if vdt.scalar() == dtypes.bool:
      v = self.ins(f"zext {ltype(vdt)} {v} to {mtype(vdt)}")
    p = self.gep(buf, idx)
    if u in self.row_ahead and u not in self.streams:
      self.prefetch(p, *self.row_ahead[u], 2)
    if u in self.streams:
      self.streaming_store(v, vdt, p, buf.dtype.base.scalar().itemsize)
    else:
      self.emit(f"store {mtype(vdt)} {v}, ptr {p}, align {buf.dtype.base.scalar().itemsize}")
    if len(u.src) > 3:
      self.emit(f"br label %stj{n}")
      self.label(f"stj{n}")

  def panel_prefetch(self, p: str) -> None:
    """Prefetch this row tile's share of the next panel into L2 (tiny_clang.panel_prefetch), from the panel load at p."""
    pp = self.panel
    assert pp is not None
    t, r = (self.ins(f"sext i32 {self.r[x]} to i64") for x in (pp.tile, pp.reduce))
    off = self.ins(f"add i64 {self.ins(f'mul i64 {t}, {pp.share}')}, {self.ins(f'mul i64 {r}, {pp.step}')}")
    self.prefetch(p, self.ins(f"add i64 {off}, {pp.ahead}"), False, 2)

  def prefetch(self, p: str, distance: Union[int, str], write: bool, locality: int) -> None:
    """Prefetch the line `distance` bytes after p, with write intent or not; locality 3 is L1 (prefetcht0), 2 is L2
    (prefetcht1 / prefetchw: a row kernel's next row)."""
    # a plain (not inbounds) step: the address ahead may lie past the end of the buffer, which the prefetch ignores
    self.decls.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    self.emit(f"call void @llvm.prefetch.p0(ptr {self.ins(f'getelementptr i8, ptr {p}, i64 {distance}')}, i32 {int(write)}, i32 {locality}, i32 1)")

  def streaming_store(self, v: str, vdt: DType, p: str, align: int) -> None:
    """A non-temporal store of a whole cache line where p is 64-byte aligned, a plain store where it is not."""
    if self.nontemporal_md is None:
      self.nontemporal_md = f"!{len(self.meta)}"
      self.meta.append(f"{self.nontemporal_md} = !{{i32 1}}")
    n = self.tmp()[2:]
    off = self.ins(f"and i64 {self.ins(f'ptrtoint ptr {p} to i64')}, 63")
    self.emit(f"br i1 {self.ins(f'icmp eq i64 {off}, 0')}, label %nt{n}, label %ntp{n}")
    self.label(f"nt{n}")
    self.emit(f"store {mtype(vdt)} {v}, ptr {p}, align 64, !nontemporal {self.nontemporal_md}")
    self.emit(f"br label %ntj{n}")
    self.label(f"ntp{n}")
    self.emit(f"store {mtype(vdt)} {v}, ptr {p}, align {align}")
    self.emit(f"br label %ntj{n}")
    self.label(f"ntj{n}")

  # *** control flow ***

  def open_range(self, u: UOp) -> None:
    n = self.tmp()[2:]
    start, end = self.val(u.src[0]), self.val(u.src[1])
    if u is self.split:
      # this core's slice of the outermost loop: [start + len*core/ncores, start + len*(core+1)/ncores)
      ln = self.ins(f"sub i32 {end}, {start}")
      ln64 = self.ins(f"sext i32 {ln} to i64")
      c64, n64 = self.ins("sext i32 %core to i64"), self.ins("sext i32 %ncores to i64")
      c1 = self.ins(f"add i64 {c64}, 1")
      lo = self.ins(f"sdiv i64 {self.ins(f'mul i64 {ln64}, {c64}')}, {n64}")
      hi = self.ins(f"sdiv i64 {self.ins(f'mul i64 {ln64}, {c1}')}, {n64}")
      start = self.ins(f"add i32 {start}, {self.ins(f'trunc i64 {lo} to i32')}")
      end = self.ins(f"add i32 {self.val(u.src[0])}, {self.ins(f'trunc i64 {hi} to i32')}")
    before = self.block
    self.emit(f"br label %loop{n}")
    self.label(f"loop{n}")
    idx = f"%ridx{n}"
    self.emit(f"{idx} = phi i32 [{start}, %{before}], [{idx}_next, %latch{n}]")
    self.emit(f"%cond{n} = icmp slt i32 {idx}, {end}")
    self.emit(f"br i1 %cond{n}, label %body{n}, label %exit{n}")
    self.label(f"body{n}")
    self.r[u] = idx
    self.loops.append((u, n, 0))

  def close_range(self, u: UOp) -> None:
    rng, n, _ = self.loops.pop()
    if rng is not u.src[0]:
      raise LLVMRenderError("ENDRANGE does not close the innermost open RANGE")
    self.emit(f"br label %latch{n}")
    self.label(f"latch{n}")
    self.emit(f"%ridx{n}_next = add nsw i32 %ridx{n}, 1")
    if rng in self.unroll:
      m = len(self.meta)
      self.meta += [f"!{m} = distinct !{{!{m}, !{m + 1}}}", f"!{m + 1} = !{{!\"llvm.loop.unroll.count\", i32 {UNROLL_TILE}}}"]
      self.emit(f"br label %loop{n}, !llvm.loop !{m}")
    else:
      self.emit(f"br label %loop{n}")
    self.label(f"exit{n}")

  # *** the walk ***

  def build(self) -> str:
    bufs: Dict[int, Tuple[str, DType, bool]] = {}
    var_args: Dict[str, str] = {}
    for u in self.uops:
      op, dt = u.op, u.dtype
      if op in (UOps.SINK, UOps.NOOP, UOps.AFTER):
        continue
      if op is UOps.DEFINE_GLOBAL:
        assert dt is not None
        self.r[u] = f"%data{u.arg[0]}"
        bufs[u.arg[0]] = (self.r[u], dt, bool(u.arg[1]))
      elif op is UOps.DEFINE_VAR:
        self.r[u] = f"%\"{u.arg.expr}\""
        var_args[u.arg.expr] = self.r[u]
      elif op in (UOps.SPECIAL, UOps.DEFINE_LOCAL, UOps.BARRIER, UOps.WMMA):
        raise LLVMRenderError(f"LLVM renderer has no {op} (render kernels for the CPU with has_local=False and no tensor cores)")
      elif op is UOps.CONST:
        assert dt is not None
        self.r[u] = self.const_of(u.arg, dt)
      elif op is UOps.DEFINE_ACC:
        assert dt is not None
        slot = f"%acc{len(self.acc_slot)}"
        self.allocas.append(f"  {slot} = alloca {ltype(dt)}")
        self.acc_slot[u] = (slot, dt)
        init = self.const_of(u.src[0].arg, dt) if u.src[0].op is UOps.CONST else self.operand(u.src[0], dt)
        self.emit(f"store {ltype(dt)} {init}, ptr {slot}")
      elif op is UOps.PHI:
        acc = u.src[0]
        slot, adt = self.acc_slot[acc]
        self.emit(f"store {ltype(adt)} {self.operand(u.src[1], adt)}, ptr {slot}")
      elif op is UOps.RANGE:
        self.open_range(u)
      elif op is UOps.ENDRANGE:
        self.close_range(u)
      elif op is UOps.IF:
        n = self.tmp()[2:]
        self.emit(f"br i1 {self.val(u.src[0])}, label %if{n}, label %endif{n}")
        self.label(f"if{n}")
        self.ifs.append(int(n))
      elif op is UOps.ENDIF:
        n2 = self.ifs.pop()
        self.emit(f"br label %endif{n2}")
        self.label(f"endif{n2}")
      elif u in self.lazy:
        continue
      elif op is UOps.LOAD:
        self.r[u] = self.load(u)
      elif op is UOps.STORE:
        self.store(u)
      elif op is UOps.ALU:
        self.r[u] = self.alu(u)
        if u in self.index_ops and u.arg in _WIDE_OPS:
          self.widen(u)
      elif op is UOps.CAST:
        assert dt is not None and u.src[0].dtype is not None
        frm = u.src[0].dtype
        v = self.val(u.src[0])
        if dt.count > 1 and frm.count == 1:
          v, frm = self.splat(v, frm, dt.count), frm.vec(dt.count)
        self.r[u] = self.cast(v, frm, dt)
      elif op is UOps.BITCAST:
        assert dt is not None and u.src[0].dtype is not None
        self.r[u] = self.ins(f"bitcast {ltype(u.src[0].dtype)} {self.val(u.src[0])} to {ltype(dt)}")
      elif op is UOps.VECTORIZE:
        assert dt is not None
        v = "poison"
        for i, s in enumerate(u.src):
          v = self.ins(f"insertelement {ltype(dt)} {v}, {ltype(dt.scalar())} {self.val(s)}, i32 {i}")
        self.r[u] = v
      elif op is UOps.GEP:
        src_dt = u.src[0].dtype
        assert src_dt is not None
        self.r[u] = self.ins(f"extractelement {ltype(src_dt)} {self.val(u.src[0])}, i32 {u.arg}")
      else:
        raise LLVMRenderError(f"LLVM renderer cannot render {op}")
    if self.loops or self.ifs:
      raise LLVMRenderError("unclosed RANGE or IF at the end of the kernel")
    # buffers in index order, then variables sorted by name: the argument order Program promises
    args = [(n, dt, mut) for _, (n, dt, mut) in sorted(bufs.items())]
    params = [f"ptr noalias align {dt.base.scalar().itemsize if isinstance(dt, PtrDType) else 1}{'' if mut else ' readonly'} {n}"
              for n, dt, mut in args]
    params += [f"i32 {var_args[k]}" for k in sorted(var_args)] + ["i32 %core", "i32 %ncores"]
    nargs = len(args) + len(var_args)
    entry = [f"define void @{self.name}_entry(ptr %args, i32 %core, i32 %ncores) #0 {{"]
    call = []
    for i in range(nargs):
      entry.append(f"  %ap{i} = getelementptr inbounds i64, ptr %args, i64 {i}")
      entry.append(f"  %a{i} = load i64, ptr %ap{i}")
      if i < len(args):
        entry.append(f"  %c{i} = inttoptr i64 %a{i} to ptr")
        call.append(f"ptr %c{i}")
      else:
        entry.append(f"  %c{i} = trunc i64 %a{i} to i32")
        call.append(f"i32 %c{i}")
    entry += [f"  call void @{self.name}({', '.join(call + ['i32 %core', 'i32 %ncores'])})", "  ret void", "}"]
    # streaming stores are weakly ordered: drain them before the slice is reported done to the other threads
    fence = ["  call void @llvm.x86.sse.sfence()"] if self.streams else []
    if self.streams:
      self.decls.add("declare void @llvm.x86.sse.sfence()")
    body = [f"define void @{self.name}({', '.join(params)}) #0 {{", "entry:", *self.allocas, *self.lines, *fence, "  ret void", "}"]
    return "\n".join(sorted(self.decls) + [f"@{self.name}_parallel = constant i32 {int(self.split is not None)}", "", *body, "", *entry, "",
                                           'attributes #0 = { nounwind "no-trapping-math"="true" }', *self.meta])


def _index_values(uops: List[UOp]) -> Set[UOp]:
  """The int32 values that addresses are computed from: the index of every load and store, and through add/mul, the
  operands of those (see _Builder.widen)."""
  out: Set[UOp] = set()
  todo = [u.src[1] for u in uops if u.op in (UOps.LOAD, UOps.STORE) and len(u.src) > 1]
  while todo:
    v = todo.pop()
    if v in out or v.dtype != dtypes.int32:
      continue
    out.add(v)
    if v.op is UOps.ALU and v.arg in _WIDE_OPS:
      todo.extend(v.src)
  return out


def cast_dt(u: UOp) -> DType:
  assert u.dtype is not None
  return u.dtype


def _reads_acc(u: UOp, acc: UOp) -> bool:
  from tiny_clang.renderer import _reads
  return _reads(u, acc)
