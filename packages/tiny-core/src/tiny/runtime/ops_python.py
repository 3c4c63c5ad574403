"""The PYTHON device: a UOp interpreter that needs no compiler and no hardware.

The renderer serialises the linearized uops to text; the program interprets them over the launch grid.
One workgroup runs at a time, all of its threads in lockstep: every uop's value is a list with one entry
per lane (a vector value is a list of such lists, one per vector element). Lockstep execution makes
barriers trivially correct; IF blocks and loops with lane-dependent bounds run under a lane mask.
WMMA follows the register layout its uop carries (the TensorCore's, copied by the lowerer), so the tensor-core
kernels of any device can be checked on any machine: `EMULATE_<DEVICE>=1` (or `PythonRenderer(emulate=...)`) borrows
that device's tensor cores (`EMULATE_CUDA=1`).
"""
from __future__ import annotations

import base64
import functools
import math
import os
import pickle
import struct
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType, PtrDType, dtypes
from tiny.helpers import getenv, prod
from tiny.ops import BinaryOps, exec_alu, python_alu, truncate
from tiny.renderer import RegisterLayout, Renderer, TensorCore

try:
  from tiny.device import Allocator as _AllocatorBase, Compiler as _CompilerBase
except ImportError:  # pragma: no cover - only while tiny.device is being written
  _AllocatorBase, _CompilerBase = object, object  # type: ignore[assignment,misc]


class PythonKernelError(RuntimeError):
  """A kernel did something undefined (out-of-bounds access, unknown uop) while being interpreted."""


# *** serialisation: (op, dtype, src indices, arg) per uop ***

def serialize_uops(uops: Sequence[UOp]) -> str:
  """Text form of a linearized uop list (base64 of a pickle), so compilers and the disk cache can carry it."""
  # a DEFINE_ACC names the RANGEs it accumulates over before they open, so index every uop first
  index: Dict[UOp, int] = {u: i for i, u in enumerate(uops)}
  rows = [(u.op, u.dtype, tuple(index[s] for s in u.src), u.arg) for u in uops]
  return base64.b64encode(pickle.dumps(rows)).decode()


def deserialize_uops(src: bytes | str) -> List[Tuple[UOps, Any, Tuple[int, ...], Any]]:
  """Inverse of serialize_uops."""
  return pickle.loads(base64.b64decode(src))


# *** tensor cores: the register layout comes with the WMMA uop (arg[8], the TensorCore's layout of A, B and C) ***

def wmma_layout(arg: Tuple[Any, ...]) -> Tuple[RegisterLayout, RegisterLayout, RegisterLayout]:
  """The register layouts of A, B and C that a WMMA uop carries (the lowerer copies them from its TensorCore)."""
  lay = arg[8] if len(arg) > 8 else ()
  if not (isinstance(lay, tuple) and len(lay) == 3 and all(isinstance(x, RegisterLayout) for x in lay)):
    raise PythonKernelError(f"WMMA {arg[0]} on {arg[4]} carries no register layout (arg[8]), so it cannot be emulated")
  return lay[0], lay[1], lay[2]


