"""LazyBuffer: dedup cache, constant folding and identities, reduces (incl. split), casts, copies, views."""
import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.helpers import Context
from tiny.lazy import LazyBuffer
from tiny.ops import BinaryOps, MetaOps, ReduceOps, UnaryOps


def realized(arr, device="PYTHON"):
  """A realized LazyBuffer holding arr (what Tensor(numpy) gives after realize)."""
  lb = LazyBuffer.metaop(MetaOps.EMPTY, arr.shape, dtypes.from_np(arr.dtype), device)
  lb.buffer.allocate().copyin(memoryview(np.ascontiguousarray(arr).tobytes()))
  del lb.srcs
  return lb


def reduce_ops_in(lb):
  """Number of reduce bases reachable from lb (unrealized part of the graph)."""
  seen, todo, n = set(), [lb.base], 0
  while todo:
    b = todo.pop()
    if id(b) in seen or b.realized is not None:
      continue
    seen.add(id(b))
    n += b.op in ReduceOps
    todo.extend(x.base for x in b.srcs)
  return n


def test_identical_nodes_are_deduplicated():
  a, b = realized(np.ones((3, 4), np.float32)), realized(np.ones((3, 4), np.float32))
  assert a.e(BinaryOps.ADD, b) is a.e(BinaryOps.ADD, b)
  assert a.e(BinaryOps.ADD, b) is not b.e(BinaryOps.ADD, a)  # operand order matters
  assert a.reshape((4, 3)) is a.reshape((4, 3))
  # metaops are not cached: two EMPTYs are two buffers
  assert LazyBuffer.metaop(MetaOps.EMPTY, (2,), dtypes.float32, "PYTHON") is not LazyBuffer.metaop(MetaOps.EMPTY, (2,), dtypes.float32, "PYTHON")


def test_base_and_views():
  a = realized(np.arange(12, dtype=np.float32).reshape(3, 4))
  v = a.permute((1, 0))
  assert v.base is a and v is not a and v.shape == (4, 3)
  assert v.realized is None and v.is_realized() and a.realized is a.buffer and v.buffer is a.buffer
  # undoing the permute gives back the base itself
  assert v.permute((1, 0)) is a
  assert a.reshape((3, 4)) is a


def test_const_folding():
  a = realized(np.zeros((2, 3), np.float32))
  c = a.const(2.0).e(BinaryOps.MUL, a.const(3.5))
  assert c.is_unrealized_unmasked_const() and c.base.arg == 7.0 and c.shape == (2, 3)
  cmp = a.const(1.0).e(BinaryOps.CMPLT, a.const(2.0))
  assert cmp.dtype == dtypes.bool and cmp.base.arg is True
  i = a.cast(dtypes.int32).const(7).e(BinaryOps.IDIV, a.cast(dtypes.int32).const(-2))
  assert i.base.arg == -3  # C semantics: truncation toward zero


def test_identities():
  a = realized(np.arange(6, dtype=np.float32).reshape(2, 3))
  # float x + 0.0 stays an add (-0.0 + 0.0 is +0.0); x + -0.0 is x for every float, and int x + 0 is x
  assert a.e(BinaryOps.ADD, a.const(-0.0)) is a
  assert a.const(-0.0).e(BinaryOps.ADD, a) is a
  assert a.e(BinaryOps.ADD, a.const(0)).base.op is BinaryOps.ADD
  ai0 = realized(np.arange(6, dtype=np.int32).reshape(2, 3))
  assert ai0.e(BinaryOps.ADD, ai0.const(0)) is ai0 and ai0.const(0).e(BinaryOps.ADD, ai0) is ai0
  assert a.e(BinaryOps.MUL, a.const(1)) is a
  # float x*0 stays a multiply (inf*0 and NaN*0 are NaN, -2*0 is -0.0); int x*0 folds to the constant 0
  z = a.e(BinaryOps.MUL, a.const(0))
  assert z.base.op is BinaryOps.MUL and not z.is_unrealized_const()
  ai = realized(np.arange(6, dtype=np.int32).reshape(2, 3))
  zi = ai.e(BinaryOps.MUL, ai.const(0))
  assert zi.is_unrealized_const() and zi.base.arg == 0
  n = a.e(BinaryOps.MUL, a.const(-1))
  assert n.base.op is UnaryOps.NEG and n.base.srcs[0] is a
  assert n.e(UnaryOps.NEG) is a
  # a masked (padded) const is not an identity: padding makes it non-uniform
  p = a.const(0).pad(((1, 1), (0, 0)))
  assert not p.is_unrealized_unmasked_const()


