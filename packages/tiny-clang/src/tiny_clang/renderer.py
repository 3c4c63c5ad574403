"""ClangRenderer: linearized UOps to portable C (clang or gcc), split across cores by the outermost parallel loop.

Kernel shape (for a kernel `k` with buffers data0.. and variables):

  void k(float* restrict data0, const float* restrict data1, const int n, int core, int ncores) { ... }
  void k_entry(const long long *args, int core, int ncores) { k((float*)args[0], (const float*)args[1], (int)args[2], core, ncores); }
  const int k_parallel = 1;

The outermost loop runs only its slice [start + len*core/ncores, start + len*(core+1)/ncores) when the kernel is
*parallel*: that loop is a global (non-reduce) loop that encloses every store. `k_parallel` tells the runtime.

Numbers: vectors are GNU `vector_size` types indexed with v[i] (gcc and clang accept both). half and bfloat16 live in
memory as 16-bit values and in registers as float, rounded back to 16 bits after every operation, which gives IEEE
half/bf16 results on any compiler (clang 14 has no x86 _Float16 arithmetic, gcc 12 has no __bf16).
"""
from __future__ import annotations

import functools
import os
import platform
import re
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Set, Tuple, cast

from tiny.backend import BinaryOps, CStyleLanguage, DType, Kernel, PatternMatcher, PtrDType, RenderError, TernaryOps, UnaryOps, UOp, \
  UOps, UPat, dtypes

from tiny_clang.heuristics import cpu_hand_coded_optimizations
from tiny_clang.conv_padding import pads_conv_input
from tiny_clang.conv_channels_last import conv_channels_last
from tiny_clang.matmul_panels import panel_width
from tiny_clang.matvec_split import split_block
from tiny_clang.panel_prefetch import PANEL_PREFETCH, PanelPrefetch, panel_prefetch
from tiny_clang.row_prefetch import ROW_PREFETCH, row_prefetches
from tiny_clang.row_stream_prefetch import row_stream_loads
from tiny_clang.streaming_stores import prefetched_loads, stream_min_bytes, stream_prefetch_bytes, streaming_stores
from tiny_clang.tile_loops import UNROLL_TILE, tile_loops
from tiny_clang.vmath import exp2_source, log2_source

HALF_PRELUDE = """#if defined(__FLT16_MAX__)
typedef _Float16 tiny_half;
#elif defined(__clang__)
typedef __fp16 tiny_half;
#else
#error "this C compiler has neither _Float16 nor __fp16: half kernels need clang or gcc >= 12"
#endif
#define tiny_h2f(h) ((float)(h))       /* macros: clang's __fp16 cannot be a parameter or a return value */
#define tiny_f2h(f) ((tiny_half)(f))
static inline float tiny_rh(float f) { return (float)(tiny_half)f; }
static inline unsigned short tiny_h2bits(float f) { tiny_half h = (tiny_half)f; unsigned short u; __builtin_memcpy(&u, &h, 2); return u; }
static inline float tiny_bits2h(unsigned short u) { tiny_half h; __builtin_memcpy(&h, &u, 2); return (float)h; }"""

BF16_PRELUDE = """typedef unsigned short tiny_bf16;
static inline float tiny_bf2f(tiny_bf16 b) { unsigned int u = (unsigned int)b << 16; float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline tiny_bf16 tiny_f2bf(float f) {
  unsigned int u; __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (tiny_bf16)((u >> 16) | 0x40u);  /* NaN stays a (quiet) NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                              /* round to nearest even */
  return (tiny_bf16)(u >> 16);
}
static inline float tiny_rbf(float f) { return tiny_bf2f(tiny_f2bf(f)); }
static inline unsigned short tiny_bf2bits(float f) { return tiny_f2bf(f); }
static inline float tiny_bits2bf(unsigned short u) { return tiny_bf2f(u); }"""

# the 16-bit float formats: storage type, load, store, round, to-bits, from-bits
_F16 = {"half": ("tiny_half", "tiny_h2f", "tiny_f2h", "tiny_rh", "tiny_h2bits", "tiny_bits2h"),
        "bf16": ("tiny_bf16", "tiny_bf2f", "tiny_f2bf", "tiny_rbf", "tiny_bf2bits", "tiny_bits2bf")}


def _f16kind(dt: Optional[DType]) -> Optional[str]:
  # called for most uops of every kernel: rule out the common case (not a 16-bit type) from the item size first
  if dt is None or (dt.itemsize != 2 * dt.count and not isinstance(dt, PtrDType)):
    return None
  s = dt.base.scalar() if isinstance(dt, PtrDType) else dt.scalar()
  return "half" if s == dtypes.float16 else "bf16" if s == dtypes.bfloat16 else None


