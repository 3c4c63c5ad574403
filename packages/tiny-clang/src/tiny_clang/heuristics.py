"""The CPU's own kernel heuristics: how CLANG and LLVM tile a kernel for a host CPU's vector registers.

Core's `Kernel.hand_coded_optimizations` asks the renderer first (`Renderer.hand_coded_optimizations`); both CPU renderers
answer with `cpu_hand_coded_optimizations`, which always chooses the opts itself. It knows what core does not: the width
and number of the host's vector registers (`simd_bytes`, `simd_registers`, declared by the renderer from what the host
has) and that clang / LLVM vectorize a plain one-accumulator reduce loop by themselves.

In order, the first that applies wins:
  0. (AVX2) a wide strip of vector accumulators for a vector times a row-major matrix (`x @ W`, one row of x);
  1. a register tile for matmul-like reduces (`a @ b`, convs): a strip of the output axis contiguous in one input;
  2. a strip of vector accumulators for a reduce over a strided axis (`x.sum(0)`);
  3. a tile of dot products when both inputs are contiguous along the reduce (`x @ W.T`);
  4. otherwise core's heuristic steps with CPU parameters: upcasts along broadcast axes (a constant's broadcast is no
     reuse), a long contiguous SUM left as one loop, other long reduces unrolled by one vector, and an elementwise
     kernel upcast by one vector.
The figures in the comments were measured on CLANG on x86 (AVX2 and AVX-512).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from tiny.backend import BinaryOps, Kernel, KernelOptError, Opt, OptOps, ReduceOps, prod
from tiny_clang.matmul_panels import panel_copy_tile, panel_tile


def _all_int(shape: Sequence[Any]) -> bool:
  return all(isinstance(s, int) for s in shape)


def _upper(x: Any) -> int:
  """An int, or the upper bound of a symbolic one."""
  while not isinstance(x, int):
    x = x.max
  return x


def _upcast_steps(width: int, cap: int) -> Optional[List[int]]:
  """UPCAST amounts (each at most cap, largest first) whose product is width; None when width has a prime factor > cap."""
  steps = []
  while width > 1:
    step = next((a for a in range(min(width, cap), 1, -1) if width % a == 0), None)
    if step is None:
      return None
    steps.append(step)
    width //= step
  return steps


def simd_lanes(k: Kernel) -> int:
  """Lanes of the output dtype in one vector register of k's renderer (0 when the renderer asks for no vector code)."""
  return int(getattr(k.opts, "simd_bytes", 0)) // k.bufs[0].dtype.itemsize


def simd_registers(k: Kernel) -> int:
  """Vector registers the renderer declares; a renderer that declares none gets 16, the fewest any SIMD CPU we target has."""
  return int(getattr(k.opts, "simd_registers", 0)) or 16


def contiguous_reduce(k: Kernel, axis: int) -> bool:
  """Every input walks reduce `axis` unmasked, with stride 1 (or 0).

  A CPU compiler vectorizes such a long reduce into one scalar accumulator by itself (the CLANG/LLVM renderers
  license reassociating exactly those adds), using several vector accumulators. A 4-way UNROLL turns the body into a
  float4 load plus a serial chain of scalar adds that blocks this, and upcasting the output axis gives several
  scalar accumulators, which are not vectorized (sum of 2**24 floats on CLANG, 2 threads: ~6 -> ~35 GB/s)."""
  ins = k.sts[1:len(k.bufs)]
  return bool(ins) and all(isinstance(s := st.real_strides()[axis], int) and s in (0, 1) for st in ins)


def _vector_pieces(width: int, lanes: int) -> int:
  """How many vectors a strip of width lanes folds into: widest first (20 -> 16 + 4 on AVX-512, 8 + 8 + 4 on AVX2)."""
  vecs, left = 0, width
  while left > 0:
    left -= next(v for v in (lanes >> i for i in range(lanes.bit_length())) if 0 < v <= left)
    vecs += 1
  return vecs


def _image_row_axis(k: Kernel, axis: int, vec: Tuple[Any, ...], ins: List[Tuple[Any, ...]], out: Tuple[Any, ...]) -> Optional[int]:
  """The output axis just outside the strip along which the vector input moves too and the other inputs of the reduce
  broadcast (a conv's output row y, next to its pixel axis x), when it is even: None otherwise. Inputs only read after
  the reduce (a fused relu mask) do not count."""
  y = axis - 1
  reduced = [s for s in ins if s is not vec and any(s[r] != 0 for r in range(k.first_reduce, len(s)))]
  if y < 0 or out[y] == 0 or vec[y] == 0 or any(s[y] != 0 for s in reduced) or k.full_shape[y] % 2 != 0:
    return None
  return y


def _padded(k: Kernel, i: int) -> bool:
  """Whether the kernel's i-th input (0: the first after the output) is read through a masked (padded) view."""
  return any(v.mask is not None for v in k.sts[1 + i].views)


