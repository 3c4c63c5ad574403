"""Device-side building blocks: Buffers, allocators, the compiler cache and the Compiled device bundle.

A device is a `Compiled`: an allocator that hands out opaque memory handles, a renderer that turns UOps
into source, a compiler that turns source into a binary (cached on disk), and a runtime that loads the
binary into a callable program. `Buffer` is the device-independent handle the engine works with; it is
allocated lazily, so building a schedule never touches device memory.
"""
from __future__ import annotations

import ctypes
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, DefaultDict, Dict, List, Optional, Sequence, Tuple
from weakref import getweakrefcount

from tiny import helpers
from tiny.capabilities import DeviceCaps
from tiny.dtype import DType, ImageDType, to_np_dtype
from tiny.helpers import DEBUG, GlobalCounters, diskcache_get, diskcache_put, flat_mv, from_mv, getenv
from tiny.renderer import Renderer

if TYPE_CHECKING:
  from tiny.registry import _Device

__all__ = ["Buffer", "BufferOptions", "JitWriteCounter",
           "Allocator", "LRUAllocator", "MallocAllocator", "Compiler", "CompileError", "Compiled", "Device"]  # noqa: F822


_Registry: Optional[_Device] = None


def _registry() -> _Device:
  # the registry builds Compiled devices from this module, so it imports this one: a Buffer finds its device through it at run
  # time (kept once found: an import statement per buffer allocation costs more than the allocation)
  global _Registry
  if _Registry is None:
    from tiny.registry import Device
    _Registry = Device
  return _Registry


def __getattr__(name: str) -> Any:
  # `from tiny.device import Device` is the spelling user code has always had; Device itself lives in tiny.registry
  if name == "Device":
    return _registry()
  raise AttributeError(f"module 'tiny.device' has no attribute {name!r}")


def _device(name: str) -> Compiled:
  return _registry()[name]


def _caps(name: str) -> DeviceCaps:
  return _registry().caps(name)


# **************** buffers ****************

@dataclass(frozen=True, eq=True)
class BufferOptions:
  """How a buffer is allocated. Buffers with different options never share LRU cache slots."""

  image: Optional[ImageDType] = None
  uncached: bool = False
  cpu_access: bool = False
  host: bool = False
  nolru: bool = False


class JitWriteCounter:
  """How many times one TinyJit replayed its capture. A buffer the captured kernels write keeps the counter (see
  `Buffer.write_version`), so a replay adds one write to all of them at the cost of one increment."""

  __slots__ = ("count",)

  def __init__(self) -> None:
    self.count = 0