def _fsuffix(dt: DType) -> str:
  """libm suffix: double functions for float64, float ones for everything else (half/bf16 compute in float)."""
  return "" if dt.scalar() == dtypes.float64 else "f"


def max_const_side(u: UOp) -> Optional[int]:
  """For a float32/float64 MAX uop: the index of an operand that is a constant other than NaN and zero (a CONST, or a
  VECTORIZE of one), else None. Against such an operand MAX needs one compare, and MAX(x, c) becomes the CPU's max
  instruction. Not zeros: which of -0.0 and 0.0 a tie gives is tiny's rule, and clang 14 (vector x < -0.0 ? -0.0 : x gave
  -0.0 for x = 0.0) does not keep it; equal nonzero values have equal bits, so their ties cannot go wrong."""
  if u.op is not UOps.ALU or u.arg is not BinaryOps.MAX or u.dtype is None or u.dtype.scalar() not in (dtypes.float32, dtypes.float64):
    return None
  for i, s in enumerate(u.src):
    if s.op is UOps.VECTORIZE and s.src and all(x is s.src[0] for x in s.src):
      s = s.src[0]
    if s.op is UOps.CONST and isinstance(s.arg, (int, float)) and not isinstance(s.arg, bool) and s.arg == s.arg and s.arg != 0:
      return i
  return None


def _max_against_const(xs: List[str], side: int, dtype: DType) -> str:
  """MAX with operand `side` a non-NaN constant, in tiny's MAX semantics (first operand wins ties, a NaN wins).

  MAX(x, c) = x < c ? c : x keeps a NaN x (the compare is false), which is exactly x86's maxps(c, x): one instruction
  instead of two compares, a mask or and a blend. MAX(c, x) = c >= x ? c : x picks a NaN x the same way."""
  a, b = xs
  cond = "_a<_b" if side == 1 else "_a>=_b"
  pick, other = ("_b", "_a") if side == 1 else ("_a", "_b")
  if dtype.count == 1:
    return f"({{ {'double' if dtype == dtypes.float64 else 'float'} _a = {a}, _b = {b}; ({cond})?{pick}:{other}; }})"
  iv = ClangRenderer.vector_name(_MASK_INT[dtype.scalar()], dtype.count)
  return (f"({{ __typeof__({a}) _a = {a}, _b = {b}; {iv} _m = ({iv})({cond}); "
          f"(__typeof__(_a))((({iv}){pick} & _m) | (({iv}){other} & ~_m)); }})")


# A MAX accumulator's update folds the unrolled values in one after the other, MAX(MAX(MAX(acc, a), b), c): a chain of
# dependent compare+blend steps through the accumulator, each waiting for the last (softmax's max loop ran at ~7 cycles
# per vector). MAX(acc, MAX(MAX(a, b), c)) leaves one step per iteration on the accumulator and the rest independent.
# MAX is associative for values and for NaN (one wins either way); only which of -0.0 and 0.0 a tie between them gives
# may change, as lane splitting already changes it.
cpu_matcher = PatternMatcher([
  (UPat(UOps.ALU, arg=BinaryOps.MAX, src=(UPat(UOps.ALU, arg=BinaryOps.MAX, src=(UPat(UOps.DEFINE_ACC, name="acc"), UPat.var("a"))),
                                          UPat.var("b"))),
   lambda acc, a, b: acc.alu(BinaryOps.MAX, a.alu(BinaryOps.MAX, b))),
])


def _max(a: str, b: str, dtype: DType) -> str:
  # the first operand wins ties and NaNs from either side win, as in tiny.ops.python_alu
  if dtypes.is_float(dtype.scalar()):
    return f"((({a}>={b})||({a}!={a}))?{a}:{b})"
  return f"(({a}>={b})?{a}:{b})"


_VECTOR_NATIVE = {BinaryOps.ADD: "+", BinaryOps.MUL: "*"}
# ops whose scalar spelling is a plain C operator expression, valid for GNU vectors as it is
# (IDIV/MOD too: on GNU vectors / and % divide lane by lane with C's truncation, as the scalar spelling does; the renderer
# only sees integer IDIV/MOD, the float ones being rewritten before)
_VECTOR_AS_SCALAR = {TernaryOps.MULACC, UnaryOps.NEG, BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR,
                     BinaryOps.IDIV, BinaryOps.MOD}
