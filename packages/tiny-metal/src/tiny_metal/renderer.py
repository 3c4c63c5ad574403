"""MetalRenderer: linearized UOps to Metal Shading Language (MSL 3.1: macOS 14 / iOS 17 and newer, Apple7+ GPUs).

A kernel is a `kernel void` function whose buffers are `device` pointers at `[[buffer(i)]]`, followed by its symbolic
variables as `constant int&` at the next indices (the order the runtime binds them in); the threadgroup and the thread in
it come from `[[threadgroup_position_in_grid]]` and `[[thread_position_in_threadgroup]]`. Workgroups share `threadgroup`
arrays and meet at `threadgroup_barrier(mem_flags::mem_threadgroup)`. Vectors are Metal's `float4` & co., built and
converted with their constructors; bit casts are `as_type<T>`.

Dtypes: no double (Metal has none: float64 kernels raise RenderError). half is native. bfloat is MSL 3.1's `bfloat`, which
this renderer treats as a storage type: every ALU on it runs in float and is rounded back, and its casts to and from
integers and bool go through float (so the kernel means the same whether or not the Metal compiler offers bfloat math).

Tensor cores are the 8x8x8 `simdgroup_matrix` multiply of a 32-thread simdgroup: each thread keeps two elements of every
tile (`thread_elements()`), in the layout `metal_tensor_cores()` declares, which the PYTHON device emulates
(`EMULATE_METAL=1`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from tiny.backend import (BinaryOps, CStyleLanguage, DType, PatternMatcher, PtrDType, RegisterLayout, RenderError, TensorCore, TernaryOps,
                          UnaryOps, UOp, UOps, UPat, dtypes)

# the MSL version the kernels are written for (bfloat and simdgroup bfloat matrices need 3.1)
MSL_VERSION = (3, 1)
MSL_HEADER = ["#include <metal_stdlib>", "using namespace metal;"]

# Metal's scalar types; there is no double
_SUPPORTED = frozenset({dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
                        dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32})
_NO_MATH = (dtypes.bfloat16,)


def _scalar(dt: DType) -> DType:
  base = dt.base if isinstance(dt, PtrDType) else dt
  return base.scalar() if base.count > 1 else base


def _unary(name: str, precise: bool = False) -> Callable[..., str]:
  """A math builtin; `precise` picks metal::precise:: for float32, whose fast variant is not accurate enough (sin loses its
  range reduction under fast math)."""
  def fn(x: str, dtype: DType) -> str:
    return f"{'precise::' if precise and _scalar(dtype) == dtypes.float32 else ''}{name}({x})"
  return fn


def _max(a: str, b: str, dtype: DType) -> str:
  # NaN from either side wins, as tiny.ops.python_alu has it; metal::max/fmax return the other operand
  if _scalar(dtype) == dtypes.bool:
    return f"({a}||{b})"
  if dtypes.is_float(_scalar(dtype)):
    return f"((({a}>={b})||({a}!={a}))?{a}:{b})"
  return f"max({a},{b})"


def _recip(x: str, dtype: DType) -> str:
  s = _scalar(dtype)
  return f"(1.0f/{x})" if s == dtypes.float32 else f"(half(1.0f)/{x})" if s == dtypes.float16 else f"(1/{x})"


# *** bfloat: storage in bfloat, arithmetic in float ***

def _bf16_alu_in_float(x: UOp) -> Optional[UOp]:
  srcs = [s.dtype for s in x.src]
  if not any(d is not None and _scalar(d) == dtypes.bfloat16 for d in srcs):
    return None
  assert x.dtype is not None, "an ALU has a dtype"
  wide = [s.cast(dtypes.float32.vec(s.dtype.count) if s.dtype.count > 1 else dtypes.float32)
          if s.dtype is not None and _scalar(s.dtype) == dtypes.bfloat16 else s for s in x.src]
  if x.dtype == dtypes.bool or _scalar(x.dtype) == dtypes.bool:
    return UOp(UOps.ALU, x.dtype, tuple(wide), x.arg)
  fdt = dtypes.float32.vec(x.dtype.count) if x.dtype.count > 1 else dtypes.float32
  return UOp(UOps.ALU, fdt, tuple(wide), x.arg).cast(x.dtype)


def _bf16_cast_via_float(x: UOp, c: UOp) -> Optional[UOp]:
  src, dst = x.dtype, c.dtype
  if src is None or dst is None or src.count > 1 or dst.count > 1 or src == dst:
    return None
  plain = (dtypes.float32, dtypes.float16)
  if (src == dtypes.bfloat16 and dst not in plain) or (dst == dtypes.bfloat16 and src not in plain):
    return x.cast(dtypes.float32).cast(dst)
  return None


metal_matcher = PatternMatcher([
  (UPat(UOps.ALU, name="x"), _bf16_alu_in_float),
  (UPat(UOps.CAST, src=(UPat.var("x"),), name="c"), _bf16_cast_via_float),
])


# *** tensor cores ***

# simdgroup_matrix 8x8, the same for A, B and C: lane L holds row (L//2)%4 + 4*(L//16) and the two adjacent columns
# 2*(L%2) + 4*((L//8)%2) + e, e = 0, 1 (the order thread_elements() uses on Apple GPUs)
SIMDGROUP_8X8_LAYOUT = RegisterLayout(2, rows=(("lane", 2, 4, 1), ("lane", 16, 0, 4)),
                                      cols=(("reg", 1, 0, 1), ("lane", 1, 2, 2), ("lane", 8, 2, 4)))
# (dtype in, dtype out) pairs of simdgroup_multiply_accumulate tiny uses; bfloat needs MSL 3.1
TENSOR_CORE_DTYPES = ((dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32), (dtypes.float16, dtypes.float16),
                      (dtypes.bfloat16, dtypes.float32), (dtypes.bfloat16, dtypes.bfloat16))
_MATRIX_NAMES = {dtypes.float32: "float", dtypes.float16: "half", dtypes.bfloat16: "bfloat"}


def metal_tensor_cores() -> List[TensorCore]:
  """simdgroup_matrix 8x8x8 on a 32-thread simdgroup (N, M, K = 8): float, half or bfloat in, float or the input type out."""
  return [TensorCore(dims=(8, 8, 8), threads=[(0, 2), (1, 4), (0, 2), (1, 2)], thread_local_sizes=[[2], [2], [2]], dtype_in=di,
                     dtype_out=do, layout=(SIMDGROUP_8X8_LAYOUT,) * 3) for di, do in TENSOR_CORE_DTYPES]


def wmma_function(name: str, dtype_in: DType, dtype_out: DType) -> str:
  """The helper behind UOps.WMMA: the thread's two elements of A, B and C go into simdgroup matrices, one
  simdgroup_multiply_accumulate, and the thread's two elements of the result come back."""
  if (dtype_in, dtype_out) not in TENSOR_CORE_DTYPES:
    raise RenderError(f"Metal has no simdgroup matrix multiply for {dtype_in} -> {dtype_out}")
  tin, tout = _MATRIX_NAMES[dtype_in], _MATRIX_NAMES[dtype_out]
  lines = [f"{tout}2 __{name}({tin}2 a, {tin}2 b, {tout}2 c) {{",
           f"  simdgroup_{tin}8x8 ma, mb;", f"  simdgroup_{tout}8x8 mc;"]
  for e in range(2):
    lines.append(f"  ma.thread_elements()[{e}] = a[{e}]; mb.thread_elements()[{e}] = b[{e}]; mc.thread_elements()[{e}] = c[{e}];")
  lines += ["  simdgroup_multiply_accumulate(mc, ma, mb, mc);", f"  return {tout}2(mc.thread_elements()[0], mc.thread_elements()[1]);", "}"]
  return "\n".join(lines)


