"""The OpenCL runtime through `gpuctypes.opencl`: platforms and devices, contexts and queues, buffers, kernel launch.

Devices are numbered across all platforms in the order the ICD loader lists them (platform by platform), so `GPU` is
the first OpenCL device of the first platform and `GPU:1` the next one. Each device gets one context and one in-order
queue with profiling on: kernels and copies run in the order they were queued, `copyout` (a blocking read) and
`synchronize` (clFinish) are where the host waits.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from tiny.backend import BufferOptions, Compiled, LRUAllocator

INSTALL_HINT = "install pocl-opencl-icd ocl-icd-libopencl1 for a CPU OpenCL"
CL_PLATFORM_NOT_FOUND_KHR = -1001

_CL: Any = None


class OpenCLError(RuntimeError):
  """An OpenCL call failed (the message names the call and the error code)."""


class OpenCLUnavailable(OpenCLError):
  """There is no usable OpenCL here: no ICD loader (libOpenCL), no platform, or no device."""


# the error codes a user is likely to meet, by name; the rest are reported by number
_ERRORS = {0: "CL_SUCCESS", -1: "CL_DEVICE_NOT_FOUND", -2: "CL_DEVICE_NOT_AVAILABLE", -3: "CL_COMPILER_NOT_AVAILABLE",
           -4: "CL_MEM_OBJECT_ALLOCATION_FAILURE", -5: "CL_OUT_OF_RESOURCES", -6: "CL_OUT_OF_HOST_MEMORY", -11: "CL_BUILD_PROGRAM_FAILURE",
           -13: "CL_MISALIGNED_SUB_BUFFER_OFFSET", -30: "CL_INVALID_VALUE", -33: "CL_INVALID_DEVICE", -34: "CL_INVALID_CONTEXT",
           -36: "CL_INVALID_COMMAND_QUEUE", -38: "CL_INVALID_MEM_OBJECT", -42: "CL_INVALID_BINARY", -44: "CL_INVALID_PROGRAM",
           -45: "CL_INVALID_PROGRAM_EXECUTABLE", -46: "CL_INVALID_KERNEL_NAME", -48: "CL_INVALID_KERNEL", -49: "CL_INVALID_ARG_INDEX",
           -50: "CL_INVALID_ARG_VALUE", -51: "CL_INVALID_ARG_SIZE", -52: "CL_INVALID_KERNEL_ARGS", -53: "CL_INVALID_WORK_DIMENSION",
           -54: "CL_INVALID_WORK_GROUP_SIZE", -55: "CL_INVALID_WORK_ITEM_SIZE", -56: "CL_INVALID_GLOBAL_OFFSET", -61: "CL_INVALID_BUFFER_SIZE",
           -63: "CL_INVALID_GLOBAL_WORK_SIZE", CL_PLATFORM_NOT_FOUND_KHR: "CL_PLATFORM_NOT_FOUND_KHR"}


def error_name(status: int) -> str:
  """'CL_INVALID_VALUE' for -30; unknown codes as 'CL error N'."""
  return _ERRORS.get(status, f"CL error {status}")


def check(status: int, what: str) -> None:
  """Raise OpenCLError naming the call when an OpenCL call did not return CL_SUCCESS."""
  if status != 0:
    raise OpenCLError(f"{what} failed: {error_name(status)} ({status})")


def cl() -> Any:
  """gpuctypes.opencl with its symbols bound. libOpenCL is loaded first with RTLD_GLOBAL: gpuctypes finds it with
  find_library (ldconfig), which misses loaders outside the cache, and then silently binds nothing."""
  global _CL
  if _CL is not None:
    return _CL
  lib = None
  for name in ("libOpenCL.so.1", "libOpenCL.so", ctypes.util.find_library("OpenCL")):
    if not name:
      continue
    try:
      lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
      break
    except OSError:
      continue
  if lib is None:
    raise OpenCLUnavailable(f"no OpenCL ICD loader (libOpenCL.so.1) found; {INSTALL_HINT}")
  try:
    import gpuctypes.opencl as gcl
  except ImportError as e:
    raise OpenCLUnavailable(f"gpuctypes is not installed ({e}): pip install gpuctypes") from e
  if not hasattr(gcl, "clGetPlatformIDs"):
    raise OpenCLUnavailable(f"gpuctypes bound no OpenCL symbols (libOpenCL not found by ctypes.util.find_library); {INSTALL_HINT}")
  _CL = gcl
  return gcl


# *** platforms and devices ***

def _info_bytes(getter: Any, obj: Any, param: int) -> bytes:
  size = ctypes.c_size_t()
  check(getter(obj, param, 0, None, ctypes.byref(size)), f"{getter.__name__}({param:#x})")
  buf = ctypes.create_string_buffer(size.value)
  check(getter(obj, param, size.value, buf, None), f"{getter.__name__}({param:#x})")
  return buf.raw[:size.value]


def _info_str(getter: Any, obj: Any, param: int) -> str:
  return _info_bytes(getter, obj, param).rstrip(b"\x00").decode(errors="replace").strip()


def _info_int(getter: Any, obj: Any, param: int) -> int:
  return int.from_bytes(_info_bytes(getter, obj, param), "little")


def platforms() -> List[Any]:
  """Every OpenCL platform the ICD loader knows (empty when it knows none)."""
  lib = cl()
  n = ctypes.c_uint32()
  status = lib.clGetPlatformIDs(0, None, ctypes.byref(n))
  if status == CL_PLATFORM_NOT_FOUND_KHR or n.value == 0:
    return []
  check(status, "clGetPlatformIDs")
  ids = (lib.cl_platform_id * n.value)()
  check(lib.clGetPlatformIDs(n.value, ids, None), "clGetPlatformIDs")
  return list(ids)


@functools.lru_cache(None)
def devices() -> Tuple[Tuple[Any, Any], ...]:
  """(platform, device) of every OpenCL device, platform by platform: index N is `GPU:N`."""
  lib = cl()
  out: List[Tuple[Any, Any]] = []
  for plat in platforms():
    n = ctypes.c_uint32()
    if lib.clGetDeviceIDs(plat, lib.CL_DEVICE_TYPE_ALL, 0, None, ctypes.byref(n)) != 0 or n.value == 0:
      continue   # CL_DEVICE_NOT_FOUND: a platform without devices is skipped
    ids = (lib.cl_device_id * n.value)()
    check(lib.clGetDeviceIDs(plat, lib.CL_DEVICE_TYPE_ALL, n.value, ids, None), "clGetDeviceIDs")
    out += [(plat, d) for d in ids]
  return tuple(out)


def opencl_problem() -> Optional[str]:
  """None when an OpenCL device can run kernels here, else why not (no loader, no platform, no device). Never raises."""
  try:
    if not platforms():
      return f"the OpenCL ICD loader found no platform (no OpenCL driver installed); {INSTALL_HINT}"
    if not devices():
      return f"the OpenCL platforms have no device; {INSTALL_HINT}"
  except OpenCLUnavailable as e:
    return str(e)
  except Exception as e:  # noqa: BLE001 - a probe reports, it does not raise
    return f"OpenCL failed to start: {type(e).__name__}: {e}"
  return None


@dataclass(frozen=True)
class DeviceInfo:
  """What tiny needs to know about one OpenCL device (clGetDeviceInfo / clGetPlatformInfo)."""
  ordinal: int
  platform: str
  name: str
  version: str
  driver: str
  extensions: Tuple[str, ...]
  max_work_group_size: int
  max_work_item_sizes: Tuple[int, ...]
  local_mem_size: int
  base_addr_align: int   # bytes a sub-buffer's offset must be a multiple of
  max_alloc: int
  correct_div_sqrt: bool   # CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT: -cl-fp32-correctly-rounded-divide-sqrt is allowed

  @property
  def fp16(self) -> bool:
    return "cl_khr_fp16" in self.extensions

  @property
  def fp64(self) -> bool:
    return "cl_khr_fp64" in self.extensions


def _device(ordinal: int) -> Tuple[Any, Any]:
  devs = devices()
  if not devs:
    raise OpenCLUnavailable(opencl_problem() or "no OpenCL device")
  if not 0 <= ordinal < len(devs):
    raise OpenCLError(f"OpenCL device {ordinal} does not exist: there are {len(devs)} device(s) (GPU .. GPU:{len(devs) - 1})")
  return devs[ordinal]


@functools.lru_cache(None)
def device_info(ordinal: int) -> DeviceInfo:
  """The DeviceInfo of device `ordinal` (GPU:ordinal)."""
  lib = cl()
  plat, dev = _device(ordinal)
  g, p = lib.clGetDeviceInfo, lib.clGetPlatformInfo
  sizes = _info_bytes(g, dev, lib.CL_DEVICE_MAX_WORK_ITEM_SIZES)
  return DeviceInfo(ordinal=ordinal, platform=_info_str(p, plat, lib.CL_PLATFORM_NAME), name=_info_str(g, dev, lib.CL_DEVICE_NAME),
                    version=_info_str(g, dev, lib.CL_DEVICE_VERSION), driver=_info_str(g, dev, lib.CL_DRIVER_VERSION),
                    extensions=tuple(_info_str(g, dev, lib.CL_DEVICE_EXTENSIONS).split()),
                    max_work_group_size=_info_int(g, dev, lib.CL_DEVICE_MAX_WORK_GROUP_SIZE),
                    max_work_item_sizes=tuple(int.from_bytes(sizes[i:i + 8], "little") for i in range(0, len(sizes), 8)),
                    local_mem_size=_info_int(g, dev, lib.CL_DEVICE_LOCAL_MEM_SIZE),
                    base_addr_align=max(1, _info_int(g, dev, lib.CL_DEVICE_MEM_BASE_ADDR_ALIGN) // 8),
                    max_alloc=_info_int(g, dev, lib.CL_DEVICE_MAX_MEM_ALLOC_SIZE),
                    correct_div_sqrt=bool(_info_int(g, dev, lib.CL_DEVICE_SINGLE_FP_CONFIG) & lib.CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT))


class _Ctx:
  """The context and the in-order, profiling queue of one device."""

  def __init__(self, ordinal: int):
    lib = cl()
    self.ordinal = ordinal
    self.platform, self.device = _device(ordinal)
    err = ctypes.c_int32()
    dev = (lib.cl_device_id * 1)(self.device)
    notify = lib.clCreateContext.argtypes[3]()   # calling a CFUNCTYPE with no function gives a NULL callback
    self.context = lib.clCreateContext(None, 1, dev, notify, None, ctypes.byref(err))
    check(err.value, f"clCreateContext(GPU:{ordinal})")
    self.queue = lib.clCreateCommandQueue(self.context, self.device, lib.CL_QUEUE_PROFILING_ENABLE, ctypes.byref(err))
    check(err.value, f"clCreateCommandQueue(GPU:{ordinal})")

  def finish(self) -> None:
    check(cl().clFinish(self.queue), f"clFinish(GPU:{self.ordinal})")


_contexts: Dict[int, _Ctx] = {}


def context(ordinal: int) -> _Ctx:
  """The context (and queue) of device `ordinal`, made on first use."""
  if ordinal not in _contexts:
    _contexts[ordinal] = _Ctx(ordinal)
  return _contexts[ordinal]


# *** memory ***

class CLBuffer:
  """A cl_mem, or a view of one: `offset` bytes into `base`. A view a kernel can take needs a sub-buffer, which OpenCL
  only makes at offsets aligned to the device's CL_DEVICE_MEM_BASE_ADDR_ALIGN; copies work at any offset."""

  def __init__(self, mem: Any, size: int, offset: int = 0, base: Optional[CLBuffer] = None):
    self.mem, self.size, self.offset, self.base = mem, size, offset, base
    self.sub: Any = None   # the sub-buffer of an aligned view, made when a kernel first needs it

  def __del__(self) -> None:
    # a view is never freed through the allocator (core frees only the buffers it allocated): release its sub-buffer here
    if self.base is not None and self.sub is not None and _CL is not None:
      try:
        _CL.clReleaseMemObject(self.sub)
      except Exception:  # noqa: BLE001 - interpreter shutdown
        pass
      self.sub = None

  @property
  def root(self) -> Any:
    """The cl_mem that holds the bytes (a view's base's)."""
    return self.base.mem if self.base is not None else self.mem