# float32 vector ops with a vector implementation in tiny_clang.vmath (libm's are scalar calls)
_VMATH = {UnaryOps.EXP2: "exp2", UnaryOps.LOG2: "log2"}
# the integer lanes a float vector's comparison mask has (and that vector MAX blends through)
_MASK_INT = {dtypes.float32: dtypes.int32, dtypes.float64: dtypes.int64}

_BASE_OPS: Dict[Any, Callable[..., str]] = {
  **CStyleLanguage.code_for_op,
  UnaryOps.SQRT: lambda x, dtype: f"__builtin_sqrt{_fsuffix(dtype)}({x})",
  UnaryOps.EXP2: lambda x, dtype: f"__builtin_exp2{_fsuffix(dtype)}({x})",
  UnaryOps.LOG2: lambda x, dtype: f"__builtin_log2{_fsuffix(dtype)}({x})",
  UnaryOps.SIN: lambda x, dtype: f"__builtin_sin{_fsuffix(dtype)}({x})",
  UnaryOps.RECIP: lambda x, dtype: f"(1.0{'f' if _fsuffix(dtype) else ''}/{x})" if dtypes.is_float(dtype.scalar()) else f"(1/{x})",
  BinaryOps.MAX: _max,
}


def _op_for(op: Any, fn: Callable[..., str]) -> Callable[..., str]:
  """Wrap a scalar op spelling: round half/bf16 results to 16 bits, and apply it lane by lane to vectors."""
  def render(*args: Any) -> str:
    *xs, dtype = args
    if dtype.count > 1:
      scalar = dtype.scalar()
      if op in _VECTOR_NATIVE and _f16kind(dtype) is None and scalar != dtypes.bool:
        return f"({xs[0]}{_VECTOR_NATIVE[op]}{xs[1]})"
      if op in _VECTOR_AS_SCALAR and _f16kind(dtype) is None and scalar != dtypes.bool:
        # C operators apply lane-wise to GNU vectors: one vector op (an FMA for MULACC) instead of a lane-by-lane rebuild
        return fn(*xs, dtype)
      if op is TernaryOps.WHERE:
        # the condition of a vector WHERE is a scalar (there are no bool vectors here): C's ?: picks a whole vector
        return f"({xs[0]}?{xs[1]}:{xs[2]})"
      if op in _VMATH and scalar == dtypes.float32:
        return f"tiny_{_VMATH[op]}_{ClangRenderer.vector_name(scalar, dtype.count)}({xs[0]})"
      if op is BinaryOps.MAX and scalar in (dtypes.float32, dtypes.float64):
        # a lane mask and a bitwise select: one vector compare + blend instead of a scalar select per lane
        iv = ClangRenderer.vector_name(_MASK_INT[scalar], dtype.count)
        return (f"({{ __typeof__({xs[0]}) _a = {xs[0]}, _b = {xs[1]}; {iv} _m = ({iv})((_a >= _b) | (_a != _a)); "
                f"(__typeof__(_a))((({iv})_a & _m) | (({iv})_b & ~_m)); }})")
      # one lane at a time; operands are pure expressions, so repeating them is safe (the compiler CSEs them)
      lanes = [render(*[f"({x})[{i}]" for x in xs], scalar) for i in range(dtype.count)]
      return f"(({ClangRenderer.vector_name(scalar, dtype.count)}){{{','.join(lanes)}}})"
    val = fn(*xs, dtype)
    kind = _f16kind(dtype)
    return f"{_F16[kind][3]}({val})" if kind is not None else val
  return render


def host_simd_bytes() -> int:
  """Width of the host's vector registers in bytes (64 with AVX-512, 32 with AVX, 16 otherwise); $SIMD_BYTES overrides."""
  if (env := os.environ.get("SIMD_BYTES")):
    return int(env)
  flags = _cpu_flags()
  return 64 if "avx512f" in flags else 32 if "avx" in flags else 16


def host_simd_registers(simd_bytes: int) -> int:
  """How many vector registers of simd_bytes the host has: 32 on aarch64 (NEON/SVE) and with AVX-512 (zmm0-31, used
  when simd_bytes is 64), 16 with AVX/AVX2/SSE; $SIMD_REGISTERS overrides."""
  if (env := os.environ.get("SIMD_REGISTERS")):
    return int(env)
  if platform.machine().lower() in ("aarch64", "arm64") or "asimd" in _cpu_flags():
    return 32
  # x86: only EVEX (AVX-512) encodings reach 32 registers; a narrower width chosen for this host gets the 16 of AVX/SSE
  return 32 if simd_bytes >= 64 else 16


