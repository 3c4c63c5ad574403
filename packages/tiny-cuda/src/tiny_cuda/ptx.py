"""PTXRenderer: linearized UOps straight to PTX, assembled in process by nvJitLink (`DEVICE=CUDA:PTX`).

Registers come in four classes, declared untyped (`.pred`, `.b16`, `.b32`, `.b64`); PTX lets an instruction of any
type of the same size use an untyped register, so every uop just names the type of its instruction. Choices:
- 8-bit integers live in 16-bit registers, re-sign/zero-extended after every op so they wrap like C's.
- half and bfloat16 are 16-bit registers; arithmetic converts to f32 and rounds back (correctly rounded for + - * /
  and sqrt, because f32 has more than twice their precision). bfloat16 -> f32 is a shift, f32 -> bfloat16 `cvt.rn`.
- exp2/log2 of float32 use the `ex2.approx`/`lg2.approx` units; sin, and exp2/log2 of other float types, use core's
  polynomial approximations (rewritten before rendering), so float64 keeps its precision.
- constants are moved into registers once; loops test their condition at the top (so an empty range runs nothing).
"""
from __future__ import annotations

import struct
from collections import defaultdict
from typing import Any, DefaultDict, Dict, List, Optional, Tuple, Union, cast

from tiny.backend import (BinaryOps, DType, PatternMatcher, PtrDType, RenderError, Renderer, TensorCore, TernaryOps, UnaryOps, UOp, UOps, UPat,
                          dtypes, prod, xexp2, xlog2)

F16 = (dtypes.float16, dtypes.bfloat16)
INT8 = (dtypes.int8, dtypes.uint8)
# PTX type of each dtype (the type named in loads/stores and conversions)
PTX_TYPE = {dtypes.bool: "pred", dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.int16: "s16", dtypes.uint16: "u16", dtypes.int32: "s32",
            dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64", dtypes.float16: "f16", dtypes.bfloat16: "bf16",
            dtypes.float32: "f32", dtypes.float64: "f64"}
# the type arithmetic is done in: 8-bit ints in 16 bits, the 16-bit floats in f32
ARITH_TYPE = {**PTX_TYPE, dtypes.int8: "s16", dtypes.uint8: "u16", dtypes.float16: "f32", dtypes.bfloat16: "f32"}
REG_CLASS = {"pred": ("pred", "%p"), 1: ("b16", "%rs"), 2: ("b16", "%rs"), 4: ("b32", "%r"), 8: ("b64", "%rd")}


def _scalar(dt: DType) -> DType:
  base = dt.base if isinstance(dt, PtrDType) else dt
  return base.scalar() if base.count > 1 else base


def _bits(dt: DType) -> str:
  """b16/b32/b64 of a non-bool scalar dtype (8-bit types live in 16-bit registers)."""
  return f"b{max(16, dt.itemsize * 8)}"


def _is_signed(dt: DType) -> bool:
  return dt in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)


def _imm(x: Any, dt: DType) -> str:
  """The PTX immediate for a Python scalar in dt."""
  if dt == dtypes.bool:
    return "1" if x else "0"
  if dt == dtypes.float32:
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", float(x)))[0]
  if dt == dtypes.float64:
    return "0d%016X" % struct.unpack("<Q", struct.pack("<d", float(x)))[0]
  if dt == dtypes.float16:
    return "0x%04X" % struct.unpack("<H", struct.pack("<e", float(x)))[0]
  if dt == dtypes.bfloat16:
    bits = struct.unpack("<I", struct.pack("<f", float(x)))[0]
    if (bits & 0x7FFFFFFF) > 0x7F800000:
      return "0x7FC0"
    return "0x%04X" % ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
  v = int(x)
  if not _is_signed(dt):
    v &= (1 << (dt.itemsize * 8)) - 1
  return str(v)


def _f64_transcendental(op: Any, fxn: Any) -> Tuple[UPat, Any]:
  return (UPat(UOps.ALU, op, (UPat.var("d", dtype=(dtypes.float64, dtypes.float16, dtypes.bfloat16)),)), fxn)


