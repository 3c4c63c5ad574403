"""Packed-panel matmul on the CPU: which products `Tensor.dot` repacks, and how the packed kernel is tiled.

A CPU kernel for `a @ b` keeps a register tile of rows x one strip of b's columns and walks the reduce axis, reading the
strip one b row at a time. With b row-major those reads are n * itemsize bytes apart, and with n a power of two they
fall into a handful of cache sets: the strip never stays in cache and every pass streams it again (1024² on AVX2: ~25
GFLOP/s per core of ~100). The CPU renderers therefore ask `Tensor.dot` (`Renderer.matmul_panel`) to copy b into
contiguous panels (n // width, k, width) first, and tile the product that reads them as:

  blocks of rows  x  panels  x  rows of the block (a register tile of `rows` x one panel)  x  k

The first row tile of a block pulls the panel (k * width floats) from L3, the others find it in L2, and a's rows stream
past it: four rows at a time, 16 bytes per reduce step, which the prefetchers keep up with from L3 whether or not the
block fits in L2. So what a block costs is its panel pulls, and it wants many row tiles, as long as the threads, which
share out the blocks, get enough of them (see `block_rows`); with all rows in one block the panel loop goes outermost.
Measured on one AVX2 core (process time, 1024² and 2048²): ~78-86 GFLOP/s against ~25 and ~18 before the packing, and
torch's 63-71 in the same session.

The copy into panels is tiled too (`panel_copy_tile`): blocks of a few rows of b, read whole, for every panel in turn.

On AVX-512 (8 x 2 zmm tile, 32 columns a panel) the kernel runs at ~85-90% of one core's FMA peak (process time,
1024² and 2048²), about what its 8 x 2 tile reaches on data already in L1/L2 in a C harness (85-91%); the copy into
panels takes ~3% of a one-thread 1024² call and Python ~3%. In that harness neither K-blocking (partial sums added into
c per block of k), packing a into (m // 8, k, 8) tiles, software prefetch of the next panel nor a 4 x 4 tile was
reliably faster than this layout with large row blocks (see `block_rows`).

Measured again on that Xeon (C harness of the kernel's loop nest, one thread, CPU time, huge pages, best of 3 rounds on
a loaded machine): with everything in L1 the 8 x 2 tile reaches ~85-93% of the FMA peak, and 12 x 2, 6 x 4, 8 x 3 and
4 x 4 tiles measure the same within the noise, so the register tile is not what holds the full-size kernel at ~75-78%
(1024² and 2048² alike). Neither are a's rows: a packed into (m // 8, k, 8) measured the same. K-blocking so that the
panel's slice stays in L1 (k blocks of 128 / 256 / 512, partial sums reloaded from c) measured 66-70 / 69-71 / 74-76%
against 75-78%, software prefetch of the panel 8-32 k steps ahead 71-77%, and 2048² in blocks of 64-256 rows 61-71%
against 76-77% with all rows in one block.
"""
from __future__ import annotations

from typing import Optional, Tuple

from tiny.backend import DType, Kernel, KernelOptError, Opt, OptOps, ReduceOps, dtypes
from tiny_clang.pool import SLICES_PER_THREAD, num_threads