@functools.lru_cache(None)
def _cpu_flags() -> FrozenSet[str]:
  # read once per process: every renderer instance (tests build many) asks
  try:
    with open("/proc/cpuinfo") as f:
      return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith(("flags", "Features"))), []))
  except OSError:
    return frozenset()


class ClangRenderer(CStyleLanguage):
  """C for the CLANG device. No local memory or thread ids: global dims are loops, the runtime splits the outer one."""

  device = "CLANG"
  has_local = False
  row_kernels = True   # a row of up to 64K floats stays in L2 between the passes: the input is streamed once, not three times
  has_shared = False
  global_max = None
  local_max = None
  supports_float4 = True
  buffer_suffix = " restrict"
  arg_int_prefix = "const int"
  infinity = "__builtin_inff()"
  nan = '__builtin_nanf("")'
  type_map = {dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.float16: "float", dtypes.bfloat16: "float"}
  code_for_op = {op: _op_for(op, fn) for op, fn in _BASE_OPS.items()}
  extra_matcher = cpu_matcher

  def __init__(self) -> None:
    self._bitcast_srcs: List[DType] = []
    # per STORE uop of the kernel being rendered, in order: a non-temporal store (tiny_clang.streaming_stores). Render
    # state must not be a plain attribute: those are the renderer's cache key
    self._streaming: List[bool] = []
    self._streams: Set[UOp] = set()      # the STORE uops behind _streaming (render_kernel ends with an sfence when any)
    # per LOAD uop, in order: its prefetch as (C byte offset from the load's address, the arguments after the address),
    # None for none (a streaming kernel's input, a row kernel's next row, a packed matmul's next panel)
    self._load_ahead: List[Optional[Tuple[str, str]]] = []
    # per STORE uop, in order: the distance (bytes) of its next-row prefetch in a row kernel, 0 for none
    self._row_store_ahead: List[int] = []
    self.simd_bytes = host_simd_bytes()
    self._x86 = platform.machine().lower() in ("x86_64", "amd64")
    self.simd_registers = host_simd_registers(self.simd_bytes)
    self.stream_min_bytes = stream_min_bytes(self.simd_bytes, _cpu_flags())
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

  # *** types ***

  @staticmethod
  def vector_name(scalar: DType, count: int) -> str:
    """Name of the GNU vector typedef for count lanes of scalar (register type: half/bf16 lanes are floats)."""
    reg = "float" if _f16kind(scalar) is not None else "_Bool" if scalar == dtypes.bool else "schar" if scalar == dtypes.int8 else scalar.name
    return f"tiny_{reg.replace(' ', '_')}{count}"

  def render_vector_dtype(self, scalar: DType, count: int) -> str:
    if scalar == dtypes.bool:
      raise RenderError("ClangRenderer has no bool vectors")
    return self.vector_name(scalar, count)

  def storage_type(self, dt: DType) -> str:
    """The C type of an element in memory (half and bfloat16 differ from their register type)."""
    kind = _f16kind(dt)
    return _F16[kind][0] if kind is not None else self.render_dtype(dt)

  def render_arg(self, name: str, dtype: DType, mutable: bool, is_buffer: bool) -> str:
    if is_buffer:
      return f"{'' if mutable else 'const '}{self.storage_type(dtype.base if isinstance(dtype, PtrDType) else dtype)}*{self.buffer_suffix} {name}"
    return f"{self.arg_int_prefix} {name}"

  # *** values ***

  def render_cast(self, x: List[str], var_dtype: DType, bitcast: bool = False) -> str:
    if bitcast:
      return self._render_bitcast(x[0], var_dtype, self._bitcast_srcs.pop(0) if self._bitcast_srcs else None)
    if len(x) > 1:
      return self.render_vectorize(x, var_dtype)
    kind = _f16kind(var_dtype)
    if var_dtype.count > 1:
      lane = (lambda v: f"{_F16[kind][3]}((float)({v}))") if kind is not None else (lambda v: f"({self.render_dtype(var_dtype.scalar())})({v})")
      lanes = ",".join(lane(f"_v[{i}]") for i in range(var_dtype.count))
      return f"({{ __typeof__({x[0]}) _v = {x[0]}; ({self.render_dtype(var_dtype)}){{{lanes}}}; }})"
    if kind is not None:
      return f"{_F16[kind][3]}((float)({x[0]}))"
    return f"({self.render_dtype(var_dtype)})({x[0]})"

  def _render_bitcast(self, x: str, to: DType, frm: Optional[DType]) -> str:
    to_kind, frm_kind = _f16kind(to), _f16kind(frm)
    if frm_kind is not None:   # 16 bits of a half/bf16 register value
      x = f"{_F16[frm_kind][4]}({x})"
      if to_kind is not None:
        return f"{_F16[to_kind][5]}({x})"
      return f"({self.render_dtype(to)})({x})"
    if to_kind is not None:
      return f"{_F16[to_kind][5]}((unsigned short)({x}))"
    t = self.render_dtype(to)
    return f"({{ {t} _t; __typeof__({x}) _s = {x}; __builtin_memcpy(&_t, &_s, sizeof(_t)); _t; }})"

  def render_vectorize(self, x: List[str], var_dtype: DType) -> str:
    return f"(({self.render_dtype(var_dtype)}){{{','.join(x)}}})"

  def render_gep(self, vec: str, idx: int, vec_dtype: DType) -> str:
    return f"{vec}[{idx}]"

  def render_load(self, output_dtype: DType, buf_name: str, buf_dtype: DType, idx: str, local: bool = False) -> str:
    prefetch = self._load_ahead.pop(0) if self._load_ahead else None
    kind = _f16kind(buf_dtype)
    if kind is None and prefetch is not None:
      # through an integer: the address ahead may lie past the end of the buffer, which a prefetch ignores
      dist, hint = prefetch
      ahead = f"__builtin_prefetch((const void*)((__UINTPTR_TYPE__)({buf_name}+({idx}))+{dist}){hint})"
      return f"({{ {ahead}; {super().render_load(output_dtype, buf_name, buf_dtype, idx, local)}; }})"
    if kind is None:
      return super().render_load(output_dtype, buf_name, buf_dtype, idx, local)
    conv = _F16[kind][1]
    if output_dtype.count == 1:
      return f"{conv}({buf_name}[{idx}])"
    lanes = ",".join(f"{conv}(_p[{i}])" for i in range(output_dtype.count))
    return f"({{ const {_F16[kind][0]} *_p = {buf_name}+({idx}); ({self.render_dtype(output_dtype)}){{{lanes}}}; }})"

  def render_store(self, buf_name: str, buf_dtype: DType, var_name: str, var_dtype: DType, idx: str, local: bool = False) -> str:
    streaming = self._streaming.pop(0) if self._streaming else False
    row_ahead = self._row_store_ahead.pop(0) if self._row_store_ahead else 0
    kind = _f16kind(buf_dtype)
    if kind is None and row_ahead and not streaming:
      ahead = f"__builtin_prefetch((void*)((__UINTPTR_TYPE__)({buf_name}+({idx}))+{row_ahead}), 1, 2);"
      return f"{ahead} {super().render_store(buf_name, buf_dtype, var_name, var_dtype, idx, local)}"
    if kind is None and streaming:
      return self._render_streaming_store(buf_name, var_name, var_dtype, idx)
    if kind is None:
      return super().render_store(buf_name, buf_dtype, var_name, var_dtype, idx, local)
    conv = _F16[kind][2]
    if var_dtype.count == 1:
      return f"{buf_name}[{idx}] = {conv}({var_name});"
    lanes = " ".join(f"_p[{i}] = {conv}(_v[{i}]);" for i in range(var_dtype.count))
    return f"{{ {self.render_dtype(var_dtype)} _v = {var_name}; {_F16[kind][0]} *_p = {buf_name}+({idx}); {lanes} }}"

  def _render_streaming_store(self, buf_name: str, var_name: str, var_dtype: DType, idx: str) -> str:
    # inline asm, not __builtin_nontemporal_store: clang merges an aligned nontemporal store and the plain store of the
    # other branch into one plain store (the nontemporal hint is dropped); the address test keeps views at odd offsets
    # on plain stores, since vmovntps faults on an unaligned address
    t = self.render_dtype(var_dtype)
    return (f"{{ {t} *_p = ({t}*)({buf_name}+({idx})); {t} _v = {var_name}; "
            f"if (((__UINTPTR_TYPE__)_p & 63) == 0) __asm__ volatile(\"vmovntps %1, %0\" : \"=m\"(*_p) : \"v\"(_v)); else *_p = _v; }}")

  # *** the kernel ***

  def render(self, name: str, uops: List[UOp]) -> str:
    uops = list(uops)
    if any(u.op in (UOps.SPECIAL, UOps.DEFINE_LOCAL, UOps.BARRIER) for u in uops):
      raise RenderError("ClangRenderer has no thread ids or local memory: render kernels for it with has_local=False")
    self._bitcast_srcs = [cast(DType, u.src[0].dtype) for u in uops if u.op is UOps.BITCAST]
    self._streams = streaming_stores(uops, self.stream_min_bytes)
    self._streaming = [u in self._streams for u in uops if u.op is UOps.STORE]
    prefetched = prefetched_loads(uops, self._streams, self.stream_prefetch_bytes) | row_stream_loads(uops, self.stream_prefetch_bytes)
    row_ahead = row_prefetches(uops, self.row_prefetch)
    self._row_store_ahead = [row_ahead[u][0] if u in row_ahead else 0 for u in uops if u.op is UOps.STORE]
    pp = panel_prefetch(uops, self.simd_bytes, self.next_panel_prefetch and not prefetched and not row_ahead)
    panel = (pp.load, _panel_offset(pp, uops)) if pp is not None else None
    self._load_ahead = [self._load_prefetch(u, prefetched, row_ahead, panel) for u in uops if u.op is UOps.LOAD]
    self._uops = uops
    return super().render(name, uops)

  def _load_prefetch(self, u: UOp, streamed: Set[UOp], row_ahead: Dict[UOp, Tuple[int, bool]],
                     panel: Optional[Tuple[UOp, str]]) -> Optional[Tuple[str, str]]:
    """The prefetch of LOAD u as (C byte offset, the arguments after the address), None for none: a packed matmul's
    next panel into L2 (tiny_clang.panel_prefetch), a streaming kernel's input into L1 (prefetcht0), a row kernel's
    next row into L2 (prefetcht1), where it waits while this row is walked again from L1."""
    if panel is not None and u is panel[0]:
      return panel[1], ", 0, 2"
    if u in streamed:
      return str(self.stream_prefetch_bytes), ""
    if u in row_ahead:
      return str(row_ahead[u][0]), ", 0, 2"
    return None

  def render_alu(self, u: UOp, operands: List[str]) -> str:
    if (side := max_const_side(u)) is not None:
      return _max_against_const(operands, side, cast(DType, u.dtype))
    return super().render_alu(u, operands)

  def render_kernel(self, function_name: str, kernel: List[str], bufs: List[Tuple[str, Tuple[DType, bool]]], uops: List[UOp],
                    prefix: Optional[List[str]] = None) -> str:
    kernel = list(kernel)
    parallel = _split_outer_loop(kernel, uops)
    _mark_reductions(kernel, uops)
    if self.simd_bytes >= 64:
      _mark_tile_loops(kernel, uops)
    if self._streams:
      # streaming stores are weakly ordered: drain them before the slice is reported done to the other threads (render
      # set _streams for these very uops: render_kernel only runs inside render)
      kernel.append("  __builtin_ia32_sfence();")
    is_ptr = [isinstance(dtype, PtrDType) for _, (dtype, _) in bufs]
    args = [self.render_arg(n, dt, mut, p) for (n, (dt, mut)), p in zip(bufs, is_ptr)] + ["int core", "int ncores"]
    head = [] if prefix is None else list(prefix)
    head += self._prelude(uops)
    casts = []
    for i, ((n, (dt, mut)), p) in enumerate(zip(bufs, is_ptr)):
      casts.append(f"({'' if mut else 'const '}{self.storage_type(cast(PtrDType, dt).base)}*)args[{i}]" if p else f"(int)args[{i}]")
    return "\n".join(head + [
      f"{self._vector_width_attribute(uops)}void {function_name}({', '.join(args)}) {{", *kernel, "}",
      f"void {function_name}_entry(const long long *args, int core, int ncores) {{ {function_name}({', '.join(casts + ['core', 'ncores'])}); }}",
      f"const int {function_name}_parallel = {int(parallel)};"])

  def _vector_width_attribute(self, uops: List[UOp]) -> str:
    """Keep the kernel's own 512-bit vectors whole on x86 (empty for narrower vector code, other hosts and plain loops).

    With -march=native on an AVX-512 host clang prefers 256-bit vectors and legalizes the renderer's 512-bit vector
    types as pairs of 256-bit halves, halving the register tile of the packed matmul (1024² one thread, CPU time: 76-92
    -> 148-151 GFLOP/s with the attribute). Loops the compiler vectorizes itself (a plain SUM) keep 256 bits: forced to
    512 they streamed slower (16M sum 21 -> 18-19 GB/s)."""
    if not self._x86 or self.simd_bytes < 64:
      return ""
    return "__attribute__((min_vector_width(512))) " if any(self._register_bytes(u.dtype) >= 64 for u in uops) else ""

  @staticmethod
  def _register_bytes(dt: Optional[DType]) -> int:
    """Bytes of the C vector type a (non-pointer) vector dtype renders to (halves compute in float lanes); 0 for scalars."""
    if dt is None or isinstance(dt, PtrDType) or dt.count == 1:
      return 0
    s = dt.scalar()
    return (4 if _f16kind(s) is not None else s.itemsize) * dt.count

  def _prelude(self, uops: List[UOp]) -> List[str]:
    kinds: Set[str] = set()
    vecs: Dict[str, Tuple[str, int]] = {}
    helpers: Set[Tuple[Any, int]] = set()
    for u in uops:
      for dt in (u.dtype, *(s.dtype for s in u.src)):
        if dt is None:
          continue
        if (k := _f16kind(dt)) is not None:
          kinds.add(k)
        base = dt.base if isinstance(dt, PtrDType) else dt
        if base.count > 1:
          s = base.scalar()
          reg = "float" if _f16kind(s) is not None else "signed char" if s == dtypes.int8 else s.name
          size = 4 if _f16kind(s) is not None else s.itemsize
          vecs[self.vector_name(s, base.count)] = (f"{reg} __attribute__((vector_size({size * base.count}), aligned({size})))", base.count)
      if u.op is UOps.ALU and u.arg in (BinaryOps.MAX, *_VMATH) and u.dtype is not None and u.dtype.count > 1 and u.dtype.scalar() in _MASK_INT:
        m = _MASK_INT[u.dtype.scalar()]
        vecs[self.vector_name(m, u.dtype.count)] = (f"{m.name} __attribute__((vector_size({m.itemsize * u.dtype.count}), aligned({m.itemsize})))",
                                                    u.dtype.count)
        if u.arg in _VMATH and u.dtype.scalar() == dtypes.float32:
          helpers.add((u.arg, u.dtype.count))
    out = [HALF_PRELUDE] if "half" in kinds else []
    out += [BF16_PRELUDE] if "bf16" in kinds else []
    # element alignment only: a vector may start at any element of a buffer (views, odd offsets)
    out += [f"typedef {decl.replace(' __attribute__', ' ' + name + ' __attribute__', 1)};" for name, (decl, _) in sorted(vecs.items())]
    for op, n in sorted(helpers, key=lambda h: (_VMATH[h[0]], h[1])):
      src = exp2_source if op is UnaryOps.EXP2 else log2_source
      out.append(src(self.vector_name(dtypes.float32, n), self.vector_name(dtypes.int32, n)))
    return out


