"""The CPU heuristic (tiny_clang.heuristics), reached through the renderer hook `Renderer.hand_coded_optimizations`.

Kernels are optimized for loop renderers that declare a fixed vector width and register count (so the chosen opts do not
depend on this host), then run on the PYTHON reference device and checked against numpy. Separate tests check that the
CLANG and LLVM renderers use the hook and declare the host's register count."""
from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, Opt, OptOps
from tiny.dtype import dtypes
from tiny.engine.schedule import create_schedule
from tiny.helpers import prod
from tiny.ops import BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tiny.runtime.ops_python import PythonRenderer
from tiny.shape.shapetracker import ShapeTracker as ST
from tiny.testing.ops_helper import run_kernel_on_python
from tiny.tensor import Tensor
from tiny_clang import renderer as clang_renderer
from tiny_clang.heuristics import THREEFRY_UPCAST_MIN, cpu_hand_coded_optimizations

F32 = dtypes.float32
rng = np.random.default_rng(0)


class _CpuRenderer(PythonRenderer):
  """A loop renderer (no locals) without vector registers, using the CPU heuristic; runs on the PYTHON device."""
  has_local = False
  has_shared = False
  supports_float4 = False

  def hand_coded_optimizations(self, k: Kernel) -> bool:
    return cpu_hand_coded_optimizations(k)


class _SimdCpuRenderer(_CpuRenderer):
  """The same with 32 vector registers of 64 bytes (AVX-512-like)."""
  supports_float4 = True
  simd_bytes = 64
  simd_registers = 32


class _Avx2CpuRenderer(_CpuRenderer):
  """The same with 16 vector registers of 32 bytes (AVX2-like)."""
  supports_float4 = True
  simd_bytes = 32
  simd_registers = 16


run_kernel = run_kernel_on_python


def reduce_kernel(op: ReduceOps, shape: Tuple[int, ...], axis: int) -> LazyOp:
  out_shape = tuple(1 if i == axis else s for i, s in enumerate(shape))
  red = LazyOp(op, (LazyOp(BufferOps.LOAD, (), MemBuffer(1, F32, ST.from_shape(shape))),), (axis,))
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (red,), MemBuffer(0, F32, ST.from_shape(out_shape))),))


def vector_accs(k: Kernel) -> List[int]:
  assert k.uops is not None
  return [u.dtype.count for u in k.uops.uops if u.op.name == "DEFINE_ACC" and u.dtype is not None and u.dtype.count > 1]


def matmul_schedule(m: int, kk: int, n: int, seed: int = 0):
  an, bn = np.random.default_rng(seed).standard_normal((m, kk), np.float32), np.random.default_rng(seed + 1).standard_normal((kk, n), np.float32)
  a, b = Tensor(an, device="PYTHON").realize(), Tensor(bn, device="PYTHON").realize()
  si = create_schedule([(a @ b).lazydata])[-1]
  return si, [an if si.bufs[i].nbytes == an.nbytes else bn for i in (1, 2)], an @ bn


def test_output_strip_for_matmul_without_vectors() -> None:
  """Without vector registers a matmul gets a wide upcast along the output axis that is contiguous in one input."""
  si, inputs, ref = matmul_schedule(16, 24, 64)
  k = Kernel(si.ast, opts=_CpuRenderer()).hand_coded_optimizations()
  assert k.upcasted > 0 and all(o.op is OptOps.UPCAST and o.axis == k.applied_opts[0].axis for o in k.applied_opts), k.applied_opts
  assert prod(k.full_shape[k.shape_len - k.upcasted:]) == 64
  np.testing.assert_allclose(run_kernel(k, inputs, (16, 64)).reshape(16, 64), ref, rtol=1e-4, atol=1e-4)