# bytes of a's rows per block: the least on any CPU (as tuned before on one AVX2 core; AVX-512 / arm64 keep it)
BLOCK_BYTES = 512 * 1024
# 16 registers (AVX2): up to 2 MB of a's rows per block, and at least 256 rows (64 row tiles), as long as every thread
# still gets SLICES_PER_THREAD blocks. A smaller block pulls every panel from L3 more often (Zen 3, tiny's kernels in a
# C harness, process time, 1 and 2 threads: 2048², 64 rows -> 256 ~1.08-1.13x; 1024 x 4096 x 1024, 32 rows -> 128
# ~1.2-1.3x, 256 ~1.25-1.4x; 1024², 128 rows -> 512 within noise); a's rows need not fit any cache
AVX2_BLOCK_BYTES = 2 * 1024 * 1024
AVX2_MIN_BLOCK_ROWS = 256
# 32 registers (AVX-512): the same rule, up to 4 MB of a's rows. A panel of 32 columns is twice the AVX2 one, so a
# block of 512 KB of rows re-pulled every panel from L3 after only 8 row tiles at k = 2048 (in-process A/B of the
# compiled kernels, one thread, process time, AVX-512 Xeon, 2048²: 64 rows 167-187 GFLOP/s, 256 rows 177-197, 512
# rows 188-197; 1024²: 128 rows 176-196, 256 rows 184-204)
AVX512_BLOCK_BYTES = 4 * 1024 * 1024
AVX512_MIN_BLOCK_ROWS = 256
# (32 registers: AVX-512) when a block of a's rows and its panel together pass this many bytes (the AVX-512 Xeon's L2),
# the block streams from L3 for every panel anyway, and smaller blocks only pull every panel from L3 more often: all rows
# then go in one block (panels outermost, shared out by the threads), so each panel is pulled once. A C harness of
# tiny's kernels on that Xeon (2 threads together, CPU time per thread, loaded machine, 3 rounds): 2048², 256-row blocks
# 145-159 GFLOP/s, 512 rows 153-170, all rows 166-179; 4096², 256 rows 147-150, all rows 159. 1024² keeps its blocks
# (128 rows and the panel: 640 KB), which read a's rows from L2: all rows there measured the same within the noise
AVX512_L2_BYTES = 2 * 1024 * 1024
# (32 registers: AVX-512) a block of fewer row tiles than this pulls each panel from L3 again after only a few tiles:
# with a long reduce (large k) the block sizes above leave few rows per block (GPT-2's MLP down-projection 128 x 3072 @
# 3072 x 768 made 4 blocks of 4 tiles), and all rows in one block, panels outermost, pull each panel once. In-process A/B
# of the compiled kernels (one thread, CPU time, AVX-512 Xeon, loaded machine): 128 x 3072 x 768 3.67-3.84 -> 3.25-3.33
# ms, 96 x 3072 x 768 2.89 -> 2.63, 64 x 4096 x 1024 3.47 -> 3.27, 128 x 4096 x 1024 7.09 -> 6.17, 256 x 4096 x 1024
# (8 tiles a block) 14.96 -> 13.45; 256 x 1024 x 1024 (16 tiles) measured the same either way and keeps its blocks
AVX512_MIN_BLOCK_TILES = 16
# below this many multiply-adds the copy into panels costs more than the product gains (a few microseconds of work)
MIN_MACS = 1 << 21
# rows of b that one block of the panel copy reads whole (see panel_copy_tile; 4 to 16 measured alike, 1 ~1.5x slower)
COPY_ROWS = 8


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
  if panel < 1 or k.first_upcast != red + 1 or len(k.bufs) < 3:
    return None
  # the product reads two buffers; any others come after the reduce (a linear layer's bias, a residual, gelu's inputs)
  read = [i for i, b in enumerate(k.bufs) if b in {x.arg for x in k.reduceop.lazyops if not x.src}]   # (leaves)
  if len(read) != 2 or 0 in read:
    return None
  shape = k.full_shape
  out, x, y = (k.sts[i].real_strides() for i in (0, *read))
  width = shape[lane]
  for vec, other in ((x, y), (y, x)):
    if vec[lane] == 1 and vec[red] == width and vec[panel] == width * shape[red] and all(vec[a] == 0 for a in range(panel)) and \
        other[lane] == 0 and other[panel] == 0 and other[red] != 0 and out[lane] == 1 and out[panel] == width:
      return panel - 1, panel, red
  return None


def _copy_rows(k: Kernel) -> Optional[int]:
  """How many k rows one block of the panel copy holds, when k is the copy of a row-major b into panels: the output is
  contiguous (n // w, k, w) and the input reads (w, row stride >= n, 1) (b, or a slice of its columns), so each (panel,
  row) step reads one w-wide piece of a row. None for any other kernel (a transposed b is not row-major)."""
  if k.reduceop is not None or k.upcasted or len(k.bufs) != 2 or len(k.full_shape) != 3 or not all(isinstance(s, int) for s in k.full_shape):
    return None
  panels, rows, width = k.full_shape
  out, src = (st.real_strides() for st in k.sts[:2])
  if out != (rows * width, width, 1) or src[0] != width or src[2] != 1 or not isinstance(src[1], int) or src[1] < panels * width \
      or panels < 2:
    return None
  return next((b for b in (COPY_ROWS, 4, 2) if rows % b == 0 and rows > b), None)


