"""A small, fast subset of the op suite that runs with core alone, on the PYTHON device (the full suite is tests/test_ops.py)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tiny.dtype import dtypes  # noqa: E402
from tiny.tensor import Tensor  # noqa: E402
from tiny.testing.ops_helper import helper_test_op  # noqa: E402

DEV = "PYTHON"


def op(shps, torch_fxn, tiny_fxn=None, **kw):
  helper_test_op(shps, torch_fxn, tiny_fxn, device=DEV, **kw)


def test_elementwise_and_broadcast():
  op([(3, 4), (1, 4)], lambda x, y: (x * y + x / (y.abs() + 1)).relu())
  op([(3, 1), (1, 2)], lambda x, y: torch.maximum(x, y), Tensor.maximum)
  op([(5,)], lambda x: x.exp().log(), atol=1e-5)
  op([(5,)], lambda x: x.sigmoid() + x.sin() + x.sqrt().square() * 0, low=0.1, atol=1e-5)
  op([(2, 3)], lambda x: torch.where(x > 0, x, -x), lambda x: (x > 0).where(x, -x))


def test_reductions():
  op([(3, 4)], lambda x: x.sum(1))
  op([(3, 4)], lambda x: x.amax(0), lambda x: x.max(0))
  op([(3, 4)], lambda x: x.mean(), atol=1e-5)
  op([(3, 4)], lambda x: x.softmax(-1), lambda x: x.softmax(-1), atol=1e-6)
  op([(3, 4)], lambda x: x.argmax(1), lambda x: x.argmax(1), forward_only=True)


def test_movement_and_indexing():
  op([(2, 3, 4)], lambda x: x.permute(2, 0, 1).reshape(4, 6).flip(0)[1:3, ::2])
  op([(4, 5)], lambda x: x[torch.tensor([2, 0])], lambda x: x[Tensor([2, 0], device=DEV)])
  op([(3, 4)], lambda x: torch.nn.functional.pad(x, (1, 0, 0, 2)), lambda x: x.pad(((0, 2), (1, 0))))
  op([(2, 3), (2, 3)], lambda x, y: torch.cat([x, y], 1), lambda x, y: x.cat(y, dim=1))


def test_matmul_conv():
  op([(3, 4), (4, 2)], lambda x, y: x @ y, atol=1e-5)
  op([(1, 2, 5, 5), (3, 2, 3, 3)], lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), lambda x, w: x.conv2d(w, padding=1), atol=1e-5,
     grad_atol=1e-4)


def test_creation_and_dtypes_on_python_device():
  np.testing.assert_equal(Tensor.arange(5, device=DEV).numpy(), np.arange(5))
  np.testing.assert_equal(Tensor.eye(3, device=DEV).numpy(), np.eye(3, dtype=np.float32))
  x = Tensor([1, -2, 3], device=DEV)
  assert (x // 2).tolist() == [0, -1, 1] and (x % 2).tolist() == [1, 0, 1]
  assert (x.cast(dtypes.float32) / 2).tolist() == [0.5, -1.0, 1.5]
  t = Tensor.zeros(2, 2, device=DEV).contiguous().realize()
  t[0, 1] = 5.0
  assert t.tolist() == [[0.0, 5.0], [0.0, 0.0]]


def test_random_on_python_device():
  Tensor.manual_seed(3)
  a = Tensor.rand(9, device=DEV).numpy()
  Tensor.manual_seed(3)
  b = Tensor.rand(9, device=DEV).numpy()
  np.testing.assert_equal(a, b)
  assert ((a >= 0) & (a < 1)).all() and len(set(a.tolist())) == 9
