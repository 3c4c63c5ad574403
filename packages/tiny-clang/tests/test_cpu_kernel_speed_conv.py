"""Correctness of the code paths added to speed up small convs on the CPU (the MNIST CNN training step).

- codegen: an unrolled reduce whose row was loaded as vectors of different widths (20 = 8 + 8 + 4) accumulates in one
  full-width vector, the narrow piece widened with lanes that change nothing (zeros for a sum, its own lanes for a max);
- CPU heuristic (AVX2-like renderer: 32-byte vectors, 16 registers): short output rows are tiled whole with a second
  output row (conv forward), short reduce rows unroll whole and a conv weight gradient upcasts its kernel row axis;
- `function.Conv.backward`: the input gradient reads the output gradient from a zero-padded copy, and the weight
  gradient of a large batch is summed in groups of images.

Kernels with chosen opts run on the PYTHON reference device and are checked against numpy; the conv gradients run on
CLANG and are checked against torch."""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, Opt, OptOps
from tiny.dtype import dtypes
from tiny.helpers import prod
from tiny.engine.schedule import create_schedule
from tiny.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tiny.shape.shapetracker import ShapeTracker as ST
from tiny.tensor import Tensor
from tiny.testing.ops_helper import run_kernel_on_python
from tiny_clang.testing import Avx2LikeRenderer

F32 = dtypes.float32


def _vector_accs(k: Kernel) -> List[int]:
  assert k.uops is not None
  return [u.dtype.count for u in k.uops.uops if u.op.name == "DEFINE_ACC" and u.dtype is not None]


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape, np.float32)


def _inputs(si: Any, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
  """The arrays in the order of the kernel's input buffers (matched by size: the test arrays have distinct sizes)."""
  return [next(a for a in arrays if a.nbytes == si.bufs[i].nbytes) for i in range(1, len(si.bufs))]


def _row_reduce(op: ReduceOps, rows: int, n: int, two_inputs: bool) -> LazyOp:
  """out[r] = reduce_{j,i} x[r, j, i] (* y[r, j, i] when two_inputs) over 3 rows j of the first n of n + 4 values:
  unrolling i leaves the loop over j (the rows do not merge), so the accumulator stays."""
  st = ST.from_shape((rows, 3, n + 4)).shrink(((0, rows), (0, 3), (0, n)))
  src = LazyOp(BufferOps.LOAD, (), MemBuffer(1, F32, st))
  if two_inputs:
    src = LazyOp(BinaryOps.MUL, (src, LazyOp(BufferOps.LOAD, (), MemBuffer(2, F32, st))))
  red = LazyOp(op, (src,), (1, 2))
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (red,), MemBuffer(0, F32, ST.from_shape((rows, 1, 1)))),))