def emulate_wmma(arg: Tuple[Any, ...], a: List[List[Any]], b: List[List[Any]], c: List[List[Any]], lanes: int,
                 per_wg: Optional[int] = None) -> List[List[Any]]:
  """D = A @ B + C for every warp; a, b, c and the result are [register element][lane], per_wg lanes a workgroup."""
  la, lb, lc = wmma_layout(arg)
  n, m, k = arg[1]
  warp = int(arg[5])
  sizes = (la.count, lb.count, lc.count)
  if (len(a), len(b), len(c)) != sizes:
    raise PythonKernelError(f"WMMA {arg[0]} takes {sizes} elements per lane for A, B, C; got {(len(a), len(b), len(c))}")
  if (per_wg or lanes) % warp or lanes % warp:
    raise PythonKernelError(f"WMMA {arg[0]} needs a multiple of {warp} threads per workgroup, got {per_wg or lanes}")
  dtype_out: DType = arg[3]
  conv = truncate.get(dtype_out, lambda x: x)
  out = [list(x) for x in c]
  # the (row, col) of every (lane, register) is the same for each warp: work it out once
  pos_a = [[la.coords(lane, e) for e in range(len(a))] for lane in range(warp)]
  pos_b = [[lb.coords(lane, e) for e in range(len(b))] for lane in range(warp)]
  pos_c = [[lc.coords(lane, e) for e in range(len(c))] for lane in range(warp)]
  for base in range(0, lanes, warp):
    am = [[0.0] * k for _ in range(m)]
    bm = [[0.0] * n for _ in range(k)]
    cm = [[0.0] * n for _ in range(m)]
    for lane in range(warp):
      for e, (i, j) in enumerate(pos_a[lane]):
        am[i][j] = a[e][base + lane]
      for e, (i, j) in enumerate(pos_b[lane]):
        bm[i][j] = b[e][base + lane]
      for e, (i, j) in enumerate(pos_c[lane]):
        cm[i][j] = c[e][base + lane]
    for lane in range(warp):
      for e, (i, j) in enumerate(pos_c[lane]):
        out[e][base + lane] = conv(cm[i][j] + sum(am[i][kk] * bm[kk][j] for kk in range(k)))
  return out


# *** memory access with the dtype's Python semantics ***

_MV_FORMATS = set("?bBhHiIlLqQfd")


def _struct_fmt(dt: DType) -> str:
  if dt.fmt is None:
    raise PythonKernelError(f"{dt} has no memory format")
  # dtype fmts are native memoryview codes; with struct's "<" prefix 'l'/'L' would mean 4 bytes, not 8
  return {"l": "q", "L": "Q"}.get(dt.fmt, dt.fmt)


class _Mem:
  """A typed view on a buffer: reads and writes of Python values, one per lane.

  Shared memory is one buffer for all the workgroups of a batch: `wg_size` is what one workgroup may
  address and `offsets[lane]` where that lane's workgroup starts.
  """

  def __init__(self, mv: memoryview, dt: DType, wg_size: Optional[int] = None, offsets: Optional[List[int]] = None):
    self.dt, self.wg_size, self.offsets = dt, wg_size, offsets
    self.mv: Any
    self.load_conv: Optional[Callable[[Any], Any]]
    self.store_conv: Callable[[Any], Any]
    raw = mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")
    if dt == dtypes.bfloat16:
      self.mv, self.load_conv, self.store_conv = raw.cast("H"), _bf16_from_bits, _bf16_to_bits
    elif dt.fmt == "e":
      self.mv, self.load_conv, self.store_conv = raw.cast("H"), _half_from_bits, _half_to_bits
    elif dt.fmt in _MV_FORMATS:
      self.mv, self.load_conv, self.store_conv = raw.cast(dt.fmt), None, _store_conv(dt)  # type: ignore[call-overload]
    else:
      raise PythonKernelError(f"PYTHON cannot address buffers of {dt}")
    self.size = len(self.mv)

  def _addr(self, idx: int, lane: int, what: str) -> int:
    limit: int = self.size if self.offsets is None or self.wg_size is None else self.wg_size
    if not 0 <= idx < limit:
      kind = "shared" if self.offsets is not None else "global"
      raise PythonKernelError(f"out of bounds {what} at index {idx} of a {kind} {self.dt} buffer of {limit} elements")
    return idx if self.offsets is None else idx + self.offsets[lane]

  def load(self, idx: int, lane: int) -> Any:
    v = self.mv[self._addr(idx, lane, "load")]
    return v if self.load_conv is None else self.load_conv(v)

  def load_all(self, idx: List[int], off: int = 0) -> List[Any]:
    """Element idx[lane] + off for every lane (none masked off)."""
    if self.offsets is not None or not idx or min(idx) + off < 0 or max(idx) + off >= self.size:
      return [self.load(i + off, lane) for lane, i in enumerate(idx)]
    mv = self.mv
    out = [mv[i + off] for i in idx]
    return out if self.load_conv is None else [self.load_conv(v) for v in out]

  def store(self, idx: int, lane: int, val: Any) -> None:
    self.mv[self._addr(idx, lane, "store")] = self.store_conv(val)


