"""A native thread pool that runs kernels split across all cores, built once per process with the C compiler.

Every kernel this package renders has an *entry* function `void NAME_entry(const long long *args, int slice, int nslices)`:
`args` holds the buffer addresses followed by the symbolic variable values, and (slice, nslices) picks the part of the
kernel's outermost parallel loop to run. A parallel kernel is cut into SLICES_PER_THREAD slices per thread that the
threads claim one at a time (an atomic counter), so a thread the OS does not run in time delays nothing but its own slice.
One ctypes call (which releases the GIL) runs a kernel on every core, and `tiny_pool_run` runs a whole list of kernels
(a JIT graph), each to completion before the next, without returning to Python.

When no C compiler is present (an LLVM-only install) the pool falls back to Python threads (`PyPool`).
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional, Sequence

from tiny_clang.settings import THREADS

POOL_SRC = r"""
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
typedef void (*tiny_entry_t)(const int64_t *args, int slice, int nslices);
#define TINY_MAXT 256
/* an idle worker spins this long before it sleeps: a kernel that comes sooner finds it awake. Measured by time, not by
   spins: one pause takes ~9 ns on the AVX-512 Xeon and ~40 ns on Skylake, and a loop of 20000 of them (0.18 ms there)
   ended before the ~0.25 ms of Python between two eager `(a @ b).realize()` calls, so every call woke the worker
   through the condition variable and it started its first slice ~0.15-1 ms late instead of ~15 us */
#define TINY_SPIN_NS 1000000LL
/* past this much of the spin, each spin yields the core instead of pausing: a process that waits for it (other test
   workers, a busy machine) runs first, while a kernel that comes still finds the worker awake */
#define TINY_SPIN_YIELD_NS 100000LL
/* read the clock once per this many spins (a vDSO call of ~20 ns against ~64 pauses or yields) */
#define TINY_SPIN_CHECK 64
static int nthr = 0;                                   /* worker threads started (the caller works too) */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER, run_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int sleeping = 0;
/* the current job: slices of one kernel handed out on demand. ctr = (generation << 32) | next slice */
static uint64_t ctr = 0;
static uint32_t cur_gen = 0;
static int done = 0;
static tiny_entry_t job_fn;
static const int64_t *job_args;
static int job_n;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
/* claim and run slices of job `gen` until none is left. A thread that comes late (the machine is busy) finds nothing
   to do instead of holding everyone up: whoever is running takes the next slice. */