_FOR = re.compile(r"^(\s*)for \((\w[\w ]*) (ridx\d+) = (.*); \3 < (.*); \3\+\+\) \{$")


def _loop_structure(uops: List[UOp]) -> Tuple[List[UOp], Dict[UOp, int], bool]:
  """(top-level RANGEs, RANGE -> nesting depth, whether some STORE sits outside every loop)."""
  depth, top, depths, store_outside = 0, [], {}, False
  for u in uops:
    if u.op is UOps.RANGE:
      if depth == 0:
        top.append(u)
      depths[u] = depth
      depth += 1
    elif u.op is UOps.ENDRANGE:
      depth -= 1
    elif u.op is UOps.STORE and depth == 0:
      store_outside = True
  return top, depths, store_outside


def _range_names(uops: List[UOp]) -> Dict[UOp, str]:
  # CStyleLanguage names loop counters ridx0, ridx1, ... in uop order
  return {u: f"ridx{i}" for i, u in enumerate(x for x in uops if x.op is UOps.RANGE)}


def _panel_offset(pp: PanelPrefetch, uops: List[UOp]) -> str:
  """The byte offset from the panel load's address to its prefetch, as a C expression of the loop counters."""
  names = _range_names(uops)
  return f"({pp.ahead}+(long long){names[pp.tile]}*{pp.share}+(long long){names[pp.reduce]}*({pp.step}))"


