"""This machine's physical limits, measured: peak fp32 FMA throughput and streaming memory bandwidth on all cores.

`bench/run.py` divides each GFLOP/s row by the FMA peak and each GB/s row by the stream bandwidth, so RESULTS.md says how
close a kernel is to what the hardware allows, not only how it compares with a peer. Both are measured by a small C
program built with the host's clang (-O3 -march=native), one pthread per core:
- peak FMA: each thread keeps 12 independent vector accumulators (enough to cover FMA latency on two ports) and runs
  a long chain of a*x+b on them; 2 flops per lane per FMA.
- stream: the better of two probes, best of several passes each: a copy of each thread's slice of a 128 MiB array into
  another (read + write counted, as STREAM's copy does; the write-allocate traffic is not counted, so a copy shows less
  than the memory delivers), and a read-only sum of a 64 MiB array (the working set of `sum 16M`) with 8 vector
  accumulators a thread (what such a reduce can reach on this host, caches included).
Run `python bench/limits.py` to print them.
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Optional

_SRC = r"""
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef float vf __attribute__((vector_size(VBYTES)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

typedef struct { long iters; float out; } fma_arg;
static void *fma_worker(void *p) {
  fma_arg *a = (fma_arg *)p;
  vf acc[12]; vf m, c;
  for (int k = 0; k < (int)(VBYTES / 4); k++) { m[k] = 0.999999f; c[k] = 1e-7f; }
  for (int j = 0; j < 12; j++) acc[j] = m * (float)(j + 1);
  for (long i = 0; i < a->iters; i++) {
    for (int j = 0; j < 12; j++) acc[j] = acc[j] * m + c;
  }
  vf s = acc[0];
  for (int j = 1; j < 12; j++) s += acc[j];
  a->out = s[0];
  return 0;
}

double peak_gflops(int threads, long iters) {
  pthread_t th[256]; fma_arg args[256];
  double st = now();
  for (int t = 0; t < threads; t++) { args[t].iters = iters; pthread_create(&th[t], 0, fma_worker, &args[t]); }
  for (int t = 0; t < threads; t++) pthread_join(th[t], 0);
  double et = now() - st;
  return 2.0 * 12 * (VBYTES / 4) * (double)iters * threads / et / 1e9;
}

typedef struct { float *dst, *src; long n; } copy_arg;
static void *copy_worker(void *p) {
  copy_arg *a = (copy_arg *)p;
  vf *d = (vf *)a->dst; const vf *s = (const vf *)a->src;
  long nv = a->n / (VBYTES / 4);
  for (long i = 0; i < nv; i++) d[i] = s[i];
  return 0;
}

typedef struct { const float *src; long n; float out; } read_arg;
static void *read_worker(void *p) {
  read_arg *a = (read_arg *)p;
  const vf *s = (const vf *)a->src;
  long nv = a->n / (VBYTES / 4) / 8 * 8;
  vf acc[8] = {0};
  for (long i = 0; i < nv; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += s[i + j];
  for (int j = 1; j < 8; j++) acc[0] += acc[j];
  a->out = acc[0][0];
  return 0;
}

/* seconds for one worker per thread, each given its own element of args (size bytes apart) */
static double run_threads(int threads, void *(*fn)(void *), void *args, size_t size) {
  pthread_t th[256];
  double st = now();
  for (int t = 0; t < threads; t++) pthread_create(&th[t], 0, fn, (char *)args + t * size);
  for (int t = 0; t < threads; t++) pthread_join(th[t], 0);
  return now() - st;
}

double read_gbs(int threads, long n, int passes) {
  float *a;
  if (posix_memalign((void **)&a, 64, n * 4)) return 0;
  memset(a, 1, n * 4);
  long per = (n / threads) / 64 * 64;
  double best = 1e30;
  for (int p = 0; p < passes; p++) {
    read_arg args[256];
    for (int t = 0; t < threads; t++) { args[t].src = a + t * per; args[t].n = per; }
    double et = run_threads(threads, read_worker, args, sizeof(read_arg));
    if (et < best) best = et;
  }
  free(a);
  return 4.0 * (double)per * threads / best / 1e9;
}

double stream_gbs(int threads, long n, int passes) {
  float *a, *b;
  if (posix_memalign((void **)&a, 64, n * 4) || posix_memalign((void **)&b, 64, n * 4)) return 0;
  memset(a, 1, n * 4); memset(b, 2, n * 4);
  long per = (n / threads) / 64 * 64;
  double best = 1e30;
  for (int p = 0; p < passes; p++) {
    copy_arg args[256];
    for (int t = 0; t < threads; t++) {
      args[t].dst = (p & 1 ? a : b) + t * per; args[t].src = (p & 1 ? b : a) + t * per; args[t].n = per;
    }
    double et = run_threads(threads, copy_worker, args, sizeof(copy_arg));
    if (et < best) best = et;
  }
  free(a); free(b);
  return 2.0 * 4 * (double)per * threads / best / 1e9;
}
"""


@dataclass(frozen=True)
class Limits:
  """Measured peaks of this machine (all cores)."""

  peak_gflops: float
  stream_gbs: float   # the better of the two probes below: what the GB/s rows are divided by
  threads: int
  vector_bytes: int
  copy_gbs: float = 0.0
  read_gbs: float = 0.0

  def describe(self) -> str:
    return (f"peak fp32 FMA {self.peak_gflops:.0f} GFLOP/s, stream {self.stream_gbs:.1f} GB/s (copy {self.copy_gbs:.1f}, "
            f"read {self.read_gbs:.1f}; {self.threads} threads, {self.vector_bytes * 8}-bit vectors; bench/limits.py)")


def _vector_bytes(cc: str) -> int:
  """The widest vector the host's clang targets with -march=native (AVX-512: 64, AVX2: 32, else 16)."""
  out = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", "/dev/null"], capture_output=True, text=True).stdout
  return 64 if "__AVX512F__" in out else 32 if "__AVX__" in out else 16


@functools.lru_cache(maxsize=None)
def measure(threads: Optional[int] = None) -> Optional[Limits]:
  """Measure the limits (about 2 s); None when no C compiler is installed."""
  cc = shutil.which("clang") or shutil.which("cc")
  if cc is None:
    return None
  vbytes = _vector_bytes(cc)
  nthreads = threads or os.cpu_count() or 1
  with tempfile.TemporaryDirectory(prefix="tiny_limits_") as d:
    src, lib = os.path.join(d, "limits.c"), os.path.join(d, "limits.so")
    with open(src, "w") as f:
      f.write(_SRC)
    # clang on an AVX-512 host prefers 256-bit vectors and would split the probe's 512-bit ones in halves (half the peak)
    wide = ["-mprefer-vector-width=512"] if vbytes == 64 else []
    subprocess.run([cc, "-O3", "-march=native", *wide, f"-DVBYTES={vbytes}", "-shared", "-fPIC", "-pthread", src, "-o", lib], check=True)
    so = ctypes.CDLL(lib)
    so.peak_gflops.restype = so.stream_gbs.restype = so.read_gbs.restype = ctypes.c_double
    so.peak_gflops.argtypes = [ctypes.c_int, ctypes.c_long]
    so.stream_gbs.argtypes = so.read_gbs.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int]
    so.peak_gflops(nthreads, 1 << 20)   # warm up the cores' clocks
    peak = max(so.peak_gflops(nthreads, 1 << 24) for _ in range(3))
    copy = so.stream_gbs(nthreads, 1 << 25, 8)
    # 64 MiB: the input of `sum 16M`, the smallest working set of the GB/s rows (a host whose cache holds part of it reads
    # it faster than a 128 MiB array: 42 vs 22 GB/s on a 2-vCPU Xeon with a large L3)
    read = so.read_gbs(nthreads, 1 << 24, 8)
  return Limits(peak, max(copy, read), nthreads, vbytes, copy, read)


if __name__ == "__main__":
  lim = measure()
  print("no C compiler found" if lim is None else lim.describe())
