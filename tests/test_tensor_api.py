"""Tensor API: creation, data out, autograd bookkeeping, contexts, errors; checked against numpy/torch/hand values."""
import os
import subprocess
import sys

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.helpers import GlobalCounters, Metadata
from tiny.registry import Device
from tiny.tensor import Tensor

torch = pytest.importorskip("torch")


# ***** creation *****

def test_from_python_values_and_dtype_inference():
  assert Tensor([1, 2, 3]).dtype == dtypes.default_int
  assert Tensor([1.0, 2]).dtype == dtypes.default_float
  assert Tensor([True, False]).dtype == dtypes.bool
  assert Tensor([]).dtype == dtypes.default_float and Tensor([]).shape == (0,)
  assert Tensor(3).dtype == dtypes.default_int and Tensor(3).shape == ()
  assert Tensor(2.5).dtype == dtypes.default_float
  assert Tensor(True).dtype == dtypes.bool
  assert Tensor([[1, 2], [3, 4]]).shape == (2, 2)
  assert Tensor(((1, 2), (3, 4))).tolist() == [[1, 2], [3, 4]]
  np.testing.assert_equal(Tensor([[1, 2], [3, 4]], dtype=dtypes.float16).numpy(), np.array([[1, 2], [3, 4]], np.float16))
  assert Tensor([1, 2], dtype="float32").dtype == dtypes.float32


def test_from_numpy_keeps_dtype():
  for npdt in (np.float32, np.float64, np.int8, np.int64, np.uint8, np.uint16, np.bool_, np.float16):
    x = (np.arange(12).reshape(3, 4) % 5).astype(npdt)
    t = Tensor(x)
    assert t.dtype == dtypes.from_np(npdt)
    np.testing.assert_equal(t.numpy(), x)
  # a non-contiguous view works too, and the tensor does not alias it afterwards
  x = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
  np.testing.assert_equal(Tensor(x).numpy(), x)
  np.testing.assert_equal(Tensor(np.float32(2.5)).numpy(), np.float32(2.5))
  np.testing.assert_equal(Tensor(np.zeros((0, 3), np.int32)).numpy(), np.zeros((0, 3), np.int32))
  np.testing.assert_equal(Tensor(np.arange(4), dtype=dtypes.float32).numpy(), np.arange(4, dtype=np.float32))


def test_from_bytes():
  t = Tensor(b"\x01\x02\xff")
  assert t.dtype == dtypes.uint8
  assert t.tolist() == [1, 2, 255]
  raw = np.array([1.5, -2.0], dtype=np.float32).tobytes()
  assert Tensor(raw, dtype=dtypes.float32).tolist() == [1.5, -2.0]


def test_ragged_and_bad_inputs():
  with pytest.raises(ValueError):
    Tensor([[1, 2], [3]])
  with pytest.raises(TypeError):
    Tensor("hello")
  with pytest.raises(TypeError):
    Tensor([1.0], dtype="not_a_dtype")
  with pytest.raises(TypeError):
    Tensor({1: 2})


def test_creation_functions():
  np.testing.assert_equal(Tensor.zeros(2, 3).numpy(), np.zeros((2, 3), np.float32))
  np.testing.assert_equal(Tensor.ones((2, 3), dtype=dtypes.int32).numpy(), np.ones((2, 3), np.int32))
  np.testing.assert_equal(Tensor.full((2, 2), 7).numpy(), np.full((2, 2), 7))
  assert Tensor.full((2,), 7).dtype == dtypes.int32 and Tensor.full((2,), 7.0).dtype == dtypes.float32
  assert Tensor.empty(4, 5).shape == (4, 5)
  assert Tensor.zeros(0, 3).numpy().shape == (0, 3)
  ref = Tensor([[1.0, 2.0], [3.0, 4.0]])
  np.testing.assert_equal(ref.zeros_like().numpy(), np.zeros((2, 2), np.float32))
  np.testing.assert_equal(ref.ones_like(dtype=dtypes.int32).numpy(), np.ones((2, 2), np.int32))
  np.testing.assert_equal(ref.full_like(3.5).numpy(), np.full((2, 2), 3.5, np.float32))
  assert Tensor([1, 2]).full_like(1).dtype == dtypes.int32
  with pytest.raises(ValueError):
    Tensor.zeros(-1, 2)
  with pytest.raises(TypeError):
    Tensor.zeros(2.5)