def _split_outer_loop(kernel: List[str], uops: List[UOp]) -> bool:
  """Rewrite the outermost loop to run the caller's slice when that is safe; True when it was rewritten."""
  top, _, store_outside = _loop_structure(uops)
  if len(top) != 1 or top[0].arg[1] or store_outside:
    return False
  name = _range_names(uops)[top[0]]
  for i, line in enumerate(kernel):
    m = _FOR.match(line)
    if m is not None and m.group(3) == name:
      ind, ty, _, start, end = m.groups()
      kernel[i:i + 1] = [f"{ind}const {ty} {name}_s = {start}, {name}_n = ({end}) - {name}_s;",
                         f"{ind}const {ty} {name}_lo = {name}_s + (int)((long long){name}_n * core / ncores);",
                         f"{ind}const {ty} {name}_hi = {name}_s + (int)((long long){name}_n * (core + 1) / ncores);",
                         f"{ind}for ({ty} {name} = {name}_lo; {name} < {name}_hi; {name}++) {{"]
      return True
  return False


def _mark_reductions(kernel: List[str], uops: List[UOp]) -> None:
  """Put `#pragma omp simd reduction(+:acc)` on innermost reduce loops whose one accumulator is a plain scalar sum.

  (Not maxes: OpenMP's combining max would not keep NaNs the way tiny's MAX does.)

  That licenses the compiler to reassociate those (and only those) additions, which is what lets it vectorize them."""
  names = _range_names(uops)
  acc_names = {u: f"acc{i}" for i, u in enumerate(x for x in uops if x.op is UOps.DEFINE_ACC)}
  # innermost loops: a RANGE with no RANGE before its ENDRANGE
  inner: Set[UOp] = set()
  last_range: Optional[UOp] = None
  for u in uops:
    if u.op is UOps.RANGE:
      last_range = u
    elif u.op is UOps.ENDRANGE and u.src[0] is last_range:
      inner.add(u.src[0])
  body: Dict[UOp, List[UOp]] = {}
  open_loops: List[UOp] = []
  for u in uops:
    if u.op is UOps.RANGE:
      open_loops.append(u)
    elif u.op is UOps.ENDRANGE:
      open_loops.pop()
    elif open_loops:
      body.setdefault(open_loops[-1], []).append(u)
  for rng in inner:
    if not rng.arg[1]:
      continue
    clauses = _reduction_clauses(body.get(rng, []), acc_names)
    # one accumulator: its add chain is the bottleneck, so lanes help. Several (a register-tiled matmul) already overlap,
    # and `omp simd` would force vectorizing across k, turning strided loads into gathers.
    if len(clauses) != 1:
      continue
    for i, line in enumerate(kernel):
      m = _FOR.match(line)
      if m is not None and m.group(3) == names[rng]:
        kernel.insert(i, "#pragma omp simd " + " ".join(clauses))
        break


