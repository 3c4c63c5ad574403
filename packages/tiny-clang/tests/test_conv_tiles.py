"""The CPU heuristic's tiles for the MNIST CNN's 3x3 convs (32->64 on 10x10 images, 64->64 on 8x8), and their results.

The opts are chosen for an AVX2-like renderer (16 registers of 32 bytes, independent of this host), run on the PYTHON
reference device and checked against numpy: the forward convs (8-pixel rows x 2 rows x 4 channels; the 6-pixel row whole
x 4 channels), the input gradient (10-pixel rows x 4 channels) and the weight gradient, whose 3 kernel rows x 4 output
channels tile (12 accumulators) is the widest one on 16 registers. The same convs forward and backward then run on CLANG
and LLVM with the host's own heuristic and are checked against torch."""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, OptOps
from tiny.engine.schedule import create_schedule
from tiny.ops import MetaOps, ReduceOps
from tiny.tensor import Tensor
from tiny.testing.ops_helper import run_kernel_on_python
from tiny_clang.testing import Avx2LikeRenderer


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape, np.float32)


def _inputs(si: Any, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
  """The arrays in the order of the kernel's input buffers (matched by size: the test arrays have distinct sizes)."""
  return [next(a for a in arrays if a.nbytes == si.bufs[i].nbytes) for i in range(1, len(si.bufs))]


def _tiled(si: Any) -> Tuple[Kernel, List[Tuple[int, int]], List[Tuple[OptOps, int, int]]]:
  """The kernel with the AVX2-like heuristic's opts, the upcasts as (size of the axis, amount) in the order applied, and
  every opt as (op, size of the axis, amount) (sizes, not axis numbers: they do not depend on how the shape was split)."""
  kern = Kernel(si.ast, opts=Avx2LikeRenderer())
  opts = []
  for o in _heuristic_opts(kern):
    opts.append((o.op, kern.full_shape[o.axis if o.op is OptOps.UPCAST else kern.first_reduce + o.axis], o.amt))
    kern.apply_opt(o)
  return kern, [(n, amt) for op, n, amt in opts if op is OptOps.UPCAST], opts


def _heuristic_opts(kern: Kernel) -> List[Any]:
  """The opts the heuristic applies to a fresh copy of kern."""
  probe = Kernel(kern.ast, opts=kern.opts)
  probe.hand_coded_optimizations()
  return list(probe.applied_opts)


def _conv_ref(xn: np.ndarray, wn: np.ndarray) -> np.ndarray:
  kh, kw = wn.shape[2:]
  oh, ow = xn.shape[2] - kh + 1, xn.shape[3] - kw + 1
  return sum(np.einsum("bchw,oc->bohw", xn[:, :, ky:ky + oh, kx:kx + ow], wn[:, :, ky, kx]) for ky in range(kh) for kx in range(kw))


# (input shape, weight shape, upcasts as (axis size, amount)): 8x8 output rows of one vector x 2 rows x 4 channels; the
# 6x6 output's row whole (4 + 2 lanes) x 4 channels
FORWARD = [((2, 4, 10, 10), (8, 4, 3, 3), [(8, 8), (8, 2), (8, 4)]),
           ((2, 4, 8, 8), (8, 4, 3, 3), [(6, 6), (8, 4)])]


@pytest.mark.parametrize("x_shape, w_shape, want", FORWARD)
def test_forward_3x3_tile_and_result(x_shape: Tuple[int, ...], w_shape: Tuple[int, ...], want: List[Tuple[int, int]]) -> None:
  xn, wn = _rand(*x_shape, seed=1), _rand(*w_shape, seed=2)
  si = create_schedule([Tensor(xn, device="PYTHON").realize().conv2d(Tensor(wn, device="PYTHON").realize()).lazydata])[-1]
  kern, ups, _ = _tiled(si)
  assert ups == want, kern.applied_opts
  ref = _conv_ref(xn, wn)
  np.testing.assert_allclose(run_kernel_on_python(kern, _inputs(si, [xn, wn]), ref.shape), ref, rtol=1e-4, atol=1e-4)


def _gradients(xn: np.ndarray, wn: np.ndarray, rn: np.ndarray) -> Tuple[Any, Any]:
  """Schedules of the input gradient and of the weight gradient of sum(conv(x, w) * r) (on PYTHON, nothing run)."""
  x = Tensor(xn, device="PYTHON", requires_grad=True).realize()
  w = Tensor(wn, device="PYTHON", requires_grad=True).realize()
  (x.conv2d(w) * Tensor(rn, device="PYTHON").realize()).sum().backward()
  assert x.grad is not None and w.grad is not None
  return create_schedule([x.grad.lazydata]), create_schedule([w.grad.lazydata])


def _sum_kernel(sched: List[Any]) -> Any:
  return next(s for s in sched if s.ast.op is MetaOps.KERNEL and any(op.op is ReduceOps.SUM for op in s.ast.lazyops))


@pytest.mark.parametrize("out,ups,seed", [(8, [(8, 4), (3, 3)], 3), (6, [(3, 3), (8, 2)], 6)], ids=["8x8", "6x6"])
def test_weight_gradient_3x3_tile(out: int, ups: List[Tuple[int, int]], seed: int) -> None:
  """The weight gradient of a 3x3 conv. On 8x8 outputs each reduce row unrolls whole as one vector, so the tile is 4
  output channels x all 3 kernel rows (12 accumulators), the channels upcast first. On 6x6 outputs a row is 4 + 2 lanes
  (two registers per kernel row): the tile stays 3 kernel rows x 2 channels, kernel rows first (4 would spill)."""
  xn, wn = _rand(2, 4, out + 2, out + 2, seed=seed), _rand(8, 4, 3, 3, seed=seed + 1)
  rn = _rand(2, 8, out, out, seed=seed + 2)
  _, wsched = _gradients(xn, wn, rn)
  si = _sum_kernel(wsched)
  kern, got_ups, opts = _tiled(si)
  assert got_ups == ups, kern.applied_opts
  assert (OptOps.UNROLL, out, out) in opts, kern.applied_opts
  ref = np.stack([np.einsum("bchw,bohw->oc", xn[:, :, ky:ky + out, kx:kx + out], rn) for ky in range(3) for kx in range(3)], -1)
  got = run_kernel_on_python(kern, _inputs(si, [xn, rn]), wn.shape)
  np.testing.assert_allclose(got, ref.reshape(wn.shape), rtol=1e-4, atol=1e-4)


def test_input_gradient_3x3_tile_and_result() -> None:
  """The input gradient of the 3x3 conv 8 -> 4 channels on 10x10 images: the 10-pixel row whole (8 + 2 lanes) x 4
  channels, checked against the full correlation of the output gradient with the flipped kernel."""
  xn, wn = _rand(2, 4, 10, 10, seed=9), _rand(8, 4, 3, 3, seed=10)
  rn = _rand(2, 8, 8, 8, seed=11)
  xsched, _ = _gradients(xn, wn, rn)
  si = xsched[-1]
  kern, ups, _ = _tiled(si)
  assert ups == [(10, 10), (4, 4)], kern.applied_opts
  ref = np.zeros_like(xn)
  for ky in range(3):
    for kx in range(3):
      ref[:, :, ky:ky + 8, kx:kx + 8] += np.einsum("bohw,oc->bchw", rn, wn[:, :, ky, kx])
  # the kernel reads the output gradient from a zero-padded copy made by an earlier kernel: pass that copy
  padded = np.pad(rn, ((0, 0), (0, 0), (2, 2), (2, 2)))
  arrays = [padded if si.bufs[i].nbytes == padded.nbytes else next(a for a in (rn, wn) if a.nbytes == si.bufs[i].nbytes)
            for i in range(1, len(si.bufs))]
  got = run_kernel_on_python(kern, arrays, xn.shape)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_mnist_3x3_convs_forward_and_backward_match_torch(device: str) -> None:
  """conv 32->64 then relu, conv 64->64 then relu (the MNIST CNN's 3x3 pair on 10x10 images) forward and backward on
  the CPU device with the host's heuristic, against torch."""
  torch = pytest.importorskip("torch")
  if device == "CLANG":
    from tiny_clang.compiler import find_cc
    if find_cc() is None:
      pytest.skip("no C compiler (clang/cc/gcc) on this machine")
  else:
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
  xn = _rand(3, 32, 10, 10, seed=12)
  w3n, w4n = _rand(64, 32, 3, 3, seed=13) * 0.1, _rand(64, 64, 3, 3, seed=14) * 0.1
  rn = _rand(3, 64, 6, 6, seed=15)
  x, w3, w4 = (Tensor(a, device=device, requires_grad=True) for a in (xn, w3n, w4n))
  out = x.conv2d(w3).relu().conv2d(w4).relu()
  (out * Tensor(rn, device=device)).sum().backward()
  tx, tw3, tw4 = (torch.tensor(a, requires_grad=True) for a in (xn, w3n, w4n))
  tout = torch.nn.functional.conv2d(torch.nn.functional.conv2d(tx, tw3).relu(), tw4).relu()
  (tout * torch.tensor(rn)).sum().backward()
  assert x.grad is not None and w3.grad is not None and w4.grad is not None
  np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-4, atol=1e-4)
  for got, want in ((x.grad, tx.grad), (w3.grad, tw3.grad), (w4.grad, tw4.grad)):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-3)