class CLAllocator(LRUAllocator):
  """Device memory of one OpenCL device: clCreateBuffer, blocking reads and writes, sub-buffer views."""

  def __init__(self, ordinal: int = 0):
    self.ordinal = ordinal
    self.ctx = context(ordinal)
    super().__init__()

  def _alloc(self, size: int, options: BufferOptions) -> CLBuffer:
    lib = cl()
    err = ctypes.c_int32()
    mem = lib.clCreateBuffer(self.ctx.context, lib.CL_MEM_READ_WRITE, size, None, ctypes.byref(err))
    if err.value in (-4, -5, -6):
      # MemoryError makes the LRU allocator free its cache and retry once
      raise MemoryError(f"clCreateBuffer({size}) on GPU:{self.ordinal}: {error_name(err.value)}")
    check(err.value, f"clCreateBuffer({size}) on GPU:{self.ordinal}")
    return CLBuffer(mem, size)

  def _free(self, opaque: CLBuffer, options: BufferOptions) -> None:
    lib = cl()
    if opaque.sub is not None:
      lib.clReleaseMemObject(opaque.sub)
      opaque.sub = None
    if opaque.base is None and opaque.mem is not None:
      check(lib.clReleaseMemObject(opaque.mem), "clReleaseMemObject")
      opaque.mem = None

  def copyin(self, dest: CLBuffer, src: memoryview) -> None:
    """Host -> device; blocking, so the caller may reuse src at once."""
    src = src.cast("B") if src.format != "B" or src.ndim != 1 else src
    if len(src) == 0:
      return
    data = (ctypes.c_char * len(src)).from_buffer_copy(src) if src.readonly else (ctypes.c_char * len(src)).from_buffer(src)
    check(cl().clEnqueueWriteBuffer(self.ctx.queue, dest.root, True, dest.offset, len(src), data, 0, None, None), "clEnqueueWriteBuffer")

  def copyout(self, dest: memoryview, src: CLBuffer) -> None:
    """Device -> host; blocking, and the queue is in order, so every kernel queued before it has finished."""
    dest = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    if len(dest) == 0:
      return
    data = (ctypes.c_char * len(dest)).from_buffer(dest)
    check(cl().clEnqueueReadBuffer(self.ctx.queue, src.root, True, src.offset, len(dest), data, 0, None, None), "clEnqueueReadBuffer")

  def offset(self, buf: CLBuffer, size: int, offset: int) -> CLBuffer:
    """A view `offset` bytes into buf. Copies through it work at any offset; kernels can take it only at offsets that are
    a multiple of the device's base address alignment (OpenCL sub-buffers)."""
    base = buf.base if buf.base is not None else buf
    return CLBuffer(base.mem, size, buf.offset + offset, base)

  def kernel_mem(self, buf: CLBuffer) -> Any:
    """The cl_mem a kernel argument takes for buf: the buffer itself, or a view's sub-buffer."""
    if buf.base is None:
      return buf.mem
    if buf.sub is None:
      align = device_info(self.ordinal).base_addr_align
      if buf.offset % align != 0:
        raise OpenCLError(f"a kernel cannot take a view at byte offset {buf.offset} on GPU:{self.ordinal}: OpenCL sub-buffers need "
                          f"offsets that are multiples of {align} bytes (caps.buffer_views is False, so core never asks for one)")
      lib = cl()
      region = lib.struct__cl_buffer_region(origin=buf.offset, size=max(1, buf.size))
      err = ctypes.c_int32()
      buf.sub = lib.clCreateSubBuffer(buf.root, lib.CL_MEM_READ_WRITE, lib.CL_BUFFER_CREATE_TYPE_REGION, ctypes.byref(region), ctypes.byref(err))
      check(err.value, f"clCreateSubBuffer(offset={buf.offset}, size={buf.size})")
    return buf.sub

  def transfer(self, dest: CLBuffer, src: CLBuffer, sz: int, src_dev: Any = None, dest_dev: Any = None) -> None:
    """Device -> device within one context (clEnqueueCopyBuffer); across devices through the host."""
    src_alloc = getattr(src_dev, "allocator", self)
    if getattr(src_alloc, "ordinal", self.ordinal) == self.ordinal:
      check(cl().clEnqueueCopyBuffer(self.ctx.queue, src.root, dest.root, src.offset, dest.offset, sz, 0, None, None), "clEnqueueCopyBuffer")
      return
    host = memoryview(bytearray(sz))
    src_alloc.copyout(host, src)
    self.copyin(dest, host)

  def synchronize(self) -> None:
    """Wait until the queue is empty (clFinish)."""
    self.ctx.finish()