@pytest.mark.parametrize("args", [(5,), (2, 9), (2, 9, 3), (10, 0, -3), (-1.5, 2.5, 0.5), (0,), (5, 2), (3, 3)])
def test_arange(args):
  ref = np.arange(*args)
  out = Tensor.arange(*args)
  np.testing.assert_allclose(out.numpy(), ref, atol=1e-6)
  assert out.shape == ref.shape
  assert dtypes.is_float(out.dtype) == np.issubdtype(ref.dtype, np.floating)


def test_arange_long_and_dtypes():
  np.testing.assert_equal(Tensor.arange(3000).numpy(), np.arange(3000))
  np.testing.assert_equal(Tensor.arange(5, dtype=dtypes.uint8).numpy(), np.arange(5, dtype=np.uint8))
  with pytest.raises(ValueError):
    Tensor.arange(0, 5, 0)


@pytest.mark.parametrize("args", [(0, 1, 5), (-2.5, 4, 11), (3, 3, 1), (1, 10, 2), (5, 0, 4), (0, 1, 0)])
def test_linspace(args):
  np.testing.assert_allclose(Tensor.linspace(*args).numpy(), torch.linspace(*args).numpy(), atol=1e-6)


@pytest.mark.parametrize("n,m", [(1, None), (3, None), (3, 5), (5, 2), (0, 3), (4, 4)])
def test_eye(n, m):
  ref = np.eye(n, m)
  np.testing.assert_equal(Tensor.eye(n, m).numpy(), ref)
  with pytest.raises(ValueError):
    Tensor.eye(-1)


# ***** data out *****

def test_numpy_tolist_item_data():
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  t = Tensor(x)
  np.testing.assert_equal(t.numpy(), x)
  assert t.tolist() == x.tolist()
  assert Tensor(3.5).item() == 3.5 and isinstance(Tensor(3.5).item(), float)
  assert Tensor([7]).item() == 7 and isinstance(Tensor([7]).item(), int)
  assert Tensor([True]).item() is True
  with pytest.raises(ValueError):
    Tensor([1, 2]).item()
  mv = t.data()
  assert mv.shape == (2, 3) and mv.format == "f"
  assert mv.tolist() == x.tolist()
  assert Tensor([1.0], dtype=dtypes.bfloat16).numpy().dtype == np.float32
  np.testing.assert_equal(t.T.numpy(), x.T)
  np.testing.assert_equal(t[:, 1].numpy(), x[:, 1])


def test_bool_len_iter():
  t = Tensor([1.0, 2.0, 3.0])
  with pytest.raises(TypeError):
    bool(t)
  with pytest.raises(TypeError):
    if t > 1:
      pass
  assert len(t) == 3
  assert [x.item() for x in t] == [1.0, 2.0, 3.0]
  with pytest.raises(TypeError):
    len(Tensor(1.0))


def test_properties():
  t = Tensor.ones(2, 3, 4, dtype=dtypes.float16)
  assert t.ndim == 3 and t.numel() == 24 and t.element_size() == 2 and t.nbytes() == 48
  assert t.size() == (2, 3, 4) and t.size(-1) == 4
  assert t.is_floating_point() and not Tensor([1]).is_floating_point()
  assert t.device == Device.DEFAULT
  assert "Tensor" in repr(t)
  assert hash(t) == id(t)


def test_to_device_and_grad_follow():
  t = Tensor([1.0, 2.0], requires_grad=True)
  (t * 3).sum().backward()
  for dev in Device.get_available_devices():
    moved = t.to(dev)
    assert moved.device == Device.canonicalize(dev)
    np.testing.assert_equal(moved.numpy(), [1.0, 2.0])
    assert moved.grad is not None and moved.grad.tolist() == [3.0, 3.0]
  assert t.to(t.device) is t


