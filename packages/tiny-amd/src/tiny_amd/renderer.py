"""HIPRenderer: linearized UOps to HIP C++ that clang compiles for AMD GPUs without the HIP headers (`-nogpuinc`).

Nothing is included, so the kernel's prelude declares what it uses: `__global__`/`__shared__` are spelled as the clang
attributes they stand for, thread indices are `__builtin_amdgcn_workgroup_id_*` / `__builtin_amdgcn_workitem_id_*`,
barriers are `s_barrier` between workgroup fences, and math is clang builtins that lower to instructions (no device
library is linked, so nothing may end up as a call to `__ocml_*`). `sin` is a small polynomial helper in the prelude
(the hardware `v_sin_f32` loses accuracy away from zero); float64 `exp2`/`log2` are core's polynomials.

`half` is `_Float16` (native arithmetic). clang-16's `__bf16` is storage only, so bfloat16 is a 16-bit struct that converts
to and from float; every bfloat16 ALU op is rewritten to compute in float. Vectors are clang `ext_vector_type`s
(`float4`, `half16`, ...); vectors of bfloat16 are small structs. RDNA3 (gfx11) has WMMA tensor cores: half in, float
or half out, whose register layout `amd_tensor_cores()` declares (the PYTHON device emulates it with `EMULATE_AMD=1`).
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from tiny.backend import (BinaryOps, CStyleLanguage, DType, PatternMatcher, PtrDType, RegisterLayout, RenderError, TensorCore, TernaryOps,
                          UnaryOps, UOp, UOps, UPat, dtypes, prod, xexp2, xlog2)

DEFAULT_ARCH = "gfx1100"
BF16 = "tiny_bf16"
# the name a vector type of each scalar gets in the prelude (<name><count>)
VECTOR_NAMES = {dtypes.float32: "float", dtypes.float64: "double", dtypes.float16: "half", dtypes.int32: "int", dtypes.uint32: "uint",
                dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.int16: "short", dtypes.uint16: "ushort", dtypes.int8: "char",
                dtypes.uint8: "uchar"}
BF16_VECTOR = "tiny_bf16x"

PRELUDE = """#define TINY_DEVICE __attribute__((device)) __attribute__((always_inline)) inline
typedef _Float16 half;"""

BF16_STRUCT = f"""struct {BF16} {{
  unsigned short bits;
  TINY_DEVICE {BF16}() = default;
  TINY_DEVICE {BF16}(float f) {{
    unsigned int u = __builtin_bit_cast(unsigned int, f);
    /* round to nearest even; a NaN stays a (quiet) NaN */
    bits = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u) : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }}
  TINY_DEVICE operator float() const {{ return __builtin_bit_cast(float, ((unsigned int)bits) << 16); }}
}};"""

BARRIER = ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
           '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");')

# pi in parts whose products with the quotient are exact (Cody-Waite reduction), and the Taylor terms that reach the precision
_SIN_PARAMS = {"float": ("f", "__builtin_rintf",
                         ("3.140625f", "0.0009670257568359375f", "6.2771141529083251953e-7f", "1.2154201256553420762e-10f"), 8),
               "double": ("", "__builtin_rint", ("3.1415926218032836914", "3.1786509424591713469e-08", "1.2246467864107188502e-16",
                                                  "1.2736634327021899816e-24"), 13)}


def sin_helper(ctype: str) -> str:
  """tiny_sin_<ctype>: x = q*pi + r with |r| <= pi/2, sin(x) = (-1)^q sin(r), sin(r) by its Taylor series. NaN and inf give NaN."""
  sfx, rint, parts, terms = _SIN_PARAMS[ctype]
  coeffs = []
  fact = 1
  for i in range(terms):
    fact *= 1 if i == 0 else (2 * i) * (2 * i + 1)
    coeffs.append(f"{(-1) ** i / fact!r}{sfx}")
  horner = coeffs[-1]
  for c in reversed(coeffs[:-1]):
    horner = f"({c} + r2 * {horner})"
  reduce = "".join(f" r = r - q * {p};" for p in parts)
  return (f"TINY_DEVICE {ctype} tiny_sin_{ctype}({ctype} x) {{\n"
          f"  {ctype} q = {rint}(x * 0.31830988618379067154{sfx}); {ctype} r = x;{reduce}\n"
          f"  {ctype} r2 = r * r; {ctype} s = r * {horner};\n"
          "  return (((long long)q) & 1) ? -s : s;\n}")


def _scalar(dt: DType) -> DType:
  base = dt.base if isinstance(dt, PtrDType) else dt
  return base.scalar() if base.count > 1 else base


def _float_fn(f32: str, f16: str, f64: Optional[str]) -> Callable[..., str]:
  """A unary op spelled per float type; bfloat16 never reaches the renderer (hip_matcher computes it in float)."""
  def fn(x: str, dtype: DType) -> str:
    s = _scalar(dtype)
    if s == dtypes.float16:
      return f"{f16}({x})"
    if s == dtypes.float64:
      if f64 is None:
        raise RenderError(f"{f32} of a double is rewritten to a polynomial before rendering")
      return f"{f64}({x})"
    return f"{f32}({x})"
  return fn


def _max(a: str, b: str, dtype: DType) -> str:
  # NaN from either side wins, as tiny.ops.python_alu has it; __builtin_fmaxf would return the other operand
  s = _scalar(dtype)
  if s == dtypes.bool:
    return f"({a}||{b})"
  if dtypes.is_float(s):
    return f"((({a}>={b})||({a}!={a}))?{a}:{b})"
  return f"(({a}>{b})?{a}:{b})"


def _recip(x: str, dtype: DType) -> str:
  s = _scalar(dtype)
  return f"(1.0f/{x})" if s == dtypes.float32 else f"(1.0/{x})" if s == dtypes.float64 else f"((half)1.0f/{x})" if s == dtypes.float16 else f"(1/{x})"


def _bf16_in_float(x: UOp) -> Optional[UOp]:
  """An ALU op on bfloat16 (or comparing bfloat16s) computed in float, the result rounded back to bfloat16."""
  if not any(s.dtype == dtypes.bfloat16 for s in x.src):
    return None
  src = tuple(s.cast(dtypes.float32) if s.dtype == dtypes.bfloat16 else s for s in x.src)
  if x.dtype == dtypes.bfloat16:
    return UOp(UOps.ALU, dtypes.float32, src, x.arg).cast(dtypes.bfloat16)
  return UOp(UOps.ALU, x.dtype, src, x.arg)


def _bf16_cast_via_float(x: UOp, c: UOp) -> Optional[UOp]:
  """A cast between bfloat16 and anything but float goes through float: the struct converts to and from float only."""
  src, dst = x.dtype, c.dtype
  if src is None or dst is None or src.count > 1 or dst.count > 1 or src == dst or dtypes.float32 in (src, dst):
    return None
  return x.cast(dtypes.float32).cast(dst) if dtypes.bfloat16 in (src, dst) else None


_F64 = (dtypes.float64,)
hip_matcher = PatternMatcher([
  (UPat(UOps.ALU, UnaryOps.EXP2, (UPat.var("d", dtype=_F64),)), xexp2),
  (UPat(UOps.ALU, UnaryOps.LOG2, (UPat.var("d", dtype=_F64),)), xlog2),
  (UPat(UOps.ALU, name="x"), _bf16_in_float),
  (UPat(UOps.CAST, src=(UPat.var("x"),), name="c"), _bf16_cast_via_float),
])


# *** tensor cores ***

# RDNA3 WMMA in wave32: lane L holds row L%16 of A and column L%16 of B (both half-waves hold the same); element e of D in
# lane L is row 2e + L//16, column L%16 (the half-out variant keeps D in the low halves of the same registers)
RDNA3_LAYOUT = (RegisterLayout(16, rows=(("lane", 1, 16, 1),), cols=(("reg", 1, 0, 1),)),
                RegisterLayout(16, rows=(("reg", 1, 0, 1),), cols=(("lane", 1, 16, 1),)),
                RegisterLayout(8, rows=(("reg", 1, 0, 2), ("lane", 16, 0, 1)), cols=(("lane", 1, 16, 1),)))


def amd_tensor_cores() -> List[TensorCore]:
  """RDNA3 WMMA 16x16x16 in wave32: half in, float or half out."""
  return [TensorCore(dims=(16, 16, 16), threads=[(0, 8), (0, 2), (1, 2)], thread_local_sizes=[[16], [16], [4, 2]], dtype_in=dtypes.half,
                     dtype_out=do, layout=RDNA3_LAYOUT) for do in (dtypes.float, dtypes.half)]


def has_wmma(arch: str) -> bool:
  """RDNA3 (gfx11xx) has the wave32 WMMA instructions amd_tensor_cores() describes; CDNA's MFMA and RDNA4's WMMA differ."""
  return arch.startswith("gfx11")


def wmma_function(tc_name: str, dtype_in: DType, dtype_out: DType) -> str:
  """The device function behind UOps.WMMA: A and B are 16 halves per lane, C/D 8 floats (or 8 halves, which the
  instruction keeps in the low half of 16: opsel false)."""
  if dtype_in != dtypes.half or dtype_out not in (dtypes.float, dtypes.half):
    raise RenderError(f"no AMD tensor core for {dtype_in} -> {dtype_out}")
  if dtype_out == dtypes.float:
    return (f"TINY_DEVICE float8 __{tc_name}(half16 a, half16 b, float8 c) {{\n"
            "  return __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c);\n}")
  return (f"TINY_DEVICE half8 __{tc_name}(half16 a, half16 b, half8 c) {{\n"
          "  half16 c16 = {};\n  for (int i = 0; i < 8; i++) c16[2*i] = c[i];\n"
          "  half16 d16 = __builtin_amdgcn_wmma_f16_16x16x16_f16_w32(a, b, c16, false);\n"
          "  half8 d;\n  for (int i = 0; i < 8; i++) d[i] = d16[2*i];\n  return d;\n}")


# *** the renderer ***

def normalize_arch(arch: str) -> str:
  """'gfx1100', 'GFX90A' or 'gfx90a:sramecc+:xnack-' -> the bare target name; anything else raises ValueError."""
  name = arch.strip().split(":")[0].lower()
  if re.fullmatch(r"gfx[0-9]{1,2}[0-9a-f]{2}", name) is None:
    raise ValueError(f"not an AMD GPU architecture: {arch!r} (expected something like gfx1100 or gfx90a)")
  return name


def default_arch() -> str:
  """AMD_ARCH from the environment, else gfx1100: the target when no GPU tells us its own."""
  return normalize_arch(os.environ.get("AMD_ARCH", "") or DEFAULT_ARCH)


class HIPRenderer(CStyleLanguage):
  """HIP C++ for one AMD GPU architecture (`arch` like "gfx1100"); WMMA tensor cores on RDNA3."""

  device = "AMD"
  suffix = "HIP"
  has_local = True
  has_shared = True
  # the grid is counted in threads by the hardware (2**32 per dim); workgroup counts stay below what HIP's launch accepts
  global_max = (2 ** 31 - 1, 65535, 65535)
  local_max = (1024, 1024, 1024)
  local_threads_max = 1024
  shared_max = 65536
  kernel_prefix = 'extern "C" __attribute__((global)) '
  buffer_suffix = " __restrict__"
  smem_prefix = "__attribute__((shared, aligned(16))) "
  smem_prefix_for_cast = False
  barrier = BARRIER
  arg_int_prefix = "const int"
  infinity = "__builtin_inff()"
  nan = "__builtin_nanf(\"\")"
  code_for_workitem = {"g": lambda d: f"__builtin_amdgcn_workgroup_id_{'xyz'[d]}()", "l": lambda d: f"__builtin_amdgcn_workitem_id_{'xyz'[d]}()",
                       "i": lambda d: (f"(__builtin_amdgcn_workgroup_id_{'xyz'[d]}()*__builtin_amdgcn_workgroup_size_{'xyz'[d]}()"
                                       f"+__builtin_amdgcn_workitem_id_{'xyz'[d]}())")}
  type_map = {dtypes.bfloat16: BF16, dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.uint16: "unsigned short",
              dtypes.uint32: "unsigned int", dtypes.int64: "long", dtypes.uint64: "unsigned long", dtypes.float16: "half"}
  code_for_op: Dict[Any, Callable] = {
    **CStyleLanguage.code_for_op,
    UnaryOps.SQRT: _float_fn("__builtin_sqrtf", "__builtin_sqrtf16", "__builtin_sqrt"),
    UnaryOps.EXP2: _float_fn("__builtin_exp2f", "__builtin_exp2f16", None),
    UnaryOps.LOG2: _float_fn("__builtin_log2f", "__builtin_log2f16", None),
    UnaryOps.SIN: _float_fn("tiny_sin_float", "(half)tiny_sin_float", "tiny_sin_double"),
    UnaryOps.RECIP: _recip, BinaryOps.MAX: _max,
    TernaryOps.MULACC: lambda a, b, c, dtype: f"(({a}*{b})+{c})",
  }
  extra_matcher = hip_matcher

  def __init__(self, arch: Optional[str] = None):
    self.arch = normalize_arch(arch) if arch is not None else default_arch()
    self.tensor_cores: List[TensorCore] = amd_tensor_cores() if has_wmma(self.arch) else []

  def __reduce__(self) -> Any:
    return (type(self), (self.arch,))

  # *** spellings ***

  def render_vector_dtype(self, scalar: DType, count: int) -> str:
    if scalar == dtypes.bfloat16:
      return f"{BF16_VECTOR}{count}"
    if scalar not in VECTOR_NAMES:
      raise RenderError(f"HIP has no vector type of {count} x {scalar}")
    return f"{VECTOR_NAMES[scalar]}{count}"

  def render_vectorize(self, x: List[str], var_dtype: DType) -> str:
    if _scalar(var_dtype) == dtypes.bfloat16:
      return f"{self.render_dtype(var_dtype)}{{{{{','.join(x)}}}}}"
    # each element converted explicitly: list-initialization refuses narrowing (a float sum of halves into half4)
    elem = self.render_dtype(var_dtype.scalar())
    return f"{self.render_dtype(var_dtype)}{{{','.join(f'({elem})({v})' for v in x)}}}"

  def render_cast(self, x: List[str], var_dtype: DType, bitcast: bool = False) -> str:
    if bitcast:
      return f"__builtin_bit_cast({self.render_dtype(var_dtype)}, {x[0]})"
    if len(x) == 1 and var_dtype.count > 1:
      # a vector-to-vector conversion: a C cast between ext_vector_types would reinterpret the bits
      return f"__builtin_convertvector({x[0]}, {self.render_dtype(var_dtype)})"
    return super().render_cast(x, var_dtype, bitcast)

  def render_gep(self, vec: str, idx: int, vec_dtype: DType) -> str:
    return f"{vec}.v[{idx}]" if _scalar(vec_dtype) == dtypes.bfloat16 else f"{vec}[{idx}]"

  def get_kernel_modifier(self, uops: List[UOp]) -> str:
    # the compiler sizes registers for the largest workgroup it is told about; the launch must stay within it
    sizes = [u.arg[2] for u in uops if u.op is UOps.SPECIAL and u.arg[1].startswith("lidx")]
    threads = prod(sizes) if sizes and all(isinstance(s, int) for s in sizes) else (1 if not sizes else self.local_threads_max)
    return f"__attribute__((amdgpu_flat_work_group_size(1, {threads}))) "

  def render_kernel(self, function_name: str, kernel: List[str], bufs: List[Tuple[str, Tuple[DType, bool]]], uops: List[UOp],
                    prefix: Optional[List[str]] = None) -> str:
    used = {_scalar(u.dtype) for u in uops if u.dtype is not None}
    vectors = {(u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype) for u in uops if u.dtype is not None}
    wmmas = {u.arg[0]: u.arg for u in uops if u.op is UOps.WMMA}
    if wmmas and not self.tensor_cores:
      raise RenderError(f"{self.arch} has no WMMA tensor cores")
    for w in wmmas.values():
      vectors |= {w[2].vec(16), w[3].vec(8), dtypes.half.vec(16)}
    lines = [PRELUDE] + list(prefix or [])
    if dtypes.bfloat16 in used:
      lines.append(BF16_STRUCT)
    for v in sorted((v for v in vectors if v.count > 1), key=lambda d: (d.scalar().name, d.count)):
      name = self.render_dtype(v)
      if v.scalar() == dtypes.bfloat16:
        lines.append(f"struct {name} {{ {BF16} v[{v.count}]; }};")
      else:
        lines.append(f"typedef {self.render_dtype(v.scalar())} {name} __attribute__((ext_vector_type({v.count})));")
    sins = {_scalar(u.dtype) for u in uops if u.op is UOps.ALU and u.arg is UnaryOps.SIN and u.dtype is not None}
    if sins & {dtypes.float32, dtypes.float16}:
      lines.append(sin_helper("float"))
    if dtypes.float64 in sins:
      lines.append(sin_helper("double"))
    for name, arg in wmmas.items():
      lines.append(wmma_function(name, arg[2], arg[3]))
    return super().render_kernel(function_name, kernel, bufs, uops, lines)
