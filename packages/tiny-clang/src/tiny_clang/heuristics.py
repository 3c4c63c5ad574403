"""The CPU's own kernel heuristics: how CLANG and LLVM tile a kernel for a host CPU's vector registers.

Core's `Kernel.hand_coded_optimizations` asks the renderer first (`Renderer.hand_coded_optimizations`); both CPU renderers
answer with `cpu_hand_coded_optimizations`, which always chooses the opts itself. It knows what core does not: the width
and number of the host's vector registers (`simd_bytes`, `simd_registers`, declared by the renderer from what the host
has) and that clang / LLVM vectorize a plain one-accumulator reduce loop by themselves.

In order, the first that applies wins:
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

from tiny.backend import Kernel, KernelOptError, Opt, OptOps, ReduceOps


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
    width = next((w for w in (2 * lanes, lanes) if k.full_shape[axis] % w == 0), None)
    if width is None and 8 < k.full_shape[axis] <= 2 * lanes and _upcast_steps(k.full_shape[axis], 16):
      # a short row (a small conv's 20 or 24 pixels) is tiled whole, as a full vector plus a partial one
      # (5x5 conv 32->32 on 24² images: 20 = 16 + 4 lanes x 8 channels ~230 GFLOP/s, 4 x 16 ~90)
      width = k.full_shape[axis]
    width = width or next((w for w in (8, 4) if k.full_shape[axis] % w == 0), None)
    if width is None:
      return False
    regs = simd_registers(k)
    # registers per row: the strip folds into vectors of lanes, lanes/2, ... (20 -> 16 + 4: two)
    vecs, left = 0, width
    while left > 0:
      left -= next(v for v in (lanes >> i for i in range(lanes.bit_length())) if 0 < v <= left)
      vecs += 1
    rows_amt = next((r for r in (16, 8, 4, 2) if rows and r * vecs <= regs // 2 and k.full_shape[rows[-1]] % r == 0), 1)
  else:
    width = next((w for w in (128, 64, 32, 16, 8) if k.full_shape[axis] % w == 0), None)
    if width is None:
      return False
    rows_amt = next((r for r in (8, 4, 2) if width <= 16 and rows and k.full_shape[rows[-1]] % r == 0), 1)
  try:
    for step in _upcast_steps(width, 16 if lanes > 1 else 8) or []:
      k.apply_opt(Opt(OptOps.UPCAST, axis, step))
    if rows_amt > 1:
      k.apply_opt(Opt(OptOps.UPCAST, rows[-1], rows_amt))
    if lanes > 1 and rows and rows[-1] + 1 == axis and k.full_shape[rows[-1]] > 1 and k.full_shape[axis] > 1:
      # (a matmul) column blocks outside row blocks: the vector input's panel stays in cache while the rows stream past
      # it (2048² on AVX-512: ~190 -> ~235 GFLOP/s); a conv, whose rows are not next to its columns, gains nothing from it
      k.apply_opt(Opt(OptOps.SWAP, rows[-1], axis))
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
  try:
    for step in _upcast_steps(width, 16) or []:
      k.apply_opt(Opt(OptOps.UPCAST, axis, step))
  except KernelOptError:
    return bool(k.upcasted)
  return True


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
  unroll = next((u for u in (lanes, 8, 4) if u <= lanes and k.full_shape[r] % u == 0), None)
  if not contiguous_reduce(k, r) or unroll is None:
    return False
  sts = [st.real_strides() for st in k.sts[1:len(k.bufs)]]
  moving = [s for s in sts if s[r] == 1]
  if len(moving) != 2:
    return False
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
  try:
    if row_amt > 1:
      k.apply_opt(Opt(OptOps.UPCAST, row_axis, row_amt))
    if col_amt > 1:
      k.apply_opt(Opt(OptOps.UPCAST, col_axis, col_amt))
    k.apply_opt(Opt(OptOps.UNROLL, r - k.first_reduce, unroll))
  except KernelOptError:
    return bool(k.upcasted)
  return True


def cpu_hand_coded_optimizations(k: Kernel) -> bool:
  """The CLANG/LLVM heuristic (`Renderer.hand_coded_optimizations`): choose k's opts for a host CPU. Always True: the
  CPU never falls back to core's generic heuristic, whose GPU-minded choices (locals, grouping) it cannot use anyway."""
  if k.opts.has_local:
    return False   # a loop-based renderer only; a GPU-like one is left to core
  if output_strip(k) or column_reduce(k) or dot_tile(k):
    return True
  lanes = simd_lanes(k)
  # a constant "broadcasts" along every axis but is no reuse worth registers; on a SIMD CPU it would only cut the
  # vector width of an elementwise kernel to the 4 that step picks
  k.upcast_reused_axes(skip_consts=lanes > 0)
  # a long contiguous SUM is left as a plain loop with one accumulator, which the compiler vectorizes
  last = k.first_upcast - 1
  vector_reduce = k.upcasted == 0 and k.first_reduce < k.first_upcast and all(r.op is ReduceOps.SUM for r in k.reduceops) and \
      _upper(k.full_shape[last]) > 32 and contiguous_reduce(k, last)
  if vector_reduce:
    return True
  # another long contiguous reduce (MAX) unrolls by one vector: the codegen keeps those lanes in a vector accumulator
  s = k.full_unupcasted_shape[-1] if k.full_unupcasted_shape else 1
  lane_reduce = lanes > 1 and k.upcasted == 0 and isinstance(s, int) and s % lanes == 0 and contiguous_reduce(k, last)
  k.unroll_reduce(lanes if lane_reduce else 4)
  # an elementwise kernel whose output is contiguous along its last axis computes whole vectors
  axis = k.first_reduce - 1
  wide = lanes > 4 and k.first_reduce > 0 and isinstance(k.full_shape[axis], int) and k.full_shape[axis] % lanes == 0 and \
      k.sts[0].real_strides()[axis] == 1
  k.upcast_output(lanes if wide else 4)
  return True
