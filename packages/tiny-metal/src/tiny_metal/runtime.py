"""The Metal runtime through the Objective-C runtime and ctypes: device, libraries, pipelines, buffers, kernel launch.

Nothing here loads at import time: importing this module is safe on any OS, and `ObjC.load()` (called on first use) is
where libobjc and Metal.framework are opened, which only succeeds on macOS. Every message goes through `ObjC.send`, which
casts `objc_msgSend` to a function type built from that call's argument and return types (objc_msgSend has no prototype
of its own), and checks that the selector's arity matches the arguments given. Tests substitute a fake `ObjC`.

Memory is `MTLStorageModeShared`: a buffer's `contents` is host memory (Apple silicon is unified), so copies are memmoves
and `as_buffer` is zero-copy; a view is the same MTLBuffer bound at a byte offset (`setBuffer:offset:atIndex:`). Kernels
are encoded one command buffer each, committed without waiting; copies and `synchronize` wait for every command buffer in
flight first, so the host never reads memory a kernel is still writing.
"""
from __future__ import annotations

import ctypes
import functools
import platform
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tiny.backend import BufferOptions, Compiled, LRUAllocator, getenv, prod

from tiny_metal.renderer import MSL_VERSION

LIBOBJC = "/usr/lib/libobjc.dylib"
METAL_FRAMEWORK = "/System/Library/Frameworks/Metal.framework/Metal"
LIBSYSTEM = "/usr/lib/libSystem.B.dylib"   # libdispatch: dispatch_data_create

MTLResourceStorageModeShared = 0
MTLPipelineOptionNone = 0
MTLCommandBufferStatusError = 5
METALLIB_MAGIC = b"MTLB"


def mtl_language_version(major: int, minor: int) -> int:
  """The MTLLanguageVersion enum value of an MSL version (major << 16 | minor: 3.1 -> 196609)."""
  return (major << 16) | minor


class ObjCError(RuntimeError):
  """A message could not be sent (no class of that name, or arguments that do not fit the selector)."""


class MetalError(RuntimeError):
  """Metal reported a failure: the message is Metal's own (NSError localizedDescription) where it gave one."""


class MTLSize(ctypes.Structure):
  """Metal's MTLSize: three NSUIntegers, passed by value."""
  _fields_ = [("width", ctypes.c_ulong), ("height", ctypes.c_ulong), ("depth", ctypes.c_ulong)]


class NSRange(ctypes.Structure):
  """Foundation's NSRange: location and length, passed by value."""
  _fields_ = [("location", ctypes.c_ulong), ("length", ctypes.c_ulong)]


# *** the Objective-C runtime ***

