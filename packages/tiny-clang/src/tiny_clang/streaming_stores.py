"""Non-temporal (streaming) stores for kernels whose output is far larger than the caches, on x86 hosts with AVX-512.

A normal store to a line that is not cached first reads that line from memory (write-allocate), then writes it back
when it is evicted: an elementwise kernel over 64 MB inputs such as `(a*b+c).relu()` moves 3 x 64 MB in, 64 MB of
read-for-ownership and 64 MB out. A non-temporal store (`vmovntps`) of a whole, aligned 64-byte line skips the read
and the cache, so the output costs its own size only. That pays only when the output would not stay cached anyway:
an output the next kernel reads back while it is still in L2/LLC must use normal stores, so only buffers of at least
STREAM_MIN_BYTES written by a kernel are streamed.

Which stores stream (decided from the linearized uops, the same for CLANG and LLVM):
- the renderer's `stream_min_bytes` is above 0: x86 with AVX-512 and 64-byte vectors (one zmm is one cache line);
- the store writes a 64-byte vector to a global buffer (half/bf16 buffers, stored lane by lane, never stream);
- no reduce loop encloses it, and the loops that do have constant bounds;
- the kernel's streamable stores into that buffer write `stream_min_bytes` or more in all.
The renderers test each address at run time: a store whose address is not 64-byte aligned (a view at an odd offset, a
row that is not a whole number of lines) is a plain store, so no alignment is ever assumed. A kernel with streaming
stores ends with an `sfence`: they are weakly ordered, and the pool's atomics then publish the finished slice.

A kernel with streaming stores and no reduce also prefetches its ungated whole-line vector loads PREFETCH_BYTES ahead
(`prefetcht0`, which never faults, so an address past the end of a buffer is harmless): such a kernel streams its inputs too, and the
hardware prefetchers alone keep too few of their lines in flight. `(a*b+c).relu()` over 16M floats, the kernel alone,
1 thread, CPU time, shuffled in-process A/B on the 2-core AVX-512 Xeon (median ratios over 4 runs): 2 KiB ahead
1.05-1.08x (as tiny renders it: CLANG 1.04x, LLVM 1.09x); 0.5 KiB 1.00x, 1 KiB 1.00-1.01x, 4 KiB 1.01-1.03x, 8 KiB 1.00x.
TINY_STREAM_PREFETCH_BYTES overrides the distance (0 turns it off).

STREAM_MIN_BYTES (TINY_STREAM_MIN_BYTES overrides; 0 turns streaming off): 16 MiB. On the 2-core AVX-512 Xeon this
was measured on (2 MiB L2 a core), a kernel `(a*b+c).relu()` that streams its output, followed by a kernel that reads
it back (in-process A/B against the same source with plain stores, 2 threads, median of pair ratios): output 4 MiB
0.86x, 8 MiB 0.99x, 16 MiB 1.01x, 32 MiB 1.09x; alone, the 64 MiB output kernel ran 1.18-1.2x faster.
"""
from __future__ import annotations

import platform
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple

from tiny.backend import DType, PtrDType, UOp, UOps, dtypes, getenv

LINE_BYTES = 64
STREAM_MIN_BYTES = int(getenv("TINY_STREAM_MIN_BYTES", 16 << 20))
PREFETCH_BYTES = int(getenv("TINY_STREAM_PREFETCH_BYTES", 2048))   # 0 turns the loads' prefetch off


def stream_min_bytes(simd_bytes: int, cpu_flags: FrozenSet[str]) -> int:
  """The threshold a renderer for this host starts at: STREAM_MIN_BYTES on x86 with AVX-512 and 64-byte vectors, else 0
  (no streaming stores). Renderers keep it as a plain attribute, so it is part of their cache key."""
  x86 = platform.machine().lower() in ("x86_64", "amd64")
  return STREAM_MIN_BYTES if x86 and simd_bytes >= LINE_BYTES and "avx512f" in cpu_flags else 0