class Buffer:
  """A (lazily allocated) region of device memory holding `size` elements of `dtype`.

  A buffer made with `base=` is a view: it shares the base's memory starting `offset` bytes in, and is
  allocated when its base is. `lb_refcount` counts the LazyBuffers that use the base, so the scheduler's
  memory planner knows which buffers are private to a schedule.

  `write_version()` changes whenever the contents may have changed, for caches of data derived from them (the packed
  matmul panels of a weight), once such a cache has called `track_writes()`: every path that writes device memory notes
  it (`note_write`), a JIT replay through the counters of the JITs that write the buffer (`add_jit_writer`).
  """

  # writes noted on this base buffer (class defaults: most buffers never have either set)
  _writes = 0
  _jit_writers: Tuple[JitWriteCounter, ...] = ()
  # (PendingSchedule, item index) while a handed-out schedule item that writes this buffer has not run (engine/pending.py)
  _pending: Optional[Tuple[Any, int]] = None
  # (weakref to PendingSchedule, item index) of handed-out items not run yet that read this buffer (engine/pending.py)
  _pending_readers: Sequence[Tuple[Any, int]] = ()
  # whether kernel runs and copies note their writes (Runner.note_writes): off until a cache of derived data first reads
  # a version (`track_writes`), so a program that keeps no such cache pays nothing per eager kernel. Versions read after
  # that are all compared with later ones, so the writes before it do not matter
  tracking_writes: ClassVar[bool] = False

  @staticmethod
  def track_writes() -> None:
    """Have every kernel run and copy note its writes from now on (before the first `write_version` a cache keeps)."""
    Buffer.tracking_writes = True

  def __init__(self, device: str, size: int, dtype: DType, opaque: Any = None, options: Optional[BufferOptions] = None,
               initial_value: Optional[bytes] = None, lb_refcount: int = 0, base: Optional[Buffer] = None, offset: int = 0,
               preallocate: bool = False):
    if not isinstance(dtype, DType):
      raise TypeError(f"Buffer dtype must be a DType, got {dtype!r}")
    if isinstance(dtype, ImageDType):
      options = BufferOptions(image=dtype)
    if size < 0:
      raise ValueError(f"Buffer size must be non-negative, got {size}")
    self.device, self.size, self.dtype, self.options, self.offset = device, size, dtype, options, offset
    self._base: Optional[Buffer] = None
    if base is None:
      if offset != 0:
        raise ValueError("only views (base=...) can have an offset")
      self._lb_refcount = lb_refcount
      if opaque is not None:
        self.allocate(opaque)
      if initial_value is not None:
        self.allocate()
        self.copyin(memoryview(initial_value))
    else:
      if base._base is not None:
        raise ValueError("a view's base must be a base buffer, not another view")
      if offset + self.nbytes > base.nbytes:
        raise ValueError(f"view of {self.nbytes} bytes at offset {offset} does not fit in a buffer of {base.nbytes} bytes")
      self._base = base
    if preallocate:
      self.allocate()

  @property
  def base(self) -> Buffer:
    return self._base if self._base is not None else self

  @property
  def lb_refcount(self) -> int:
    return self.base._lb_refcount

  def ref(self, cnt: int) -> None:
    """Add cnt to the LazyBuffer refcount of the base."""
    (self._base if self._base is not None else self)._lb_refcount += cnt

  def is_allocated(self) -> bool:
    return hasattr(self, "_buf")

  @property
  def handle(self) -> Any:
    """The device memory behind this buffer: the opaque object its allocator's `alloc` (or `offset`, for a view) returned.

    Part of the backend API (tiny.backend): graph executors and runtimes pass it to their launch calls. Read-only; raises
    RuntimeError when the buffer is not allocated yet (call `ensure_allocated()` first)."""
    if not self.is_allocated():
      raise RuntimeError(f"{self!r} is not allocated: it has no device handle yet (call ensure_allocated())")
    return self._buf

  def note_write(self) -> None:
    """Record that the contents (of the base buffer, for a view) may have changed."""
    (self._base if self._base is not None else self)._writes += 1

  def add_jit_writer(self, counter: JitWriteCounter) -> None:
    """The kernels of a JIT capture write this buffer: each replay, counted by `counter`, is a write."""
    base = self._base if self._base is not None else self
    if not any(c is counter for c in base._jit_writers):
      base._jit_writers = base._jit_writers + (counter,)

  def write_version(self) -> int:
    """A number that grows with every write to the base buffer's memory: two equal readings mean no write in between."""
    base = self._base if self._base is not None else self
    return base._writes + sum(c.count for c in base._jit_writers)

  def ensure_allocated(self) -> Buffer:
    """Allocate if not yet allocated; returns self."""
    return self if self.is_allocated() else self.allocate()

  def allocate(self, opaque: Any = None, external_ptr: Optional[int] = None) -> Buffer:
    """Get device memory for this buffer (or adopt `opaque`/`external_ptr`). Allocating twice is an error."""
    if hasattr(self, "_buf"):
      raise RuntimeError(f"{self!r} is already allocated")
    self.allocator = (_Registry if _Registry is not None else _registry())[self.device].allocator
    if external_ptr is not None:
      # memory owned by someone else (a mapped file, a foreign tensor): adopt it, never free it
      self._buf = self.allocator.from_external(external_ptr, self.nbytes, self.options) if hasattr(self.allocator, "from_external") \
        else external_ptr
      return self
    if self._base is not None:
      self._base.ensure_allocated()
      if not hasattr(self.allocator, "offset"):
        raise RuntimeError(f"device {self.device} does not support buffer views")
      self._buf = self.allocator.offset(self.base._buf, self.nbytes, self.offset)
      return self
    if opaque is not None:
      self._buf = opaque
    else:
      nbytes = self.size * self.dtype.itemsize
      # the memory of a kept eager result of this size, if any (see recycle_buffer), else the allocator's
      if not _free_buffers or self.options is not None or (mem := _take_free_memory(self.allocator, nbytes)) is None:
        mem = self.allocator.alloc(nbytes, self.options)
      self._buf = mem
      if not self.device.startswith("DISK"):
        GlobalCounters.mem_used = used = GlobalCounters.mem_used + nbytes
        if used > GlobalCounters.mem_peak:
          GlobalCounters.mem_peak = used
      self._owned = True
    # no write noted: a buffer is allocated once, before anything could have read (and cached) its contents
    return self

  # True once allocate() got memory from the allocator, which __del__ gives back (adopted and view memory is not)
  _owned = False
  # True while kept for reuse (see recycle_buffer): its memory counts as free in GlobalCounters.mem_used
  _kept = False

  def __reduce__(self) -> Tuple[Any, ...]:
    # pickling carries the contents (when allocated) so a buffer can cross process boundaries
    buf = None
    if self._base is not None:
      return self.__class__, (self.device, self.size, self.dtype, None, None, None, 0, self.base, self.offset, self.is_allocated())
    if self.device == "NPY":
      return self.__class__, (self.device, self.size, self.dtype, self._buf, self.options, None, self.lb_refcount)
    if self.is_allocated():
      buf = bytearray(self.nbytes)
      self.copyout(memoryview(buf))
    return self.__class__, (self.device, self.size, self.dtype, None, self.options, buf, self.lb_refcount)

  @property
  def nbytes(self) -> int:
    return self.size * self.dtype.itemsize

  def __del__(self) -> None:
    if not self._owned:
      return
    try:
      nbytes = self.size * self.dtype.itemsize
      if not self._kept and not self.device.startswith("DISK"):   # (a kept buffer's memory already counts as free)
        GlobalCounters.mem_used -= nbytes
      self.allocator.free(self._buf, nbytes, self.options)
    except Exception:  # interpreter shutdown: the module globals may already be gone
      pass

  def __repr__(self) -> str:
    return f"<buf real:{self.is_allocated()} device:{self.device} size:{self.size} dtype:{self.dtype}" + \
      (f" offset:{self.offset}" if self._base is not None else "") + (f" {self.options}" if self.options is not None else "") + ">"

  def as_buffer(self, allow_zero_copy: bool = False, force_zero_copy: bool = False) -> memoryview:
    """The contents as a memoryview: zero-copy when allowed and the allocator can, else a copy."""
    if (force_zero_copy or allow_zero_copy) and hasattr(self.allocator_or_device(), "as_buffer") and \
        (force_zero_copy or _caps(self.device).zero_copy):
      return getattr(self.allocator_or_device(), "as_buffer")(self._buf)
    if force_zero_copy:
      raise RuntimeError(f"device {self.device} cannot give a zero-copy view of its memory")
    return self.copyout(memoryview(bytearray(self.nbytes)))

  def allocator_or_device(self) -> Allocator:
    return self.allocator if hasattr(self, "allocator") else _device(self.device).allocator

  def copyin(self, mv: memoryview) -> Buffer:
    """Copy host bytes into the buffer (allocating it first if needed)."""
    mv = flat_mv(mv)
    if mv.nbytes != self.nbytes:
      raise ValueError(f"copyin of {mv.nbytes} bytes into a buffer of {self.nbytes} bytes")
    self.ensure_allocated()
    self.allocator.copyin(self._buf, mv)
    self.note_write()
    return self

  def copyout(self, mv: memoryview) -> memoryview:
    """Copy the buffer's bytes into host memory `mv` and return it."""
    mv = flat_mv(mv)
    if mv.nbytes != self.nbytes:
      raise ValueError(f"copyout of a buffer of {self.nbytes} bytes into {mv.nbytes} bytes")
    if not self.is_allocated():
      raise RuntimeError(f"cannot copy out of {self!r}: it is not allocated")
    self.allocator.copyout(mv, self._buf)
    return mv

  def numpy(self) -> Any:
    """The contents as a numpy array of the buffer's dtype (a copy unless zero-copy is possible)."""
    import numpy as np

    return np.frombuffer(bytes(self.as_buffer()), dtype=to_np_dtype(self.dtype.scalar() if hasattr(self.dtype, "scalar") else self.dtype))

  def view(self, size: int, dtype: DType, offset: int) -> Buffer:
    """A buffer of `size` elements of `dtype` aliasing this one's memory, `offset` bytes in."""
    if offset >= self.nbytes and self.nbytes > 0:
      raise ValueError(f"view offset {offset} is past the end of a buffer of {self.nbytes} bytes")
    if self._base is not None:
      return Buffer(self.device, size, dtype, base=self._base, offset=self.offset + offset)
    return Buffer(self.device, size, dtype, base=self, offset=offset)