static void work(uint32_t gen) {
  for (;;) {
    uint64_t v = __atomic_load_n(&ctr, __ATOMIC_SEQ_CST);
    if ((uint32_t)(v >> 32) != gen) return;
    tiny_entry_t fn = __atomic_load_n(&job_fn, __ATOMIC_RELAXED);
    const int64_t *args = __atomic_load_n(&job_args, __ATOMIC_RELAXED);
    int n = __atomic_load_n(&job_n, __ATOMIC_RELAXED);
    if ((int)(uint32_t)v >= n) return;
    /* a successful claim means job gen is unfinished, so fn/args/n read above still describe it */
    if (!__atomic_compare_exchange_n(&ctr, &v, v + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) continue;
    fn(args, (int)(uint32_t)v, n);
    __atomic_add_fetch(&done, 1, __ATOMIC_SEQ_CST);
  }
}
static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
static void *worker(void *arg) {
  uint32_t seen = (uint32_t)(uintptr_t)arg;
  for (;;) {
    uint32_t g;
    int spins = 0, yielding = 0;
    long long idle_since = now_ns();
    while ((g = (uint32_t)(__atomic_load_n(&ctr, __ATOMIC_SEQ_CST) >> 32)) == seen) {
      long long idle = ++spins % TINY_SPIN_CHECK == 0 ? now_ns() - idle_since : -1;
      if (idle >= TINY_SPIN_NS) {
        pthread_mutex_lock(&mu);
        __atomic_add_fetch(&sleeping, 1, __ATOMIC_SEQ_CST);
        while ((uint32_t)(__atomic_load_n(&ctr, __ATOMIC_SEQ_CST) >> 32) == seen) pthread_cond_wait(&cv, &mu);
        __atomic_sub_fetch(&sleeping, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&mu);
        continue;
      }
      if (idle >= 0) yielding = idle >= TINY_SPIN_YIELD_NS;
      if (yielding) sched_yield(); else cpu_relax();
    }
    seen = g;
    work(g);
  }
  return 0;
}
static void after_fork_child(void) {
  /* threads do not survive fork: start over, new workers are made on demand */
  nthr = 0; sleeping = 0;
  pthread_mutex_init(&mu, 0); pthread_mutex_init(&run_mu, 0); pthread_cond_init(&cv, 0);
}
static int ensure_workers(int T) {
  static int atfork_done = 0;
  if (!atfork_done) { pthread_atfork(0, 0, after_fork_child); atfork_done = 1; }
  if (T > TINY_MAXT) T = TINY_MAXT;
  while (nthr + 1 < T) {
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&th, &attr, worker, (void *)(uintptr_t)cur_gen);
    pthread_attr_destroy(&attr);
    if (err) break;
    nthr++;
  }
  return nthr + 1 < T ? nthr + 1 : T;
}
static void run_split(tiny_entry_t fn, const int64_t *args, int nslices) {
  __atomic_store_n(&job_fn, fn, __ATOMIC_RELAXED);
  __atomic_store_n(&job_args, args, __ATOMIC_RELAXED);
  __atomic_store_n(&job_n, nslices, __ATOMIC_RELAXED);
  __atomic_store_n(&done, 0, __ATOMIC_RELAXED);
  uint32_t gen = ++cur_gen;
  __atomic_store_n(&ctr, (uint64_t)gen << 32, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&sleeping, __ATOMIC_SEQ_CST)) {
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
  }
  work(gen);
  for (int spins = 0; __atomic_load_n(&done, __ATOMIC_SEQ_CST) < nslices; spins++) {
    if (spins < 4000) cpu_relax(); else sched_yield();
  }
}
/* run n kernels in order, each to completion; kernel k is cut into slices shared by T threads when par[k] != 0.
   Returns the threads available. */
