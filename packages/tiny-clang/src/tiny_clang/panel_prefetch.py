"""A packed matmul (tiny_clang.matmul_panels) with its panel loop outermost fetches the next panel while it computes this one.

With the panels outermost, a kernel walks panel p (k * width floats, contiguous) once per row tile: the first row tile
pulls it from memory, the others find it in L2. A linear layer's weights are read once per call, so that first tile
streams the panel from DRAM at what one core's misses keep in flight (~13 GB/s on the AVX-512 Xeon), while the tile
itself could take ~3x that: the first tile of every panel waits on memory. A software prefetch of panel p + 1 spread
over the row tiles of panel p overlaps that pull with the arithmetic: row tile t prefetches its 1/tiles share of the next
panel, a few bytes further each reduce step (one prefetch instruction per step, so each line is asked for a few times
in a row, which costs an issue slot only).

Measured (in-process A/B of the compiled CLANG kernel, one thread, CPU time, caches flushed before each call, as a
model's weights come in; loaded 2-vCPU AVX-512 Xeon, best of 15): GPT-2's prefill, 128 rows: x @ W 768x3072 4.18-4.19
-> 3.45-3.46 ms, 768x2304 3.10 -> 2.61, 3072x768 4.03 -> 3.82 and 3.62 -> 3.65 (a 1.5 MB a and two 384 KB panels fill
the 2 MB L2). Prefetching the whole next panel from every row tile at the same reduce step (constant distance, 1 or 2
prefetches a step) gained nothing (3.87 -> 3.73-3.80 ms). Warm (weights in L3) the kernels ran the same within noise.

What is prefetched (decided from the linearized uops, the same for CLANG and LLVM): the first ungated whole-line vector
LOAD of a global buffer inside exactly three loops, (panels, row tiles, reduce) outermost first, where the index moves
by the panel's size when the panel loop steps, not at all with the row tile, and by `width` with the reduce step, with
panel size = width * reduce trip count (contiguous panels), MIN_TILES to MAX_TILES row tiles and a buffer of at least
MIN_BYTES. TINY_PANEL_PREFETCH=0 turns it off (the renderers' `next_panel_prefetch`, part of their cache key).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from tiny.backend import UOp, UOps, getenv
from tiny_clang.row_prefetch import index_step
from tiny_clang.streaming_stores import in_loops, whole_line

PANEL_PREFETCH = int(getenv("TINY_PANEL_PREFETCH", 1))
# a buffer of panels below this stays in L2/L3 between uses, or is pulled too briefly to matter
MIN_BYTES = 1 << 20
# with fewer row tiles the share of each tile grows and the prefetch of the next panel comes in bursts
MIN_TILES = 4
# with more, the one pull of a panel from memory is a small part of the panel's work, and the prefetch instruction in
# every reduce step of the FMA-bound loop costs more than it hides: 2048² (256 row tiles) ran 298-307 against 328-334
# GFLOP/s without it (2 threads, CLANG, same minutes)
MAX_TILES = 32


@dataclass(frozen=True)
class PanelPrefetch:
  """One prefetch per reduce step at `load`'s address + ahead + tile index * share + reduce index * step (bytes)."""

  load: UOp
  tile: UOp
  reduce: UOp
  ahead: int
  share: int
  step: int


def _const(u: UOp) -> Optional[int]:
  return int(u.arg) if u.op is UOps.CONST and isinstance(u.arg, int) and not isinstance(u.arg, bool) else None


def panel_prefetch(uops: Sequence[UOp], simd_bytes: int, enabled: bool = True) -> Optional[PanelPrefetch]:
  """The next-panel prefetch of a packed matmul kernel with its panels outermost, or None (see the module docstring)."""
  if not enabled or simd_bytes < 64:
    return None
  for u, open_ranges in in_loops(uops):
    if u.op is not UOps.LOAD or u.src[0].op is not UOps.DEFINE_GLOBAL or len(open_ranges) != 3:
      continue
    if len(u.src) >= 4 or not whole_line(u.dtype):   # gated
      continue
    loops = list(open_ranges)
    panel, tile, red = loops
    if panel.arg[1] or tile.arg[1] or not red.arg[1]:
      return None
    trips = [(_const(r.src[1]) or 0) - (_const(r.src[0]) or 0) for r in loops]
    if any(t <= 0 for t in trips) or not MIN_TILES <= trips[1] <= MAX_TILES:
      return None
    size, width = index_step(u.src[1], loops, 0), index_step(u.src[1], loops, 2)
    if size is None or width is None or index_step(u.src[1], loops, 1) != 0 or width <= 0 or size != width * trips[2]:
      return None
    item = u.src[0].dtype.base.itemsize   # type: ignore[union-attr]
    if trips[0] * size * item < MIN_BYTES:
      return None
    share = -(-size * item // trips[1])
    step = -(-share // trips[2])
    # the load walks the panel width * item bytes a step; the prefetch walks its tile's share `step` bytes a step
    return PanelPrefetch(u, tile, red, size * item, step * trips[2], step - width * item)
  return None