def _lane_fill(width: int, lanes: int) -> float:
  """The share of vector lanes a strip of width lanes uses once folded into vectors widest first (20 of 16 + 4: 0.625)."""
  return width / (_vector_pieces(width, lanes) * lanes)


def _stacked_rows_tile(n: int, n_rows: int, n_channels: int, lanes: int, max_accumulators: int = 20) -> Tuple[int, int]:
  """(32 registers: AVX-512) (output rows, channels) for a conv tiled by whole short rows of n pixels read from an
  unpadded input: the codegen packs the rows of one channel into full vectors (20 pixels x 4 rows = 5 zmm vectors; 6 x
  3 = 16 + 2 lanes), so stacking rows fills the lanes a lone row's partial vector wastes (a 20-pixel row alone is 16 +
  4 lanes, the 4 widened to a whole FMA). Picks the best-filled stacking of at most 4 rows (fewer rows on a tie: each
  row past the first is shuffled into place), then the most channels whose accumulators fit in max_accumulators.

  MNIST step b64 convs, one thread, CPU time: 5x5 32->32 forward on 24² (20 px x 4 rows x 4 channels) 11.7 -> 9.1 ms,
  3x3 64->64 forward on 8² (6 x 3 x 8) 4.1 -> 1.85 ms, 3x3 32->64 forward on 10² (8 x 2 x 16) 1.12 -> 0.96 ms;
  all 4 rows of 6 pixels (36 lanes in 3 vectors) was slower (4.7 ms), as was stacking through a padded view."""
  # stackings that leave a partial vector of more than an eighth of the lanes are not taken: 10 pixels x 2 rows (16 + 4
  # lanes) ran ~1.2x slower than one row of 8 + 2 (3x3 64->32 input gradient on 10²)
  fits = [d for d in (2, 3, 4) if n_rows % d == 0 and (d * n) % lanes <= lanes // 8]
  d = max([1] + fits, key=lambda d: (_lane_fill(d * n, lanes), -d))
  pieces = _vector_pieces(d * n, lanes)
  r = next((r for r in (16, 8, 4, 2) if n_channels % r == 0 and r * pieces <= max_accumulators), 1)
  return d, r


def output_strip(k: Kernel) -> bool:
  """Matmul-like reduce: upcast a wide strip of the last output axis (True when applied).

  The axis must be contiguous in the output and in one input while another input broadcasts along it; then each
  reduce step loads one value of the broadcast input and one contiguous vector of the other, which the C compiler
  vectorizes. Measured on CLANG (1024² matmul): a 1x128 strip runs ~6x faster than a 4x4 register tile. A strip
  of 16 or less (a conv's output row) also upcasts an output axis that the vector input broadcasts over, so each
  loaded vector feeds several rows (conv 32x64x56x56, 3x3: ~10 -> ~35 GFLOP/s)."""
  if k.reduceop is None or k.first_reduce == 0 or k.upcasted or not _all_int(k.full_shape):
    return False

  def strides_of(st: Any) -> Tuple[Any, ...]:
    # a padded input (conv) has no real strides; its last view's strides still say how it moves along each axis
    return tuple(v if v is not None else w for v, w in zip(st.real_strides(), st.views[-1].strides))
  out, ins = strides_of(k.sts[0]), [strides_of(st) for st in k.sts[1:len(k.bufs)]]
  axis = k.first_reduce - 1
  # the vector input takes part in the reduce (a residual added after a matmul is contiguous along the axis too)
  vec = next((s for s in ins if s[axis] == 1 and any(s[r] != 0 for r in range(k.first_reduce, len(s)))), None)
  if out[axis] != 1 or vec is None or not any(s[axis] == 0 for s in ins):
    return False
  rows = [a for a in range(axis) if out[a] != 0 and vec[a] == 0 and any(s[a] != 0 for s in ins if s is not vec)]
  lanes = simd_lanes(k)
  if lanes > 1:
    # the codegen re-vectorizes: a register tile of rows x (1 or 2 vectors) fed by one vector load and one broadcast per
    # row each step, using half the register file for accumulators (1024² on AVX-512: 8x32 tile ~230 GFLOP/s, 1x128 ~95;
    # 3x3 conv 64->64 at 56²: 16 output channels x 8 pixels ~200, 8 x 8 ~160)
    n = k.full_shape[axis]
    width = next((w for w in (2 * lanes, lanes) if n % w == 0), None)
    # (not when the last piece would be a single scalar lane, 9 = 8 + 1: n is even, except where AVX-512 always took it)
    short = width is None and (8 < n <= 2 * lanes or (4 < n <= 3 * lanes and n % 2 == 0)) and _upcast_steps(n, 16) is not None
    wide_row = simd_registers(k) > 16 and width is None and 3 * lanes < n <= 4 * lanes and n % 8 == 0 and \
        not _padded(k, next(i for i, s in enumerate(ins) if s is vec))
    if wide_row:
      # (32 registers: AVX-512) a large unpadded image's row of 3 full vectors and a half one (56 = 16 + 16 + 16 + 8)
      # tiled whole times half the register file's worth of channels. The strip of 8 lanes it got before fills half of
      # each zmm register (3x3 conv 64->64 on 56², input copied into a padded buffer, 1 thread: 56 px x 4 channels
      # ~100-108 GFLOP/s, 56 x 2 x 2 rows ~89, 8 px x 16 channels ~70-73; through the padded view ~56, see
      # tiny_clang.conv_padding)
      width = n
    if short:
      # a short row (a small conv's 6, 20 or 24 pixels) is tiled whole, as full vectors plus a partial one
      # (5x5 conv 32->32 on 24² images, AVX-512: 20 = 16 + 4 lanes x 8 channels ~230 GFLOP/s, 4 x 16 ~90; on AVX2
      # 20 = 8 + 8 + 4 lanes x 2 channels x 2 rows ~2x the 4 x 8 tile, and the 3x3 conv's 6 = 4 + 2 lanes x 4
      # channels ~3x the generic heuristic's 3 x 4)
      width = n
    width = width or next((w for w in (8, 4) if n % w == 0), None)
    if width is None:
      return False
    regs = simd_registers(k)
    y = _image_row_axis(k, axis, vec, ins, out)
    if y is not None and regs <= 16 and n <= 3 * lanes and n % 4 == 0:
      # (16 registers: AVX2/SSE) a small image's whole row of full vectors (8, 16, 24 pixels; 20 = 8 + 8 + 4) times a few
      # channels times two output rows: each weight broadcast feeds twice the vectors, and the second row's inputs are
      # the rows the next kernel row reads (L1 hits). 3/4 of the registers hold accumulators (on AVX2: 5x5 conv's
      # 24 = 3 x 8 pixels x 2 channels x 2 rows ~1.3x the 8 x 8 tile, 8 pixels x 4 x 2 ~1.3x 8 x 8)
      width, short = n, True
    vecs = _vector_pieces(width, lanes)
    rows_amt = next((r for r in (16, 8, 4, 2) if rows and r * vecs <= regs // 2 and k.full_shape[rows[-1]] % r == 0), 1)
    if short and y is not None and n % 4 == 0:
      rows_amt = next((r for r in (8, 4, 2) if rows and 2 * r * vecs <= regs * 3 // 4 and k.full_shape[rows[-1]] % r == 0), 1)
    y_amt = 2 if short and y is not None and 2 * rows_amt * vecs <= regs * 3 // 4 else 1
    if wide_row:
      y_amt = 1
    if short and y is not None and regs > 16 and not _padded(k, next(i for i, s in enumerate(ins) if s is vec)):
      stack, chans = _stacked_rows_tile(n, k.full_shape[y], k.full_shape[rows[-1]] if rows else 1, lanes)
      # only a tile measured to pay off: at least 4 channels (24 pixels x 4 rows x 2 channels ran ~1.4x slower than 2 x
      # 4), and lanes filled at least as well as the two-row tile above (26 pixels keep 2 rows: 52 = 3 x 16 + 4 lanes)
      if chans >= 4 and _lane_fill(stack * n, lanes) >= _lane_fill(y_amt * n, lanes):
        y_amt, rows_amt = stack, chans
    if y is not None and regs <= 16 and not short and vecs == 1 and rows and not _padded(k, next(i for i, s in enumerate(ins) if s is vec)):
      # (16 registers: AVX2) a large unpadded image's strip of one vector: two output rows x half the channels keep the
      # 8 accumulators but load 2 vectors + 4 weights per 8 FMAs instead of 1 + 8 (3x3 conv 64->64, 58² unpadded, 1
      # thread: 8 px x 2 rows x 4 channels ~85 GFLOP/s, 8 x 8 ~68). Not when the input is padded: each vector load
      # there is a masked load whose mask check and fallback gather cost more than the broadcasts saved (56² padded:
      # 2 x 4 ~0.9x the 8 x 8 tile)
      rows_amt = next((r for r in (8, 4, 2) if 2 * r <= regs // 2 and k.full_shape[rows[-1]] % r == 0), 1)
      y_amt = 2 if rows_amt > 1 else 1
  else:
    width = next((w for w in (128, 64, 32, 16, 8) if k.full_shape[axis] % w == 0), None)
    if width is None:
      return False
    rows_amt = next((r for r in (8, 4, 2) if width <= 16 and rows and k.full_shape[rows[-1]] % r == 0), 1)
    y, y_amt = None, 1
  try:
    for step in _upcast_steps(width, 16 if lanes > 1 else 8) or []:
      k.apply_opt(Opt(OptOps.UPCAST, axis, step))
    if lanes > 1 and y is not None and y_amt > 1:
      # a short row leaves registers free: a second output row reuses each weight broadcast (the two rows' inputs
      # overlap, so their loads hit the L1 cache); 20 pixels x 2 channels x 2 rows on AVX2 runs ~1.4x 20 x 2.
      # (before the channels: y is the higher axis, and upcasting all of an axis removes it)
      k.apply_opt(Opt(OptOps.UPCAST, y, y_amt))
    if rows_amt > 1:
      k.apply_opt(Opt(OptOps.UPCAST, rows[-1], rows_amt))
    if lanes > 1 and rows and rows[-1] + 1 == axis and k.full_shape[rows[-1]] > 1 and k.full_shape[axis] > 1:
      # (a matmul) column blocks outside row blocks: the vector input's panel stays in cache while the rows stream past
      # it (2048² on AVX-512: ~190 -> ~235 GFLOP/s); a conv, whose rows are not next to its columns, gains nothing from it
      k.apply_opt(Opt(OptOps.SWAP, rows[-1], axis))
  except KernelOptError:
    return bool(k.upcasted)
  return True


def _real_or_view_strides(st: Any) -> Tuple[Any, ...]:
  """real_strides, with a padded view's own strides where the real stride is not known."""
  return tuple(v if v is not None else w for v, w in zip(st.real_strides(), st.views[-1].strides))


def matvec_strip(k: Kernel) -> bool:
  """A vector times a row-major matrix (`x @ W` with one row of x, GPT-2's decode step): upcast the output axis, which
  is contiguous in W, by a strip of 8 vector accumulators, else 4 (True when applied).

  Nothing is reused here: each weight is read once, so the kernel streams W at the memory's pace or not at all. Each
  reduce step reads a strip of one row of W, and the next step jumps a whole row ahead; a strip of 2 vectors (64
  bytes, one cache line per row) leaves the hardware prefetchers nothing to follow and keeps only a few lines in
  flight. A strip of 8 vectors reads 4 lines of each row. Measured on CLANG, AVX2, 2 threads, W not in cache
  (768x3072 and 3072x768): 2 vectors ~9-11 GB/s, 8 vectors ~15-18, 16 (spills) about the same as 8. AVX-512 (32
  registers), which the generic steps left at a strip of 2 zmm vectors: 8 zmm vectors (8 lines of each row) read 12
  JIT-replayed weight matrices (85-113 MB) at a best of 23-39 GB/s against 12-19, on a loaded 2-vCPU Xeon; 16 vectors
  were no better than 8."""
  lanes = simd_lanes(k)
  if lanes <= 1 or k.reduceop is None or k.reduceop.op is not ReduceOps.SUM or len(k.reduceops) != 1 or \
      k.first_reduce == 0 or k.upcasted or not _all_int(k.full_shape[:k.first_reduce]):
    return False
  axis = k.first_reduce - 1
  out, ins = _real_or_view_strides(k.sts[0]), [_real_or_view_strides(st) for st in k.sts[1:len(k.bufs)]]
  reduce_axes = range(k.first_reduce, k.first_upcast)
  # the matrix: contiguous along the output axis and moving along the reduce
  mats = [s for s in ins if s[axis] == 1 and any(s[r] != 0 for r in reduce_axes)]
  if len(mats) != 1:
    return False
  # the vector: moving along the reduce, broadcast along the strip's axis, and along every other output axis unless the
  # matrix moves there too (one row of x per matrix: no reuse of a loaded vector). A batch of matrix-vector products
  # qualifies: decode's attention over the cached values, one per head, whose reduce runs to a Variable
  vecs = [s for s in ins if any(s[r] != 0 for r in reduce_axes) and s[axis] == 0 and
          all(s[a] == 0 or mats[0][a] != 0 for a in range(k.first_reduce) if k.full_shape[a] != 1)]
  if out[axis] != 1 or not vecs or len(mats) + len(vecs) != sum(any(s[r] != 0 for r in reduce_axes) for s in ins):
    return False
  n = k.full_shape[axis]
  width = next((v * lanes for v in (8, 4) if n % (v * lanes) == 0), None)
  if width is None:
    return False
  return _upcast_strip(k, axis, width)


def _upcast_strip(k: Kernel, axis: int, width: int) -> bool:
  """Upcast `axis` by width in steps of at most 16; True when anything was upcast (an opt that does not apply stops it)."""
  try:
    for step in _upcast_steps(width, 16) or []:
      k.apply_opt(Opt(OptOps.UPCAST, axis, step))
  except KernelOptError:
    return bool(k.upcasted)
  return True


def column_reduce(k: Kernel) -> bool:
  """Reduce over a strided axis (`x.sum(0)`): upcast the output axis that every input reads with stride 1 to a
  vector-register strip (True when applied). Each reduce step then loads whole vectors and adds them into vector
  accumulators, instead of one strided scalar per output (4096² sum(0) on CLANG: ~1.3 -> ~60 GB/s)."""
  lanes = simd_lanes(k)
  if lanes <= 1 or k.reduceop is None or k.first_reduce == 0 or k.upcasted or not _all_int(k.full_shape):
    return False
  axis = k.first_reduce - 1
  sts = [st.real_strides() for st in k.sts[:len(k.bufs)]]
  moving = [s for s in sts[1:] if s[axis] != 0]
  if sts[0][axis] != 1 or not moving or any(s[axis] != 1 for s in moving):
    return False
  # a reduce that some input walks with stride 1 is a row reduce: the vectorizable single-accumulator loop handles it
  if any(s[r] == 1 for s in moving for r in range(k.first_reduce, k.first_upcast)):
    return False
  # as many vector accumulators as half the register file: each pass over the reduce axis touches one page per row,
  # so wider strips mean fewer passes (4096² sum(0): 2 vectors ~20 GB/s, 8 ~48, 16 ~63)
  vecs = simd_registers(k) // 2
  width = next((w for w in (vecs * lanes, 8 * lanes, 4 * lanes, 2 * lanes, lanes, 8, 4) if k.full_shape[axis] % w == 0), None)
  if width is None:
    return False
  return _upcast_strip(k, axis, width)


def _window_axis(k: Kernel, rows: List[int], r: int, x: Tuple[Any, ...]) -> Optional[int]:
  """A short output axis (<= 8) that input x slides along with the same stride as along one of the reduce axes other
  than the vectorized one `r` (a conv weight gradient's ky, which moves through the input rows like the output row y
  does): None when there is none."""
  reduce_strides = {x[a] for a in range(k.first_reduce, k.first_upcast) if a != r and k.full_shape[a] > 1}
  return next((a for a in reversed(rows) if 1 < k.full_shape[a] <= 8 and x[a] not in (0, 1) and x[a] in reduce_strides), None)


def _window_tile_accumulators(k: Kernel, rows: int, unroll: int, lanes: int) -> int:
  """How many vector accumulators a conv weight gradient's tile (`rows` kernel rows times some output channels) may use.

  Usually 2/3 of the registers. (16 registers: AVX2) when each kernel row's input is one full vector (a reduce row of
  exactly one vector, unrolled whole), a step holds only the `rows` input vectors and one gradient vector besides the
  accumulators, so every other register may accumulate: the 3x3 conv 32->64 weight gradient on 8x8 outputs, 3 rows
  x 4 channels (12 accumulators), runs ~1.2x the 3 x 2 tile (CLANG, 1 thread). Rows of partial vectors (6 = 4 + 2,
  20 = 8 + 8 + 4) hold more registers per row and keep the usual budget."""
  regs = simd_registers(k)
  if regs <= 16 and unroll == lanes:
    return max(regs * 2 // 3, regs - rows - 1)
  return regs * 2 // 3


def dot_tile(k: Kernel) -> bool:
  """Matmul whose inputs are both contiguous along the reduce (`x @ W.T`, a Linear layer): a tile of rows x cols
  dot products, each a vector accumulator along the reduce (the reduce unrolls by one vector; the codegen keeps those
  lanes in the accumulator and sums them once at the end). True when applied.

  (GPT-2's 128x768 @ 768x2304ᵀ on AVX-512: 4x3 tile ~280 GFLOP/s, 4x2 ~260, the generic heuristic ~50; a 5x5 conv's
  weight gradient, reduced over 20-wide rows, unrolls by 4: ~40 -> ~105.)"""
  lanes = simd_lanes(k)
  if lanes <= 1 or k.reduceop is None or k.reduceop.op is not ReduceOps.SUM or len(k.reduceops) != 1 or k.upcasted or \
      not _all_int(k.full_shape) or k.first_reduce == 0:
    return False
  r = k.first_upcast - 1
  n = k.full_shape[r]
  unroll = next((u for u in (lanes, 8, 4) if u <= lanes and n % u == 0), None)
  if n % lanes != 0 and 4 < n <= 3 * lanes and n % 2 == 0:
    # a short row (a conv's 20 or 6 pixels) unrolls whole: the codegen accumulates it in full vectors (8 + 8 + 4 lanes,
    # the 4 widened with zeros; 4 + 2), not 4 lanes at a time or not at all (no piece is a lone scalar: n is even)
    unroll = n
  if not contiguous_reduce(k, r) or unroll is None:
    return False
  sts = [st.real_strides() for st in k.sts[1:len(k.bufs)]]
  moving = [s for s in sts if s[r] == 1]
  if len(moving) != 2:
    # (32 registers: AVX-512) a relu's weight gradient reads the output gradient and the relu's mask input through the
    # same view: two inputs, one of them read twice. Its tile is that of the plain product (MNIST's 5x5 conv 32->32
    # weight gradient, batch 64, 1 thread: 5 kernel rows x 4 channels 21.9 ms, the generic 4 x 4 channels 25.6)
    distinct = list(dict.fromkeys(moving))
    if simd_registers(k) <= 16 or len(distinct) != 2:
      return False
    moving = distinct
  x, y = moving

  def only(a: Any, b: Any) -> List[int]:  # output axes that a walks and b broadcasts over
    return [i for i in range(k.first_reduce) if a[i] != 0 and b[i] == 0 and k.full_shape[i] > 1]
  rows, cols = only(x, y), only(y, x)
  if not cols:
    rows, cols = cols, rows
  if not cols:
    return False

  def pick(axes: List[int], amts: Tuple[int, ...]) -> Tuple[int, int]:  # (axis, amount): the innermost axis the amount divides
    return next(((a, amt) for amt in amts for a in reversed(axes) if k.full_shape[a] % amt == 0), (-1, 1))
  row_axis, row_amt = pick(rows, (4, 2))
  col_axis, col_amt = pick(cols, (3, 2) if row_amt > 1 else (8, 4, 2))
  col_first = False
  if (win := _window_axis(k, rows, r, x)) is not None:
    # a conv's weight gradient: all of one kernel axis (ky) times a few output channels. Its rows of the input are the
    # rows the reduce walks next, so they stay in L1 (5x5 conv 32->32 on 24² images, AVX2: 5 x 2 tile ~1.8x the 4 x 2
    # tile over input channels, which streams four channels' images per output tile)
    row_axis, row_amt = win, k.full_shape[win]
    accs = _window_tile_accumulators(k, row_amt, unroll, lanes)
    col_axis, col_amt = pick(cols, tuple(a for a in (4, 3, 2) if a * row_amt <= accs))
    # the wide tile (more accumulators than the usual 2/3 of the registers) runs ~1.2x faster with the columns
    # outermost (each gradient vector feeds all kernel rows in a row); the 5x5 convs' narrower tiles are faster the
    # other way round (1->32 weight gradient, 5 x 2 tile: ky first ~1.15x)
    col_first = col_amt * row_amt > simd_registers(k) * 2 // 3 and col_amt < k.full_shape[col_axis]
  unroll_axis = r - k.first_reduce   # counted before the upcasts: one that takes a whole axis removes it
  try:
    if col_amt > 1 and (col_first or (col_axis > row_axis and row_amt == k.full_shape[row_axis])):
      # (the wide tile's order, above) or: upcasting all of the row axis removes it, so the higher (column) axis goes
      # first so that its index stays valid
      k.apply_opt(Opt(OptOps.UPCAST, col_axis, col_amt))
      col_amt = 1
    if row_amt > 1:
      k.apply_opt(Opt(OptOps.UPCAST, row_axis, row_amt))
    if col_amt > 1:
      k.apply_opt(Opt(OptOps.UPCAST, col_axis, col_amt))
    k.apply_opt(Opt(OptOps.UNROLL, unroll_axis, unroll))
  except KernelOptError:
    return bool(k.upcasted)
  return True


def elementwise_full_vector(k: Kernel, lanes: int) -> None:
  """An elementwise kernel whose output is contiguous along its last axis, which some input broadcasts over (softmax's
  exp(x - max) / sum): upcast that axis by one full vector first. Core's reuse step would upcast it by only 4, half an
  AVX2 register and a quarter of an AVX-512 one (softmax 4096² exp-div kernel, 1 thread, CPU time: AVX2 ~2x; AVX-512
  32.5 -> 14.5 ms)."""
  axis = k.first_reduce - 1
  if k.upcasted or axis < 0 or not isinstance(n := k.full_shape[axis], int) or n % lanes != 0 or \
      k.sts[0].real_strides()[axis] != 1:
    return
  if any(st.views[-1].strides[axis] == 0 for st in k.sts[1:len(k.bufs)]):
    try:
      k.apply_opt(Opt(OptOps.UPCAST, axis, lanes))
    except KernelOptError:
      pass


def transpose_tile(k: Kernel, lanes: int) -> bool:
  """An elementwise kernel whose output is contiguous along one axis while an input is contiguous along another (a
  channels-last buffer read in channels-first order): upcast both axes by one vector, so the input is read in whole
  vectors along its axis and the output written in whole vectors along its own, the block transposed in registers.
  Upcast along the output's axis only, each output vector is gathered from `lanes` scalar loads per input. True when
  applied."""
  if k.reduceop is not None or k.upcasted or k.first_reduce == 0 or not _all_int(k.full_shape):
    return False
  out = k.sts[0].real_strides()
  a = next((i for i in range(k.first_reduce) if out[i] == 1 and k.full_shape[i] % lanes == 0), None)
  if a is None:
    return False
  ins = [st.real_strides() for st in k.sts[1:len(k.bufs)]]
  b = next((i for x in ins if x[a] not in (0, 1) for i in range(k.first_reduce)
            if i != a and x[i] == 1 and k.full_shape[i] % lanes == 0), None)
  if b is None:
    return False
  try:
    # the higher axis first: an upcast that takes a whole axis removes it, which would shift the axes after it
    for axis in sorted((a, b), reverse=True):
      k.apply_opt(Opt(OptOps.UPCAST, axis, lanes))
  except KernelOptError:
    return bool(k.upcasted)
  return True


def reduce_rows(k: Kernel, lanes: int, rows: int = 4) -> None:
  """(16 registers: AVX2) A long reduce that will be unrolled by one vector along its contiguous axis (a row max):
  first upcast the innermost output axis that the inputs walk by `rows`, when the kernel has enough outputs to stay
  parallel. Each row gets its own vector accumulator, so the loop carries `rows` independent compare-and-blend chains
  instead of one: a NaN-keeping max is several dependent instructions per step, and a single chain cannot keep up
  with the loads (softmax's 4096² row max on CLANG, AVX2, 2 threads: 1 row ~13 GB/s, 4 rows ~23)."""
  ins = [st.real_strides() for st in k.sts[1:len(k.bufs)]]
  for axis in reversed(range(k.first_reduce)):
    n = k.full_shape[axis]
    if isinstance(n, int) and n > 1 and n % rows == 0 and n // rows >= 16 and any(s[axis] != 0 for s in ins):
      try:
        k.apply_opt(Opt(OptOps.UPCAST, axis, rows))
      except KernelOptError:
        pass
      return
    if n != 1:
      return   # only the innermost output axis: an outer one would read rows far apart


# below this many outputs a random-number kernel stays one scalar lane per loop iteration (see small_threefry)
THREEFRY_UPCAST_MIN = 1 << 16


def small_threefry(k: Kernel) -> bool:
  """A kernel drawing fewer than THREEFRY_UPCAST_MIN random numbers (weight init, small dropout masks): left without
  upcasts. Threefry's 20 rounds upcast by a vector are 8 scalar chains until `vectorize_lanes` packs them again at the
  end of codegen, so the Python passes cost ~8x (0.15 s a kernel, the bulk of an MNIST first step's ten draws), while
  the scalar loop (which clang still vectorizes in part) costs ~12 ns more per number: under 1 ms at this size."""
  shape = k.sts[0].shape
  if not _all_int(shape) or prod(shape) >= THREEFRY_UPCAST_MIN:
    return False
  return any(x.op is BinaryOps.THREEFRY for x in k.ast.lazyops)


def split_gather_unroll(k: Kernel, lanes: int) -> bool:
  """(AVX-512) True when the last reduce axis should stay a loop rather than be unrolled whole: at least one vector
  long but not a multiple of the lanes, and read by some input through an index that is not a stride (a 2x2 max
  pool's gradient, spread back over the pooled rows by `(i // 2)`, fused into BatchNorm's backward sums).

  Unrolled whole, such an axis becomes a 16-lane and a 4-lane piece of every load plus one scalar chain per lane for
  the rest of the body; left rolled, clang vectorizes the loop itself. MNIST step b64, BatchNorm backward over
  (64, 32, 20, 20), one thread, CPU time: 1.55-1.97 -> 0.68-0.73 ms per kernel."""
  if lanes < 16 or k.reduceop is None or k.first_reduce >= k.first_upcast or k.upcasted:
    return False
  last = k.first_upcast - 1
  s = k.full_shape[last]
  if not isinstance(s, int) or s < lanes or s % lanes == 0 or s > 32:
    return False
  return any(st.real_strides()[last] is None for st in k.sts[1:len(k.bufs)])


def gathered_row_unroll(k: Kernel) -> None:
  """For a kernel split_gather_unroll leaves rolled: when the reduce axis outside the last one is read through an
  index that is not a stride too (the pooled gradient's rows, `(i // 2)`), unroll it by 4 (or 2), so neighbouring rows,
  which read the same gathered values, share those loads in one loop body.

  MNIST step b64, BatchNorm backward sums over (64, 32, 20, 20), one thread, CPU time: 0.73 -> 0.54 ms per kernel
  (by 2: 0.60)."""
  row = k.first_upcast - 2
  if row < k.first_reduce or not isinstance(s := k.full_shape[row], int) or s % 2 != 0:
    return
  if not any(st.real_strides()[row] is None and st.real_strides()[row + 1] is None for st in k.sts[1:len(k.bufs)]):
    return
  try:
    k.apply_opt(Opt(OptOps.UNROLL, row - k.first_reduce, 4 if s % 4 == 0 else 2))
  except KernelOptError:
    pass


def pooled_row_upcast(k: Kernel, lanes: int) -> None:
  """(AVX-512) A small window reduce unrolled whole (a 2x2 max pool, or its backward's count of maxima) over a short
  output row that no other step upcast: upcast the whole row (at most `lanes` outputs), so the windows of one output
  row become a few wide contiguous loads of the input rows instead of a 2-float load per output in a 10-trip loop that
  clang cannot vectorize (the input walks the row with the window's stride).

  MNIST step b64, the max pool of BatchNorm's output and its backward count over (64, 32, 10, 10), one thread, CPU
  time: 0.57 -> 0.20 and 0.75 -> 0.27 ms per kernel."""
  # the reduce is all unrolled (no reduce loop is left) and no output axis is upcast
  if lanes < 16 or k.reduceop is None or k.first_reduce == 0 or k.first_reduce != k.first_upcast or \
      any(o.op is OptOps.UPCAST for o in k.applied_opts):
    return
  axis = k.first_reduce - 1
  n = k.full_shape[axis]
  if not isinstance(n, int) or not 2 <= n <= lanes:
    return
  # an input walking the row with a stride over 1 (the window's) and the window itself with stride 1
  strided = [st.real_strides() for st in k.sts[1:len(k.bufs)]]
  if not any(isinstance(s := x[axis], int) and s > 1 and any(y == 1 for y in x[k.first_upcast:]) for x in strided):
    return
  try:
    k.apply_opt(Opt(OptOps.UPCAST, axis, 0))
  except KernelOptError:
    pass


def cpu_hand_coded_optimizations(k: Kernel) -> bool:
  """The CLANG/LLVM heuristic (`Renderer.hand_coded_optimizations`): choose k's opts for a host CPU. Always True: the
  CPU never falls back to core's generic heuristic, whose GPU-minded choices (locals, grouping) it cannot use anyway."""
  if k.opts.has_local:
    return False   # a loop-based renderer only; a GPU-like one is left to core
  if panel_tile(k, simd_lanes(k), simd_registers(k)) or panel_copy_tile(k) or matvec_strip(k) or output_strip(k) or column_reduce(k) or dot_tile(k):
    return True
  if small_threefry(k):
    return True
  lanes = simd_lanes(k)
  # (not random numbers on AVX-512: a 16-lane threefry keeps uint64 lanes packed and unpacked, and codegen time grows
  # with the lanes; it keeps the width the steps below give it, as before)
  if lanes > 4 and transpose_tile(k, lanes):
    return True
  if lanes > 4 and k.reduceop is None and (simd_registers(k) <= 16 or not any(x.op is BinaryOps.THREEFRY for x in k.ast.lazyops)):
    elementwise_full_vector(k, lanes)
  # a constant "broadcasts" along every axis but is no reuse worth registers; on a SIMD CPU it would only cut the
  # vector width of an elementwise kernel to the 4 that step picks
  # and a buffer that is broadcast along the axis and every loop inside it (BatchNorm's per-channel parameters over the
  # batch axis) is a loop-invariant load that clang hoists: upcasting for it only unrolls the body (MNIST step b64, the
  # max-pool backward count over BatchNorm's output, (64, 32, 10, 10), one thread, CPU time: 1.3 -> 0.75 ms)
  k.upcast_reused_axes(skip_consts=lanes > 0, skip_hoisted=True)
  # a long contiguous SUM is left as a plain loop with one accumulator, which the compiler vectorizes
  last = k.first_upcast - 1
  vector_reduce = k.upcasted == 0 and k.first_reduce < k.first_upcast and all(r.op is ReduceOps.SUM for r in k.reduceops) and \
      _upper(k.full_shape[last]) > 32 and contiguous_reduce(k, last)
  if vector_reduce:
    return True
  # another long contiguous reduce (MAX) unrolls by one vector: the codegen keeps those lanes in a vector accumulator
  s = k.full_unupcasted_shape[-1] if k.full_unupcasted_shape else 1
  lane_reduce = lanes > 1 and k.upcasted == 0 and isinstance(s, int) and s % lanes == 0 and contiguous_reduce(k, last)
  if lane_reduce and k.reduceop is not None and simd_registers(k) <= 16:
    reduce_rows(k, lanes)
  if not split_gather_unroll(k, lanes):
    k.unroll_reduce(lanes if lane_reduce else 4)
    if lane_reduce and len(k.reduceops) > 1 and any(r.op is ReduceOps.MAX for r in k.reduceops) and simd_registers(k) > 16:
      # (32 registers: AVX-512; row kernels, tiny.engine.row_fusion: their row is in cache) 4 vectors a step, which
      # tiny_clang.renderer.cpu_matcher folds into the MAX accumulator with one dependent step instead of four: softmax's
      # max loop was latency-bound at ~7 cycles per vector (llvm-mca, sapphirerapids: ~2.2 after)
      rest = k.full_unupcasted_shape[-1] if k.full_unupcasted_shape else 1
      if isinstance(rest, int) and rest % 4 == 0 and rest >= 16 and k.first_reduce < k.first_upcast:
        try:
          k.apply_opt(Opt(OptOps.UNROLL, len(k.full_unupcasted_shape) - 1 - k.first_reduce, 4))
        except KernelOptError:
          pass
  else:
    gathered_row_unroll(k)
  # an elementwise kernel whose output is contiguous along its last axis computes whole vectors
  axis = k.first_reduce - 1
  wide = lanes > 4 and k.first_reduce > 0 and isinstance(k.full_shape[axis], int) and k.full_shape[axis] % lanes == 0 and \
      k.sts[0].real_strides()[axis] == 1
  k.upcast_output(lanes if wide else 4)
  pooled_row_upcast(k, lanes)
  return True
