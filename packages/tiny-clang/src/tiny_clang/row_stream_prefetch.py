"""A dot product over long contiguous rows of a large matrix (`x @ W.T` for one row of x: GPT-2's language-model head)
prefetches its rows ahead, on hosts whose renderers prefetch streaming kernels (tiny_clang.streaming_stores).

Such a kernel keeps one vector accumulator per output and walks that output's row of W, the rows one after another: a
single sequential stream per thread through a matrix far larger than the caches. The hardware prefetchers keep too few
of its lines in flight for one core to reach the memory bandwidth; a software prefetch the renderer's streaming
distance ahead (2 KiB) adds the lines the core would otherwise wait for.

Measured (the kernel's C alone, 1 x 768 @ 768 x 50257, 1 thread, CPU time, in-process interleaved best of 10, loaded
2-vCPU AVX-512 Xeon): 11.4-11.6 ms (13.3-13.6 GB/s) as rendered; prefetching 1 KiB ahead 9.2-9.7 ms, 4 KiB 9.0-9.2,
16 KiB 9.0-9.4 (prefetcht0 and prefetcht1 alike). The matrix-vector products of tiny_clang.matvec_split, which walk
32 rows side by side, measured no better with such prefetches (0.9-1.0x), so only the one-row-at-a-time walk gets them.

Which loads (decided from the linearized uops, the same for CLANG and LLVM): an ungated whole-line vector LOAD of a
global buffer inside exactly two loops, an output loop and, inside it, a reduce loop, where the index moves by the
vector's lanes with the reduce step and by the whole row (lanes x reduce trip count) with the output step, reading at
least MIN_BYTES in all.
"""
from __future__ import annotations

from typing import Sequence, Set

from tiny.backend import UOp, UOps
from tiny_clang.panel_prefetch import _const
from tiny_clang.row_prefetch import index_step
from tiny_clang.streaming_stores import LINE_BYTES, in_loops, whole_line

# a matrix this large is read from memory on every call (GPT-2's head: 154 MB)
MIN_BYTES = 16 << 20


def row_stream_loads(uops: Sequence[UOp], distance: int) -> Set[UOp]:
  """The LOAD uops of a dot product over contiguous rows to prefetch `distance` bytes ahead (none when distance <= 0)."""
  out: Set[UOp] = set()
  if distance <= 0:
    return out
  for u, open_ranges in in_loops(uops):
    if u.op is not UOps.LOAD or u.src[0].op is not UOps.DEFINE_GLOBAL or len(open_ranges) != 2 or len(u.src) >= 4:
      continue
    if not whole_line(u.dtype):
      continue
    loops = list(open_ranges)
    if loops[0].arg[1] or not loops[1].arg[1]:
      continue
    trips = [(_const(r.src[1]) or 0) - (_const(r.src[0]) or 0) for r in loops]
    lanes = u.dtype.count   # type: ignore[union-attr]
    if any(t <= 0 for t in trips) or index_step(u.src[1], loops, 1) != lanes or index_step(u.src[1], loops, 0) != lanes * trips[1]:
      continue
    if trips[0] * trips[1] * LINE_BYTES >= MIN_BYTES:
      out.add(u)
  return out
