"""The CUDA runtime through the driver API (gpuctypes): contexts, memory, copies, kernel launch, timing.

Run on an H100 by `hardware_check.sh` (see the README). Every driver call goes through `check`, which names the call and
the CUDA error; after a kernel faults (an illegal or misaligned address) the context stays broken and every later call
reports that error.

All work is issued on the legacy default stream, so kernels, copies and graph launches of one context run in order;
`copyout` and `synchronize` are the points where the host waits.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any, Dict, List, Optional, Tuple

from tiny.backend import BufferOptions, Compiled, LRUAllocator

_CUDA: Any = None


class CUDAError(RuntimeError):
  """A CUDA driver call failed (the message names the call and the CUDA error)."""


class CUDADriverMissing(CUDAError):
  """libcuda could not be loaded, or it does not provide the driver API."""


def driver_problem() -> Optional[str]:
  """None when the CUDA driver can be loaded and bound here, else why not. Never raises."""
  try:
    cuda()
    return None
  except CUDADriverMissing as e:
    return str(e)
  except Exception as e:  # noqa: BLE001 - a probe reports, it does not raise
    return f"loading the CUDA driver failed: {type(e).__name__}: {e}"


def cuda() -> Any:
  """gpuctypes.cuda with its symbols bound. libcuda is loaded first with RTLD_GLOBAL: gpuctypes looks it up with
  find_library (ldconfig), which misses drivers installed outside the loader cache, and binds nothing when it fails."""
  global _CUDA
  if _CUDA is not None:
    return _CUDA
  lib = None
  for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
    try:
      lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
      break
    except OSError:
      continue
  if lib is None:
    raise CUDADriverMissing("no CUDA driver (libcuda) found")
  try:
    import gpuctypes.cuda as gcuda
  except ImportError as e:
    raise CUDADriverMissing(f"gpuctypes is not installed ({e}): pip install gpuctypes") from e
  if not hasattr(gcuda, "cuInit"):
    raise CUDADriverMissing("no CUDA driver (libcuda) found: gpuctypes bound no driver symbols")
  _CUDA = gcuda
  return gcuda


def check(status: int, what: str) -> None:
  """Raise CUDAError naming the call when a driver call did not return CUDA_SUCCESS."""
  if status != 0:
    cu = cuda()
    msg = ctypes.POINTER(ctypes.c_char)()
    desc = "unknown error"
    if cu.cuGetErrorString(status, ctypes.byref(msg)) == 0 and msg:
      desc = ctypes.string_at(msg).decode(errors="replace")
    raise CUDAError(f"{what} failed: CUDA error {status} ({desc})")


# *** devices and contexts ***

_initialized = False
_contexts: Dict[int, Any] = {}


def device_count() -> int:
  """How many CUDA GPUs the driver sees."""
  _init()
  n = ctypes.c_int32()
  check(cuda().cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
  return n.value


def _init() -> None:
  global _initialized
  if not _initialized:
    check(cuda().cuInit(0), "cuInit")
    _initialized = True


def _cudevice(ordinal: int) -> Any:
  _init()
  dev = ctypes.c_int32()
  check(cuda().cuDeviceGet(ctypes.byref(dev), ordinal), f"cuDeviceGet({ordinal})")
  return dev


def context(ordinal: int) -> Any:
  """The (primary) context of GPU `ordinal`, made current. One per ordinal, shared with other libraries (torch)."""
  cu = cuda()
  if ordinal not in _contexts:
    count = device_count()
    if not 0 <= ordinal < count:
      raise CUDAError(f"CUDA device {ordinal} does not exist: the driver sees {count} GPU(s)")
    ctx = cu.CUcontext()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), _cudevice(ordinal)), f"cuDevicePrimaryCtxRetain({ordinal})")
    _contexts[ordinal] = ctx
  check(cu.cuCtxSetCurrent(_contexts[ordinal]), f"cuCtxSetCurrent({ordinal})")
  return _contexts[ordinal]


def compute_capability(ordinal: int) -> str:
  """'sm_XY' of GPU `ordinal`."""
  major, minor = ctypes.c_int32(), ctypes.c_int32()
  check(cuda().cuDeviceComputeCapability(ctypes.byref(major), ctypes.byref(minor), _cudevice(ordinal)), "cuDeviceComputeCapability")
  return f"sm_{major.value}{minor.value}"


def synchronize(ordinal: int) -> None:
  """Wait until all work queued in the context of GPU `ordinal` is done."""
  context(ordinal)
  check(cuda().cuCtxSynchronize(), "cuCtxSynchronize")


# *** memory ***

class _Pinned:
  """A page-locked host buffer (fast, asynchronous DMA) and a ctypes view of it."""

  def __init__(self, size: int):
    self.size = size
    ptr = ctypes.c_void_p()
    check(cuda().cuMemHostAlloc(ctypes.byref(ptr), size, 0), f"cuMemHostAlloc({size})")
    self.ptr = ptr.value or 0
    self.mv = memoryview((ctypes.c_uint8 * size).from_address(self.ptr)).cast("B")

  def free(self) -> None:
    if self.ptr:
      cuda().cuMemFreeHost(ctypes.c_void_p(self.ptr))
      self.ptr = 0


class CUDAAllocator(LRUAllocator):
  """Device memory of one GPU (opaque handles are device pointers as ints); host-visible buffers are pinned memory.

  copyin stages through pinned buffers and returns at once (the DMA runs in order with the kernels); the staging
  buffers come back to a small pool when the device synchronizes."""

  def __init__(self, ordinal: int = 0):
    self.ordinal = ordinal
    self._staging_free: List[_Pinned] = []
    self._staging_busy: List[_Pinned] = []
    super().__init__()

  def _alloc(self, size: int, options: BufferOptions) -> Any:
    context(self.ordinal)
    if getattr(options, "host", False):
      return _Pinned(size)
    ptr = ctypes.c_uint64()
    check(cuda().cuMemAlloc_v2(ctypes.byref(ptr), max(1, size)), f"cuMemAlloc({size}) on CUDA:{self.ordinal}")
    return ptr.value

  def _free(self, opaque: Any, options: BufferOptions) -> None:
    context(self.ordinal)
    if isinstance(opaque, _Pinned):
      opaque.free()
    else:
      check(cuda().cuMemFree_v2(opaque), "cuMemFree")

  def as_buffer(self, src: Any) -> memoryview:
    """Zero-copy view of a host (pinned) buffer; device memory has none."""
    if not isinstance(src, _Pinned):
      raise TypeError("only host-visible (pinned) CUDA buffers have a zero-copy view")
    self.synchronize()
    return src.mv

  def _staging(self, size: int) -> _Pinned:
    for i, b in enumerate(self._staging_free):
      if b.size >= size:
        return self._staging_free.pop(i)
    return _Pinned(max(size, 1 << 20))

  def copyin(self, dest: Any, src: memoryview) -> None:
    """Host -> device, asynchronous (src is copied to pinned memory first, so the caller may reuse it at once)."""
    context(self.ordinal)
    src = src.cast("B") if src.format != "B" or src.ndim != 1 else src
    stage = self._staging(len(src))
    stage.mv[:len(src)] = src
    self._staging_busy.append(stage)
    check(cuda().cuMemcpyHtoDAsync_v2(dest, ctypes.c_void_p(stage.ptr), len(src), None), "cuMemcpyHtoDAsync")

  def copyout(self, dest: memoryview, src: Any) -> None:
    """Device -> host; waits for every kernel queued before it."""
    context(self.ordinal)
    dest = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    stage = self._staging(len(dest))
    try:
      check(cuda().cuMemcpyDtoHAsync_v2(ctypes.c_void_p(stage.ptr), src, len(dest), None), "cuMemcpyDtoHAsync")
      self.synchronize()
      dest[:] = stage.mv[:len(dest)]
    finally:
      self._staging_free.append(stage)

  def transfer(self, dest: Any, src: Any, sz: int, src_dev: Any = None, dest_dev: Any = None) -> None:
    """Device -> device: within one GPU a DtoD copy, across GPUs a peer copy (through the host if peers cannot see each other)."""
    src_ord = getattr(getattr(src_dev, "allocator", None), "ordinal", self.ordinal)
    dest_ord = getattr(getattr(dest_dev, "allocator", None), "ordinal", self.ordinal)
    cu = cuda()
    if src_ord == dest_ord:
      context(dest_ord)
      check(cu.cuMemcpyDtoDAsync_v2(dest, src, sz, None), "cuMemcpyDtoDAsync")
      return
    src_ctx, dest_ctx = context(src_ord), context(dest_ord)
    synchronize(src_ord)   # the source may still be written by kernels queued in the other context
    context(dest_ord)
    check(cu.cuMemcpyPeerAsync(dest, dest_ctx, src, src_ctx, sz, None), f"cuMemcpyPeerAsync(CUDA:{src_ord} -> CUDA:{dest_ord})")

  def offset(self, buf: Any, size: int, offset: int) -> Any:
    """A view into a device buffer: the pointer moved by offset bytes."""
    if isinstance(buf, _Pinned):
      raise TypeError("views of pinned host buffers are not supported")
    return buf + offset

  def synchronize(self) -> None:
    """Wait for the GPU, then recycle the staging buffers of finished copies."""
    synchronize(self.ordinal)
    self._staging_free.extend(self._staging_busy)
    self._staging_busy.clear()


# *** programs ***

def _timed(ordinal: int, launch: Any) -> float:
  """Run launch() between two events and return the seconds between them."""
  cu = cuda()
  st, en = cu.CUevent(), cu.CUevent()
  check(cu.cuEventCreate(ctypes.byref(st), 0), "cuEventCreate")
  check(cu.cuEventCreate(ctypes.byref(en), 0), "cuEventCreate")
  try:
    check(cu.cuEventRecord(st, None), "cuEventRecord")
    launch()
    check(cu.cuEventRecord(en, None), "cuEventRecord")
    check(cu.cuEventSynchronize(en), "cuEventSynchronize")
    ms = ctypes.c_float()
    check(cu.cuEventElapsedTime(ctypes.byref(ms), st, en), "cuEventElapsedTime")
    return ms.value * 1e-3
  finally:
    cu.cuEventDestroy_v2(st)
    cu.cuEventDestroy_v2(en)


class KernelArgs:
  """The kernelParams array of a launch: a pointer to each argument (u64 device pointers, then int32 variables)."""

  def __init__(self, bufs: Tuple[Any, ...], vals: Tuple[int, ...]):
    self.values: List[Any] = [ctypes.c_uint64(b) for b in bufs] + [ctypes.c_int32(v) for v in vals]
    self.params = (ctypes.c_void_p * max(1, len(self.values)))(*[ctypes.addressof(v) for v in self.values])

  def set_buf(self, i: int, ptr: int) -> None:
    """Point buffer argument i at another device pointer (the kernelParams array stays valid)."""
    self.values[i].value = ptr


class CUDAProgram:
  """A kernel loaded from a CUBIN (or PTX, which the driver JITs) into the context of GPU `ordinal`."""

  def __init__(self, ordinal: int, name: str, lib: bytes):
    self.ordinal, self.name, self.lib = ordinal, name, lib
    cu = cuda()
    context(ordinal)
    self.module = cu.CUmodule()
    image = ctypes.create_string_buffer(lib + (b"\x00" if not lib.startswith(b"\x7fELF") else b""))
    check(cu.cuModuleLoadData(ctypes.byref(self.module), image), f"cuModuleLoadData({name})")
    self.fn = cu.CUfunction()
    check(cu.cuModuleGetFunction(ctypes.byref(self.fn), self.module, name.encode()), f"cuModuleGetFunction({name})")

  def __call__(self, *bufs: Any, global_size: Tuple[int, ...] = (1, 1, 1), local_size: Optional[Tuple[int, ...]] = (1, 1, 1),
               vals: Tuple[int, ...] = (), wait: bool = False) -> Optional[float]:
    gsz = (tuple(global_size) + (1, 1, 1))[:3]
    lsz = (tuple(local_size or (1, 1, 1)) + (1, 1, 1))[:3]
    args = KernelArgs(bufs, vals)
    cu = cuda()
    context(self.ordinal)

    def launch() -> None:
      check(cu.cuLaunchKernel(self.fn, *gsz, *lsz, 0, None, args.params, None), f"cuLaunchKernel({self.name}, grid={gsz}, block={lsz})")
    if wait:
      return _timed(self.ordinal, launch)
    launch()
    return None

  def __del__(self) -> None:
    if getattr(self, "module", None) is not None and _CUDA is not None:
      try:
        _CUDA.cuModuleUnload(self.module)
      except Exception:  # noqa: BLE001 - interpreter shutdown
        pass


def program_loader(ordinal: int) -> Any:
  """runtime(name, lib) -> CUDAProgram for GPU `ordinal`."""
  return functools.partial(CUDAProgram, ordinal)


class CUDADevice(Compiled):
  """CUDA:N. Renderer and compiler target the GPU's compute capability."""

  def __init__(self, device: str, ordinal: int, renderer: Any, compiler: Any, graph: Any):
    self.ordinal = ordinal
    super().__init__(device, CUDAAllocator(ordinal), renderer, compiler, program_loader(ordinal), graph)

  def synchronize(self) -> None:
    """Wait for every kernel and copy queued on this GPU."""
    alloc: Any = self.allocator
    alloc.synchronize()