def test_output_rows_and_channels_for_padded_conv() -> None:
  """A padded conv (the input's view is masked) gets the output-row strip plus an output-channel upcast."""
  xn, wn = np.random.default_rng(2).standard_normal((2, 4, 8, 8), np.float32), np.random.default_rng(3).standard_normal((16, 4, 3, 3), np.float32)
  x, w = Tensor(xn, device="PYTHON").realize(), Tensor(wn, device="PYTHON").realize()
  si = create_schedule([x.conv2d(w, padding=1).lazydata])[-1]
  k = Kernel(si.ast, opts=_CpuRenderer())
  ox_axis, cout_axis = k.first_reduce - 1, k.full_shape.index(16)
  k.hand_coded_optimizations()
  assert k.applied_opts == [Opt(OptOps.UPCAST, ox_axis, 8), Opt(OptOps.UPCAST, cout_axis, 8)], k.applied_opts
  xp = np.pad(xn, ((0, 0), (0, 0), (1, 1), (1, 1)))
  ref = sum(np.einsum("bchw,oc->bohw", xp[:, :, ky:ky + 8, kx:kx + 8], wn[:, :, ky, kx]) for ky in range(3) for kx in range(3))
  inputs = [xn if si.bufs[i].nbytes == xn.nbytes else wn for i in (1, 2)]
  np.testing.assert_allclose(run_kernel(k, inputs, (2, 16, 8, 8)), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_long_contiguous_sum_stays_one_accumulator(op: str) -> None:
  """A long stride-1 SUM keeps a plain one-accumulator loop (the C/LLVM compiler vectorizes it); MAX still unrolls."""
  xn = np.random.default_rng(4).standard_normal((64, 512), np.float32)
  si = create_schedule([getattr(Tensor(xn, device="PYTHON").realize(), op)(1).lazydata])[-1]
  k = Kernel(si.ast, opts=_CpuRenderer()).hand_coded_optimizations()
  if op == "sum":
    assert k.applied_opts == [] and k.upcasted == 0, k.applied_opts
  else:
    assert any(o.op is OptOps.UNROLL for o in k.applied_opts), k.applied_opts
  np.testing.assert_allclose(run_kernel(k, [xn], (64,)), getattr(xn, op)(1), rtol=1e-4, atol=1e-4)
  # a GPU-style renderer (with locals) is not affected: core's heuristic still unrolls or groups the sum
  assert Kernel(si.ast, opts=PythonRenderer()).hand_coded_optimizations().applied_opts


def test_register_tile_with_simd() -> None:
  """With vector registers a matmul gets rows x 2 vectors of accumulators (half the register file), column blocks outermost."""
  si, inputs, ref = matmul_schedule(32, 24, 64, seed=4)
  k = Kernel(si.ast, opts=_SimdCpuRenderer()).hand_coded_optimizations()
  assert prod(k.full_shape[k.shape_len - k.upcasted:]) == 8 * 32, k.applied_opts
  assert k.applied_opts[-1].op is OptOps.SWAP, k.applied_opts
  np.testing.assert_allclose(run_kernel(k, inputs, (32, 64)).reshape(32, 64), ref, rtol=1e-4, atol=1e-4)
  assert len(vector_accs(k)) == 16


@pytest.mark.parametrize("regs, rows", [(32, 8), (16, 4)])
def test_register_tile_follows_the_declared_register_count(regs: int, rows: int) -> None:
  """The row count of the tile comes from the renderer's `simd_registers`: NEON's 32 registers of 16 bytes fit 8 rows of
  2 vectors in half of them, x86's 16 (SSE/AVX2) only 4."""
  class Neonish(_CpuRenderer):
    supports_float4 = True
    simd_bytes = 16
    simd_registers = regs
  si, inputs, ref = matmul_schedule(32, 24, 64, seed=6)
  k = Kernel(si.ast, opts=Neonish()).hand_coded_optimizations()
  assert k.applied_opts[:2] == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, rows)], k.applied_opts
  np.testing.assert_allclose(run_kernel(k, inputs, (32, 64)).reshape(32, 64), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cols", [512, 48, 20])
def test_column_reduce_upcasts_the_contiguous_output_axis(cols: int) -> None:
  """x.sum(0) with vector registers: the output axis that the input reads with stride 1 becomes a strip of vector accumulators."""
  x = rng.random((24, cols), dtype=np.float32) - 0.5
  k = Kernel(reduce_kernel(ReduceOps.SUM, (24, cols), 0), opts=_SimdCpuRenderer()).hand_coded_optimizations()
  want = next(w for w in (256, 128, 64, 32, 16, 8, 4) if cols % w == 0)
  assert prod(k.full_shape[k.shape_len - k.upcasted:]) == want, k.applied_opts
  np.testing.assert_allclose(run_kernel(k, [x], (1, cols)), x.sum(0, keepdims=True), rtol=1e-4, atol=1e-4)
  assert (16 in vector_accs(k)) == (want >= 16)


def test_row_max_unrolls_by_one_vector() -> None:
  x = rng.random((8, 256), dtype=np.float32)
  k = Kernel(reduce_kernel(ReduceOps.MAX, (8, 256), 1), opts=_SimdCpuRenderer()).hand_coded_optimizations()
  assert Opt(OptOps.UNROLL, 0, 16) in k.applied_opts, k.applied_opts
  np.testing.assert_allclose(run_kernel(k, [x], (8, 1)), x.max(1, keepdims=True))


def test_dot_tile_for_x_times_w_transposed() -> None:
  """`x @ W.T` (both inputs contiguous along the reduce): a 4x3 tile of dot products, the reduce unrolled by one vector."""
  xn, wn = rng.standard_normal((8, 64), np.float32), rng.standard_normal((48, 64), np.float32)
  x, w = Tensor(xn, device="PYTHON").realize(), Tensor(wn, device="PYTHON").realize()
  si = create_schedule([(x @ w.T).lazydata])[-1]
  k = Kernel(si.ast, opts=_SimdCpuRenderer()).hand_coded_optimizations()
  assert k.applied_opts == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 3), Opt(OptOps.UNROLL, 0, 16)], k.applied_opts
  inputs = [xn if si.bufs[i].nbytes == xn.nbytes else wn for i in (1, 2)]
  np.testing.assert_allclose(run_kernel(k, inputs, (8, 48)), xn @ wn.T, rtol=1e-4, atol=1e-4)


