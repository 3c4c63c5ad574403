"""CUDARenderer: linearized UOps to CUDA C for NVRTC.

half and bfloat16 are the CUDA headers' `half` and `nv_bfloat16` (arithmetic through their operators and `h*`
intrinsics, sm_80+ for bfloat16). Vectors of float/double/int are CUDA's builtin `float4` & co. built with
`make_float4`; vectors of the 16-bit floats are small aligned structs declared in the kernel's prelude. Tensor cores are
`mma.sync.aligned.m16n8k16` in inline PTX, wrapped in one `__WMMA_...` function per instruction used; their register
layout is the one `cuda_tensor_cores()` below declares, which the PYTHON device emulates (`EMULATE_CUDA=1`).

`PTXRenderer` (PTX straight from the uops) lives in `tiny_cuda.ptx` and is re-exported here.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from tiny.backend import (BinaryOps, CStyleLanguage, DType, PatternMatcher, PtrDType, RegisterLayout, RenderError, TensorCore, TernaryOps,
                          UnaryOps, UOp, UOps, UPat, dtypes, prod)

F16 = (dtypes.float16, dtypes.bfloat16)
# CUDA's own vector types: <scalar name><2|3|4> with make_<name><n>()
BUILTIN_VECTORS = {dtypes.float32: "float", dtypes.float64: "double", dtypes.int32: "int", dtypes.uint32: "uint",
                   dtypes.int64: "longlong", dtypes.uint64: "ulonglong", dtypes.int16: "short", dtypes.uint16: "ushort",
                   dtypes.int8: "char", dtypes.uint8: "uchar"}
F16_VECTOR_NAMES = {dtypes.float16: "tiny_half", dtypes.bfloat16: "tiny_bf16x"}


def _scalar(dt: DType) -> DType:
  base = dt.base if isinstance(dt, PtrDType) else dt
  return base.scalar() if base.count > 1 else base


def _is_f16(dt: Optional[DType]) -> bool:
  return dt is not None and _scalar(dt) in F16


def _f16_fn(name: str, default: str) -> Callable[..., str]:
  """A unary op spelled `default(x)` for float/double and `name(x)` for half and bfloat16."""
  return lambda x, dtype: f"{name if _is_f16(dtype) else default}({x})"


def _max(a: str, b: str, dtype: DType) -> str:
  # NaN from either side wins, as tiny.ops.python_alu has it; max()/fmaxf and __hmax would return the other operand
  if _is_f16(dtype):
    return f"__hmax_nan({a},{b})"
  if _scalar(dtype) == dtypes.bool:
    return f"({a}||{b})"
  if dtypes.is_float(_scalar(dtype)):
    return f"((({a}>={b})||({a}!={a}))?{a}:{b})"
  return f"max({a},{b})"


INT16 = (dtypes.int16, dtypes.uint16)
# the 16-bit negation as an opaque multiply by -1: NVVM turns any spelling of -x into neg.s16, and ptxas leaves
# neg.s16 of -32768 as +32768 in the 32-bit register behind it, which a division or compare that follows then reads
NEG16_FUNCTION = ('__device__ __forceinline__ short tiny_neg16(short x) { short r; asm("mul.lo.s16 %0, %1, -1;" : "=h"(r) : "h"(x)); '
                  'return r; }')


def _neg(x: str, dtype: DType) -> str:
  if _scalar(dtype) in INT16:
    return f"(({'short' if _scalar(dtype) == dtypes.int16 else 'unsigned short'})tiny_neg16((short){x}))"
  return f"(!{x})" if _scalar(dtype) == dtypes.bool else f"(-{x})"


def _recip(x: str, dtype: DType) -> str:
  if _is_f16(dtype):
    return f"hrcp({x})"
  return f"(1.0f/{x})" if _scalar(dtype) == dtypes.float32 else f"(1.0/{x})" if _scalar(dtype) == dtypes.float64 else f"(1/{x})"


def _via_float(x: UOp, c: UOp) -> Optional[UOp]:
  """A cast between a 16-bit float and anything but float/double goes through float: the CUDA headers' conversions
  between half, bfloat16, integers and bool are either missing or ambiguous."""
  src, dst = x.dtype, c.dtype
  if src is None or dst is None or src.count > 1 or dst.count > 1 or src == dst:
    return None
  plain = (dtypes.float32, dtypes.float64)
  if (_is_f16(src) and dst not in plain) or (_is_f16(dst) and src not in plain):
    return x.cast(dtypes.float32).cast(dst)
  return None


cuda_matcher = PatternMatcher([(UPat(UOps.CAST, src=(UPat.var("x"),), name="c"), _via_float)])


# mma.sync.m16n8k16 fragments (PTX ISA): the lanes form 8 groups of 4; group g = L//4 holds rows g and g+8, thread
# t = L%4 of the group holds columns 2t and 2t+1 (and +8 where the fragment has more registers)
MMA_M16N8K16_LAYOUT = (
  RegisterLayout(8, rows=(("lane", 4, 0, 1), ("reg", 2, 2, 8)), cols=(("lane", 1, 4, 2), ("reg", 1, 2, 1), ("reg", 4, 0, 8))),
  RegisterLayout(4, rows=(("lane", 1, 4, 2), ("reg", 1, 2, 1), ("reg", 2, 0, 8)), cols=(("lane", 4, 0, 1),)),
  RegisterLayout(4, rows=(("lane", 4, 0, 1), ("reg", 2, 0, 8)), cols=(("lane", 1, 4, 2), ("reg", 1, 2, 1))),
)


def cuda_tensor_cores() -> List[TensorCore]:
  """mma.sync m16n8k16 (sm_80+): 32 threads, half/bfloat16 in, float out."""
  return [TensorCore(dims=(8, 16, 16), threads=[(0, 2), (0, 2), (1, 2), (1, 2), (1, 2)], thread_local_sizes=[[2, 2, 2], [2, 2], [2, 2]],
                     dtype_in=di, dtype_out=do, layout=MMA_M16N8K16_LAYOUT)
          for di, do in ((dtypes.half, dtypes.float), (dtypes.bfloat16, dtypes.float))]


def wmma_function(tc_name: str, dtype_in: DType, dtype_out: DType, renderer: CUDARenderer) -> str:
  """The device function behind UOps.WMMA for mma.sync m16n8k16: A is 8 16-bit values (4 .b32 registers), B 4 values
  (2 registers), C/D 4 floats; each thread's element order is the PTX fragment order."""
  if (dtype_in, dtype_out) not in ((dtypes.float16, dtypes.float32), (dtypes.bfloat16, dtypes.float32)):
    raise RenderError(f"no CUDA tensor core for {dtype_in} -> {dtype_out}")
  ptx_in = "f16" if dtype_in == dtypes.float16 else "bf16"
  a, b, c = renderer.render_dtype(dtype_in.vec(8)), renderer.render_dtype(dtype_in.vec(4)), renderer.render_dtype(dtype_out.vec(4))
  return (f"__device__ __forceinline__ {c} __{tc_name}({a} a, {b} b, {c} c) {{\n"
          "  const unsigned int *ra = (const unsigned int *)&a, *rb = (const unsigned int *)&b;\n"
          f'  asm("mma.sync.aligned.m16n8k16.row.col.f32.{ptx_in}.{ptx_in}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"\n'
          '      : "+f"(c.x), "+f"(c.y), "+f"(c.z), "+f"(c.w) : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));\n'
          "  return c;\n}")