def _store_conv(dt: DType) -> Callable[[Any], Any]:
  if dt == dtypes.bool:
    return bool
  if dtypes.is_int(dt):
    wrap = truncate.get(dt, int)
    return lambda x: wrap(int(x))
  if dt == dtypes.float32:
    return truncate.get(dt, float)
  return float


def _half_from_bits(bits: int) -> float:
  return struct.unpack("<e", struct.pack("<H", bits))[0]


def _half_to_bits(x: Any) -> int:
  return struct.unpack("<H", struct.pack("<e", truncate[dtypes.float16](x)))[0]


def _bf16_from_bits(bits: int) -> float:
  return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def _bf16_to_bits(x: Any) -> int:
  return struct.unpack("<I", struct.pack("<f", truncate[dtypes.bfloat16](x)))[0] >> 16


# *** scalar semantics ***

@functools.lru_cache(None)
def lane_alu(op: Any, dtype: DType) -> Callable[..., Any]:
  """exec_alu(op, dtype, operands) as a function of the operands, with the per-call table lookups done once."""
  fxn, conv = python_alu.get(op), truncate.get(dtype)
  if fxn is None or op is BinaryOps.THREEFRY or dtype.count > 1:
    return lambda *x: exec_alu(op, dtype, x)
  if conv is None:
    return fxn
  if getattr(conv, "is_int", False):
    def int_result(*x: Any) -> Any:
      ret = fxn(*x)
      # exec_alu gives 0 for an integer op whose float result is not finite (division by zero)
      return 0 if isinstance(ret, float) and not math.isfinite(ret) else conv(ret)
    return int_result
  return lambda *x: conv(fxn(*x))

def _cast(x: Any, dt: DType) -> Any:
  """C-style conversion of a Python scalar to dt."""
  if dt == dtypes.bool:
    return bool(x)
  if dtypes.is_int(dt):
    if isinstance(x, float):
      # NaN and infinities have no integer value (undefined in C); 0 keeps the interpreter going
      x = math.trunc(x) if math.isfinite(x) else 0
    return truncate.get(dt, int)(int(x))
  return truncate.get(dt, float)(float(x))


def _bitcast(x: Any, src: DType, dst: DType) -> Any:
  if src.itemsize != dst.itemsize:
    raise PythonKernelError(f"bitcast from {src} to {dst} changes the size")
  bits = _to_bits(x, src)
  return _from_bits(bits, dst)


def _to_bits(x: Any, dt: DType) -> int:
  if dt == dtypes.bfloat16:
    return _bf16_to_bits(x)
  raw = struct.pack("<" + _struct_fmt(dt), _cast(x, dt))
  return int.from_bytes(raw, "little")


def _from_bits(bits: int, dt: DType) -> Any:
  if dt == dtypes.bfloat16:
    return _bf16_from_bits(bits)
  return struct.unpack("<" + _struct_fmt(dt), bits.to_bytes(dt.itemsize, "little"))[0]


def _zero(dt: Optional[DType]) -> Any:
  if dt is None:
    return 0
  s = dt.scalar() if dt.count > 1 else dt
  return False if s == dtypes.bool else 0 if dtypes.is_int(s) else 0.0


# *** renderer, compiler, program, allocator ***

EMULATE_PREFIX = "EMULATE_"