def panel_copy_tile(k: Kernel) -> bool:
  """Tile the copy of a row-major b into panels (see `_copy_rows`): blocks of COPY_ROWS rows of b, all panels per block.

  Walking one panel down all k rows reads a w-wide piece of every row, one cache line a row apart (a page apart for
  n = 1024 floats), which the prefetchers do not follow; a block of a few rows read for every panel in turn reads
  those rows whole while writing COPY_ROWS consecutive lines of each panel (1024² on one AVX2 core, C: ~250 -> ~165 us;
  2048²: ~3.0 -> ~1.7 ms). True when applied."""
  if (rows := _copy_rows(k)) is None:
    return False
  width = k.full_shape[2]
  try:
    for step in ((width,) if width <= 16 else (16, width // 16)):
      k.apply_opt(Opt(OptOps.UPCAST, 2, step))
    k.apply_opt(Opt(OptOps.BLOCK, 1, rows))
    k.apply_opt(Opt(OptOps.SWAP, 0, 1))
  except KernelOptError:
    return bool(k.upcasted)
  return True


def block_rows(regs: int, rows: int, row_bytes: int, m: int, threads: int) -> int:
  """Rows of a in one block of the packed product: at least one register tile of `rows` and BLOCK_BYTES of a's rows of
  row_bytes each; up to AVX2_BLOCK_BYTES / AVX2_MIN_BLOCK_ROWS with 16 vector registers (AVX2), AVX512_BLOCK_BYTES /
  AVX512_MIN_BLOCK_ROWS with 32 (AVX-512), while the m rows still make SLICES_PER_THREAD blocks for each of `threads`
  threads (the blocks are what the threads share out)."""
  least = max(rows, BLOCK_BYTES // row_bytes)
  most, min_rows = (AVX512_BLOCK_BYTES, AVX512_MIN_BLOCK_ROWS) if regs > 16 else (AVX2_BLOCK_BYTES, AVX2_MIN_BLOCK_ROWS)
  return max(least, min(max(min_rows, most // row_bytes), m // (SLICES_PER_THREAD * threads)))


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
  threads = num_threads()
  row_bytes = k.full_shape[red] * k.bufs[0].dtype.itemsize
  tiles = block_rows(regs, rows, row_bytes, m, threads) // rows
  if regs > 16 and tiles * rows * row_bytes + width * row_bytes > AVX512_L2_BYTES and k.full_shape[panel] >= SLICES_PER_THREAD * threads:
    tiles = m // rows   # (see AVX512_L2_BYTES) one block of all rows: the panel loop goes outermost below
  per_block = next((b for b in range(tiles, 1, -1) if (m // rows) % b == 0), 1)
  if regs > 16 and per_block < AVX512_MIN_BLOCK_TILES and k.full_shape[panel] >= SLICES_PER_THREAD * threads:
    per_block = m // rows   # (see AVX512_MIN_BLOCK_TILES) one block of all rows, panels outermost
  try:
    for step in ((width,) if width <= 16 else (16, width // 16)):
      k.apply_opt(Opt(OptOps.UPCAST, panel + 1, step))
    if rows > 1:
      k.apply_opt(Opt(OptOps.UPCAST, rows_axis, rows))
    if per_block > 1 and m // rows > per_block:
      k.apply_opt(Opt(OptOps.BLOCK, rows_axis, per_block))
    elif m // rows > 1 and k.full_shape[panel] >= SLICES_PER_THREAD * threads:
      # all rows in one block (or no divisor makes blocks): panels outermost, so each panel is pulled once and all row
      # tiles read it from L2. Row tiles outermost pull every panel for every row tile (AVX2, 256 x 2048 x 2048 and
      # 128 x 1024 x 4096 in one block: ~0.43x); they stay outermost where too few panels would be left to share out
      k.apply_opt(Opt(OptOps.SWAP, rows_axis, panel))
  except KernelOptError:
    return bool(k.upcasted)
  return True
