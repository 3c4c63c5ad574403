"""The reduce loops of register tiles, which both CPU renderers ask the compiler to unroll UNROLL_TILE times.

An innermost reduce loop that updates at least TILE_ACCS vector accumulators (a matmul or conv register tile) is
unrolled UNROLL_TILE times when its constant trip count allows.

LLVM (tiny_clang.llvmir, every host): LLVM's own choice is 2; in-process A/B on the packed matmul (1024² and 2048², AVX2
Zen 3, 1 and 2 threads) put 8 at 1.00-1.05x of 2, the most on a loaded machine (fewer instructions per FMA).

CLANG (tiny_clang.renderer, AVX-512 hosts only): clang -O2 leaves the packed matmul's 8 x 2 zmm tile loop (16 FMAs, 10
loads) rolled. Unrolled 8 times it ran 1.05-1.09x faster (in-process A/B of the two compiled kernels, 1 thread,
process time, AVX-512 Xeon: 1024² 163-171 -> 176-181 GFLOP/s, 2048² 152-156 -> 164-170), the same as 4 and better
than 16. AVX2 hosts keep clang's own choice (not measured here).
"""
from __future__ import annotations

from typing import List, Sequence, Set

from tiny.backend import UOp, UOps

TILE_ACCS, UNROLL_TILE = 4, 8


def tile_loops(uops: Sequence[UOp]) -> Set[UOp]:
  """The innermost reduce RANGEs with a constant trip count that UNROLL_TILE divides and TILE_ACCS or more vector
  accumulators: the reduce loops of register tiles."""
  out: Set[UOp] = set()
  open_ranges: List[UOp] = []
  inner: Set[UOp] = set()
  for u in uops:
    if u.op is UOps.RANGE:
      inner.difference_update(open_ranges)
      open_ranges.append(u)
      inner.add(u)
    elif u.op is UOps.ENDRANGE and open_ranges:
      open_ranges.pop()
  for r in inner:
    lo, hi = r.src[0], r.src[1]
    if not r.arg[1] or lo.op is not UOps.CONST or hi.op is not UOps.CONST or (hi.arg - lo.arg) % UNROLL_TILE != 0 or hi.arg <= lo.arg:
      continue
    accs = sum(1 for u in uops if u.op is UOps.DEFINE_ACC and r in u.src and u.dtype is not None and u.dtype.count > 1)
    if accs >= TILE_ACCS:
      out.add(r)
  return out