def test_dtype_and_shape_checks():
  a, b = realized(np.zeros((2, 3), np.float32)), realized(np.zeros((2, 3), np.int32))
  with pytest.raises(TypeError):
    a.e(BinaryOps.ADD, b)
  with pytest.raises(ValueError):
    a.e(BinaryOps.ADD, a.reshape((3, 2)))


def test_reduce_shapes_and_const_folding():
  a = realized(np.ones((3, 4, 5), np.float32))
  r = a.r(ReduceOps.SUM, (1,))
  assert r.shape == (3, 1, 5) and r.base.op is ReduceOps.SUM and r.base.arg == (1,)
  assert a.r(ReduceOps.MAX, ()) is a
  # a float sum over no axis is x + 0.0: a sum starts at +0.0, so -0.0 comes out +0.0 as in numpy
  s0 = a.r(ReduceOps.SUM, ())
  assert s0.base.op is BinaryOps.ADD and s0.base.srcs[0] is a
  ai = realized(np.ones((3, 4), np.int32))
  assert ai.r(ReduceOps.SUM, ()) is ai
  c = a.const(2.0).r(ReduceOps.SUM, (1, 2))
  assert c.is_unrealized_const() and c.base.arg == 40.0 and c.shape == (3, 1, 1)
  m = a.const(-3.0).r(ReduceOps.MAX, (0,))
  assert m.base.arg == -3.0
  empty = realized(np.ones((0, 4), np.float32))
  s = empty.r(ReduceOps.SUM, (0,))
  assert s.is_unrealized_const() and s.base.arg == 0 and s.shape == (1, 4)


def test_large_reduce_is_split_in_two():
  a = realized(np.ones((1 << 16,), np.float32))
  out = a.r(ReduceOps.SUM, (0,))
  assert out.shape == (1,)
  assert reduce_ops_in(out) == 2
  with Context(SPLIT_REDUCEOP=0):
    assert reduce_ops_in(a.r(ReduceOps.MAX, (0,))) == 1
  # a small reduce is never split
  assert reduce_ops_in(realized(np.ones((64,), np.float32)).r(ReduceOps.SUM, (0,))) == 1


def test_cast_and_bitcast():
  a = realized(np.zeros((4,), np.float32))
  assert a.cast(dtypes.float32) is a
  c = a.cast(dtypes.int32)
  assert c.dtype == dtypes.int32 and c.base.op is UnaryOps.CAST
  b = a.cast(dtypes.int32, bitcast=True)
  assert b.base.op in (UnaryOps.BITCAST, MetaOps.VIEW)
  with pytest.raises(RuntimeError):
    a.cast(dtypes.float16, bitcast=True)  # size-changing bitcast is DISK only
  k = a.const(3.7).cast(dtypes.int32)
  assert k.is_unrealized_const() and k.base.arg == 3


def test_copy_to_device():
  a = realized(np.arange(8, dtype=np.float32))
  assert a.copy_to_device("PYTHON") is a
  c = a.copy_to_device("NPY")
  assert c.base.op is MetaOps.COPY and c.device == "NPY" and c.base.srcs[0] is a
  # copying back the unrealized copy goes straight from the source
  back = c.copy_to_device("PYTHON", force=False)
  assert back is a
  # constants are never copied
  k = a.const(5.0).copy_to_device("NPY")
  assert k.is_unrealized_const() and k.device == "NPY"
  # a shrink copies only what it uses
  s = a.shrink(((2, 5),)).copy_to_device("NPY")
  assert s.base.op is MetaOps.COPY and s.base.srcs[0].shape == (3,)


def test_contiguous():
  a = realized(np.zeros((2, 3), np.float32))
  x = a.e(UnaryOps.NEG)
  assert x.contiguous() is x and x.forced_realize
  t = a.permute((1, 0)).contiguous()
  assert t.base.op is MetaOps.CONTIGUOUS and t.shape == (3, 2)


def test_assign_requires_realized_target_and_same_size():
  a = realized(np.zeros((4,), np.float32))
  x = a.e(UnaryOps.NEG)
  asg = a.assign(x)
  assert asg.base.op is MetaOps.ASSIGN and asg.buffer is a.buffer
  with pytest.raises(RuntimeError):
    x.assign(a)  # x is not realized
  with pytest.raises(ValueError):
    a.assign(realized(np.zeros((5,), np.float32)))


def test_zero_size_is_const():
  a = realized(np.zeros((4,), np.float32))
  z = a.shrink(((2, 2),))
  assert z.shape == (0,) and z.is_unrealized_const()


def test_buffer_refcount_follows_lazybuffers():
  a = realized(np.zeros((4,), np.float32))
  x = a.e(UnaryOps.NEG)
  buf = x.buffer
  assert buf.lb_refcount == 1
  v = x.reshape((2, 2))
  assert buf.lb_refcount == 1  # views do not own the buffer
  del x, v
  assert buf.lb_refcount == 0