# **************** free eager results ****************

# Small buffers whose last user died, kept whole (the Buffer object and its memory) by allocator and byte size, for the
# next eager result like them: an eager loop frees one result per op and makes another just like it, and building,
# allocating and freeing a Buffer cost more than its kernel. Only a Buffer nothing else can reach is kept (see
# recycle_buffer), so one handed out again is never one that a tensor, a view, a JIT, a schedule or a cache still holds.
# Their memory counts as free (GlobalCounters.mem_used), as in the allocator's LRU cache, and any allocation of that
# size takes it (Buffer.allocate), so keeping them never makes the allocator get more memory. LRU=0 keeps none.
_free_buffers: Dict[Tuple[Allocator, int], List[Buffer]] = {}
FREE_BUFFER_MAX_BYTES = 1 << 16
_FREE_PER_KEY = 4
_FREE_MAX_KEYS = 64
# references a Buffer that nothing else holds has in recycle_buffer: the caller's two (the _BufferUse's attribute and
# its local), recycle_buffer's argument and getrefcount's own
_ONLY_OURS = 4
# that count holds on interpreters where every argument and local is a strong reference (checked on 3.11; 3.10-3.13 keep
# those rules). One that borrows references (3.14's LOAD_FAST_BORROW) counts fewer, so a buffer someone else still held
# could read as ours: there nothing is kept, which costs speed, never results
_REFCOUNTS_KNOWN = (3, 10) <= sys.version_info[:2] <= (3, 13) and sys.implementation.name == "cpython"
_KEEP_FREE = bool(getenv("LRU", 1)) and _REFCOUNTS_KNOWN