@pytest.mark.parametrize("n, accs", [(20, 8), (12, 8), (6, 4), (10, 8), (24, 8)])
def test_short_row_dot_accumulates_in_one_full_vector(n: int, accs: int) -> None:
  """A sum of products over a row of n unrolled whole: one vector accumulator as wide as the widest load (the row's
  narrower tail widened with zeros), and the exact dot products."""
  x, y = _rand(4, 3, n + 4, seed=1), _rand(4, 3, n + 4, seed=2)
  k = Kernel(_row_reduce(ReduceOps.SUM, 4, n, True), opts=Avx2LikeRenderer())
  k.apply_opt(Opt(OptOps.UNROLL, 1, n))
  got = run_kernel_on_python(k, [x, y], (4,))
  assert _vector_accs(k) == [accs], _vector_accs(k)
  np.testing.assert_allclose(got, (x * y)[..., :n].sum((1, 2)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [20, 12, 6])
def test_short_row_max_widens_with_its_own_lanes(n: int) -> None:
  """A row max unrolled whole: the narrow piece is widened with copies of its lanes (zeros would win over negatives)."""
  x = -np.abs(_rand(4, 3, n + 4, seed=3)) - 1.0   # every value negative: a zero lane would give a wrong max of 0
  k = Kernel(_row_reduce(ReduceOps.MAX, 4, n, False), opts=Avx2LikeRenderer())
  k.apply_opt(Opt(OptOps.UNROLL, 1, n))
  got = run_kernel_on_python(k, [x], (4,))
  assert len(_vector_accs(k)) == 1 and _vector_accs(k)[0] > 1, _vector_accs(k)
  np.testing.assert_array_equal(got, x[..., :n].max((1, 2)))


def _conv_ref(xn: np.ndarray, wn: np.ndarray) -> np.ndarray:
  kh, kw = wn.shape[2:]
  oh, ow = xn.shape[2] - kh + 1, xn.shape[3] - kw + 1
  return sum(np.einsum("bchw,oc->bohw", xn[:, :, ky:ky + oh, kx:kx + ow], wn[:, :, ky, kx]) for ky in range(kh) for kx in range(kw))


@pytest.mark.parametrize("hw, k, cout, want_row", [(24, 5, 8, 20), (8, 3, 16, 6)])
def test_conv_forward_tiles_a_short_row_whole(hw: int, k: int, cout: int, want_row: int) -> None:
  """A conv whose output rows (20, 6 pixels) are no multiple of the 8 lanes gets the whole row as its strip."""
  xn, wn = _rand(2, 4, hw, hw, seed=4), _rand(cout, 4, k, k, seed=5)
  si = create_schedule([Tensor(xn, device="PYTHON").realize().conv2d(Tensor(wn, device="PYTHON").realize()).lazydata])[-1]
  kern = Kernel(si.ast, opts=Avx2LikeRenderer())
  ox = kern.first_reduce - 1
  kern.hand_coded_optimizations()
  assert prod(o.amt for o in kern.applied_opts if o.op is OptOps.UPCAST and o.axis == ox) == want_row, kern.applied_opts
  got = run_kernel_on_python(kern, _inputs(si, [xn, wn]), (2, cout, want_row, want_row))
  np.testing.assert_allclose(got, _conv_ref(xn, wn), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("hw, k, masked", [(24, 5, False), (28, 5, False), (10, 3, False), (10, 3, True)])
def test_conv_forward_small_image_row_adds_a_second_output_row(hw: int, k: int, masked: bool) -> None:
  """A whole small-image row of full vectors (20 = 8 + 8 + 4, 24 = 3 x 8, 8) x a few channels leaves registers for a
  second output row (y upcast by 2); an input read only after the reduce (a relu mask) does not prevent it."""
  xn, wn, mn = _rand(1, 2, hw, hw, seed=6), _rand(4, 2, k, k, seed=7), _rand(1, 4, hw - k + 1, hw - k + 1, seed=8)
  out = Tensor(xn, device="PYTHON").realize().conv2d(Tensor(wn, device="PYTHON").realize())
  if masked:
    out = out * (Tensor(mn, device="PYTHON").realize() > 0)
  si = create_schedule([out.lazydata])[-1]
  kern = Kernel(si.ast, opts=Avx2LikeRenderer())
  oy = kern.first_reduce - 2
  kern.hand_coded_optimizations()
  assert Opt(OptOps.UPCAST, oy, 2) in kern.applied_opts, kern.applied_opts
  o = hw - k + 1
  got = run_kernel_on_python(kern, _inputs(si, [xn, wn, mn]), (1, 4, o, o))
  np.testing.assert_allclose(got, _conv_ref(xn, wn) * ((mn > 0) if masked else 1), rtol=1e-4, atol=1e-4)



def _conv_kernel(x_shape: Tuple[int, ...], w_shape: Tuple[int, ...], padding: int) -> Tuple[Any, Kernel]:
  """The conv's schedule item (on PYTHON, nothing run) and its kernel with the AVX2-like heuristic's opts applied."""
  x, w = Tensor.empty(*x_shape, device="PYTHON"), Tensor.empty(*w_shape, device="PYTHON")
  si = create_schedule([x.conv2d(w, padding=padding).lazydata])[-1]
  kern = Kernel(si.ast, opts=Avx2LikeRenderer())
  kern.hand_coded_optimizations()
  return si, kern


def _upcasts(kern: Kernel) -> List[Tuple[int, int]]:
  return [(o.axis, o.amt) for o in kern.applied_opts if o.op is OptOps.UPCAST]


def test_large_padded_conv_keeps_one_row_of_eight_channels() -> None:
  """The benchmark's conv (b32 64->64 56x56 3x3, padding 1): a padded input makes every vector load a masked one, so
  the strip stays 8 pixels x 8 channels (1 load per 8 FMAs; 2 rows x 4 channels measured ~0.9x)."""
  _, kern = _conv_kernel((32, 64, 56, 56), (64, 64, 3, 3), 1)
  # axes: batch, out channel, y, x (then the reduce: in channel, ky, kx)
  assert _upcasts(kern) == [(3, 8), (1, 8)], kern.applied_opts


def test_large_unpadded_conv_adds_a_second_output_row() -> None:
  """The same conv on an unpadded 58x58 input: 8 pixels x 2 output rows x 4 channels (~1.25x the 8 x 8 tile)."""
  _, kern = _conv_kernel((32, 64, 58, 58), (64, 64, 3, 3), 0)
  assert _upcasts(kern) == [(3, 8), (2, 2), (1, 4)], kern.applied_opts


@pytest.mark.parametrize("x_shape, w_shape, padding, want", [
  ((2, 3, 42, 42), (12, 3, 3, 3), 0, [(3, 8), (2, 2), (1, 4)]),   # 40x40 output: 5 strips of 8 pixels, 2 rows, 4 channels
  ((2, 2, 28, 42), (6, 2, 3, 3), 0, [(3, 8), (2, 2), (1, 2)]),    # 6 channels: 4 does not divide them, 2 does
  ((2, 3, 43, 42), (12, 3, 3, 3), 0, [(3, 8), (1, 4)]),            # 41 output rows (odd): no row pairs, 4 of 12 channels
  ((2, 2, 40, 40), (5, 2, 3, 3), 1, [(3, 8)]),                     # padded, 5 channels (prime): one vector strip
  ((2, 2, 20, 44), (4, 2, 5, 5), 0, [(3, 8), (2, 2), (1, 4)]),     # 5x5 kernel, 16x40 output
])
def test_conv_strip_choice_and_result_on_odd_sizes(x_shape: Tuple[int, ...], w_shape: Tuple[int, ...], padding: int,
                                                   want: List[Tuple[int, int]]) -> None:
  """The strip chosen for convs of odd sizes (AVX2-like renderer), run on PYTHON and checked against numpy."""
  si, kern = _conv_kernel(x_shape, w_shape, padding)
  assert _upcasts(kern) == want, kern.applied_opts
  xn, wn = _rand(*x_shape, seed=15), _rand(*w_shape, seed=16)
  pad = ((0, 0), (0, 0), (padding, padding), (padding, padding))
  ref = _conv_ref(np.pad(xn, pad), wn)
  got = run_kernel_on_python(kern, _inputs(si, [xn, wn]), ref.shape)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bs, cin, cout, h, w, k, padding", [
  (3, 5, 12, 42, 42, 3, 0),    # 40x40 output: the two-row strip on an AVX2 host
  (2, 3, 6, 27, 58, 3, 0),     # 25x56 output: odd row count
  (2, 4, 8, 56, 56, 3, 1),     # padded: the 8 x 8 strip
  (1, 3, 10, 30, 66, 5, 0),    # 26x62 output: no strip of 8 pixels
])
def test_conv_forward_matches_torch_on_clang(bs: int, cin: int, cout: int, h: int, w: int, k: int, padding: int) -> None:
  """The conv forward on CLANG with the host's own heuristic (on an AVX2 host: the strips above) against torch."""
  torch = pytest.importorskip("torch")
  from tiny_clang.compiler import find_cc
  if find_cc() is None:
    pytest.skip("no C compiler (clang/cc/gcc) on this machine")
  xn, wn = _rand(bs, cin, h, w, seed=17), _rand(cout, cin, k, k, seed=18)
  got = Tensor(xn, device="CLANG").conv2d(Tensor(wn, device="CLANG"), padding=padding).numpy()
  ref = torch.nn.functional.conv2d(torch.tensor(xn), torch.tensor(wn), padding=padding).numpy()
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def _weight_grad_schedule(xn: np.ndarray, wn: np.ndarray) -> Tuple[List[Any], np.ndarray, np.ndarray]:
  """The schedule item of the weight gradient reduce (no batch split: 2 images) and the gradient of sum(conv * r)."""
  x, w = Tensor(xn, device="PYTHON").realize(), Tensor(wn, device="PYTHON", requires_grad=True).realize()
  out = x.conv2d(w)
  rn = _rand(*out.shape, seed=9)
  (out * Tensor(rn, device="PYTHON").realize()).sum().backward()
  assert w.grad is not None
  sched = create_schedule([w.grad.lazydata])
  kh, kw = wn.shape[2:]
  oh, ow = out.shape[2:]
  ref = np.stack([np.einsum("bchw,bohw->oc", xn[:, :, ky:ky + oh, kx:kx + ow], rn) for ky in range(kh) for kx in range(kw)], -1)
  return sched, ref.reshape(wn.shape), rn