def test_elementwise_upcasts_one_vector_ignoring_constants() -> None:
  """An elementwise kernel with a constant upcasts its contiguous axis by one vector (a constant is no reuse)."""
  x = Tensor.empty(64, 64, device="PYTHON")
  si = create_schedule([(x * 2 + 1).lazydata])[-1]
  assert Kernel(si.ast, opts=_SimdCpuRenderer()).hand_coded_optimizations().applied_opts == [Opt(OptOps.UPCAST, 0, 16)]


@pytest.mark.parametrize("shape", [(2, 48, 32), (32, 16)])
def test_transpose_tile_upcasts_both_contiguous_axes(shape: Tuple[int, ...]) -> None:
  """A channels-last buffer (..., hw, c) read in channels-first order times another: both the output's contiguous axis
  and the input's become one vector each, and the result is the transposed product."""
  xn, yn = rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)
  x, y = Tensor(xn, device="PYTHON").realize(), Tensor(yn, device="PYTHON").realize()
  out = x.transpose(-1, -2) * (y.transpose(-1, -2) > 0)
  si = create_schedule([out.lazydata])[-1]
  k = Kernel(si.ast, opts=_SimdCpuRenderer()).hand_coded_optimizations()
  assert [o.op for o in k.applied_opts] == [OptOps.UPCAST, OptOps.UPCAST] and k.upcasted == 2, k.applied_opts
  assert all(o.amt == 16 for o in k.applied_opts), k.applied_opts
  want = np.swapaxes(xn, -1, -2) * (np.swapaxes(yn, -1, -2) > 0)
  inputs = [xn, yn] if si.bufs[1].as_buffer().tobytes() == xn.tobytes() else [yn, xn]
  np.testing.assert_allclose(run_kernel(k, inputs, want.shape), want, rtol=1e-6)


# *** the CLANG and LLVM renderers ***

def _cpu_renderers() -> List[type]:
  from tiny_clang.renderer import ClangRenderer
  ret: List[type] = [ClangRenderer]
  try:
    from tiny_clang.llvmir import LLVMRenderer
    ret.append(LLVMRenderer)
  except ImportError:
    pass
  return ret