def recycle_buffer(buf: Buffer) -> None:
  """Keep buf, whose LazyBuffer count just fell to 0, for take_free_buffer when nothing else can reach it: a plain
  allocated base Buffer of its own memory (not adopted, no options, not on disk), small, no weak reference (a cache keyed
  by it), and no other reference at all (sys.getrefcount); else it is left to die as usual. Called by
  lazy._BufferUse.__del__ only."""
  if buf.__class__ is not Buffer or not buf._owned or buf.options is not None or buf._base is not None or not _KEEP_FREE or \
      (nbytes := buf.size * buf.dtype.itemsize) > FREE_BUFFER_MAX_BYTES or getweakrefcount(buf) or \
      sys.getrefcount(buf) != _ONLY_OURS or buf.device.startswith("DISK"):
    return
  key = (buf.allocator, nbytes)
  if (lst := _free_buffers.get(key)) is None:
    if len(_free_buffers) >= _FREE_MAX_KEYS:
      drop_free_buffers()
    lst = _free_buffers.setdefault(key, [])   # (one step: another thread may be adding the same key)
  if len(lst) >= _FREE_PER_KEY:
    return
  # marked first: should the list be dropped by another thread at any point, the Buffer's __del__ knows its memory
  # counts as free already
  buf._kept = True
  GlobalCounters.mem_used -= nbytes
  lst.append(buf)


def _pop_free(allocator: Allocator, nbytes: int) -> Optional[Buffer]:
  if (lst := _free_buffers.get((allocator, nbytes))) is None:
    return None
  try:
    buf = lst.pop()   # (another thread may have emptied the list since the lookup)
  except IndexError:
    return None
  # memory handed out again: an LRU allocator counts it as one of its cache hits, as if it had come back through it
  if (hits := getattr(allocator, "hits", None)) is not None:
    allocator.hits = hits + 1   # type: ignore[attr-defined]
  return buf


def take_free_buffer(allocator: Allocator, size: int, dtype: DType) -> Optional[Buffer]:
  """A kept Buffer (allocated, no LazyBuffer using it) of this allocator holding size elements of dtype; None when there
  is none. The caller makes it the buffer of a base of that device, size and dtype."""
  # by bytes: memory of the same length serves any dtype (and the key needs no DType hash, a Python call). _pop_free,
  # inline: this runs for every eager result
  if (lst := _free_buffers.get((allocator, nbytes := size * dtype.itemsize))) is None or not lst:
    return None
  try:
    buf = lst.pop()   # (another thread may have emptied the list since the check)
  except IndexError:
    return None
  if (hits := getattr(allocator, "hits", None)) is not None:
    allocator.hits = hits + 1   # type: ignore[attr-defined]
  if buf.dtype is not dtype:
    buf.size, buf.dtype = size, dtype
  buf._kept = False
  GlobalCounters.mem_used = used = GlobalCounters.mem_used + nbytes
  if used > GlobalCounters.mem_peak:
    GlobalCounters.mem_peak = used
  return buf