class ObjC:
  """libobjc (+ Metal.framework and libdispatch) through ctypes. Object handles are ints (None for nil)."""

  def __init__(self, libobjc: Any, metal: Any, libsystem: Any):
    self.libobjc, self.metal, self.libsystem = libobjc, metal, libsystem
    libobjc.objc_getClass.restype, libobjc.objc_getClass.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    libobjc.sel_registerName.restype, libobjc.sel_registerName.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    libobjc.objc_autoreleasePoolPush.restype, libobjc.objc_autoreleasePoolPush.argtypes = ctypes.c_void_p, []
    libobjc.objc_autoreleasePoolPop.restype, libobjc.objc_autoreleasePoolPop.argtypes = None, [ctypes.c_void_p]
    metal.MTLCreateSystemDefaultDevice.restype, metal.MTLCreateSystemDefaultDevice.argtypes = ctypes.c_void_p, []
    libsystem.dispatch_data_create.restype = ctypes.c_void_p
    libsystem.dispatch_data_create.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p]
    self._sels: Dict[str, int] = {}
    self._fns: Dict[Tuple[Any, ...], Callable[..., Any]] = {}

  @staticmethod
  def load() -> ObjC:
    """The real runtime; ObjCError off macOS."""
    if platform.system() != "Darwin":
      raise ObjCError(f"Metal needs macOS (this is {platform.system()})")
    try:
      return ObjC(ctypes.CDLL(LIBOBJC), ctypes.CDLL(METAL_FRAMEWORK), ctypes.CDLL(LIBSYSTEM))
    except OSError as e:
      raise ObjCError(f"cannot load the Objective-C runtime or Metal.framework: {e}") from e

  def cls(self, name: str) -> int:
    """The class object named `name`."""
    c = self.libobjc.objc_getClass(name.encode())
    if not c:
      raise ObjCError(f"no Objective-C class {name!r}")
    return c

  def sel(self, name: str) -> int:
    if name not in self._sels:
      self._sels[name] = self.libobjc.sel_registerName(name.encode())
    return self._sels[name]

  def _msgsend(self, restype: Any, argtypes: Tuple[Any, ...]) -> Callable[..., Any]:
    """objc_msgSend as a function of (self, _cmd, *argtypes) -> restype; one per signature."""
    key = (restype, argtypes)
    if key not in self._fns:
      proto = ctypes.CFUNCTYPE(restype, ctypes.c_void_p, ctypes.c_void_p, *argtypes)
      addr = ctypes.cast(self.libobjc.objc_msgSend, ctypes.c_void_p).value
      if not addr:
        raise ObjCError("libobjc has no objc_msgSend")
      self._fns[key] = proto(addr)
    return self._fns[key]

  def send(self, obj: Optional[int], selector: str, *args: Tuple[Any, Any], restype: Any = ctypes.c_void_p) -> Any:
    """[obj selector:args...]; each argument is (ctypes type, value). Sending to nil is an error here (Objective-C would
    silently return 0, which hides the real failure)."""
    if not obj:
      raise ObjCError(f"message {selector} sent to nil")
    if selector.count(":") != len(args):
      raise ObjCError(f"{selector} takes {selector.count(':')} argument(s), got {len(args)}")
    fn = self._msgsend(restype, tuple(t for t, _ in args))
    return fn(obj, self.sel(selector), *(v for _, v in args))

  # *** Foundation ***

  def nsstring(self, s: str) -> int:
    """An autoreleased NSString with the text s."""
    return self.send(self.cls("NSString"), "stringWithUTF8String:", (ctypes.c_char_p, s.encode()))

  def pystring(self, nsstring: Optional[int]) -> str:
    """The text of an NSString ('' for nil)."""
    if not nsstring:
      return ""
    raw = self.send(nsstring, "UTF8String", restype=ctypes.c_char_p)
    return raw.decode(errors="replace") if raw else ""

  def error_text(self, nserror: Optional[int]) -> Optional[str]:
    """localizedDescription of an NSError, or None when there is no error."""
    return self.pystring(self.send(nserror, "localizedDescription")) if nserror else None

  def release(self, obj: Optional[int]) -> None:
    if obj:
      self.send(obj, "release", restype=None)

  def retain(self, obj: int) -> int:
    return self.send(obj, "retain")

  def pool_push(self) -> int:
    return self.libobjc.objc_autoreleasePoolPush()

  def pool_pop(self, pool: int) -> None:
    self.libobjc.objc_autoreleasePoolPop(pool)


@functools.lru_cache(None)
def objc() -> ObjC:
  """The process's ObjC runtime, loaded on first use."""
  return ObjC.load()


def with_error(rt: ObjC, what: str, call: Callable[[Any], Optional[int]]) -> int:
  """Run a Metal call that takes an `NSError **` (passed to `call`) and returns an object; MetalError with the NSError's
  text when the object is nil."""
  err = ctypes.c_void_p(None)
  obj = call(ctypes.byref(err))
  if not obj:
    raise MetalError(f"{what} failed: {rt.error_text(err.value) or 'no error description'}")
  return obj


# *** device, libraries, pipelines ***