@pytest.mark.parametrize("cls", _cpu_renderers())
def test_clang_and_llvm_renderers_use_the_cpu_heuristic(cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
  """CLANG and LLVM declare the vector width and register count and answer the hook with the CPU heuristic."""
  monkeypatch.setenv("SIMD_BYTES", "64")
  monkeypatch.setenv("SIMD_REGISTERS", "32")
  r = cls()
  assert (r.simd_bytes, r.simd_registers) == (64, 32)
  si, _, _ = matmul_schedule(32, 24, 64, seed=4)
  mine = Kernel(si.ast, opts=r).hand_coded_optimizations().applied_opts
  assert mine == Kernel(si.ast, opts=_SimdCpuRenderer()).hand_coded_optimizations().applied_opts and mine[-1].op is OptOps.SWAP, mine


@pytest.mark.parametrize("machine, flags, simd_bytes, want", [
  ("x86_64", {"sse2", "avx", "avx2", "avx512f"}, 64, 32), ("x86_64", {"sse2", "avx", "avx2"}, 32, 16), ("x86_64", {"sse2"}, 16, 16),
  ("aarch64", {"fp", "asimd"}, 16, 32), ("arm64", set(), 16, 32)])
def test_host_simd_registers(machine: str, flags: set, simd_bytes: int, want: int, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.delenv("SIMD_REGISTERS", raising=False)
  monkeypatch.setattr(clang_renderer.platform, "machine", lambda: machine)
  monkeypatch.setattr(clang_renderer, "_cpu_flags", lambda: frozenset(flags))
  assert clang_renderer.host_simd_registers(simd_bytes) == want
  monkeypatch.setenv("SIMD_REGISTERS", "8")
  assert clang_renderer.host_simd_registers(simd_bytes) == 8


# *** random numbers ***

def _threefry_kernel(n: int) -> LazyOp:
  from tiny.ops import BinaryOps
  Tensor.manual_seed(3)
  sched = create_schedule([Tensor.rand(n, device="PYTHON").lazydata])
  return next(si.ast for si in sched if si.ast.op is MetaOps.KERNEL and any(x.op is BinaryOps.THREEFRY for x in si.ast.lazyops))


@pytest.mark.parametrize("n, upcast", [(1000, False), (THREEFRY_UPCAST_MIN - 8, False), (THREEFRY_UPCAST_MIN, True)])
def test_small_random_draws_are_not_upcast(n: int, upcast: bool) -> None:
  """A kernel drawing fewer than THREEFRY_UPCAST_MIN numbers keeps one lane (its codegen would cost ~8x in Python for
  under a millisecond of run time); a larger draw is upcast like any elementwise kernel."""
  opts = Kernel(_threefry_kernel(n), opts=_SimdCpuRenderer()).hand_coded_optimizations().applied_opts
  assert (len(opts) > 0) == upcast, opts


def test_reduce_axis_read_through_a_gather_stays_rolled_on_avx512() -> None:
  """BatchNorm's backward sums over a max pool's gradient spread back with (i // 2): with 16 lanes the 20-wide last
  reduce axis is not unrolled whole (it would split into a 16- and a 4-lane piece of scalar work) and the row axis
  outside it, gathered too, is unrolled by 4 (gathered_row_unroll); with 8 lanes (AVX2-like) the old choice, unrolling
  the last axis, stays."""
  xn, gn = rng.standard_normal((2, 3, 20, 20), np.float32), rng.standard_normal((2, 3, 10, 10), np.float32)
  x, g = Tensor(xn, device="PYTHON").realize(), Tensor(gn, device="PYTHON").realize()
  up = g.reshape(2, 3, 10, 1, 10, 1).expand(2, 3, 10, 2, 10, 2).reshape(2, 3, 20, 20)
  si = create_schedule([(x * up).sum((0, 2, 3)).lazydata])[-1]
  want = (xn * gn.repeat(2, 2).repeat(2, 3)).sum((0, 2, 3))
  inputs = [xn if si.bufs[i].nbytes == xn.nbytes else gn for i in (1, 2)]

  for renderer, unrolled in ((_SimdCpuRenderer(), False), (_Avx2CpuRenderer(), True)):
    k = Kernel(si.ast, opts=renderer)
    last = k.shape_len - 1
    assert k.full_shape[last] == 20 and k.sts[2 if si.bufs[2].nbytes == gn.nbytes else 1].real_strides()[last] is None
    row = Opt(OptOps.UNROLL, last - 1 - k.first_reduce, 4)
    k.hand_coded_optimizations()
    # rolled, the last axis is not unrolled, but the gathered row axis outside it is (by 4: rows share gathered loads)
    assert (k.applied_opts == [row]) == (not unrolled), k.applied_opts
    np.testing.assert_allclose(run_kernel(k, inputs, (3,)).reshape(3), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 4])
def test_batched_matvec_gets_the_strip(rows: int) -> None:
  """Attention weights times cached values, one matrix per head (p (H, 1, n) @ v (H, n, 64)): each head's vector meets
  only its own matrix, so the head-dim axis becomes a strip of vector accumulators as in `x @ W`. With several query
  rows (a batched matmul) a row of p would be loaded once per strip, so the strip is not used."""
  pn, vn = rng.standard_normal((3, rows, 24), np.float32), rng.standard_normal((3, 24, 64), np.float32)
  p, v = Tensor(pn, device="PYTHON").realize(), Tensor(vn, device="PYTHON").realize()
  si = create_schedule([(p @ v).lazydata])[-1]
  k = Kernel(si.ast, opts=_SimdCpuRenderer())
  strip_axis = k.first_reduce - 1
  k.hand_coded_optimizations()
  strip = [o for o in k.applied_opts if o.op is OptOps.UPCAST and o.axis == strip_axis]
  assert (prod(o.amt for o in strip) == 64) == (rows == 1), k.applied_opts
  inputs = [pn if si.bufs[i].nbytes == pn.nbytes else vn for i in (1, 2)]
  np.testing.assert_allclose(run_kernel(k, inputs, (3, rows, 64)), pn @ vn, rtol=1e-4, atol=1e-4)
  if rows == 1:
    assert vector_accs(k) == [16] * 4


# *** broadcast loads the compiler hoists ***

def _normalized_pool(n: int) -> Tuple[Any, List[np.ndarray], np.ndarray]:
  """A max pool of a per-channel affine map (BatchNorm's output, then max_pool2d): one kernel whose per-channel
  parameters are broadcast along the batch axis and every loop inside the channel axis."""
  xn = rng.standard_normal((n, 4, 20, 20), np.float32)
  mn, sn = rng.standard_normal(4).astype(np.float32), rng.random(4, np.float32) + 0.5
  x, m, s = (Tensor(a, device="PYTHON").realize() for a in (xn, mn, sn))
  si = create_schedule([((x - m.reshape(1, 4, 1, 1)) * s.reshape(1, 4, 1, 1)).max_pool2d().lazydata])[-1]
  y = (xn - mn.reshape(1, 4, 1, 1)) * sn.reshape(1, 4, 1, 1)
  want = y.reshape(n, 4, 10, 2, 10, 2).max((3, 5))
  arrays = {id(t.lazydata.base.realized): a for t, a in ((x, xn), (m, mn), (s, sn))}
  return si, [arrays[id(b)] for b in si.bufs[1:]], want


def test_batch_axis_not_upcast_for_hoisted_per_channel_parameters() -> None:
  """The per-channel parameters' loads sit outside the 10x10x2x2 loops inside the channel axis (clang hoists them), so
  upcasting the batch axis to reuse them gains nothing and only unrolls the body (MNIST step b64, max-pool backward
  mask over BatchNorm's output, one thread: 1.3 -> 0.75 ms). Core's generic heuristic (a GPU's) still upcasts it."""
  si, inputs, want = _normalized_pool(8)
  k = Kernel(si.ast, opts=_SimdCpuRenderer())
  k.hand_coded_optimizations()
  assert not any(o.op is OptOps.UPCAST and o.axis == 0 for o in k.applied_opts), k.applied_opts
  np.testing.assert_allclose(run_kernel(k, inputs, want.shape), want, rtol=1e-5, atol=1e-5)
  generic = Kernel(si.ast, opts=PythonRenderer())
  generic.upcast_reused_axes()
  assert any(o.op is OptOps.UPCAST and o.axis == 0 for o in generic.applied_opts), generic.applied_opts
  np.testing.assert_allclose(run_kernel(generic, inputs, want.shape), want, rtol=1e-5, atol=1e-5)


def test_reuse_inside_a_reduce_loop_still_upcasts_with_skip_hoisted() -> None:
  """A matmul's left operand is broadcast along the output columns but moves along the reduce loop inside them: its
  load is not hoisted, so upcasting the columns for it still saves loads and skip_hoisted keeps that upcast."""
  an, bn = rng.standard_normal((64, 24), np.float32), rng.standard_normal((24, 48), np.float32)
  a, b = Tensor(an, device="PYTHON").realize(), Tensor(bn, device="PYTHON").realize()
  si = create_schedule([(a @ b).lazydata])[-1]
  picks = []
  for skip in (False, True):
    k = Kernel(si.ast, opts=PythonRenderer())
    k.upcast_reused_axes(skip_hoisted=skip)
    picks.append(k.applied_opts)
  assert picks[0] == picks[1] and len(picks[0]) > 0, picks
  inputs = [an if si.bufs[i].nbytes == an.nbytes else bn for i in (1, 2)]
  np.testing.assert_allclose(run_kernel(k, inputs, (64, 48)), an @ bn, rtol=1e-4, atol=1e-4)


def test_pooled_row_upcast_whole_on_avx512() -> None:
  """A 2x2 max pool with its window unrolled over a 10-wide output row: with 16 lanes the whole row is upcast (its
  windows become wide contiguous loads of two input rows; MNIST step b64: 0.57 -> 0.20 ms per kernel); with 8 lanes
  (AVX2-like) the row stays a loop, as before."""
  si, inputs, want = _normalized_pool(2)

  for renderer, whole in ((_SimdCpuRenderer(), True), (_Avx2CpuRenderer(), False)):
    k = Kernel(si.ast, opts=renderer)
    row = k.first_reduce - 1
    assert k.full_shape[row] == 10
    k.hand_coded_optimizations()
    assert (Opt(OptOps.UPCAST, row, 0) in k.applied_opts) == whole, k.applied_opts
    np.testing.assert_allclose(run_kernel(k, inputs, want.shape), want, rtol=1e-5, atol=1e-5)