def _take_free_memory(allocator: Allocator, nbytes: int) -> Any:
  """The memory of a kept Buffer of this allocator and size (the kept Buffer is dropped without freeing it); None if none."""
  if (buf := _pop_free(allocator, nbytes)) is None:
    return None
  buf._owned = False
  return buf._buf


def drop_free_buffers() -> None:
  """Let every kept Buffer go (back to its allocator): when memory runs short, or to start from a clean state."""
  # each one's __del__ frees its memory (and, as it is marked kept, leaves mem_used alone)
  while _free_buffers:
    _free_buffers.popitem()[1].clear()


# **************** allocators ****************

class Allocator:
  """Hands out opaque device memory handles. Subclasses implement _alloc, _free, copyin, copyout.

  Optional capabilities, detected with hasattr by callers: `as_buffer(src) -> memoryview` (zero-copy host
  view), `offset(buf, size, offset)` (sub-buffer views), `transfer(dest, src, sz, src_dev, dest_dev)`
  (device-to-device copy).
  """

  def alloc(self, size: int, options: Optional[BufferOptions] = None) -> Any:
    if not isinstance(size, int) or size < 0:
      raise ValueError(f"alloc size must be a non-negative int, got {size!r}")
    return self._alloc(max(size, 1), options if options is not None else BufferOptions())

  def _alloc(self, size: int, options: BufferOptions) -> Any:
    raise NotImplementedError("this allocator cannot allocate")

  def free(self, opaque: Any, size: int, options: Optional[BufferOptions] = None) -> None:
    self._free(opaque, options if options is not None else BufferOptions())

  def _free(self, opaque: Any, options: BufferOptions) -> None:
    pass  # the default lets the garbage collector reclaim the memory

  def copyin(self, dest: Any, src: memoryview) -> None:
    raise NotImplementedError("this allocator cannot copy in")

  def copyout(self, dest: memoryview, src: Any) -> None:
    raise NotImplementedError("this allocator cannot copy out")


class LRUAllocator(Allocator):
  """Keeps freed buffers, keyed by (size, options), and hands them out again instead of allocating.

  `hits` counts allocations served from the cache, `allocs` those that reached the device. When the
  device runs out of memory the cache is emptied and the allocation retried once.
  """

  def __init__(self) -> None:
    self.cache: DefaultDict[Tuple[int, Optional[BufferOptions]], List[Any]] = defaultdict(list)
    self.hits, self.allocs = 0, 0

  def alloc(self, size: int, options: Optional[BufferOptions] = None) -> Any:
    if len(c := self.cache[(size, options)]):
      self.hits += 1
      return c.pop()
    self.allocs += 1
    try:
      return super().alloc(size, options)
    except (RuntimeError, MemoryError):
      drop_free_buffers()
      self.free_cache()
      return super().alloc(size, options)

  def free_cache(self) -> None:
    """Really free every cached buffer."""
    for (sz, options), opaques in self.cache.items():
      for opaque in opaques:
        super().free(opaque, sz, options)
      opaques.clear()

  # LRU=0 turns the cache off; read on the first free (not on every one: an environment lookup costs more than the free)
  _lru: Optional[bool] = None

  def free(self, opaque: Any, size: int, options: Optional[BufferOptions] = None) -> None:
    if (lru := self._lru) is None:
      lru = self._lru = bool(getenv("LRU", 1))
    if lru and (options is None or not options.nolru):
      self.cache[(size, options)].append(opaque)
    else:
      super().free(opaque, size, options)