class MetalDeviceHandle:
  """One MTLDevice with its command queue."""

  def __init__(self, rt: ObjC, handle: int):
    self.rt, self.handle = rt, handle
    self.name = rt.pystring(rt.send(handle, "name"))
    self.queue = rt.send(handle, "newCommandQueue")
    if not self.queue:
      raise MetalError(f"{self.name}: newCommandQueue returned nil")
    self.max_threadgroup_memory = int(rt.send(handle, "maxThreadgroupMemoryLength", restype=ctypes.c_ulong))

  def compile_options(self) -> int:
    """MTLCompileOptions for the renderer's MSL version; fast math only with METAL_FAST_MATH=1 (it would fold the NaN
    tests tiny's max relies on)."""
    rt = self.rt
    opts = rt.send(rt.cls("MTLCompileOptions"), "new")
    rt.send(opts, "setLanguageVersion:", (ctypes.c_ulong, mtl_language_version(*MSL_VERSION)), restype=None)
    rt.send(opts, "setFastMathEnabled:", (ctypes.c_bool, bool(getenv("METAL_FAST_MATH", 0))), restype=None)
    return opts

  def library_from_source(self, src: str) -> MetalObject:
    """newLibraryWithSource:options:error: (Metal's compiler); MetalError with its log on failure."""
    rt = self.rt
    # the NSString and the NSError are autoreleased: drain them here, not at some outer pool that may not exist
    pool, opts = rt.pool_push(), self.compile_options()
    try:
      lib = with_error(rt, "compiling the kernel (newLibraryWithSource)", lambda err: rt.send(
        self.handle, "newLibraryWithSource:options:error:", (ctypes.c_void_p, rt.nsstring(src)), (ctypes.c_void_p, opts),
        (ctypes.c_void_p, err)))
    finally:
      rt.release(opts)
      rt.pool_pop(pool)
    return MetalObject(rt, lib)

  def library_from_data(self, data: bytes) -> MetalObject:
    """newLibraryWithData:error: for a .metallib; the bytes are copied into a dispatch_data_t."""
    rt = self.rt
    buf = ctypes.create_string_buffer(data, len(data))
    ddata = rt.libsystem.dispatch_data_create(buf, len(data), None, None)   # default destructor: dispatch copies the bytes
    if not ddata:
      raise MetalError("dispatch_data_create failed")
    try:
      lib = with_error(rt, "loading the metallib (newLibraryWithData)", lambda err: rt.send(
        self.handle, "newLibraryWithData:error:", (ctypes.c_void_p, ddata), (ctypes.c_void_p, err)))
    finally:
      rt.release(ddata)
    return MetalObject(rt, lib)

  def library(self, lib: bytes) -> MetalObject:
    """A MTLLibrary from what a METAL compiler returned: metallib bytes, else MSL source."""
    return self.library_from_data(lib) if lib[:4] == METALLIB_MAGIC else self.library_from_source(lib.decode())


class MetalObject:
  """An object handle this process owns (+1 retained); `release()` gives it back, once."""

  def __init__(self, rt: ObjC, handle: int):
    self.rt, self.handle = rt, handle

  def release(self) -> None:
    if self.handle:
      self.rt.release(self.handle)
      self.handle = 0


@functools.lru_cache(None)
def device_handle() -> MetalDeviceHandle:
  """The system default MTLDevice (MTLCreateSystemDefaultDevice); MetalError when there is none."""
  rt = objc()
  handle = rt.metal.MTLCreateSystemDefaultDevice()
  if not handle:
    raise MetalError("MTLCreateSystemDefaultDevice returned nil: this Mac has no Metal device")
  return MetalDeviceHandle(rt, handle)


def default_device() -> MetalDeviceHandle:
  """The MTLDevice METAL compiles for and runs on."""
  return device_handle()


def metal_problem() -> Optional[str]:
  """None when Metal can run kernels here, else why not. Never raises."""
  if platform.system() != "Darwin":
    return "Metal needs macOS"
  try:
    device_handle()
  except Exception as e:  # noqa: BLE001 - a probe reports, it does not raise
    return f"Metal failed to start: {type(e).__name__}: {e}"
  return None


# *** memory ***

class MetalBuffer:
  """A shared-storage MTLBuffer, or a view `offset` bytes into one (`view` True: never released through it)."""

  def __init__(self, handle: int, size: int, offset: int = 0, view: bool = False):
    self.handle, self.size, self.offset, self.view = handle, size, offset, view