def _mark_tile_loops(kernel: List[str], uops: List[UOp]) -> None:
  """Ask clang to unroll each register tile's reduce loop UNROLL_TILE times (tiny_clang.tile_loops says which and why)."""
  names = _range_names(uops)
  for rng in tile_loops(uops):
    for i, line in enumerate(kernel):
      m = _FOR.match(line)
      if m is not None and m.group(3) == names[rng]:
        kernel.insert(i, f"#pragma clang loop unroll_count({UNROLL_TILE})")
        break


def _reduction_clauses(body: List[UOp], acc_names: Dict[UOp, str]) -> List[str]:
  clauses = []
  for u in body:
    if u.op in (UOps.STORE, UOps.IF, UOps.WMMA):
      return []
    if u.op is not UOps.PHI:
      continue
    acc, val = u.src
    if acc.dtype is None or acc.dtype.count != 1 or acc.op is not UOps.DEFINE_ACC or acc not in acc_names:
      return []
    if val.op is not UOps.ALU or _f16kind(acc.dtype) is not None:
      return []
    if val.op is UOps.ALU and val.arg in (BinaryOps.ADD, TernaryOps.MULACC) and _only_through(val, acc, BinaryOps.ADD):
      op = "+"
    else:
      return []
    if dtypes.is_float(acc.dtype) or dtypes.is_int(acc.dtype):
      clauses.append(f"reduction({op}:{acc_names[acc]})")
    else:
      return []
  return clauses


def _only_through(val: UOp, acc: UOp, op: Any) -> bool:
  """True when acc occurs once in val and only as a (chain of) op operand(s): `((acc + a) + b) + c` is a sum into acc."""
  if val is acc:
    return True
  if val.op is not UOps.ALU:
    return False
  readers = [s for s in val.src if _reads(s, acc)]
  if len(readers) != 1:
    return False
  if val.arg is op or (op is BinaryOps.ADD and val.arg is TernaryOps.MULACC and val.src[2] is readers[0] and readers[0] is not val.src[0]
                       and readers[0] is not val.src[1]):
    return _only_through(readers[0], acc, op)
  return False


def _reads(u: UOp, acc: UOp, seen: Optional[Set[int]] = None) -> bool:
  seen = set() if seen is None else seen
  if u is acc:
    return True
  if id(u) in seen or u.op in (UOps.DEFINE_GLOBAL, UOps.CONST, UOps.RANGE, UOps.DEFINE_VAR):
    return False
  seen.add(id(u))
  return any(_reads(s, acc, seen) for s in u.src)