# exp2/log2 have a hardware unit for f32 only: the others get core's polynomials
ptx_matcher = PatternMatcher([_f64_transcendental(UnaryOps.EXP2, xexp2), _f64_transcendental(UnaryOps.LOG2, xlog2)])

Reg = Union[str, List[str]]


class PTXRenderer(Renderer):
  """PTX for one GPU architecture; the same tensor cores as the CUDA C renderer (mma.sync m16n8k16, sm_80+)."""

  device = "CUDA"
  suffix = "PTX"
  global_max = (2 ** 31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  local_threads_max = 1024
  shared_max = 49152
  supports_float4 = True
  # non-empty: the ops PTX has an instruction (sequence) for; SIN is missing on purpose (polynomial, see module doc)
  code_for_op: Dict[Any, Any] = {op: None for op in (UnaryOps.NEG, UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SQRT, UnaryOps.RECIP, *BinaryOps,
                                                     TernaryOps.WHERE, TernaryOps.MULACC) if op is not BinaryOps.THREEFRY}
  extra_matcher = ptx_matcher

  def __init__(self, arch: Optional[str] = None):
    from tiny_cuda.compiler import arch_and_tensor_cores
    self.arch, tcs = arch_and_tensor_cores(arch)
    self.tensor_cores: List[TensorCore] = tcs

  def __reduce__(self) -> Any:
    return (type(self), (self.arch,))

  def render(self, name: str, uops: List[UOp]) -> str:
    """PTX source of the kernel `name` (an `.entry` taking the buffers by index, then the variables by name)."""
    return _PTXWriter(self.arch).write(name, list(uops))


class _PTXWriter:
  """One kernel's worth of state: registers, labels, the instruction list."""

  def __init__(self, arch: str):
    self.arch = arch
    self.lines: List[str] = []
    self.counts: DefaultDict[str, int] = defaultdict(int)
    self.r: Dict[UOp, Reg] = {}
    self.labels = 0
    self.shared: List[str] = []

  # *** registers and emission ***

  def reg(self, dt: DType) -> str:
    """A fresh register for a scalar dtype."""
    cls = REG_CLASS["pred"] if dt == dtypes.bool else REG_CLASS[dt.itemsize]
    n = self.counts[cls[1]]
    self.counts[cls[1]] += 1
    return f"{cls[1]}{n}"

  def emit(self, line: str) -> None:
    self.lines.append(("" if line.endswith(":") else "  ") + line)

  def label(self, kind: str) -> str:
    self.labels += 1
    return f"$L_{kind}_{self.labels}"

  def const(self, x: Any, dt: DType) -> str:
    d = self.reg(dt)
    self.emit(f"mov.{'pred' if dt == dtypes.bool else _bits(dt)} {d}, {_imm(x, dt)};")
    return d

  def to_f32(self, x: str, dt: DType) -> str:
    """x as a float32 register (x of any float type)."""
    if dt == dtypes.float32:
      return x
    d = self.reg(dtypes.float32)
    if dt == dtypes.float16:
      self.emit(f"cvt.f32.f16 {d}, {x};")
    elif dt == dtypes.bfloat16:
      self.emit(f"cvt.u32.u16 {d}, {x};")
      self.emit(f"shl.b32 {d}, {d}, 16;")
    elif dt == dtypes.float64:
      self.emit(f"cvt.rn.f32.f64 {d}, {x};")
    else:
      raise RenderError(f"not a float: {dt}")
    return d

  def from_f32(self, x: str, dt: DType) -> str:
    """Round the float32 register x to a 16-bit float dtype."""
    d = self.reg(dt)
    self.emit(f"cvt.rn.{PTX_TYPE[dt]}.f32 {d}, {x};")
    return d

  def norm8(self, x: str, dt: DType) -> str:
    """Re-extend the low 8 bits of a 16-bit register holding an int8/uint8, so it wraps like C."""
    self.emit(f"cvt.{ARITH_TYPE[dt]}.{PTX_TYPE[dt]} {x}, {x};")
    return x

  # *** operations ***

  def cast(self, x: str, src: DType, dst: DType) -> str:  # noqa: C901
    """Convert the register x from src to dst (C semantics: floats truncate toward zero into ints)."""
    if src == dst:
      return x
    if dst == dtypes.bool:
      d = self.reg(dst)
      if src in F16:
        x, src = self.to_f32(x, src), dtypes.float32
      zero = _imm(0, src)
      self.emit(f"setp.{'neu' if dtypes.is_float(src) else 'ne'}.{ARITH_TYPE[src]} {d}, {x}, {zero};")
      return d
    if src == dtypes.bool:
      d = self.reg(dst)
      if dst in F16:
        self.emit(f"selp.b16 {d}, {_imm(1, dst)}, {_imm(0, dst)}, {x};")
      else:
        self.emit(f"selp.{ARITH_TYPE[dst] if dst not in INT8 else _bits(dst)} {d}, {_imm(1, dst)}, {_imm(0, dst)}, {x};")
      return d
    if src in F16 or dst in F16:
      if src in F16 and dst in F16:
        return self.from_f32(self.to_f32(x, src), dst)
      if src in F16:
        return self.cast(self.to_f32(x, src), dtypes.float32, dst)
      if src != dtypes.float32:
        x, src = self.cast(x, src, dtypes.float32), dtypes.float32
      return self.from_f32(x, dst)
    d = self.reg(dst)
    sf, df = dtypes.is_float(src), dtypes.is_float(dst)
    if sf and df:
      self.emit(f"cvt{'.rn' if dst.itemsize < src.itemsize else ''}.{PTX_TYPE[dst]}.{PTX_TYPE[src]} {d}, {x};")
    elif sf:
      self.emit(f"cvt.rzi.{PTX_TYPE[dst]}.{PTX_TYPE[src]} {d}, {x};")
    elif df:
      self.emit(f"cvt.rn.{PTX_TYPE[dst]}.{PTX_TYPE[src]} {d}, {x};")
    elif src.itemsize == dst.itemsize and dst not in INT8:
      self.emit(f"mov.{_bits(dst)} {d}, {x};")
    else:
      # an 8-bit source is a 16-bit register already extended: convert from its register type
      self.emit(f"cvt.{PTX_TYPE[dst] if dst not in INT8 else ARITH_TYPE[dst]}.{ARITH_TYPE[src]} {d}, {x};")
      if dst in INT8:
        self.norm8(d, dst)
    return d

  def alu(self, op: Any, dt: DType, srcs: List[str], sdts: List[DType]) -> str:  # noqa: C901
    """The register holding op(srcs) of result dtype dt (srcs have dtypes sdts)."""
    operand_dt = sdts[-1] if op is TernaryOps.WHERE else sdts[0]
    if op is TernaryOps.WHERE:
      d = self.reg(dt)
      if dt == dtypes.bool:
        t1, t2 = self.reg(dt), self.reg(dt)
        self.emit(f"and.pred {t1}, {srcs[0]}, {srcs[1]};")
        self.emit(f"not.pred {t2}, {srcs[0]};")
        self.emit(f"and.pred {t2}, {t2}, {srcs[2]};")
        self.emit(f"or.pred {d}, {t1}, {t2};")
      else:
        self.emit(f"selp.{_bits(dt)} {d}, {srcs[1]}, {srcs[2]}, {srcs[0]};")
      return d
    if operand_dt == dtypes.bool:
      return self._bool_alu(op, srcs)
    if operand_dt in F16:
      # compute in f32; a comparison gives a bool, everything else rounds back
      f = self.alu(op, dtypes.bool if dt == dtypes.bool else dtypes.float32, [self.to_f32(s, operand_dt) for s in srcs], [dtypes.float32] * len(srcs))
      return f if dt == dtypes.bool else self.from_f32(f, dt)
    t = ARITH_TYPE[operand_dt]
    is_float = dtypes.is_float(operand_dt)
    d = self.reg(dt)
    a = srcs
    if op is BinaryOps.CMPLT:
      self.emit(f"setp.lt.{t} {d}, {a[0]}, {a[1]};")
      return d
    if op is BinaryOps.CMPNE:
      self.emit(f"setp.{'neu' if is_float else 'ne'}.{t} {d}, {a[0]}, {a[1]};")
      return d
    ut = _bits(operand_dt)
    if op is BinaryOps.ADD:
      self.emit(f"add.{t} {d}, {a[0]}, {a[1]};")
    elif op is BinaryOps.MUL:
      self.emit(f"mul{'' if is_float else '.lo'}.{t} {d}, {a[0]}, {a[1]};")
    elif op is TernaryOps.MULACC:
      self.emit(f"{'fma.rn' if is_float else 'mad.lo'}.{t} {d}, {a[0]}, {a[1]}, {a[2]};")
    elif op is BinaryOps.IDIV:
      self.emit(f"div.{t} {d}, {a[0]}, {a[1]};")
    elif op is BinaryOps.MOD:
      self.emit(f"rem.{t} {d}, {a[0]}, {a[1]};")
    elif op is BinaryOps.MAX and is_float:
      # max.f32 returns the other operand for a NaN; tiny's MAX keeps a NaN from either side (tiny.ops.python_alu)
      nan, keep = self.reg(dtypes.bool), self.reg(dtypes.bool)
      self.emit(f"setp.nan.{t} {nan}, {a[0]}, {a[0]};")
      self.emit(f"setp.ge.or.{t} {keep}, {a[0]}, {a[1]}, {nan};")
      self.emit(f"selp.{ut} {d}, {a[0]}, {a[1]}, {keep};")
    elif op is BinaryOps.MAX:
      self.emit(f"max.{t} {d}, {a[0]}, {a[1]};")
    elif op in (BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR):
      self.emit(f"{ {BinaryOps.XOR: 'xor', BinaryOps.AND: 'and', BinaryOps.OR: 'or'}[op]}.{ut} {d}, {a[0]}, {a[1]};")
    elif op in (BinaryOps.SHL, BinaryOps.SHR):
      amt = a[1] if sdts[1].itemsize == 4 else self.cast(a[1], sdts[1], dtypes.uint32)
      kind = "shl" if op is BinaryOps.SHL else "shr"
      self.emit(f"{kind}.{ut if op is BinaryOps.SHL else t} {d}, {a[0]}, {amt};")
    elif op is UnaryOps.NEG and operand_dt in (dtypes.int16, dtypes.uint16):
      # ptxas keeps neg.s16 of -32768 as +32768 in the 32-bit register behind it, and a division or compare that
      # follows reads that (seen on sm_90 with CUDA 13); a multiply by -1 gives the same bits and wraps
      self.emit(f"mul.lo.s16 {d}, {a[0]}, -1;")
    elif op is UnaryOps.NEG:
      self.emit(f"neg.{t if is_float or _is_signed(operand_dt) else t.replace('u', 's')} {d}, {a[0]};")
    elif op is UnaryOps.RECIP:
      self._float_only(op, operand_dt)
      self.emit(f"rcp.rn.{t} {d}, {a[0]};")
    elif op is UnaryOps.SQRT:
      self._float_only(op, operand_dt)
      self.emit(f"sqrt.rn.{t} {d}, {a[0]};")
    elif op in (UnaryOps.EXP2, UnaryOps.LOG2):
      if operand_dt != dtypes.float32:
        raise RenderError(f"PTX renders {op} of float32 only, got {operand_dt} (the polynomial rewrite should have run)")
      self.emit(f"{'ex2' if op is UnaryOps.EXP2 else 'lg2'}.approx.f32 {d}, {a[0]};")
    else:
      raise RenderError(f"PTX cannot render {op} on {operand_dt}")
    return self.norm8(d, dt) if dt in INT8 else d

  def _float_only(self, op: Any, dt: DType) -> None:
    if not dtypes.is_float(dt):
      raise RenderError(f"PTX renders {op} on floats only, got {dt}")

  def _bool_alu(self, op: Any, a: List[str]) -> str:
    d = self.reg(dtypes.bool)
    simple = {BinaryOps.ADD: "or", BinaryOps.MAX: "or", BinaryOps.OR: "or", BinaryOps.MUL: "and", BinaryOps.AND: "and",
              BinaryOps.XOR: "xor", BinaryOps.CMPNE: "xor"}
    if op in simple:
      self.emit(f"{simple[op]}.pred {d}, {a[0]}, {a[1]};")
    elif op is UnaryOps.NEG:
      self.emit(f"not.pred {d}, {a[0]};")
    elif op is BinaryOps.CMPLT:
      self.emit(f"not.pred {d}, {a[0]};")
      self.emit(f"and.pred {d}, {d}, {a[1]};")
    elif op is TernaryOps.MULACC:
      self.emit(f"and.pred {d}, {a[0]}, {a[1]};")
      self.emit(f"or.pred {d}, {d}, {a[2]};")
    else:
      raise RenderError(f"PTX cannot render {op} on bool")
    return d

  def address(self, buf: UOp, idx: UOp) -> Tuple[str, int]:
    """(64-bit base register, byte offset) of buf[idx]."""
    base = self.r[buf]
    assert isinstance(base, str)
    elem = _scalar(buf.dtype)  # type: ignore[arg-type]
    if idx.op is UOps.CONST:
      return base, int(idx.arg) * elem.itemsize
    ir = self.r[idx]
    assert isinstance(ir, str)
    off, d = self.reg(dtypes.int64), self.reg(dtypes.int64)
    if idx.dtype is not None and idx.dtype.itemsize == 8:
      self.emit(f"mul.lo.s64 {off}, {ir}, {elem.itemsize};")
    else:
      self.emit(f"mul.wide.{'s' if idx.dtype is None or _is_signed(idx.dtype) else 'u'}32 {off}, {ir}, {elem.itemsize};")
    self.emit(f"add.s64 {d}, {base}, {off};")
    return d, 0

  def mem(self, kind: str, space: str, dt: DType, addr: Tuple[str, int], regs: List[str], gate: Optional[str] = None) -> None:
    """ld/st of the registers regs (scalar dtype dt each, consecutive in memory), predicated on gate. Vectors become
    v2/v4 instructions of at most 16 bytes; eight 16-bit values travel as four 32-bit words."""
    if dt.itemsize == 2 and len(regs) == 8:
      words = [self.reg(dtypes.uint32) for _ in range(4)]
      if kind == "st" or gate is not None:
        for i, w in enumerate(words):
          self.emit(f"mov.b32 {w}, {{{regs[2 * i]}, {regs[2 * i + 1]}}};")
      self.mem(kind, space, dtypes.uint32, addr, words, gate)
      if kind == "ld":
        for i, w in enumerate(words):
          self.emit(f"mov.b32 {{{regs[2 * i]}, {regs[2 * i + 1]}}}, {w};")
      return
    size = 1 if dt == dtypes.bool else dt.itemsize
    per = max(1, min(len(regs), 16 // size))
    if len(regs) not in (1, 2, 4) or per < len(regs):
      for i in range(0, len(regs), per):
        self.mem(kind, space, dt, (addr[0], addr[1] + i * size), regs[i:i + per], gate)
      return
    pre = f"@{gate} " if gate is not None else ""
    t = "u8" if dt == dtypes.bool else PTX_TYPE[dt] if dt not in F16 else "b16"
    operand = regs[0] if len(regs) == 1 else "{" + ", ".join(regs) + "}"
    vec = "" if len(regs) == 1 else f".v{len(regs)}"
    where = f"[{addr[0]}+{addr[1]}]" if addr[1] else f"[{addr[0]}]"
    if kind == "ld":
      self.emit(f"{pre}ld.{space}{vec}.{t} {operand}, {where};")
    else:
      self.emit(f"{pre}st.{space}{vec}.{t} {where}, {operand};")

  def load(self, u: UOp) -> Reg:
    buf, idx = u.src[0], u.src[1]
    space = "shared" if buf.op is UOps.DEFINE_LOCAL else "global"
    dt = u.dtype
    assert dt is not None
    sdt, n = _scalar(dt), dt.count
    gated = len(u.src) >= 4 and u.src[2].op is not UOps.BARRIER
    gate = self.r[u.src[2]] if gated else None
    assert gate is None or isinstance(gate, str)
    addr = self.address(buf, idx)
    # the registers that receive the load: bools arrive as bytes in 16-bit registers
    mem_dt = dtypes.uint8 if sdt == dtypes.bool else sdt
    regs = [self.reg(mem_dt) for _ in range(n)]
    if gated:
      alt = self.r[u.src[3]]
      alts = alt if isinstance(alt, list) else [alt] * n
      adt = _scalar(u.src[3].dtype)  # type: ignore[arg-type]
      for rg, a in zip(regs, alts):
        self.emit(f"mov.{_bits(mem_dt)} {rg}, {a};" if sdt != dtypes.bool else f"selp.u16 {rg}, 1, 0, {a};")
      assert adt == sdt
    self.mem("ld", space, mem_dt if sdt != dtypes.bool else dtypes.bool, addr, regs, gate)
    if sdt == dtypes.bool:
      preds = [self.reg(dtypes.bool) for _ in range(n)]
      for p, rg in zip(preds, regs):
        self.emit(f"setp.ne.u16 {p}, {rg}, 0;")
      regs = preds
    return regs[0] if n == 1 else regs

  def store(self, u: UOp) -> None:
    buf, idx, val = u.src[0], u.src[1], u.src[2]
    space = "shared" if buf.op is UOps.DEFINE_LOCAL else "global"
    vdt = val.dtype
    assert vdt is not None
    sdt = _scalar(vdt)
    vr = self.r[val]
    regs = vr if isinstance(vr, list) else [vr]
    gate = self.r[u.src[3]] if len(u.src) > 3 else None
    assert gate is None or isinstance(gate, str)
    addr = self.address(buf, idx)
    if sdt == dtypes.bool:
      bytes_ = [self.reg(dtypes.uint16) for _ in regs]
      for b, p in zip(bytes_, regs):
        self.emit(f"selp.u16 {b}, 1, 0, {p};")
      regs = bytes_
    self.mem("st", space, sdt, addr, regs, gate)

  def wmma(self, u: UOp) -> List[str]:
    name, _, dtype_in, dtype_out = u.arg[0], u.arg[1], u.arg[2], u.arg[3]
    if dtype_out != dtypes.float32 or dtype_in not in F16:
      raise RenderError(f"no CUDA tensor core for {name}")
    a, b, c = (self.r[s] for s in u.src)
    if not (isinstance(a, list) and isinstance(b, list) and isinstance(c, list)) or (len(a), len(b), len(c)) != (8, 4, 4):
      raise RenderError(f"{name} takes 8, 4 and 4 registers per thread")

    def pack(xs: List[str]) -> List[str]:
      words = [self.reg(dtypes.uint32) for _ in range(len(xs) // 2)]
      for i, w in enumerate(words):
        self.emit(f"mov.b32 {w}, {{{xs[2 * i]}, {xs[2 * i + 1]}}};")
      return words
    ra, rb = pack(a), pack(b)
    d = [self.reg(dtypes.float32) for _ in range(4)]
    t = PTX_TYPE[dtype_in]
    self.emit(f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{{', '.join(d)}}}, {{{', '.join(ra)}}}, {{{', '.join(rb)}}}, {{{', '.join(c)}}};")
    return d

  # *** the walk ***

  def write(self, name: str, uops: List[UOp]) -> str:  # noqa: C901
    params: Dict[int, str] = {}
    var_params: Dict[str, str] = {}
    loops: Dict[UOp, Tuple[str, str]] = {}
    ifs: Dict[UOp, str] = {}
    for u in uops:
      op, src, arg = u.op, u.src, u.arg
      dt: Any = u.dtype  # None only for the statement uops, which do not read it
      sdt: Any
      if op in (UOps.SINK, UOps.NOOP, UOps.AFTER) and dt is None:
        continue
      if op is UOps.DEFINE_GLOBAL:
        params[arg[0]] = f"data{arg[0]}"
        d = self.reg(dtypes.uint64)
        self.emit(f"ld.param.u64 {d}, [data{arg[0]}];")
        self.emit(f"cvta.to.global.u64 {d}, {d};")
        self.r[u] = d
      elif op is UOps.DEFINE_VAR:
        pname = f"var_{arg.expr}"
        if arg.expr in var_params:
          raise RenderError(f"variable {arg.expr} is defined twice")
        var_params[arg.expr] = pname
        d = self.reg(dtypes.int32)
        self.emit(f"ld.param.u32 {d}, [{pname}];")
        self.r[u] = d
      elif op is UOps.DEFINE_LOCAL:
        elem = _scalar(dt)
        self.shared.append(f".shared .align 16 .b8 {arg[0]}[{max(1, arg[1] * elem.itemsize)}];")
        d = self.reg(dtypes.uint64)
        self.emit(f"mov.u64 {d}, {arg[0]};")
        self.r[u] = d
      elif op is UOps.SPECIAL:
        dim, sname = "xyz"[arg[0]], arg[1]
        d = self.reg(dtypes.int32)
        if sname.startswith("gidx"):
          self.emit(f"mov.u32 {d}, %ctaid.{dim};")
        elif sname.startswith("lidx"):
          self.emit(f"mov.u32 {d}, %tid.{dim};")
        elif sname.startswith("idx"):
          t1, t2 = self.reg(dtypes.int32), self.reg(dtypes.int32)
          self.emit(f"mov.u32 {t1}, %ctaid.{dim};")
          self.emit(f"mov.u32 {t2}, %ntid.{dim};")
          self.emit(f"mov.u32 {d}, %tid.{dim};")
          self.emit(f"mad.lo.s32 {d}, {t1}, {t2}, {d};")
        else:
          raise RenderError(f"unknown SPECIAL {sname}")
        self.r[u] = d
      elif op is UOps.CONST:
        self.r[u] = self.const(arg, dt)
      elif op is UOps.DEFINE_ACC:
        init = self.r[src[0]]
        inits = init if isinstance(init, list) else [init] * dt.count
        sdt = _scalar(dt)
        regs = [self.reg(sdt) for _ in inits]
        for rg, i in zip(regs, inits):
          self.emit(f"mov.{'pred' if sdt == dtypes.bool else _bits(sdt)} {rg}, {i};")
        self.r[u] = regs[0] if dt.count == 1 else regs
      elif op is UOps.PHI:
        acc, new = self.r[src[0]], self.r[src[1]]
        accs, news = (acc, new) if isinstance(acc, list) else ([acc], [new])
        sdt = _scalar(src[0].dtype)  # type: ignore[arg-type]
        for a, n in zip(accs, news):  # type: ignore[arg-type]
          self.emit(f"mov.{'pred' if sdt == dtypes.bool else _bits(sdt)} {a}, {n};")
        self.r[u] = acc
      elif op is UOps.RANGE:
        i = self.reg(dtypes.int32)
        self.emit(f"mov.u32 {i}, {self.r[src[0]]};")
        top, end = self.label("loop"), self.label("endloop")
        loops[u] = (top, end)
        p = self.reg(dtypes.bool)
        self.emit(f"{top}:")
        self.emit(f"setp.ge.s32 {p}, {i}, {self.r[src[1]]};")
        self.emit(f"@{p} bra {end};")
        self.r[u] = i
      elif op is UOps.ENDRANGE:
        top, end = loops[src[0]]
        ri = self.r[src[0]]
        self.emit(f"add.s32 {ri}, {ri}, 1;")
        self.emit(f"bra {top};")
        self.emit(f"{end}:")
      elif op is UOps.IF:
        end = self.label("endif")
        ifs[u] = end
        self.emit(f"@!{self.r[src[0]]} bra {end};")
      elif op is UOps.ENDIF:
        self.emit(f"{ifs[src[0]]}:")
      elif op is UOps.BARRIER:
        self.emit("bar.sync 0;")
      elif op is UOps.LOAD:
        self.r[u] = self.load(u)
      elif op is UOps.STORE:
        self.store(u)
      elif op is UOps.ALU:
        if dt.count > 1:
          raise RenderError(f"PTX renders scalar ALU ops only, got {dt}")
        self.r[u] = self.alu(arg, dt, [cast(str, self.r[s]) for s in src], [cast(DType, s.dtype) for s in src])
      elif op is UOps.CAST:
        sdt = src[0].dtype
        if dt.count > 1 or sdt.count > 1:
          raise RenderError(f"PTX casts scalars only, got {sdt} -> {dt}")
        self.r[u] = self.cast(cast(str, self.r[src[0]]), sdt, dt)
      elif op is UOps.BITCAST:
        sdt = src[0].dtype
        if sdt is None or sdt.itemsize != dt.itemsize or dt.count > 1:
          raise RenderError(f"bitcast from {sdt} to {dt} changes the size")
        d = self.reg(dt)
        self.emit(f"mov.{_bits(dt)} {d}, {self.r[src[0]]};")
        if dt in INT8:
          self.norm8(d, dt)
        self.r[u] = d
      elif op is UOps.VECTORIZE:
        self.r[u] = [self.r[s] for s in src]  # type: ignore[misc]
      elif op is UOps.GEP:
        vec = self.r[src[0]]
        if not isinstance(vec, list):
          raise RenderError("GEP of a scalar")
        self.r[u] = vec[arg]
      elif op is UOps.WMMA:
        self.r[u] = self.wmma(u)
      else:
        raise RenderError(f"PTX cannot render {op}")
    return self.finish(name, uops, params, var_params)

  def finish(self, name: str, uops: List[UOp], params: Dict[int, str], var_params: Dict[str, str]) -> str:
    args = [f"  .param .u64 {params[i]}" for i in sorted(params)] + [f"  .param .u32 {var_params[k]}" for k in sorted(var_params)]
    lsizes = {u.arg[0]: u.arg[2] for u in uops if u.op is UOps.SPECIAL and u.arg[1].startswith("lidx")}
    maxntid = ""
    if all(isinstance(s, int) for s in lsizes.values()):
      maxntid = f".maxntid {', '.join(str(lsizes.get(i, 1)) for i in range(3))}\n" if lsizes else ".maxntid 1, 1, 1\n"
      assert prod(lsizes.values()) <= 1024 or not lsizes, "more than 1024 threads per block"
    decls = [f"  .reg .{cls} {prefix}<{self.counts[prefix]}>;" for cls, prefix in (REG_CLASS["pred"], REG_CLASS[2], REG_CLASS[4], REG_CLASS[8])
             if self.counts[prefix]]
    version = "8.7" if int(self.arch[3:].rstrip("af")) >= 100 else "7.8"
    head = f".version {version}\n.target {self.arch}\n.address_size 64\n\n.visible .entry {name}(\n" + ",\n".join(args) + "\n)\n" + maxntid
    body = decls + [f"  {s}" for s in self.shared] + self.lines + ["  ret;"]
    return head + "{\n" + "\n".join(body) + "\n}\n"