@pytest.mark.parametrize("hw, k", [(24, 5), (8, 3)])
def test_conv_weight_gradient_upcasts_the_kernel_row(hw: int, k: int) -> None:
  """The weight gradient's reduce over 20 (or 6) pixels unrolls whole and its tile takes the whole kernel row axis (ky)."""
  xn, wn = _rand(2, 4, hw, hw, seed=10), _rand(4, 4, k, k, seed=11)
  sched, ref, rn = _weight_grad_schedule(xn, wn)
  si = next(s for s in sched if s.ast.op is MetaOps.KERNEL and any(op.op is ReduceOps.SUM for op in s.ast.lazyops))
  kern = Kernel(si.ast, opts=Avx2LikeRenderer())
  full = list(kern.full_shape)
  kern.hand_coded_optimizations()
  ups = [o for o in kern.applied_opts if o.op is OptOps.UPCAST]
  assert any(o.amt == k and full[o.axis] == k for o in ups), kern.applied_opts
  assert any(o.op is OptOps.UNROLL and o.amt == hw - k + 1 for o in kern.applied_opts), kern.applied_opts
  got = run_kernel_on_python(kern, _inputs(si, [xn, rn]), wn.shape)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bs, cin, cout, hw, k, padding", [
  (64, 3, 4, 24, 5, 0),    # 20x20 output: the weight gradient sums 4 groups of 16 images; the input gradient pads by 4
  (6, 2, 3, 44, 3, 1),     # 6 images of 44x44: 2 groups of 3
  (4, 3, 5, 9, 3, 1),      # padding 1: the input gradient pads by 1; one group
  (2, 2, 3, 7, 3, 3),      # padding 3 > k - 1: the input gradient crops instead (negative pad)
  (3, 2, 2, 10, 1, 0),     # 1x1 kernel: nothing to pad
])
def test_conv_gradients_match_torch(bs: int, cin: int, cout: int, hw: int, k: int, padding: int) -> None:
  torch = pytest.importorskip("torch")
  from tiny_clang.compiler import find_cc
  if find_cc() is None:
    pytest.skip("no C compiler (clang/cc/gcc) on this machine")
  xn, wn = _rand(bs, cin, hw, hw, seed=12), _rand(cout, cin, k, k, seed=13)
  x = Tensor(xn, device="CLANG", requires_grad=True)
  w = Tensor(wn, device="CLANG", requires_grad=True)
  out = x.conv2d(w, padding=padding)
  rn = _rand(*out.shape, seed=14)
  (out * Tensor(rn, device="CLANG")).sum().backward()
  tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  tout = torch.nn.functional.conv2d(tx, tw, padding=padding)
  (tout * torch.tensor(rn)).sum().backward()
  assert x.grad is not None and w.grad is not None
  np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_batch_groups() -> None:
  from tiny.function import _batch_groups
  assert _batch_groups(64, 400) == 4      # 16 images of 20x20 per group
  assert _batch_groups(64, 576) == 8      # 14 -> 8 images of 24x24
  assert _batch_groups(64, 64) == 1       # small outputs keep one reduce
  assert _batch_groups(6, 44 * 44) == 2   # 4 per group does not divide 6: 3
  assert _batch_groups(7, 10000) == 7     # one image per group