def stream_prefetch_bytes(min_bytes: int) -> int:
  """How far ahead a streaming kernel prefetches its loads on a renderer whose stream threshold is min_bytes: 0 where it
  never streams (renderers keep it as a plain attribute, so it is part of their cache key)."""
  return max(0, PREFETCH_BYTES) if min_bytes > 0 else 0


def _trip_count(rng: UOp) -> Optional[int]:
  lo, hi = rng.src[0], rng.src[1]   # a store loop of a row kernel has a third source (its AFTER)
  if lo.op is not UOps.CONST or hi.op is not UOps.CONST:
    return None
  return max(0, int(hi.arg) - int(lo.arg))


def _is_16bit_float(dt: DType) -> bool:
  return dt.scalar() in (dtypes.float16, dtypes.bfloat16)


def whole_line(dt: Optional[DType]) -> bool:
  """dt is a vector filling one whole 64-byte cache line, of a type the renderers load and store as such (16-bit floats
  and bools go through conversions)."""
  return dt is not None and dt.count > 1 and dt.itemsize == LINE_BYTES and not _is_16bit_float(dt) and dt.scalar() != dtypes.bool


def in_loops(uops: Sequence[UOp]) -> Iterator[Tuple[UOp, List[UOp]]]:
  """Each uop other than RANGE and ENDRANGE, with the loops open around it (outermost first). The list is the walk's
  own and changes as it goes on: read it before the next step."""
  open_ranges: List[UOp] = []
  for u in uops:
    if u.op is UOps.RANGE:
      open_ranges.append(u)
    elif u.op is UOps.ENDRANGE:
      if open_ranges:
        open_ranges.pop()
    else:
      yield u, open_ranges


def streaming_stores(uops: Sequence[UOp], min_bytes: int) -> Set[UOp]:
  """The STORE uops of a kernel to render as non-temporal stores when a buffer that gets min_bytes or more streams
  (see the module docstring for the rules); none when min_bytes <= 0."""
  if min_bytes <= 0:
    return set()
  candidates: Dict[UOp, List[UOp]] = {}
  written: Dict[UOp, int] = {}
  for u, open_ranges in in_loops(uops):
    if u.op is UOps.STORE:
      buf, value = u.src[0], u.src[2]
      if buf.op is not UOps.DEFINE_GLOBAL or not isinstance(buf.dtype, PtrDType) or value.dtype is None:
        continue
      if not whole_line(value.dtype):
        continue
      if any(r.arg[1] for r in open_ranges):
        continue
      trips = 1
      for r in open_ranges:
        n = _trip_count(r)
        if n is None:
          break
        trips *= n
      else:
        candidates.setdefault(buf, []).append(u)
        written[buf] = written.get(buf, 0) + trips * LINE_BYTES
  return {s for buf, stores in candidates.items() if written[buf] >= min_bytes for s in stores}


def prefetched_loads(uops: Sequence[UOp], streams: Set[UOp], distance: int) -> Set[UOp]:
  """The LOAD uops a kernel prefetches `distance` bytes ahead of: when it has streaming stores (streams, from
  streaming_stores) and no reduce, its ungated loads of a whole 64-byte vector from a global buffer; none otherwise."""
  # a reduce re-reads its inputs (matmul panels, softmax rows) from cache: prefetching them only costs issue slots (2048²
  # matmul, 2 threads, quiet machine: 306-317 GFLOP/s with the prefetches, 327-331 without)
  if not streams or distance <= 0 or any(u.op is UOps.DEFINE_ACC for u in uops):
    return set()
  out: Set[UOp] = set()
  for u in uops:
    if u.op is not UOps.LOAD or u.dtype is None or u.src[0].op is not UOps.DEFINE_GLOBAL:
      continue
    if len(u.src) >= 4 and u.src[2].op is not UOps.BARRIER:
      continue   # a gated load may read nothing at all: leave it alone
    if whole_line(u.dtype):
      out.add(u)
  return out
