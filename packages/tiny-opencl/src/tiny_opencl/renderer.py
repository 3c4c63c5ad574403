"""OpenCLRenderer: linearized UOps to OpenCL C (1.2 and later).

Kernels are `__kernel` functions over `__global` buffers; workgroups share `__local` arrays and meet at
`barrier(CLK_LOCAL_MEM_FENCE)`; thread indices are `get_group_id`/`get_local_id`/`get_global_id`. Vectors are OpenCL's
builtin `float4` & co., built with `(float4)(a, b, c, d)`, converted with `convert_float4` and reinterpreted with
`as_float4` (OpenCL forbids C casts between vector types and through pointers to private memory).

`half` needs the device's cl_khr_fp16 and `double` its cl_khr_fp64: the renderer enables the extension a kernel uses
and refuses (RenderError) a dtype its device lacks. There is no bfloat16. Without a device (rendering only) both
extensions are assumed and the launch limits are OpenCL's minimums.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from tiny.backend import BinaryOps, CStyleLanguage, DType, PtrDType, RenderError, UOp, UOps, dtypes

# every dtype OpenCL C has; half and double only with their extensions
_ALL_DTYPES = frozenset({dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
                         dtypes.uint64, dtypes.float16, dtypes.float32, dtypes.float64})


def _scalar(dt: DType) -> DType:
  base = dt.base if isinstance(dt, PtrDType) else dt
  return base.scalar() if base.count > 1 else base


def _max(a: str, b: str, dtype: DType) -> str:
  # NaN from either side wins, as tiny.ops.python_alu has it; OpenCL's max()/fmax() return the other operand
  if _scalar(dtype) == dtypes.bool:
    return f"({a}||{b})"
  if dtypes.is_float(_scalar(dtype)):
    return f"((({a}>={b})||({a}!={a}))?{a}:{b})"
  return f"max({a},{b})"


class OpenCLRenderer(CStyleLanguage):
  """OpenCL C for one device: `fp16`/`fp64` say whether it has cl_khr_fp16/cl_khr_fp64; the limits come from
  clGetDeviceInfo (`tiny_opencl.plugin` passes them) or are OpenCL's guaranteed minimums."""

  device = "GPU"
  suffix = "GPU"
  kernel_prefix = "__kernel "
  buffer_prefix = "__global "
  smem_align = "__attribute__ ((aligned (16))) "
  smem_prefix = "__local "
  barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
  float4 = "(float4)"
  uses_vload = True
  has_local = True
  has_shared = True
  global_max = (2 ** 31 - 1,) * 3
  code_for_workitem = {"g": lambda d: f"get_group_id({d})", "l": lambda d: f"get_local_id({d})", "i": lambda d: f"get_global_id({d})"}
  type_map = {dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint", dtypes.int64: "long",
              dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.float64: "double", dtypes.bool: "bool"}
  code_for_op: Dict[Any, Callable] = {**CStyleLanguage.code_for_op, BinaryOps.MAX: _max}

  def __init__(self, fp16: bool = True, fp64: bool = True, local_max: Tuple[int, ...] = (256, 256, 64), local_threads_max: int = 256,
               shared_max: int = 32768):
    self.fp16, self.fp64 = fp16, fp64
    self.local_max = tuple(local_max)
    self.local_threads_max = local_threads_max
    self.shared_max = shared_max

  def __reduce__(self) -> Any:
    return (type(self), (self.fp16, self.fp64, self.local_max, self.local_threads_max, self.shared_max))

  def supported_dtypes(self) -> FrozenSet[DType]:
    """The dtypes kernels for this device may use (no bfloat16; half and double only with their extensions)."""
    return frozenset(d for d in _ALL_DTYPES if (d != dtypes.float16 or self.fp16) and (d != dtypes.float64 or self.fp64))

  # *** spellings ***

  def render_vector_dtype(self, scalar: DType, count: int) -> str:
    if scalar == dtypes.bool or count not in (2, 3, 4, 8, 16):
      raise RenderError(f"OpenCL has no vector type of {count} x {scalar}")
    return f"{self.render_dtype(scalar)}{count}"

  def render_gep(self, vec: str, idx: int, vec_dtype: DType) -> str:
    return f"{vec}.s{idx:x}"

  def render_cast(self, x: List[str], var_dtype: DType, bitcast: bool = False) -> str:
    if bitcast:
      return f"as_{self.render_dtype(var_dtype)}({x[0]})"
    if len(x) > 1:
      return self.render_vectorize(x, var_dtype)
    if var_dtype.count > 1:
      # a vector-to-vector conversion; a C cast to a vector type would only broadcast a scalar
      return f"convert_{self.render_dtype(var_dtype)}({x[0]})"
    return f"({self.render_dtype(var_dtype)})({x[0]})"

  def render_const(self, x: Any, dtype: DType) -> str:
    scalar = _scalar(dtype)
    if scalar == dtypes.float16 and dtype.count == 1 and x == x and abs(x) != float("inf"):
      return f"(half)({float(x)!r}f)"   # a float literal: a plain 1.0 would be a double, which needs cl_khr_fp64
    val = super().render_const(x, dtype)
    # OpenCL's 64-bit integers are long/ulong, with the l/ul suffixes (long long is reserved)
    return val.replace("ll", "l") if scalar in (dtypes.int64, dtypes.uint64) else val

  def render_arg(self, name: str, dtype: DType, mutable: bool, is_buffer: bool) -> str:
    if is_buffer and _scalar(dtype) == dtypes.bool:
      # pointers to bool may not be kernel arguments: bools live in memory as uchar 0/1
      return f"{'' if mutable else 'const '}{self.buffer_prefix}uchar* {name}"
    return super().render_arg(name, dtype, mutable, is_buffer)

  def render_kernel(self, function_name: str, kernel: List[str], bufs: List[Tuple[str, Tuple[DType, bool]]], uops: List[UOp],
                    prefix: Optional[List[str]] = None) -> str:
    used = {_scalar(u.dtype) for u in uops if u.dtype is not None}
    lines = list(prefix or [])
    if dtypes.float16 in used:
      if not self.fp16:
        raise RenderError("this OpenCL device has no cl_khr_fp16: it cannot run half kernels")
      lines.append("#pragma OPENCL EXTENSION cl_khr_fp16 : enable")
    if dtypes.float64 in used:
      if not self.fp64:
        raise RenderError("this OpenCL device has no cl_khr_fp64: it cannot run double kernels")
      lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    if dtypes.bfloat16 in used:
      raise RenderError("OpenCL has no bfloat16")
    args = [self.render_arg(name, dtype, mutable, isinstance(dtype, PtrDType)) for name, (dtype, mutable) in bufs]
    head = f"__kernel {self._workgroup_attribute(uops)}void {function_name}({', '.join(args)}) {{"
    return "\n".join(lines + [head, *kernel, "}"])

  def _workgroup_attribute(self, uops: List[UOp]) -> str:
    """reqd_work_group_size when the group size is known when rendering: the driver then compiles for exactly that size
    (PoCL unrolls the work-items of a group into loops, GPUs size their register allocation)."""
    specials = [u.arg for u in uops if u.op is UOps.SPECIAL]
    if any(name.startswith("idx") for _, name, _ in specials):
      return ""   # get_global_id kernels are launched without a local size
    size = [1, 1, 1]
    for dim, name, sz in specials:
      if name.startswith("lidx"):
        if not isinstance(sz, int):
          return ""
        size[dim] = sz
    return f"__attribute__((reqd_work_group_size({size[0]},{size[1]},{size[2]}))) "
