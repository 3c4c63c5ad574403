"""A native thread pool that runs kernels split across all cores, built once per process with the C compiler.

Every kernel this package renders has an *entry* function `void NAME_entry(const long long *args, int core, int ncores)`:
`args` holds the buffer addresses followed by the symbolic variable values, and (core, ncores) picks the slice of the
kernel's outermost parallel loop to run. The pool calls entries from its worker threads, so one ctypes call (which
releases the GIL) runs a kernel on every core, and `tiny_pool_run` runs a whole list of kernels (a JIT graph) with a
barrier between dependent kernels and no Python in between.

When no C compiler is present (an LLVM-only install) the pool falls back to Python threads (`PyPool`).
"""
from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List, Optional, Sequence

from tiny.helpers import THREADS

POOL_SRC = r"""
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
typedef void (*tiny_entry_t)(const int64_t *args, int core, int ncores);
#define TINY_MAXT 256
static int nthr = 0;                                  /* worker threads started (the caller is participant 0) */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER, run_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static unsigned long job_gen = 0;
static int job_n, job_T;
static tiny_entry_t const *job_fns;
static const int64_t *const *job_args;
static const int32_t *job_par;
static int bar_arrived = 0, bar_phase = 0;
static unsigned long start_gen[TINY_MAXT];              /* job_gen when worker p was made: it waits for the next one */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
/* spin a little (kernels are short), then yield: the machine may have fewer free cores than threads */
static void barrier(int T) {
  int phase = __atomic_load_n(&bar_phase, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&bar_arrived, 1, __ATOMIC_ACQ_REL) == T) {
    __atomic_store_n(&bar_arrived, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&bar_phase, phase + 1, __ATOMIC_RELEASE);
    return;
  }
  for (int spins = 0; __atomic_load_n(&bar_phase, __ATOMIC_ACQUIRE) == phase; spins++) {
    if (spins < 4000) cpu_relax(); else sched_yield();
  }
}
static void run_part(int p, int T) {
  for (int k = 0; k < job_n; k++) {
    int par = job_par[k];
    if (par) job_fns[k](job_args[k], p, T);
    else if (p == 0) job_fns[k](job_args[k], 0, 1);
    /* a barrier is needed where the next kernel may read what this one wrote on another core, and at the end */
    if (k == job_n - 1 || par || job_par[k + 1]) barrier(T);
  }
}
static void *worker(void *arg) {
  int p = (int)(intptr_t)arg;
  unsigned long seen = start_gen[p];
  for (;;) {
    int spins = 0;
    while (__atomic_load_n(&job_gen, __ATOMIC_ACQUIRE) == seen && spins < 20000) { cpu_relax(); spins++; }
    pthread_mutex_lock(&mu);
    while (job_gen == seen) pthread_cond_wait(&cv, &mu);
    seen = job_gen;
    int T = job_T;
    pthread_mutex_unlock(&mu);
    if (p < T) run_part(p, T);
  }
  return 0;
}
static void after_fork_child(void) {
  /* threads do not survive fork: start over, new workers are made on demand */
  nthr = 0; bar_arrived = 0; bar_phase = 0;
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
    start_gen[nthr + 1] = job_gen;
    int err = pthread_create(&th, &attr, worker, (void *)(intptr_t)(nthr + 1));
    pthread_attr_destroy(&attr);
    if (err) break;
    nthr++;
  }
  return nthr + 1 < T ? nthr + 1 : T;
}
/* run n kernels in order; kernel k is split across T cores when par[k] != 0. Returns the cores used. */
int tiny_pool_run(int n, tiny_entry_t const *fns, const int64_t *const *args, const int32_t *par, int T) {
  int anypar = 0;
  for (int k = 0; k < n; k++) anypar |= par[k];
  if (T <= 1 || !anypar || n == 0) {
    for (int k = 0; k < n; k++) fns[k](args[k], 0, 1);
    return 1;
  }
  pthread_mutex_lock(&run_mu);
  T = ensure_workers(T);
  if (T <= 1) {
    for (int k = 0; k < n; k++) fns[k](args[k], 0, 1);
    pthread_mutex_unlock(&run_mu);
    return 1;
  }
  pthread_mutex_lock(&mu);
  job_n = n; job_fns = fns; job_args = args; job_par = par; job_T = T;
  __atomic_add_fetch(&job_gen, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  run_part(0, T);
  pthread_mutex_unlock(&run_mu);
  return T;
}
int tiny_pool_run1(tiny_entry_t fn, const int64_t *args, int32_t par, int T) {
  return tiny_pool_run(1, &fn, &args, &par, T);
}
"""


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


def get_pool() -> Any:
  """The process-wide pool: native when a C compiler can build it, else Python threads."""
  global _pool
  with _pool_lock:
    if _pool is None:
      try:
        from tiny_clang.compiler import ClangCompiler, find_cc
        from tiny_clang.runtime import load_shared
        if find_cc() is None:
          raise RuntimeError("no C compiler")
        _pool = NativePool(load_shared(ClangCompiler("pool", opt_args=["-O2", "-pthread"]).compile_cached(POOL_SRC)))
      except Exception:
        _pool = PyPool()
    return _pool


def run_list(fns: List[int], args: List[Any], par: List[int], T: int) -> int:
  """Run a list of kernel entries on the pool (helper for tests and the graph)."""
  pool = get_pool()
  if isinstance(pool, NativePool):
    n = len(fns)
    fa, aa, pa = (ctypes.c_void_p * n)(*fns), (ctypes.c_void_p * n)(*[ctypes.addressof(a) for a in args]), (ctypes.c_int32 * n)(*par)
    return pool.run(n, fa, aa, pa, T)
  return pool.run_list(fns, args, par, T)