class CUDARenderer(CStyleLanguage):
  """CUDA C for one GPU architecture (`arch` like "sm_80"); tensor cores on sm_80 and newer."""

  device = "CUDA"
  suffix = "CUDA"
  global_max = (2 ** 31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  local_threads_max = 1024
  shared_max = 49152
  kernel_prefix = 'extern "C" __global__ '
  smem_prefix = "__shared__ __align__(16) "
  smem_prefix_for_cast = False
  barrier = "__syncthreads();"
  float4 = "make_float4"
  infinity = "__int_as_float(0x7f800000)"
  nan = "__int_as_float(0x7fffffff)"
  code_for_workitem = {"g": lambda d: f"blockIdx.{'xyz'[d]}", "l": lambda d: f"threadIdx.{'xyz'[d]}",
                       "i": lambda d: f"(blockIdx.{'xyz'[d]}*blockDim.{'xyz'[d]}+threadIdx.{'xyz'[d]})"}
  type_map = {dtypes.bfloat16: "nv_bfloat16", dtypes.int8: "signed char", dtypes.int64: "long long", dtypes.uint64: "unsigned long long"}
  code_for_op: Dict[Any, Callable] = {
    **CStyleLanguage.code_for_op,
    UnaryOps.SQRT: _f16_fn("hsqrt", "sqrt"), UnaryOps.EXP2: _f16_fn("hexp2", "exp2"), UnaryOps.LOG2: _f16_fn("hlog2", "log2"),
    UnaryOps.SIN: _f16_fn("hsin", "sin"), UnaryOps.RECIP: _recip, BinaryOps.MAX: _max,
    TernaryOps.MULACC: lambda a, b, c, dtype: f"(({a}*{b})+{c})", UnaryOps.NEG: _neg,
  }
  extra_matcher = cuda_matcher

  def __init__(self, arch: Optional[str] = None):
    from tiny_cuda.compiler import arch_and_tensor_cores
    self.arch, tcs = arch_and_tensor_cores(arch)
    self.tensor_cores: List[TensorCore] = tcs

  def __reduce__(self) -> Any:
    return (type(self), (self.arch,))

  # *** spellings ***

  def render_vector_dtype(self, scalar: DType, count: int) -> str:
    if scalar in F16_VECTOR_NAMES:
      return f"{F16_VECTOR_NAMES[scalar]}{count}"
    if scalar in BUILTIN_VECTORS and count in (2, 3, 4):
      return f"{BUILTIN_VECTORS[scalar]}{count}"
    raise RenderError(f"CUDA has no vector type of {count} x {scalar}")

  def render_gep(self, vec: str, idx: int, vec_dtype: DType) -> str:
    if _scalar(vec_dtype) in F16_VECTOR_NAMES:
      return f"{vec}.v[{idx}]"
    return f"{vec}.{'xyzw'[idx]}"

  def get_kernel_modifier(self, uops: List[UOp]) -> str:
    sizes = [u.arg[2] for u in uops if u.op is UOps.SPECIAL and u.arg[1].startswith("lidx")]
    if not all(isinstance(s, int) for s in sizes):
      return ""
    return f"__launch_bounds__({prod(sizes) if sizes else 1}) "

  def render_kernel(self, function_name: str, kernel: List[str], bufs: List[Tuple[str, Tuple[DType, bool]]], uops: List[UOp],
                    prefix: Optional[List[str]] = None) -> str:
    lines = list(prefix or [])
    used = {u.dtype for u in uops if u.dtype is not None} | {s for u in uops if u.dtype is not None for s in [_ptr_base(u.dtype)]}
    wmmas = {u.arg[0]: u.arg for u in uops if u.op is UOps.WMMA}
    for w in wmmas.values():
      used |= {w[2].vec(8), w[2].vec(4), w[3].vec(4)}
    if any(_scalar(d) == dtypes.float16 for d in used):
      lines.append("#include <cuda_fp16.h>")
    if any(_scalar(d) == dtypes.bfloat16 for d in used):
      lines.append("#include <cuda_bf16.h>")
    for d in sorted({d for d in used if d.count > 1 and d.scalar() in F16_VECTOR_NAMES}, key=lambda d: (d.scalar().name, d.count)):
      lines.append(self._f16_vector_struct(d))
    for name, arg in wmmas.items():
      lines.append(wmma_function(name, arg[2], arg[3], self))
    if any(u.op is UOps.ALU and u.arg is UnaryOps.NEG and u.dtype is not None and _scalar(u.dtype) in INT16 for u in uops):
      lines.append(NEG16_FUNCTION)
    return super().render_kernel(function_name, kernel, bufs, uops, lines)

  def _f16_vector_struct(self, dt: DType) -> str:
    name, elem, n = self.render_dtype(dt), self.render_dtype(dt.scalar()), dt.count
    params = ", ".join(f"{elem} x{i}" for i in range(n))
    return (f"struct __align__({2 * n}) {name} {{ {elem} v[{n}]; }};\n"
            f"__device__ __forceinline__ {name} make_{name}({params}) {{ {name} r; "
            + " ".join(f"r.v[{i}] = x{i};" for i in range(n)) + " return r; }")


def _ptr_base(dt: DType) -> DType:
  return dt.base if isinstance(dt, PtrDType) else dt


def __getattr__(name: str) -> Any:
  if name == "PTXRenderer":
    from tiny_cuda.ptx import PTXRenderer
    return PTXRenderer
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