def emulated_from_env() -> Optional[str]:
  """The device named by an EMULATE_<DEVICE> variable set to a true value, or None; several are an error."""
  names = sorted(k[len(EMULATE_PREFIX):] for k, v in os.environ.items() if k.startswith(EMULATE_PREFIX) and v.strip() not in ("", "0"))
  if len(names) > 1:
    raise ValueError(f"PYTHON can emulate one device at a time, but {', '.join(EMULATE_PREFIX + n for n in names)} are all set")
  return names[0] if names else None


def emulated_tensor_cores(device: str) -> List[TensorCore]:
  """The tensor cores of `device` for the PYTHON device to emulate.

  The device's own renderer is the only authority (asked through the registry: no device is built, no hardware touched),
  so core holds no vendor's tensor cores."""
  from tiny.registry import Device, DeviceError
  tcs: List[TensorCore] = []
  try:
    tcs = list(getattr(Device.renderer(device), "tensor_cores", None) or [])
  except (DeviceError, NotImplementedError):
    pass  # not installed, or a plugin without a renderer
  if not tcs:
    raise ValueError(f"PYTHON cannot emulate the tensor cores of {device!r}: no installed device of that name declares any")
  if missing := [str(tc) for tc in tcs if not tc.layout]:
    raise ValueError(f"PYTHON cannot emulate the tensor cores {missing} of {device!r}: they declare no register layout")
  return tcs


class PythonRenderer(Renderer):
  """'Renders' a kernel by serialising its uops. `emulate` (or EMULATE_<DEVICE>=1) borrows that device's tensor cores.

  While emulating, `device` is the emulated device's name, so kernels and their caches say which device they stand in
  for; the program keeps running on PYTHON.
  """

  device = "PYTHON"
  has_local = True
  has_shared = True
  row_kernels = True   # an emulator: it runs them to check the GPU-style lowering of row kernels, not for speed
  supports_float4 = True

  def __init__(self, emulate: Optional[str] = None) -> None:
    if emulate is None:
      emulate = emulated_from_env()
    if emulate is not None:
      self.tensor_cores: List[TensorCore] = emulated_tensor_cores(emulate)
      self.device = emulate
    self.emulate = emulate

  def render(self, name: str, uops: List[UOp]) -> str:
    """The uops as text (base64 of a pickle of (op, dtype, src indices, arg) rows)."""
    return serialize_uops(list(uops))


class PythonCompiler(_CompilerBase):  # type: ignore[misc,valid-type]
  """The identity compiler: the 'binary' is the serialised uop text."""

  def __init__(self, cachekey: Optional[str] = None) -> None:
    if _CompilerBase is not object:
      super().__init__(cachekey)

  def compile(self, src: str) -> bytes:
    """src as bytes (checked to decode, so a corrupt source fails here rather than at launch)."""
    try:
      deserialize_uops(src)
    except Exception as e:
      from tiny.device import CompileError
      raise CompileError(f"not a PYTHON kernel: {e}", src[:200]) from e
    return src.encode()

  def compile_cached(self, src: str) -> bytes:
    return self.compile(src)


class PythonAllocator(_AllocatorBase):  # type: ignore[misc,valid-type]
  """Host memory as memoryviews over bytearrays."""

  def alloc(self, size: int, options: Any = None) -> memoryview:
    if not isinstance(size, int) or size < 0:
      raise ValueError(f"alloc size must be a non-negative int, got {size!r}")
    return memoryview(bytearray(size))

  def _alloc(self, size: int, options: Any) -> memoryview:
    return memoryview(bytearray(size))

  def free(self, opaque: Any, size: int, options: Any = None) -> None:
    pass  # the garbage collector owns the bytearray

  def as_buffer(self, src: memoryview) -> memoryview:
    """Zero-copy: the buffer itself."""
    return src

  def copyin(self, dest: memoryview, src: memoryview) -> None:
    dest[:] = src.cast("B") if src.format != "B" or src.ndim != 1 else src

  def copyout(self, dest: memoryview, src: memoryview) -> None:
    (dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest)[:] = src

  def offset(self, buf: memoryview, size: int, offset: int) -> memoryview:
    return buf[offset:offset + size]