# *** programs ***

class CLProgram:
  """A kernel loaded from a program binary (what CLCompiler returns) on device `ordinal`."""

  def __init__(self, ordinal: int, name: str, lib: bytes):
    self.ordinal, self.name, self.lib = ordinal, name, lib
    self.ctx = context(ordinal)
    self.allocator: Optional[CLAllocator] = None
    api = cl()
    err, status = ctypes.c_int32(), ctypes.c_int32()
    binary = (ctypes.c_ubyte * len(lib)).from_buffer_copy(lib)
    bins = (ctypes.POINTER(ctypes.c_ubyte) * 1)(ctypes.cast(binary, ctypes.POINTER(ctypes.c_ubyte)))
    dev = (api.cl_device_id * 1)(self.ctx.device)
    self.program = api.clCreateProgramWithBinary(self.ctx.context, 1, dev, (ctypes.c_uint64 * 1)(len(lib)), bins, ctypes.byref(status),
                                                 ctypes.byref(err))
    check(err.value, f"clCreateProgramWithBinary({name})")
    check(status.value, f"clCreateProgramWithBinary({name}) binary status")
    # a program made from a binary must still be built (for a binary this is a link step, it does not recompile)
    check(api.clBuildProgram(self.program, 1, dev, None, api.clBuildProgram.argtypes[4](), None), f"clBuildProgram({name})")
    self.kernel = api.clCreateKernel(self.program, name.encode(), ctypes.byref(err))
    check(err.value, f"clCreateKernel({name})")

  def __call__(self, *bufs: Any, global_size: Tuple[int, ...] = (1, 1, 1), local_size: Optional[Tuple[int, ...]] = None,
               vals: Tuple[int, ...] = (), wait: bool = False) -> Optional[float]:
    api = cl()
    alloc = self.allocator
    for i, b in enumerate(bufs):
      mem = alloc.kernel_mem(b) if alloc is not None and isinstance(b, CLBuffer) else (b.mem if isinstance(b, CLBuffer) else b)
      check(api.clSetKernelArg(self.kernel, i, ctypes.sizeof(ctypes.c_void_p), ctypes.byref(mem)), f"clSetKernelArg({self.name}, {i})")
    for i, v in enumerate(vals, start=len(bufs)):
      check(api.clSetKernelArg(self.kernel, i, 4, ctypes.byref(ctypes.c_int32(v))), f"clSetKernelArg({self.name}, {i})")
    gsz = (tuple(global_size) + (1, 1, 1))[:3]
    # OpenCL's global size counts work-items, tiny's counts groups: multiply by the group size
    lsz = None if local_size is None else (tuple(local_size) + (1, 1, 1))[:3]
    items = tuple(g * (lsz[i] if lsz is not None else 1) for i, g in enumerate(gsz))
    if any(x == 0 for x in items):
      return 0.0 if wait else None
    gl = (ctypes.c_uint64 * 3)(*items)
    lo = (ctypes.c_uint64 * 3)(*lsz) if lsz is not None else None
    event = api.cl_event()
    st = time.perf_counter()
    check(api.clEnqueueNDRangeKernel(self.ctx.queue, self.kernel, 3, None, gl, lo, 0, None, ctypes.byref(event) if wait else None),
          f"clEnqueueNDRangeKernel({self.name}, global={items}, local={lsz})")
    if not wait:
      return None
    try:
      check(api.clWaitForEvents(1, ctypes.byref(event)), "clWaitForEvents")
      start, end = ctypes.c_uint64(), ctypes.c_uint64()
      st1 = api.clGetEventProfilingInfo(event, api.CL_PROFILING_COMMAND_START, 8, ctypes.byref(start), None)
      st2 = api.clGetEventProfilingInfo(event, api.CL_PROFILING_COMMAND_END, 8, ctypes.byref(end), None)
      if st1 == 0 and st2 == 0 and end.value >= start.value:
        return (end.value - start.value) * 1e-9
      return time.perf_counter() - st   # a queue without profiling: the host's view of the launch
    finally:
      api.clReleaseEvent(event)

  def __del__(self) -> None:
    if _CL is None:
      return
    try:
      if getattr(self, "kernel", None):
        _CL.clReleaseKernel(self.kernel)
      if getattr(self, "program", None):
        _CL.clReleaseProgram(self.program)
    except Exception:  # noqa: BLE001 - interpreter shutdown
      pass


class CLDevice(Compiled):
  """GPU:N: one OpenCL device with its allocator, renderer, compiler and programs."""

  def __init__(self, device: str, ordinal: int, renderer: Any, compiler: Any):
    self.ordinal = ordinal
    self.cl_allocator = CLAllocator(ordinal)
    super().__init__(device, self.cl_allocator, renderer, compiler, self._load)

  def _load(self, name: str, lib: bytes) -> CLProgram:
    prg = CLProgram(self.ordinal, name, lib)
    prg.allocator = self.cl_allocator   # so that views become sub-buffers at launch
    return prg

  def synchronize(self) -> None:
    """Wait for every kernel and copy queued on this device."""
    self.cl_allocator.synchronize()