int tiny_pool_run(int n, tiny_entry_t const *fns, const int64_t *const *args, const int32_t *par, int T) {
  int anypar = 0;
  for (int k = 0; k < n; k++) anypar |= par[k];
  if (T <= 1 || !anypar) {
    for (int k = 0; k < n; k++) fns[k](args[k], 0, 1);
    return 1;
  }
  pthread_mutex_lock(&run_mu);
  T = ensure_workers(T);
  for (int k = 0; k < n; k++) {
    if (par[k] && T > 1) run_split(fns[k], args[k], T * TINY_SLICES_PER_THREAD);
    else fns[k](args[k], 0, 1);
  }
  pthread_mutex_unlock(&run_mu);
  return T;
}
int tiny_pool_run1(tiny_entry_t fn, const int64_t *args, int32_t par, int T) {
  return tiny_pool_run(1, &fn, &args, &par, T);
}
"""


# a parallel kernel is cut into this many slices per thread, handed out on demand: a thread the OS does not schedule
# in time (the machine is busy) holds up at most one slice, and uneven slices even out
SLICES_PER_THREAD = 4


def num_threads() -> int:
  """Threads a kernel may use: THREADS when set (1 turns threading off), else every core this process may run on."""
  if THREADS.value > 0:
    return int(THREADS.value)
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:  # not Linux
    return max(1, os.cpu_count() or 1)


class NativePool:
  """ctypes front of POOL_SRC: `run1(entry_addr, args, parallel, T)` and `run(n, fns, args, par, T)`."""

  def __init__(self, lib: Any) -> None:
    self.lib = lib
    self.run = lib.tiny_pool_run
    self.run.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    self.run.restype = ctypes.c_int
    self.run1 = lib.tiny_pool_run1
    self.run1.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
    self.run1.restype = ctypes.c_int


class PyPool:
  """The same interface with Python threads, for machines without a C compiler (the ctypes calls drop the GIL)."""

  def __init__(self) -> None:
    self.ex: Optional[ThreadPoolExecutor] = None
    self.lock = threading.Lock()
    self.entry_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)

  def _call(self, fn: int, args: int, core: int, n: int) -> None:
    self.entry_type(fn)(args, core, n)

  def run1(self, fn: int, args: Any, par: int, T: int) -> int:
    addr = ctypes.addressof(args) if not isinstance(args, int) else args
    if not par or T <= 1:
      self._call(fn, addr, 0, 1)
      return 1
    with self.lock:
      if self.ex is None:
        self.ex = ThreadPoolExecutor(max_workers=max(T - 1, 1), thread_name_prefix="tiny_clang")
      futs = [self.ex.submit(self._call, fn, addr, c, T) for c in range(1, T)]
      self._call(fn, addr, 0, T)
      for f in futs:
        f.result()
    return T

  def run_list(self, fns: Sequence[int], args: Sequence[Any], par: Sequence[int], T: int) -> int:
    for f, a, p in zip(fns, args, par):
      self.run1(f, a, p, T)
    return T


_pool: Optional[Any] = None
_pool_lock = threading.Lock()
# why the native pool could not be built (None while it is native or not built yet): `python -m tiny doctor` shows it
fallback_reason: Optional[str] = None


def get_pool() -> Any:
  """The process-wide pool: native when a C compiler can build it, else Python threads (with one warning saying why)."""
  global _pool, fallback_reason
  with _pool_lock:
    if _pool is None:
      try:
        from tiny_clang.compiler import ClangCompiler, find_cc
        from tiny_clang.runtime import load_shared
        if find_cc() is None:
          raise RuntimeError("no C compiler (clang, cc or gcc) on PATH")
        src = f"#define TINY_SLICES_PER_THREAD {SLICES_PER_THREAD}\n" + POOL_SRC
        _pool = NativePool(load_shared(ClangCompiler("pool", opt_args=["-O2", "-pthread"]).compile_cached(src)))
      except Exception as e:   # any failure to build or load it: the Python pool runs the same kernels, only slower
        first_line = (str(e).strip().splitlines() or [""])[0]   # a compiler error is long: its first line names the problem
        fallback_reason = f"{type(e).__name__}: {first_line}" if first_line else type(e).__name__
        warnings.warn(f"tiny_clang: the native thread pool could not be built ({fallback_reason}); kernels run on Python threads",
                      RuntimeWarning, stacklevel=2)
        _pool = PyPool()
    return _pool


def build_in_background() -> None:
  """Start building the process-wide pool on a daemon thread, so that its compile (~0.7 s of clang with an empty cache)
  overlaps with rendering and compiling the first kernels; the first kernel run waits for it under the lock."""
  if _pool is None:
    threading.Thread(target=get_pool, name="tiny-clang-pool-build", daemon=True).start()


def pool_notes() -> List[str]:
  """One line on the thread pool for `python -m tiny doctor`: native, or Python threads and why (builds the pool)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)   # doctor prints the reason itself
    pool = get_pool()
  if isinstance(pool, NativePool):
    return [f"thread pool: native, {num_threads()} threads"]
  return [f"thread pool: Python threads (the native pool could not be built: {fallback_reason})"]


def run_list(fns: List[int], args: List[Any], par: List[int], T: int) -> int:
  """Run a list of kernel entries on the pool (helper for tests and the graph)."""
  pool = get_pool()
  if isinstance(pool, NativePool):
    n = len(fns)
    fa, aa, pa = (ctypes.c_void_p * n)(*fns), (ctypes.c_void_p * n)(*[ctypes.addressof(a) for a in args]), (ctypes.c_int32 * n)(*par)
    return pool.run(n, fa, aa, pa, T)
  return pool.run_list(fns, args, par, T)