class MetalRenderer(CStyleLanguage):
  """MSL for Apple GPUs (Apple7 / M1 and newer, MSL 3.1)."""

  device = "METAL"
  suffix = "METAL"
  has_local = True
  has_shared = True
  supports_float4 = True
  # thread ids are int in the kernel; Metal's own grid limit is far above this
  global_max = (2 ** 31 - 1,) * 3
  local_max = (1024, 1024, 1024)
  local_threads_max = 1024
  shared_max = 32768
  kernel_prefix = "kernel "
  buffer_prefix = "device "
  smem_prefix = "threadgroup "
  barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
  arg_int_prefix = "constant int&"
  float4 = "float4"
  code_for_workitem = {"g": lambda d: f"gid.{'xyz'[d]}", "l": lambda d: f"lid.{'xyz'[d]}", "i": lambda d: f"tid.{'xyz'[d]}"}
  type_map = {dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint", dtypes.int64: "long",
              dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.bfloat16: "bfloat", dtypes.bool: "bool"}
  code_for_op: Dict[Any, Callable] = {
    **CStyleLanguage.code_for_op,
    UnaryOps.SQRT: _unary("sqrt"), UnaryOps.EXP2: _unary("exp2"), UnaryOps.LOG2: _unary("log2"), UnaryOps.SIN: _unary("sin", precise=True),
    UnaryOps.RECIP: _recip, BinaryOps.MAX: _max, TernaryOps.MULACC: lambda a, b, c, dtype: f"(({a}*{b})+{c})",
  }
  extra_matcher = metal_matcher

  def __init__(self) -> None:
    self.tensor_cores: List[TensorCore] = metal_tensor_cores()

  def __reduce__(self) -> Any:
    return (type(self), ())

  def supported_dtypes(self) -> FrozenSet[DType]:
    """The dtypes Metal kernels may use: everything but float64."""
    return _SUPPORTED

  # *** spellings ***

  def render_vector_dtype(self, scalar: DType, count: int) -> str:
    if scalar not in _SUPPORTED or count not in (2, 3, 4):
      raise RenderError(f"Metal has no vector type of {count} x {scalar}")
    return f"{self.render_dtype(scalar)}{count}"

  def render_cast(self, x: List[str], var_dtype: DType, bitcast: bool = False) -> str:
    if bitcast:
      return f"as_type<{self.render_dtype(var_dtype)}>({x[0]})"
    if len(x) > 1:
      return self.render_vectorize(x, var_dtype)
    # a functional cast converts a scalar, and a vector element by element (a C cast would reinterpret a vector)
    return f"{self.render_dtype(var_dtype)}({x[0]})"

  def render_const(self, x: Any, dtype: DType) -> str:
    scalar = _scalar(dtype)
    if scalar in (dtypes.float16, dtypes.bfloat16) and dtype.count == 1 and x == x and abs(x) != float("inf"):
      return f"{self.render_dtype(scalar)}({float(x)!r}f)"   # from a float literal: Metal has no double literals
    val = super().render_const(x, dtype)
    # Metal's 64-bit integers are long/ulong, with the l/ul suffixes
    return val.replace("ll", "l") if scalar in (dtypes.int64, dtypes.uint64) else val

  def render_local(self, name: str, dtype: DType, size: int) -> str:
    # 16-byte aligned so that vector loads and stores (threadgroup float4*) may address it
    return f"threadgroup __attribute__((aligned(16))) {self.render_dtype(dtype)} {name}[{size}];"

  def render_kernel(self, function_name: str, kernel: List[str], bufs: List[Tuple[str, Tuple[DType, bool]]], uops: List[UOp],
                    prefix: Optional[List[str]] = None) -> str:
    used = {_scalar(u.dtype) for u in uops if u.dtype is not None}
    if dtypes.float64 in used:
      raise RenderError("Metal has no double (float64): cast to float32 before running on METAL")
    args = []
    for i, (name, (dtype, mutable)) in enumerate(bufs):
      if isinstance(dtype, PtrDType):
        args.append(f"{'' if mutable else 'const '}device {self.render_dtype(dtype)}* {name} [[buffer({i})]]")
      else:
        args.append(f"{self.arg_int_prefix} {name} [[buffer({i})]]")
    args += ["uint3 gid [[threadgroup_position_in_grid]]", "uint3 lid [[thread_position_in_threadgroup]]"]
    if any(u.op is UOps.SPECIAL and u.arg[1].startswith("idx") for u in uops):
      args.append("uint3 tid [[thread_position_in_grid]]")
    lines = MSL_HEADER + list(prefix or [])
    wmmas = {u.arg[0]: u.arg for u in uops if u.op is UOps.WMMA}
    lines += [wmma_function(name, arg[2], arg[3]) for name, arg in wmmas.items()]
    return "\n".join(lines + [f"kernel void {function_name}({', '.join(args)}) {{", *kernel, "}"])