class MetalAllocator(LRUAllocator):
  """MTLBuffers in shared storage on one device. `sync` waits for the kernels in flight (the device's synchronize)."""

  def __init__(self, dev: MetalDeviceHandle, sync: Callable[[], None]):
    self.dev, self.sync = dev, sync
    super().__init__()

  def _alloc(self, size: int, options: BufferOptions) -> MetalBuffer:
    handle = self.dev.rt.send(self.dev.handle, "newBufferWithLength:options:", (ctypes.c_ulong, size),
                              (ctypes.c_ulong, MTLResourceStorageModeShared))
    if not handle:
      raise MemoryError(f"Metal could not allocate {size} bytes on {self.dev.name}")
    return MetalBuffer(handle, size)

  def _free(self, opaque: MetalBuffer, options: BufferOptions) -> None:
    if not opaque.view:
      self.dev.rt.release(opaque.handle)

  def _host(self, buf: MetalBuffer) -> memoryview:
    ptr = self.dev.rt.send(buf.handle, "contents")
    if not ptr:
      raise MetalError("MTLBuffer contents is NULL (the buffer is not in shared storage)")
    return memoryview((ctypes.c_char * buf.size).from_address(ptr + buf.offset)).cast("B")

  def as_buffer(self, src: MetalBuffer) -> memoryview:
    """The buffer's bytes in host memory, without a copy (after the kernels in flight are done)."""
    self.sync()
    return self._host(src)

  def copyin(self, dest: MetalBuffer, src: memoryview) -> None:
    self.as_buffer(dest)[:len(src)] = src.cast("B") if src.format != "B" or src.ndim != 1 else src

  def copyout(self, dest: memoryview, src: MetalBuffer) -> None:
    mv = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    mv[:] = self.as_buffer(src)[:len(mv)]

  def offset(self, buf: MetalBuffer, size: int, offset: int) -> MetalBuffer:
    """A view `offset` bytes into buf: the same MTLBuffer, bound at buf.offset + offset."""
    if offset < 0 or offset + size > buf.size:
      raise ValueError(f"a view of {size} bytes at {offset} does not fit a buffer of {buf.size} bytes")
    return MetalBuffer(buf.handle, size, buf.offset + offset, view=True)


# *** programs ***

def check_launch(name: str, global_size: Sequence[int], local_size: Sequence[int], max_threads: int) -> None:
  """ValueError when a launch does not fit the pipeline: sizes below 1, or more threads per threadgroup than
  maxTotalThreadsPerThreadgroup (which depends on the kernel's register use, so may be below the renderer's 1024)."""
  if len(global_size) != 3 or len(local_size) != 3 or any(int(x) < 1 for x in (*global_size, *local_size)):
    raise ValueError(f"{name}: launch sizes must be three positive ints, got global {tuple(global_size)} local {tuple(local_size)}")
  if (threads := prod(local_size)) > max_threads:
    raise ValueError(f"{name}: a threadgroup of {tuple(local_size)} = {threads} threads exceeds this pipeline's "
                     f"maxTotalThreadsPerThreadgroup of {max_threads}")


