"""Runtimes of the CPU devices: load a compiled kernel, call it on every core; the host-memory allocator."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from tiny.backend import BufferOptions, LRUAllocator, flat_mv, to_function_name

from tiny_clang.pool import NativePool, get_pool, num_threads
from tiny_clang.settings import THREADS

# a kernel whose fastest of its first PARALLEL_SAMPLES single-core runs takes less than this stays on one core: waking the
# pool costs more than it saves. One sample is not enough: on a busy machine a 16-float kernel's first run can take
# longer (preempted, cold caches), and the choice holds for the rest of the process
PARALLEL_MIN_SECONDS = 40e-6
PARALLEL_SAMPLES = 3

_tmpdir = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def load_shared(lib: bytes) -> ctypes.CDLL:
  """dlopen a shared object given as bytes. The file exists only between write and dlopen (a unique name, so the
  loader never mistakes it for an earlier kernel)."""
  fd, path = tempfile.mkstemp(prefix="tiny_clang_", suffix=".so", dir=_tmpdir)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(lib)
    return ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
  finally:
    os.unlink(path)


# the int64 argument array types by length (ctypes makes the type `c_int64 * n` anew on every call); length 0 gets one slot,
# since the entry reads args even when a kernel has none
_ARG_ARRAYS = [ctypes.c_int64 * max(1, n) for n in range(33)]


def buf_address(b: Any) -> int:
  """Address of an opaque buffer of ClangAllocator (a ctypes array) or a raw int pointer."""
  return b if isinstance(b, int) else ctypes.addressof(b)


class CPUProgram:
  """Shared call logic: `entry` is the address of `NAME_entry(args, core, ncores)`, `parallel` says whether the kernel's
  outermost loop may be split across cores.

  With THREADS=0 (auto) a kernel runs on one core first; it goes parallel from then on when that run took more than
  PARALLEL_MIN_SECONDS. THREADS=N>1 always splits parallel kernels N ways, THREADS=1 never splits.
  """

  name: str
  entry: int
  parallel: int

  def _setup_threads(self) -> None:
    self.pool = get_pool()
    self.auto_threads: Optional[int] = None if THREADS.value == 0 else 0
    self._samples: List[float] = []

  def threads(self) -> int:
    """How many cores the next call uses."""
    if not self.parallel:
      return 1
    if THREADS.value > 0:
      return int(THREADS.value)
    return self.auto_threads or 1

  def __call__(self, *bufs: Any, global_size: Tuple[int, ...] = (1, 1, 1), local_size: Tuple[int, ...] = (1, 1, 1),
               vals: Tuple[int, ...] = (), wait: bool = False) -> Optional[float]:
    n = len(bufs) + len(vals)
    args = (_ARG_ARRAYS[n] if n < len(_ARG_ARRAYS) else ctypes.c_int64 * n)(*[buf_address(b) for b in bufs], *vals)
    if wait or self.auto_threads is None:
      et = self.run_args(args)
      return et if wait else None
    # nothing to time: the run is not waited on and the core count is settled (a small eager kernel's usual case)
    self.pool.run1(self.entry, args, self.parallel, self.threads())
    return None

  def graph_threads(self) -> int:
    """The core count a JIT graph (tiny_clang.graph.CPUGraph) fixes for this kernel when it captures it.

    That is threads() once the first runs have settled it. A TinyJit captures on its second call, so a kernel whose
    first run took under 100 * PARALLEL_MIN_SECONDS is still unsettled then; threads() says 1 for it, and the graph
    used to run it on one core for good. It gets the rule applied to the runs timed so far instead. MNIST step b64 on
    CLANG, 2 cores: 45 of its 60 kernels were captured unsettled; on a quiet machine that is every kernel under ~4 ms,
    ~17 of the step's ~61 ms of single-core kernel time (estimated from per-kernel single-core times). With no run timed
    yet the kernel is split: a small kernel loses a few microseconds to the pool, a large one left on one core of two
    takes twice as long."""
    if not self.parallel:
      return 1
    if THREADS.value > 0 or self.auto_threads is not None:
      return self.threads()
    return num_threads() if not self._samples or min(self._samples) > PARALLEL_MIN_SECONDS else 1

  # the kernel function itself (not its entry): `NAME(ptr, ..., core, ncores)`, and a ctypes prototype over it by the
  # number of buffers, made on the first direct call
  fn_addr = 0
  _direct_fn: Any = None

  def direct(self, *bufs: Any) -> bool:
    """Run a kernel without Variables on one core, calling the kernel function with the buffers themselves: no argument
    array, no pool. False, having done nothing, where that is not how the next call would run (the core count is not
    settled yet, or it would use several cores), the kernel function is unknown, or a buffer is not a ctypes array."""
    if (fn := self._direct_fn) is None:
      if self.auto_threads is None or not self.fn_addr:
        return False
      # no argument types: ctypes then passes each array as a pointer to its data and the two ints as C ints, which is the
      # kernel's signature (`NAME(ptr, ..., int core, int ncores)`), without converting each array to a c_void_p on every
      # call, which took most of the call's time. Made once the core count is settled (it stays settled)
      fn = self._direct_fn = ctypes.CFUNCTYPE(None)(self.fn_addr)
    if self.parallel and ((t := THREADS.value) > 1 or (t <= 0 and (self.auto_threads or 0) > 1)):   # what threads() would say, inline
      return False
    for b in bufs:
      # a raw int address would go to C as a 32-bit int: it takes the argument-array path, which converts it. (Allocators
      # here hand out ctypes arrays; isinstance with the ctypes Array type goes through its metaclass, three times slower)
      if isinstance(b, int):
        return False
    fn(*bufs, 0, 1)
    return True

  def run_args(self, args: Any) -> float:
    """Run on a prebuilt argument array (int64 buffer addresses, then variable values); returns the seconds it took."""
    T = self.threads()
    st = time.perf_counter()
    self.pool.run1(self.entry, args, self.parallel, T)
    et = time.perf_counter() - st
    if self.auto_threads is None and THREADS.value == 0:
      self._samples.append(et)
      if et > 100 * PARALLEL_MIN_SECONDS or len(self._samples) >= PARALLEL_SAMPLES:   # a long kernel needs no second look
        self.auto_threads = num_threads() if min(self._samples) > PARALLEL_MIN_SECONDS else 1
    return et


class ClangProgram(CPUProgram):
  """A CLANG kernel: `lib` is a shared object exporting NAME, NAME_entry and NAME_parallel."""

  def __init__(self, name: str, lib: bytes):
    # the engine passes the function name; a display name (with colors) is turned into it the same way the renderer did
    self.name, self.lib = (name := to_function_name(name)), lib
    self.so = load_shared(lib)
    try:
      self.fxn = getattr(self.so, name)
      self.entry = ctypes.cast(getattr(self.so, f"{name}_entry"), ctypes.c_void_p).value or 0
      self.fn_addr = ctypes.cast(self.fxn, ctypes.c_void_p).value or 0
    except AttributeError as e:
      raise RuntimeError(f"shared object for {name} lacks the kernel or its entry: was it rendered by ClangRenderer? ({e})") from e
    try:
      self.parallel = ctypes.c_int32.in_dll(self.so, f"{name}_parallel").value
    except ValueError:
      self.parallel = 0
    self._setup_threads()


class LLVMProgram(CPUProgram):
  """An LLVM kernel: `lib` is an ELF object from LLVMCompiler, linked in process by an MCJIT engine of its own."""

  def __init__(self, name: str, lib: bytes):
    from tiny_clang.compiler import host_target_machine, init_llvm
    llvm = init_llvm()
    self.name, self.lib = (name := to_function_name(name)), lib
    with _llvm_lock:
      # the engine owns its TargetMachine, so each program gets a fresh one (sharing one segfaults at teardown)
      self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), host_target_machine())
      self.engine.add_object_file(llvm.ObjectFileRef.from_data(lib))
      self.engine.finalize_object()
      self.entry = self.engine.get_function_address(f"{name}_entry")
      fn = self.engine.get_function_address(name)
      par = self.engine.get_global_value_address(f"{name}_parallel")
    if not self.entry or not fn:
      raise RuntimeError(f"LLVM object for {name} lacks the kernel or its entry: was it rendered by LLVMRenderer?")
    self.parallel = ctypes.c_int32.from_address(par).value if par else 0
    self.fn_addr = fn
    self._setup_threads()


_llvm_lock = threading.Lock()


# ***** allocator *****

class _libc:
  lib: Any = None

  @classmethod
  def get(cls) -> Any:
    if cls.lib is None:
      lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
      lib.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
      lib.posix_memalign.restype = ctypes.c_int
      lib.free.argtypes = [ctypes.c_void_p]
      lib.free.restype = None
      if hasattr(lib, "madvise"):
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.madvise.restype = ctypes.c_int
      cls.lib = lib
    return cls.lib


# Linux transparent huge pages: a buffer of at least HUGE_PAGE bytes starts on a 2 MiB boundary and asks for huge pages
# (MADV_HUGEPAGE, which the common THP setting "madvise" needs). A stream over 64 MB then takes 32 TLB entries instead
# of 16384 page walks: a sum of 16M floats on 2 cores reads ~10% faster. Smaller buffers keep 4 KiB pages (no waste).
HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
_use_huge_pages = sys.platform.startswith("linux")


def advise_huge_pages(addr: int, size: int) -> bool:
  """Ask Linux to back the whole 2 MiB pages inside [addr, addr+size) with huge pages; False when it refused or cannot."""
  lo, hi = -(-addr // HUGE_PAGE) * HUGE_PAGE, (addr + size) // HUGE_PAGE * HUGE_PAGE
  if not _use_huge_pages or hi <= lo or not hasattr(_libc.get(), "madvise"):
    return False
  return _libc.get().madvise(lo, hi - lo, _MADV_HUGEPAGE) == 0


def alloc_host(size: int, align: int) -> Any:
  """`size` bytes of host memory (a ctypes array, free with free()), `align`-aligned; huge pages from HUGE_PAGE bytes."""
  ptr = ctypes.c_void_p()
  huge = size >= HUGE_PAGE and _use_huge_pages
  if _libc.get().posix_memalign(ctypes.byref(ptr), max(align, HUGE_PAGE) if huge else align, size) != 0 or not ptr.value:
    raise MemoryError(f"cannot allocate {size} bytes of host memory")
  if huge:
    advise_huge_pages(ptr.value, size)   # only a hint: 4 KiB pages work the same, a little slower
  return (ctypes.c_uint8 * size).from_address(ptr.value)


class ClangAllocator(LRUAllocator):
  """Host memory for CLANG and LLVM: 64-byte aligned (one cache line, one AVX-512 vector), not zeroed, freed with free().
  Buffers of HUGE_PAGE bytes or more are 2 MiB aligned and use transparent huge pages where Linux offers them.

  Buffers are ctypes arrays over the malloc'd memory, so `as_buffer` is a zero-copy memoryview."""

  ALIGN = 64

  def __init__(self) -> None:
    super().__init__()
    self.live: Dict[int, int] = {}

  def _alloc(self, size: int, options: BufferOptions) -> Any:
    return alloc_host(size, self.ALIGN)

  def _free(self, opaque: Any, options: BufferOptions) -> None:
    _libc.get().free(ctypes.addressof(opaque))

  def as_buffer(self, src: Any) -> memoryview:
    return flat_mv(memoryview(src))

  def copyin(self, dest: Any, src: memoryview) -> None:
    if src.nbytes:
      flat_mv(memoryview(dest))[:src.nbytes] = flat_mv(src)

  def copyout(self, dest: memoryview, src: Any) -> None:
    if dest.nbytes:
      flat_mv(dest)[:] = flat_mv(memoryview(src))[:dest.nbytes]

  def offset(self, buf: Any, size: int, offset: int) -> Any:
    # from_buffer keeps a reference to buf, so a view never outlives the memory it looks at
    return (ctypes.c_uint8 * size).from_buffer(buf, offset)

  def from_external(self, ptr: int, size: int, options: Optional[BufferOptions] = None) -> Any:
    """Wrap memory someone else owns (never freed by this allocator)."""
    return (ctypes.c_uint8 * size).from_address(ptr)


def run_entries(progs: List[CPUProgram], args: List[Any], T: int) -> int:
  """Run several programs back to back on the pool (one native call when the pool is native)."""
  pool = get_pool()
  if isinstance(pool, NativePool):
    from tiny_clang.pool import run_list
    return run_list([p.entry for p in progs], args, [p.parallel for p in progs], T)
  return pool.run_list([p.entry for p in progs], args, [p.parallel for p in progs], T)