class PythonProgram:
  """Interprets a serialised kernel over the launch grid."""

  def __init__(self, name: str, lib: bytes) -> None:
    self.name = name
    self.rows = deserialize_uops(lib)
    self._prepare()

  def _prepare(self) -> None:
    rows = self.rows
    # a PHI is the accumulator it assigns: reading the PHI reads the accumulator (what C does)
    acc_of: Dict[int, int] = {}
    for i, (op, _, src, _) in enumerate(rows):
      if op is UOps.PHI:
        acc_of[i] = acc_of.get(src[0], src[0])
    self.rows = [(op, dt, tuple(acc_of.get(s, s) for s in src), arg) for op, dt, src, arg in rows]
    # loop ends and the ENDRANGE of every RANGE
    self.end_of: Dict[int, int] = {}
    stack: List[int] = []
    for i, (op, _, src, _) in enumerate(self.rows):
      if op in (UOps.RANGE, UOps.IF):
        stack.append(i)
      elif op in (UOps.ENDRANGE, UOps.ENDIF):
        if not stack or self.rows[stack[-1]][0] is not (UOps.RANGE if op is UOps.ENDRANGE else UOps.IF):
          raise PythonKernelError(f"{op} at {i} closes no open scope")
        self.end_of[stack.pop()] = i
    if stack:
      raise PythonKernelError(f"scopes opened at {stack} are never closed")
    self.global_order = sorted(arg[0] for op, _, _, arg in self.rows if op is UOps.DEFINE_GLOBAL)
    self.var_order = sorted((str(arg.expr) for op, _, _, arg in self.rows if op is UOps.DEFINE_VAR))

  def __call__(self, *bufs: Any, global_size: Tuple[int, ...] = (1, 1, 1), local_size: Tuple[int, ...] = (1, 1, 1),
               vals: Tuple[int, ...] = (), wait: bool = False) -> Optional[float]:
    st = time.perf_counter()
    if len(bufs) < len(self.global_order):
      raise ValueError(f"kernel {self.name} takes {len(self.global_order)} buffers, got {len(bufs)}")
    if len(vals) != len(self.var_order):
      raise ValueError(f"kernel {self.name} takes {len(self.var_order)} variables ({self.var_order}), got {len(vals)} values")
    gsz = (tuple(global_size) + (1, 1, 1))[:3]
    lsz = (tuple(local_size) + (1, 1, 1))[:3] if local_size is not None else (1, 1, 1)
    buf_of = {idx: bufs[i] for i, idx in enumerate(self.global_order)}
    val_of = dict(zip(self.var_order, vals))
    # workgroups are independent, so several run in lockstep as one batch of lanes: fewer, longer list operations
    per_wg = prod(lsz)
    batch = max(1, getenv("PYTHON_BATCH_LANES", 2048) // per_wg)
    wg_ids = [(x, y, z) for z in range(gsz[2]) for y in range(gsz[1]) for x in range(gsz[0])]
    wg_lids = [(i % lsz[0], (i // lsz[0]) % lsz[1], i // (lsz[0] * lsz[1])) for i in range(per_wg)]
    for b in range(0, len(wg_ids), batch):
      self._run_batch(wg_ids[b:b + batch], wg_lids, lsz, buf_of, val_of)
    return time.perf_counter() - st if wait else None

  def _run_batch(self, wgs: List[Tuple[int, int, int]], wg_lids: List[Tuple[int, int, int]], lsz: Tuple[int, ...],  # noqa: C901
                 buf_of: Dict[int, Any], val_of: Dict[str, int]) -> None:
    per_wg = len(wg_lids)
    lanes = per_wg * len(wgs)
    gids = [g for g in wgs for _ in range(per_wg)]
    lids = wg_lids * len(wgs)
    rows: List[Tuple[UOps, Any, Tuple[int, ...], Any]] = self.rows
    vals: List[Any] = [None] * len(rows)
    masks: List[Optional[List[bool]]] = [None]  # None: every lane active
    pc = 0
    while pc < len(rows):
      op, dt, src, arg = rows[pc]
      mask = masks[-1]
      inp = [vals[s] for s in src]
      if op is UOps.DEFINE_GLOBAL:
        if arg[0] not in buf_of:
          raise PythonKernelError(f"buffer data{arg[0]} was not passed")
        vals[pc] = _Mem(buf_of[arg[0]], dt.base if isinstance(dt, PtrDType) else dt)
      elif op is UOps.DEFINE_LOCAL:
        elem = dt.base if isinstance(dt, PtrDType) else dt
        vals[pc] = _Mem(memoryview(bytearray(arg[1] * elem.itemsize * len(wgs))), elem, arg[1], [(i // per_wg) * arg[1] for i in range(lanes)])
      elif op is UOps.DEFINE_VAR:
        vals[pc] = [val_of[str(arg.expr)]] * lanes
      elif op is UOps.SPECIAL:
        dim, name = arg[0], arg[1]
        if name.startswith("gidx"):
          vals[pc] = [gid[dim] for gid in gids]
        elif name.startswith("lidx"):
          vals[pc] = [lid[dim] for lid in lids]
        elif name.startswith("idx"):
          vals[pc] = [gid[dim] * lsz[dim] + lid[dim] for gid, lid in zip(gids, lids)]
        else:
          raise PythonKernelError(f"unknown SPECIAL {name}")
      elif op is UOps.CONST:
        vals[pc] = [arg] * lanes if dt is None or dt.count == 1 else [[arg] * lanes for _ in range(dt.count)]
      elif op is UOps.DEFINE_ACC:
        init = inp[0]
        vals[pc] = list(init) if dt.count == 1 else ([list(x) for x in init] if isinstance(init[0], list) else [list(init) for _ in range(dt.count)])
      elif op is UOps.RANGE:
        start, end = inp[0], inp[1]
        vals[pc] = list(start)
        active = [bool(m) and i < e for m, i, e in zip(mask or [True] * lanes, start, end)]
        if not any(active):
          pc = self.end_of[pc] + 1
          continue
        masks.append(None if all(active) else active)
      elif op is UOps.ENDRANGE:
        rng = src[0]
        masks.pop()
        outer = masks[-1]
        cur = [i + 1 for i in vals[rng]]
        vals[rng] = cur
        end = vals[rows[rng][2][1]]
        active = [bool(m) and i < e for m, i, e in zip(outer or [True] * lanes, cur, end)]
        if any(active):
          masks.append(None if all(active) else active)
          pc = rng + 1
          continue
      elif op is UOps.IF:
        cond = inp[0]
        active = [bool(c) and (mask is None or mask[i]) for i, c in enumerate(cond)]
        if not any(active):
          pc = self.end_of[pc] + 1
          continue
        masks.append(None if all(active) else active)
      elif op is UOps.ENDIF:
        masks.pop()
      elif op is UOps.BARRIER:
        pass  # the lanes of a workgroup run in lockstep: every store before this point is already visible
      elif op is UOps.LOAD:
        vals[pc] = self._load(dt, inp, src, rows, mask, lanes)
      elif op is UOps.STORE:
        self._store(inp, rows[src[2]][1], mask, lanes)
      elif op is UOps.PHI:
        acc, new = src[0], inp[1]
        if mask is None:
          vals[acc] = [list(x) for x in new] if dt is not None and dt.count > 1 else list(new)
        elif dt is not None and dt.count > 1:
          vals[acc] = [[n if m else o for m, n, o in zip(mask, nv, ov)] for nv, ov in zip(new, vals[acc])]
        else:
          vals[acc] = [n if m else o for m, n, o in zip(mask, new, vals[acc])]
      elif op is UOps.ALU:
        vals[pc] = self._alu(arg, dt, inp, src, rows, mask, lanes)
      elif op is UOps.CAST:
        sdt = rows[src[0]][1]
        if dt.count > 1:
          xs = inp[0] if sdt is not None and sdt.count > 1 else [inp[0]] * dt.count
          vals[pc] = [[_cast(v, dt.scalar()) for v in x] for x in xs]
        else:
          vals[pc] = [_cast(v, dt) for v in inp[0]]
      elif op is UOps.BITCAST:
        sdt = rows[src[0]][1]
        vals[pc] = [_bitcast(v, sdt, dt) for v in inp[0]]
      elif op is UOps.VECTORIZE:
        vals[pc] = [list(x) for x in inp]
      elif op is UOps.GEP:
        vals[pc] = inp[0][arg]
      elif op is UOps.WMMA:
        vals[pc] = emulate_wmma(arg, inp[0], inp[1], inp[2], lanes, per_wg)
      elif op in (UOps.SINK, UOps.NOOP):
        vals[pc] = inp[0] if inp else None
      elif op is UOps.AFTER:
        vals[pc] = None   # only orders: the stores it follows ran before it, in this interpreter's list order
      else:
        raise PythonKernelError(f"PYTHON cannot run {op}")
      pc += 1

  @staticmethod
  def _alu(arg: Any, dt: DType, inp: List[Any], src: Tuple[int, ...], rows: List[Any], mask: Optional[List[bool]], lanes: int) -> List[Any]:
    if dt.count > 1:
      # an ALU on vectors works lane by lane on every element
      per = [[x[j] if rows[s][1] is not None and rows[s][1].count > 1 else x for x, s in zip(inp, src)] for j in range(dt.count)]
      sdt = dt.scalar()
      return [PythonProgram._alu(arg, sdt, p, (), rows, mask, lanes) for p in per]
    fxn = lane_alu(arg, dt)
    if mask is None:
      return list(map(fxn, *inp))
    z = _zero(dt)
    return [fxn(*ops) if m else z for m, ops in zip(mask, zip(*inp))]

  @staticmethod
  def _load(dt: DType, inp: List[Any], src: Tuple[int, ...], rows: List[Any], mask: Optional[List[bool]], lanes: int) -> Any:
    mem: _Mem = inp[0]
    idx = inp[1]
    gated = len(src) >= 4 and rows[src[2]][0] is not UOps.BARRIER
    gate = inp[2] if gated else None
    alt = inp[3] if gated else None
    count = dt.count
    if mask is None and gate is None:
      if count == 1:
        return mem.load_all(idx)
      return [mem.load_all(idx, j) for j in range(count)]
    active = [(mask is None or mask[i]) and (gate is None or bool(gate[i])) for i in range(lanes)]
    if count == 1:
      z = _zero(dt)
      return [mem.load(idx[i], i) if active[i] else (alt[i] if alt is not None else z) for i in range(lanes)]
    out = []
    for j in range(count):
      if alt is None:
        aj = [_zero(dt)] * lanes
      else:
        aj = alt[j] if isinstance(alt[0], list) else alt
      out.append([mem.load(idx[i] + j, i) if active[i] else aj[i] for i in range(lanes)])
    return out

  @staticmethod
  def _store(inp: List[Any], vdt: Optional[DType], mask: Optional[List[bool]], lanes: int) -> None:
    mem: _Mem = inp[0]
    idx, val = inp[1], inp[2]
    gate = inp[3] if len(inp) > 3 and isinstance(inp[3], list) else None  # an IF as the gate is already in the mask
    count = vdt.count if vdt is not None else 1
    for i in range(lanes):
      if (mask is None or mask[i]) and (gate is None or gate[i]):
        if count > 1:
          for j in range(count):
            mem.store(idx[i] + j, i, val[j][i])
        else:
          mem.store(idx[i], i, val[i])
