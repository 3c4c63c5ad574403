"""CLCompiler: OpenCL C -> the device's program binary, with clCreateProgramWithSource + clBuildProgram.

OpenCL compiles in the driver, so unlike NVRTC this needs an OpenCL platform with the target device. The binary
(CL_PROGRAM_BINARIES) is what the compile cache stores; its key names the platform, the device and the driver version,
because a binary is only valid for the driver that made it.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
from typing import Any, Optional

from tiny.backend import CompileError, Compiler, getenv

from tiny_opencl.runtime import check, cl, context, device_info, error_name


def _build_log(program: Any, device: Any) -> str:
  lib = cl()
  size = ctypes.c_size_t()
  if lib.clGetProgramBuildInfo(program, device, lib.CL_PROGRAM_BUILD_LOG, 0, None, ctypes.byref(size)) != 0:
    return "(no build log)"
  buf = ctypes.create_string_buffer(size.value)
  lib.clGetProgramBuildInfo(program, device, lib.CL_PROGRAM_BUILD_LOG, size.value, buf, None)
  return buf.value.decode(errors="replace").strip()


class CLCompiler(Compiler):
  """OpenCL C -> program binary for device `ordinal` (GPU:ordinal). `options` go to clBuildProgram (CL_BUILD_OPTIONS adds
  more from the environment); they change the binary, so they are part of the cache key."""

  def __init__(self, ordinal: int = 0, options: Optional[str] = None):
    self.ordinal = ordinal
    info = device_info(ordinal)
    # tiny compares with numpy bit for bit in places: ask for IEEE division and sqrt where the device can give them
    ieee = "-cl-fp32-correctly-rounded-divide-sqrt" if info.correct_div_sqrt else ""
    self.options = " ".join(x for x in [ieee, options or "", getenv("CL_BUILD_OPTIONS", "")] if x)
    ident = "\0".join([info.platform, info.name, info.version, info.driver, self.options])
    slug = re.sub(r"[^A-Za-z0-9]+", "_", f"{info.name}_{info.driver}").strip("_")[:48]
    super().__init__(f"compile_opencl_{slug}_{hashlib.sha256(ident.encode()).hexdigest()[:12]}")

  def compile(self, src: str) -> bytes:
    """The program binary of src. Raises CompileError with the driver's build log and the numbered source on failure."""
    lib = cl()
    ctx = context(self.ordinal)
    err = ctypes.c_int32()
    text = ctypes.create_string_buffer(src.encode())
    strings = (ctypes.POINTER(ctypes.c_char) * 1)(ctypes.cast(text, ctypes.POINTER(ctypes.c_char)))
    program = lib.clCreateProgramWithSource(ctx.context, 1, strings, None, ctypes.byref(err))
    check(err.value, "clCreateProgramWithSource")
    try:
      dev = (lib.cl_device_id * 1)(ctx.device)
      status = lib.clBuildProgram(program, 1, dev, self.options.encode(), lib.clBuildProgram.argtypes[4](), None)
      if status != 0:
        info = device_info(self.ordinal)
        raise CompileError(f"OpenCL ({info.platform}, {info.name}) could not build the kernel: {error_name(status)}\n"
                           f"{_build_log(program, ctx.device)}", src)
      sizes = (ctypes.c_size_t * 1)()
      check(lib.clGetProgramInfo(program, lib.CL_PROGRAM_BINARY_SIZES, ctypes.sizeof(sizes), sizes, None), "clGetProgramInfo(BINARY_SIZES)")
      binary = (ctypes.c_ubyte * sizes[0])()
      ptrs = (ctypes.POINTER(ctypes.c_ubyte) * 1)(ctypes.cast(binary, ctypes.POINTER(ctypes.c_ubyte)))
      check(lib.clGetProgramInfo(program, lib.CL_PROGRAM_BINARIES, ctypes.sizeof(ptrs), ptrs, None), "clGetProgramInfo(BINARIES)")
      if sizes[0] == 0:
        raise CompileError(f"OpenCL GPU:{self.ordinal} built the kernel but returned an empty program binary", src)
      return bytes(binary)
    finally:
      lib.clReleaseProgram(program)