def test_realize_schedule_contiguous_detach():
  a = Tensor([1.0, 2.0]) + 1
  sched = a.schedule()
  assert len(sched) >= 1
  b = Tensor([1.0, 2.0]) * 2
  assert b.realize() is b and b.lazydata.base.realized is not None
  assert b.tolist() == [2.0, 4.0]
  c = Tensor.ones(3, 4).T.contiguous().realize()
  assert c.lazydata.base.realized is not None and c.lazydata.st.contiguous
  d = Tensor([1.0], requires_grad=True)
  e = (d * 2).detach()
  assert e.requires_grad is False and e._ctx is None
  assert e.tolist() == [2.0]


def test_assign_and_replace():
  t = Tensor([1.0, 2.0, 3.0]).realize()
  buf = t.lazydata.base.realized
  t.assign(Tensor([4.0, 5.0, 6.0])).realize()
  assert t.tolist() == [4.0, 5.0, 6.0]
  assert t.lazydata.base.realized is buf, "assign to a realized tensor writes its buffer in place"
  t += 1
  t.realize()
  assert t.tolist() == [5.0, 6.0, 7.0]
  t.assign([0.0, 0.0, 1.0])
  assert t.tolist() == [0.0, 0.0, 1.0]
  with pytest.raises(ValueError):
    t.assign(Tensor([1.0, 2.0]))
  with pytest.raises(TypeError):
    t.assign(Tensor([1, 2, 3]))
  r = Tensor([1.0, 2.0, 3.0])
  r.replace(Tensor([9.0, 8.0, 7.0]))
  assert r.tolist() == [9.0, 8.0, 7.0]
  with pytest.raises(ValueError):
    r.replace(Tensor([1.0]))


def test_setitem_realized_buffer_and_sequence():
  t = Tensor.zeros(3, 3).contiguous().realize()
  for i in range(3):
    t[i, i] = float(i + 1)
  np.testing.assert_equal(t.numpy(), np.diag([1.0, 2.0, 3.0]).astype(np.float32))
  u = Tensor.zeros(4)
  u[1:3] = Tensor([5.0, 6.0])
  assert u.tolist() == [0.0, 5.0, 6.0, 0.0]


# ***** autograd *****

def test_backward_and_accumulation():
  x = Tensor([[1.0, -2.0], [3.0, 4.0]], requires_grad=True)
  y = (x * x).sum()
  y.backward()
  np.testing.assert_equal(x.grad.numpy(), 2 * x.numpy())
  (x * 3).sum().backward()
  np.testing.assert_equal(x.grad.numpy(), 2 * x.numpy() + 3, err_msg="gradients accumulate across backward calls")


def test_backward_shared_subexpression_and_explicit_gradient():
  xt = torch.tensor([0.5, 1.5, -1.0], requires_grad=True)
  x = Tensor([0.5, 1.5, -1.0], requires_grad=True)
  a, at = x.exp(), xt.exp()
  ((a * a + a.sin()) * x).sum().backward()
  ((at * at + at.sin()) * xt).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5)
  v = Tensor([1.0, 2.0], requires_grad=True)
  (v * v).backward(Tensor([1.0, 10.0]))
  assert v.grad.tolist() == [2.0, 40.0]


def test_backward_errors():
  with pytest.raises(ValueError):
    Tensor([1.0, 2.0], requires_grad=True).mul(2).backward()
  with pytest.raises(RuntimeError):
    Tensor(1.0).backward()


def test_requires_grad_semantics():
  a = Tensor([1.0])
  assert a.requires_grad is None
  b = Tensor([1.0], requires_grad=True)
  c = Tensor([1.0], requires_grad=False)
  assert (a + b).requires_grad is True
  assert (a + c).requires_grad is None
  assert (c * 2).requires_grad is False
  assert (b < 2).requires_grad is False, "comparisons have no gradient"
  d = Tensor([2.0], requires_grad=True)
  (d * 2 + (d > 1).where(d, 0)).sum().backward()
  assert d.grad.tolist() == [3.0]
  e = Tensor([2.0], requires_grad=True)
  with pytest.raises(RuntimeError):
    e.bitcast(dtypes.int32)