class _MallocAllocator(LRUAllocator):
  """Host memory from ctypes, 64-byte aligned so vectorized kernels may use aligned loads."""

  ALIGN = 64

  def _alloc(self, size: int, options: BufferOptions) -> Any:
    raw = (ctypes.c_uint8 * (size + self.ALIGN))()
    pad = (-ctypes.addressof(raw)) % self.ALIGN
    # from_buffer keeps `raw` alive through the returned array's _objects
    return (ctypes.c_uint8 * size).from_buffer(raw, pad)

  def as_buffer(self, src: Any) -> memoryview:
    return flat_mv(memoryview(src))

  def copyin(self, dest: Any, src: memoryview) -> None:
    if len(src):
      ctypes.memmove(dest, from_mv(src) if not src.readonly else bytes(src), len(src))

  def copyout(self, dest: memoryview, src: Any) -> None:
    if len(dest):
      ctypes.memmove(from_mv(dest), src, len(dest))

  def offset(self, buf: Any, size: int, offset: int) -> Any:
    return (ctypes.c_uint8 * size).from_buffer(buf, offset)


MallocAllocator = _MallocAllocator()


# **************** compilers ****************

def _numbered(src: str) -> str:
  return "\n".join(f"{i + 1:4d} | {line}" for i, line in enumerate(src.splitlines()))


class CompileError(RuntimeError):
  """A kernel failed to compile. Carries the source (`.src`) and the compiler's message (`.compiler_msg`)."""

  def __init__(self, msg: str, src: Optional[str] = None):
    self.compiler_msg, self.src = msg, src
    super().__init__(msg if src is None else f"{msg}\n--- source ---\n{_numbered(src)}")


class Compiler:
  """Turns source into a binary. `compile_cached` memoizes on disk (per `cachekey`, i.e. per toolchain)."""

  def __init__(self, cachekey: Optional[str] = None):
    self.cachekey = None if getenv("DISABLE_COMPILER_CACHE") else cachekey

  def compile(self, src: str) -> bytes:
    """Compile one source; the default 'compiler' is the identity on the source text."""
    return src.encode()

  # True when compile() may run in several threads at once (it holds no shared state and mostly waits on a subprocess):
  # the engine then compiles the new kernels of a schedule in parallel. The disk cache itself is used from one thread only.
  parallel_compile: bool = False

  def compile_many(self, srcs: Sequence[str]) -> List[Optional[bytes]]:
    """compile() of every source, for the engine's batched first compile; None in place of a source that failed (compiling
    it alone raises the error). A compiler that does better with many sources at once (one process for all) overrides it."""
    libs: List[Optional[bytes]] = []
    for src in srcs:
      try:
        libs.append(self.compile(src))
      except Exception:  # noqa: BLE001 - the kernel is compiled again, alone, when it is lowered: that raises it in order
        libs.append(None)
    return libs

  def cache_lookup(self, src: str) -> Optional[bytes]:
    """The binary of src from the disk cache, or None (no cache, a miss, or a corrupt or foreign entry)."""
    if self.cachekey is None or helpers.CACHELEVEL < 1:
      return None
    lib = diskcache_get(self.cachekey, src)
    return lib if isinstance(lib, bytes) else None

  def cache_store(self, src: str, lib: bytes) -> None:
    """Remember lib as the binary of src in the disk cache (when caching is on)."""
    if self.cachekey is not None and helpers.CACHELEVEL >= 1:
      diskcache_put(self.cachekey, src, lib)

  def compile_cached(self, src: str) -> bytes:
    """compile(src), served from the disk cache when possible. Corrupt or foreign entries are rebuilt."""
    if (lib := self.cache_lookup(src)) is None:
      if DEBUG >= 5:
        print(f"compiling with {type(self).__name__}, cache miss for {self.cachekey}")
      lib = self.compile(src)
      self.cache_store(src, lib)
    return lib


class Compiled:
  """A device: allocator + renderer + compiler + runtime (+ an optional graph executor for the JIT)."""

  def __init__(self, device: str, allocator: Allocator, renderer: Optional[Renderer], compiler: Optional[Compiler], runtime: Any,
               graph: Any = None, caps: Optional[DeviceCaps] = None):
    self.dname, self.allocator, self.compiler, self.runtime, self.graph = device, allocator, compiler or Compiler(), runtime, graph
    # what the device can do; the registry sets it from the plugin's DeviceSpec, also on device objects a plugin builds itself
    self.caps: DeviceCaps = caps if caps is not None else DeviceCaps()
    if renderer is None:
      renderer = Renderer()
    self.renderer = renderer

  @property
  def device(self) -> str:
    return self.dname

  def synchronize(self) -> None:
    """Wait for all work queued on the device (a no-op for synchronous devices)."""

  def __repr__(self) -> str:
    return f"<{type(self).__name__} {self.dname}>"

