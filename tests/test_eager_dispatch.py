"""Eager dispatch: the cheap paths of `Tensor <op> python scalar` and of realizing one small op give the same graphs and the
same numbers as the general paths."""
import pickle

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.lazy import LazyBuffer, lazycache
from tiny.ops import BinaryOps
from tiny.shape.shapetracker import ShapeTracker
from tiny.tensor import Tensor


def test_scalar_ops_match_numpy() -> None:
  a = np.random.default_rng(0).random(16).astype(np.float32)
  x = Tensor(a).realize()
  y = x
  want = a.copy()
  for i in range(5):
    y = (y * 1.0001 + 0.0001 * i).realize()
    want = want * np.float32(1.0001) + np.float32(0.0001 * i)
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
  np.testing.assert_array_equal((x * 2 - 3).numpy(), a * 2 - 3)
  np.testing.assert_array_equal((2 * x + 0.5).numpy(), 2 * a + 0.5)


def test_int_scalar_ops_wrap_like_c() -> None:
  x = Tensor(np.array([1, 2, 3], dtype=np.int8)).realize()
  np.testing.assert_array_equal((x * 100).numpy(), (np.array([1, 2, 3], dtype=np.int8) * np.int8(100)))
  np.testing.assert_array_equal((x + 300).numpy(), np.array([1, 2, 3], dtype=np.int8) + np.int8(44))


def test_fresh_const_op_skips_the_lazy_cache_but_shared_consts_dedup() -> None:
  x = Tensor.rand(8).realize().lazydata
  # a constant that two ops read: the second op is the first one (lazy cache)
  c = x.const(2.0)
  assert x.e(BinaryOps.MUL, c) is x.e(BinaryOps.MUL, c)
  # a constant made for one op only: nothing to find, so nothing is put in the cache
  before = len(lazycache)
  f = x.fresh_const(2.0)
  y = x.e(BinaryOps.MUL, f)
  assert len(lazycache) == before and y.srcs[1] is f and f.base.arg == 2.0
  # the same graph as the general path builds
  assert f.st == c.st and f.dtype == c.dtype and f.base.op is c.base.op


def test_fresh_const_of_scalar_and_empty_shapes() -> None:
  s = Tensor(3.0).realize()
  np.testing.assert_array_equal((s * 2).numpy(), np.float32(6.0))
  e = Tensor.empty(0, 4)
  assert (e * 2).shape == (0, 4) and (e * 2).numpy().shape == (0, 4)


def test_cached_hashes_do_not_travel_in_pickles() -> None:
  dt = dtypes.float32
  hash(dt)
  assert "_hash" not in pickle.loads(pickle.dumps(dt)).__dict__ and pickle.loads(pickle.dumps(dt)) == dt
  st = ShapeTracker.from_shape((4, 5)).permute((1, 0))
  assert st.shape == (5, 4) and st.size == 20
  st2 = pickle.loads(pickle.dumps(st))
  assert st2 == st and not {"_hash", "shape", "size"} & set(st2.__dict__) and st2.shape == (5, 4)


def test_lazybuffer_class_defaults_are_per_instance_when_set() -> None:
  x = Tensor.rand(4).realize().lazydata
  a, b = x.e(BinaryOps.ADD, x), x.e(BinaryOps.MUL, x)
  a.forced_realize = True
  assert not b.forced_realize and not LazyBuffer.forced_realize
  assert a._readers is not b._readers


def test_eager_cache_tells_signed_zeros_and_nans_apart() -> None:
  from tiny.engine import schedule
  a = np.array([1.0, -2.0, 3.0, -4.0], dtype=np.float32)
  x = Tensor(a).realize()
  for _ in range(2):   # the second round runs from the eager caches
    np.testing.assert_array_equal(np.signbit((x * 0.0).realize().numpy()), np.signbit(a * np.float32(0.0)))
    np.testing.assert_array_equal(np.signbit((x * -0.0).realize().numpy()), np.signbit(a * np.float32(-0.0)))
  (x + float("nan")).realize()
  n = len(schedule._eager_asts)
  for _ in range(3):
    assert np.isnan((x + float("nan")).realize().numpy()).all()
  assert len(schedule._eager_asts) == n, "a NaN constant must find its cached kernel"


def test_eager_cache_tells_float_and_int_constants_apart() -> None:
  from tiny.engine.schedule import _arg_key
  assert _arg_key(2.0) != _arg_key(2) and _arg_key(1.0) != _arg_key(True) and _arg_key(0.0) != _arg_key(-0.0)
  assert _arg_key(2.5) == _arg_key(2.5) and _arg_key(float("nan")) == _arg_key(float("nan"))


def test_eager_realize_counts_kernels_and_reuses_buffers() -> None:
  from tiny.helpers import GlobalCounters
  x = Tensor.rand(16).realize()
  y = x
  for _ in range(3):
    y = (y * 1.5 + 0.25).realize()
  want = y.numpy() * np.float32(1.5) + np.float32(0.25)
  k = GlobalCounters.kernel_count
  y = (y * 1.5 + 0.25).realize()
  assert GlobalCounters.kernel_count == k + 1
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)


def test_buffer_use_is_counted_while_lazybuffers_live() -> None:
  import gc
  from tiny.device import Buffer
  x = Tensor.rand(8).realize()
  buf = x.lazydata.base.buffer
  n = buf.lb_refcount
  v = x.lazydata.e(BinaryOps.ADD, x.lazydata)   # no Buffer until it is needed: not counted
  assert buf.lb_refcount == n
  y = x.contiguous().lazydata   # a base already realized: the same LazyBuffer, no new use
  assert buf.lb_refcount == n
  _ = v.buffer   # made on first use, counted on its own Buffer
  assert v.buffer.lb_refcount == 1
  other = Buffer(buf.device, 8, dtypes.float32)
  v.buffer = other   # a new Buffer: the old use ends, the new one starts
  assert other.lb_refcount == 1
  v.buffer = other   # the same one again: still one use
  assert other.lb_refcount == 1
  del v, y
  gc.collect()
  assert other.lb_refcount == 0


@pytest.mark.parametrize("device", ["PYTHON", "CLANG"])
def test_symbolic_launch_sizes_are_not_fixed_once(device: str) -> None:
  """A kernel may have a symbolic launch size and no Variable argument (PYTHON, GPU): its launch is worked out per call."""
  from tiny.shape.symbolic import Variable
  base = np.arange(30, dtype=np.float32).reshape(3, 10)
  for n in (3, 7):
    vi = Variable("i", 1, 10).bind(n)
    t = Tensor(base, device=device).shrink(((0, 3), (0, vi)))
    np.testing.assert_allclose(t.sum(0).sum().numpy(), base[:, :n].sum())
