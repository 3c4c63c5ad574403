"""Packed-panel matmul on the CPU: which products `Tensor.dot` repacks, and how the packed kernel is tiled.

A CPU kernel for `a @ b` keeps a register tile of rows x one strip of b's columns and walks the reduce axis, reading the
strip one b row at a time. With b row-major those reads are n * itemsize bytes apart, and with n a power of two they
fall into a handful of cache sets: the strip never stays in cache and every pass streams it again (1024² on AVX2: ~25
GFLOP/s per core of ~100). The CPU renderers therefore ask `Tensor.dot` (`Renderer.matmul_panel`) to copy b into
contiguous panels (n // width, k, width) first, and tile the product that reads them as:

  blocks of rows  x  panels  x  rows of the block (a register tile of `rows` x one panel)  x  k

so one panel (k * width floats) stays in L2 while a block of a's rows, small enough to stay in L2 beside it, streams
past it; the panel loop runs once per block, not once per row tile. Measured on one AVX2 core (process time, 1024² and
2048²): ~78-86 GFLOP/s against ~25 and ~18 before, and torch's 63-71 in the same session.
"""
from __future__ import annotations

from typing import Optional, Tuple

from tiny.backend import DType, Kernel, KernelOptError, Opt, OptOps, ReduceOps, dtypes

# bytes of a's rows that one block keeps in cache beside a panel (about half an L2 of current x86/arm cores; 256 KB to
# 2 MB measured within noise of each other on 1024² and 2048², 4 MB ~10% slower)
BLOCK_BYTES = 512 * 1024
# below this many multiply-adds the copy into panels costs more than the product gains (a few microseconds of work)
MIN_MACS = 1 << 21


def panel_width(simd_bytes: int, m: int, k: int, n: int, dtype: DType) -> int:
  """`Renderer.matmul_panel` for a CPU with simd_bytes-wide vectors: two vectors of columns, or 0 (no packing).

  Only float32/float64 products with enough rows to amortize the copy (a matrix-vector product streams b once anyway),
  a reduce long enough to alias, and n a multiple of the width."""
  if dtype not in (dtypes.float32, dtypes.float64) or simd_bytes < 16:
    return 0
  width = 2 * simd_bytes // dtype.itemsize
  if m < 16 or k < 64 or n < 2 * width or n % width != 0 or m * k * n < MIN_MACS:
    return 0
  return width


def _panel_axes(k: Kernel) -> Optional[Tuple[int, int, int]]:
  """(last row axis, panel axis, reduce axis) when k reads b as packed panels (n // w, k, w) and a broadcasts along them."""
  if k.reduceop is None or k.upcasted or k.reduceop.op is not ReduceOps.SUM or not all(isinstance(s, int) for s in k.full_shape):
    return None
  lane, panel, red = k.first_reduce - 1, k.first_reduce - 2, k.first_reduce
  if panel < 1 or k.first_upcast != red + 1 or len(k.bufs) != 3:
    return None
  shape = k.full_shape
  out, x, y = (st.real_strides() for st in k.sts[:3])
  width = shape[lane]
  for vec, other in ((x, y), (y, x)):
    if vec[lane] == 1 and vec[red] == width and vec[panel] == width * shape[red] and all(vec[a] == 0 for a in range(panel)) and \
        other[lane] == 0 and other[panel] == 0 and other[red] != 0 and out[lane] == 1 and out[panel] == width:
      return panel - 1, panel, red
  return None


def panel_tile(k: Kernel, lanes: int, regs: int) -> bool:
  """Tile a product that reads packed panels (see the module doc) for `regs` vector registers of `lanes` lanes of the
  output dtype (tiny_clang.heuristics.simd_lanes / simd_registers); True when applied, False leaves k untouched."""
  if (axes := _panel_axes(k)) is None:
    return False
  rows_axis, panel, red = axes
  width = k.full_shape[panel + 1]
  vecs = max(1, width // max(lanes, 1))
  m = k.full_shape[rows_axis]
  # half the register file holds accumulators: rows x vecs of them (AVX2: 4 x 2, AVX-512: 8 x 2)
  rows = next((r for r in (8, 4, 2) if r * vecs <= regs // 2 and m % r == 0), 1)
  block_rows = max(rows, BLOCK_BYTES // (k.full_shape[red] * k.bufs[0].dtype.itemsize))
  per_block = next((b for b in range(block_rows // rows, 1, -1) if (m // rows) % b == 0), 1)
  try:
    for step in ((width,) if width <= 16 else (16, width // 16)):
      k.apply_opt(Opt(OptOps.UPCAST, panel + 1, step))
    if rows > 1:
      k.apply_opt(Opt(OptOps.UPCAST, rows_axis, rows))
    if per_block > 1 and m // rows > per_block:
      k.apply_opt(Opt(OptOps.BLOCK, rows_axis, per_block))
  except KernelOptError:
    return bool(k.upcasted)
  return True
