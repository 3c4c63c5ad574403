"""Programs the kernel optimizer once got wrong, on every device that computes, under NOOPT and the default heuristic.

Each case is checked against numpy or torch, never against another tiny run, so a wrong kernel cannot pass by
agreeing with itself.
"""
from __future__ import annotations

import numpy as np
import pytest

from tiny.helpers import Context
from tiny.registry import Device
from tiny.tensor import Tensor

torch = pytest.importorskip("torch")

COMPUTE = [d for d in ("CLANG", "LLVM", "PYTHON") if d in Device.get_available_devices()]
OPT_MODES = {"noopt": {"NOOPT": 1}, "heuristic": {"NOOPT": 0}}


@pytest.fixture(params=COMPUTE)
def device(request: pytest.FixtureRequest) -> str:
  return str(request.param)


@pytest.mark.parametrize("mode", OPT_MODES)
def test_padded_add_after_unrolled_reduce(device: str, mode: str) -> None:
  """An unrolled reduce feeding an add with a padded (gated) load stored twice to one address, the second store
  dropping the padded operand: a.pad(...) + b.sum(2) gave 2 where 3 is right."""
  with Context(**OPT_MODES[mode]):
    a = Tensor.ones(4, 4, device=device).contiguous().realize()
    b = Tensor.ones(4, 5, 2, device=device).contiguous().realize()
    got = (a.pad(((0, 0), (1, 0))) + b.sum(2)).numpy()
  want = np.pad(np.ones((4, 4), np.float32), ((0, 0), (1, 0))) + np.ones((4, 5, 2), np.float32).sum(2)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", OPT_MODES)
@pytest.mark.parametrize("shape,axis", [((3, 6, 4), 2), ((2, 3, 8), 2), ((5, 4, 3), 1)])
def test_elementwise_with_reduce_axis_views(device: str, mode: str, shape: tuple, axis: int) -> None:
  """Elementwise operands of a reduce result (padded, flipped, broadcast) read with every unroll the optimizer picks."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal(shape).astype(np.float32)
  out_shape = tuple(s for i, s in enumerate(shape) if i != axis)
  y = rng.standard_normal(tuple(s - 1 for s in out_shape)).astype(np.float32)
  with Context(**OPT_MODES[mode]):
    tx, ty = Tensor(x, device=device), Tensor(y, device=device)
    got = (ty.pad(((1, 0), (0, 1))).flip(0) * 2 + tx.sum(axis) + tx.max(axis)).numpy()
  want = np.flip(np.pad(y, ((1, 0), (0, 1))), 0) * 2 + x.sum(axis) + x.max(axis)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", OPT_MODES)
def test_gather_plus_fancy_index_gradient(device: str, mode: str) -> None:
  """Both gradient terms of gather + fancy indexing reach t.grad (one of them was dropped by the same miscompile)."""
  x = np.arange(20, dtype=np.float32).reshape(4, 5)
  idx = [[0, 1], [2, 3], [4, 0], [1, 1]]
  with Context(**OPT_MODES[mode]):
    t = Tensor(x, device=device, requires_grad=True)
    (t.gather(1, Tensor(idx, device=device)).sum() + t[[0, 2], 1:4].sum()).backward()
    assert t.grad is not None
    got = t.grad.numpy()
  tt = torch.tensor(x, requires_grad=True)
  (tt.gather(1, torch.tensor(idx)).sum() + tt[[0, 2], 1:4].sum()).backward()
  np.testing.assert_array_equal(got, tt.grad.numpy())