class MetalProgram:
  """One kernel: its library, function and compute pipeline, launched through the device's queue."""

  def __init__(self, device: MetalDevice, name: str, lib: bytes):
    self.device, self.name = device, name
    dev, rt = device.mtl, device.mtl.rt
    pool = rt.pool_push()
    try:
      self._build(dev, name, lib)
    finally:
      rt.pool_pop(pool)
    self.max_threads = int(rt.send(self.pipeline.handle, "maxTotalThreadsPerThreadgroup", restype=ctypes.c_ulong))
    self.simd_width = int(rt.send(self.pipeline.handle, "threadExecutionWidth", restype=ctypes.c_ulong))

  def _build(self, dev: MetalDeviceHandle, name: str, lib: bytes) -> None:
    rt = dev.rt
    self.library = dev.library(lib)
    fn = rt.send(self.library.handle, "newFunctionWithName:", (ctypes.c_void_p, rt.nsstring(name)))
    if not fn:
      self.library.release()
      raise MetalError(f"the library has no kernel named {name!r}")
    self.function = MetalObject(rt, fn)
    # through a descriptor, so that the pipeline may also be used from an indirect command buffer (MetalGraph)
    desc = rt.send(rt.cls("MTLComputePipelineDescriptor"), "new")
    try:
      rt.send(desc, "setComputeFunction:", (ctypes.c_void_p, fn), restype=None)
      rt.send(desc, "setSupportIndirectCommandBuffers:", (ctypes.c_bool, True), restype=None)
      self.pipeline = MetalObject(rt, with_error(rt, f"building the pipeline of {name}", lambda err: rt.send(
        dev.handle, "newComputePipelineStateWithDescriptor:options:reflection:error:", (ctypes.c_void_p, desc),
        (ctypes.c_ulong, MTLPipelineOptionNone), (ctypes.c_void_p, None), (ctypes.c_void_p, err))))
    finally:
      rt.release(desc)

  def __call__(self, *bufs: MetalBuffer, global_size: Tuple[int, ...] = (1, 1, 1), local_size: Optional[Tuple[int, ...]] = None,
               vals: Tuple[int, ...] = (), wait: bool = False) -> Optional[float]:
    gsz, lsz = (tuple(global_size) + (1, 1, 1))[:3], (tuple(local_size or ()) + (1, 1, 1))[:3]
    if any(g == 0 for g in gsz):
      return 0.0 if wait else None
    check_launch(self.name, gsz, lsz, self.max_threads)
    rt = self.device.mtl.rt
    pool = rt.pool_push()
    try:
      cbuf = rt.retain(rt.send(self.device.mtl.queue, "commandBuffer"))
      enc = rt.send(cbuf, "computeCommandEncoder")
      rt.send(enc, "setComputePipelineState:", (ctypes.c_void_p, self.pipeline.handle), restype=None)
      for i, b in enumerate(bufs):
        rt.send(enc, "setBuffer:offset:atIndex:", (ctypes.c_void_p, b.handle), (ctypes.c_ulong, b.offset), (ctypes.c_ulong, i), restype=None)
      for i, v in enumerate(vals, start=len(bufs)):
        val = ctypes.c_int32(v)
        rt.send(enc, "setBytes:length:atIndex:", (ctypes.c_void_p, ctypes.addressof(val)), (ctypes.c_ulong, 4), (ctypes.c_ulong, i),
                restype=None)
      rt.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (MTLSize, MTLSize(*gsz)), (MTLSize, MTLSize(*lsz)), restype=None)
      rt.send(enc, "endEncoding", restype=None)
      rt.send(cbuf, "commit", restype=None)
    finally:
      rt.pool_pop(pool)
    if not wait:
      self.device.in_flight.append(cbuf)
      return None
    return self.device.wait(cbuf)

  def __del__(self) -> None:
    for obj in ("pipeline", "function", "library"):
      if (o := getattr(self, obj, None)) is not None:
        try:
          o.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
          pass


class MetalDevice(Compiled):
  """METAL: the default MTLDevice with its queue, allocator and programs."""

  def __init__(self, device: str, renderer: Any, compiler: Any, mtl: Optional[MetalDeviceHandle] = None, graph: Any = None):
    self.mtl = mtl if mtl is not None else device_handle()
    self.in_flight: List[int] = []
    super().__init__(device, MetalAllocator(self.mtl, self.synchronize), renderer, compiler, self._load, graph)

  def _load(self, name: str, lib: bytes) -> MetalProgram:
    return MetalProgram(self, name, lib)

  def wait(self, cbuf: int) -> float:
    """Wait for one committed command buffer and release it; its GPU time in seconds; MetalError if it failed."""
    rt = self.mtl.rt
    try:
      rt.send(cbuf, "waitUntilCompleted", restype=None)
      if rt.send(cbuf, "status", restype=ctypes.c_long) == MTLCommandBufferStatusError:
        raise MetalError(f"a kernel failed on {self.mtl.name}: {rt.error_text(rt.send(cbuf, 'error')) or 'no error description'}")
      return float(rt.send(cbuf, "GPUEndTime", restype=ctypes.c_double) - rt.send(cbuf, "GPUStartTime", restype=ctypes.c_double))
    finally:
      rt.release(cbuf)

  def synchronize(self) -> None:
    """Wait for every kernel in flight; the first failure is raised after all were waited for."""
    pending, self.in_flight = self.in_flight, []
    first: Optional[Exception] = None
    for cbuf in pending:
      try:
        self.wait(cbuf)
      except MetalError as e:
        first = first or e
    if first is not None:
      raise first