def test_no_grad_and_inference_mode():
  x = Tensor([1.0], requires_grad=True)
  Tensor.no_grad = True
  try:
    assert (x * 2)._ctx is None
  finally:
    Tensor.no_grad = False
  with Tensor.inference_mode():
    assert Tensor.no_grad and (x * 2)._ctx is None
  assert not Tensor.no_grad and (x * 2)._ctx is not None

  @Tensor.inference_mode()
  def f(t):
    return t * 2
  assert f(x)._ctx is None


def test_train_context():
  assert Tensor.training is False
  with Tensor.train():
    assert Tensor.training is True
    with Tensor.train(False):
      assert Tensor.training is False
    assert Tensor.training is True
  assert Tensor.training is False


def test_deep_graph_backward():
  x = Tensor([1.0], requires_grad=True)
  y = x
  for _ in range(3000):
    y = y * 1.0001
  y.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [1.0001 ** 3000], rtol=1e-3)


# ***** errors and misc API *****

def test_axis_errors():
  t = Tensor.ones(2, 3)
  with pytest.raises(IndexError):
    t.sum(axis=2)
  with pytest.raises(IndexError):
    t.transpose(0, 5)
  with pytest.raises(IndexError):
    t.unsqueeze(4)
  with pytest.raises(TypeError):
    t.sum(axis=1.5)
  with pytest.raises(ValueError):
    t.permute(1, 0, 2)
  with pytest.raises(ValueError):
    t.flip(0, 0)
  with pytest.raises(ValueError):
    t.expand(4, 3)
  with pytest.raises(ValueError):
    t.pad(((1, 1),))
  assert t.sum(axis=-1).shape == (2,)
  assert Tensor(3.0).sum(0).shape == ()


def test_dtype_errors():
  with pytest.raises(TypeError):
    Tensor([1.5]) ^ Tensor([2.5])
  with pytest.raises(TypeError):
    Tensor([1.5]) << 2
  with pytest.raises(TypeError):
    Tensor([1.5]).one_hot(3)
  with pytest.raises(TypeError):
    Tensor.rand(3, dtype=dtypes.int32)
  with pytest.raises(TypeError):
    Tensor([1, 2]).cast("float77")
  with pytest.raises(TypeError):
    Tensor([True]) - Tensor([False])


def test_device_method_shortcuts():
  for dev in Device.get_available_devices():
    t = getattr(Tensor([1.0]), dev.lower())()
    assert t.device == dev
  with pytest.raises(AttributeError):
    Tensor([1.0]).not_a_device_or_method()


def test_metadata_recorded_on_lazybuffers():
  x = Tensor.ones(4, 4).contiguous().realize()
  y = x.relu()
  assert isinstance(y.lazydata.metadata, Metadata) and y.lazydata.metadata.name == "relu"


def test_global_counters_count_kernels():
  GlobalCounters.reset()
  (Tensor.ones(8, 8).contiguous() + 1).realize()
  assert GlobalCounters.kernel_count >= 1


def test_multi_and_single_device_tensors_do_not_mix():
  from tiny.multi import MultiDeviceError
  a = Tensor([1.0, 2.0]).shard(("CLANG:0", "CLANG:1"), axis=0)
  with pytest.raises(MultiDeviceError, match="shard or copy it first"):
    (a + Tensor([1.0, 2.0], device="CLANG:0")).realize()


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=120)


def test_default_float_env():
  r = _run("from tiny.tensor import Tensor; from tiny.dtype import dtypes; t = Tensor([1.5]); "
           "assert t.dtype == dtypes.half, t.dtype; assert Tensor.rand(3).dtype == dtypes.half; print(t.numpy().dtype)", DEFAULT_FLOAT="HALF")
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "float16"
  bad = _run("import tiny.tensor", DEFAULT_FLOAT="NOPE")
  assert bad.returncode != 0 and "DEFAULT_FLOAT" in bad.stderr
