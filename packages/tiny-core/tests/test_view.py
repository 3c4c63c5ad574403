"""View: canonical creation, each movement op, reshape with masks, merging two views. Checked by hand and against numpy."""
import numpy as np
import pytest

from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.view import View, strides_for_shape
from tiny.testing.strategies import shapetracker_indices


def _read(v: View, buf: np.ndarray) -> np.ndarray:
  """What a view reads from buf, -1 where invalid."""
  idx, valid = shapetracker_indices(ShapeTracker((v,)))
  return np.where(valid, buf[np.clip(idx, 0, len(buf) - 1)], -1)


def test_strides_for_shape():
  assert strides_for_shape((2, 3, 4)) == (12, 4, 1)
  assert strides_for_shape((2, 1, 4)) == (4, 0, 1)
  assert strides_for_shape(()) == ()


def test_create_is_canonical_and_cached():
  v = View.create((2, 1, 3), (3, 7, 1))
  assert v.strides == (3, 0, 1) and v.contiguous
  assert View.create((2, 3)) is View.create((2, 3))
  z = View.create((2, 0, 3), (1, 2, 3), 5, ((0, 1), (0, 0), (0, 3)))
  assert z.strides == (0, 0, 0) and z.offset == 0 and z.mask is None and z.contiguous
  assert View.create((2, 3), mask=((0, 2), (0, 3))).mask is None
  single = View.create((4, 5), (5, 1), 0, ((2, 3), (0, 5)))
  assert single.strides == (0, 1) and single.offset == 10 and not single.contiguous
  empty = View.create((4, 5), (5, 1), 3, ((2, 3), (1, 1)))
  assert empty.mask == ((0, 0), (0, 0)) and empty.strides == (0, 0) and empty.offset == 0


def test_movement_ops_match_numpy():
  buf = np.arange(24)
  base = View.create((4, 6))
  a = buf.reshape(4, 6)
  assert np.array_equal(_read(base.permute((1, 0)), buf), a.T)
  assert np.array_equal(_read(base.shrink(((1, 3), (2, 5))), buf), a[1:3, 2:5])
  assert np.array_equal(_read(base.stride((-1, 2)), buf), a[::-1, ::2])
  assert np.array_equal(_read(base.stride((3, -4)), buf), a[::3, ::-4])
  assert np.array_equal(_read(base.pad(((1, 0), (2, 1))), buf), np.pad(a, ((1, 0), (2, 1)), constant_values=-1))
  col = View.create((4, 1)).expand((4, 5))
  assert col.strides == (1, 0) and np.array_equal(_read(col, buf), np.broadcast_to(buf[:4, None], (4, 5)))


def test_pad_then_shrink_back_removes_the_mask():
  v = View.create((4, 6)).pad(((1, 1), (2, 0)))
  assert v.mask == ((1, 5), (2, 8)) and v.offset == -6 - 2
  back = v.shrink(((1, 5), (2, 8)))
  assert back == View.create((4, 6))


def test_reshape_split_merge_and_ones():
  v = View.create((4, 6)).permute((1, 0))  # strides (1, 6)
  assert v.reshape((3, 2, 4)) == View.create((3, 2, 4), (2, 1, 6))
  assert v.reshape((6, 1, 4, 1)).strides == (1, 0, 6, 0)
  assert v.reshape((24,)) is None  # a transpose can't be flattened
  assert v.reshape((4, 6)) is None
  assert View.create((2, 3, 4)).shrink(((0, 2), (0, 3), (1, 3))).reshape((6, 2)) == View.create((6, 2), (4, 1), 1)


def test_reshape_keeps_masks_when_they_stay_boxes():
  buf = np.arange(12)
  padded = View.create((3, 4)).pad(((1, 1), (0, 0)))  # (5, 4), rows 1..3 valid
  r = padded.reshape((5, 2, 2))
  assert r is not None and r.mask == ((1, 4), (0, 2), (0, 2))
  assert np.array_equal(_read(r, buf), np.pad(buf.reshape(3, 4), ((1, 1), (0, 0)), constant_values=-1).reshape(5, 2, 2))
  merged = padded.reshape((20,))
  assert merged is not None and merged.mask == ((4, 16),)
  assert np.array_equal(_read(merged, buf), np.pad(buf.reshape(3, 4), ((1, 1), (0, 0)), constant_values=-1).reshape(20))
  # a mask on the inner dim of a merge is not an interval
  assert View.create((3, 4)).pad(((0, 0), (1, 1))).reshape((18,)) is None


def test_reshape_errors():
  v = View.create((4, 6))
  with pytest.raises(ValueError):
    v.reshape((5, 5))
  with pytest.raises(ValueError):
    v.reshape((-4, -6))
  with pytest.raises(ValueError):
    View.create((0, 3)).reshape((3,))


def test_other_errors():
  v = View.create((4, 6))
  with pytest.raises(ValueError):
    v.permute((0, 0))
  with pytest.raises(ValueError):
    v.permute((0,))
  with pytest.raises(ValueError):
    v.expand((8, 6))
  with pytest.raises(ValueError):
    v.expand((4, 6, 1))
  with pytest.raises(ValueError):
    v.shrink(((0, 5), (0, 6)))
  with pytest.raises(ValueError):
    v.shrink(((3, 2), (0, 6)))
  with pytest.raises(ValueError):
    v.pad(((0, -1), (0, 0)))
  with pytest.raises(ValueError):
    v.pad(((0, 1),))
  with pytest.raises(ValueError):
    v.stride((0, 1))
  with pytest.raises(ValueError):
    v.stride((1,))
  with pytest.raises(ValueError):
    View.create((2, -1))


def test_add_merges_views():
  buf = np.arange(24)
  v2 = View.create((4, 6)).permute((1, 0))
  v1 = View.create((6, 4)).shrink(((1, 5), (0, 4))).stride((1, -1))
  merged = v2 + v1
  assert merged is not None
  want = buf.reshape(4, 6).T[1:5, ::-1]
  assert np.array_equal(_read(merged, buf), want)
  assert View.create((4, 6)) + v1 is v1
  # a flattened transpose can't be one view
  assert (v2 + View.create((24,))) is None


def test_add_projects_masks():
  buf = np.arange(12)
  padded = View.create((3, 4)).pad(((1, 1), (1, 1)))  # (5, 6)
  inner = View.create((5, 6)).shrink(((1, 4), (1, 5)))  # exactly the valid part
  merged = padded + inner
  assert merged is not None and merged.mask is None and np.array_equal(_read(merged, buf), buf.reshape(3, 4))
  partly = View.create((5, 6)).shrink(((0, 3), (0, 6)))
  merged = padded + partly
  want = np.pad(buf.reshape(3, 4), ((1, 1), (1, 1)), constant_values=-1)[0:3]
  assert merged is not None and np.array_equal(_read(merged, buf), want)


def test_invert_and_minify():
  v = View.create((2, 3, 4)).permute((2, 0, 1))
  inv = v.invert((2, 3, 4))
  assert inv is not None and (v + inv) == View.create((2, 3, 4))
  assert View.create((2, 3, 4)).shrink(((0, 1), (0, 3), (0, 4))).invert((2, 3, 4)) is None
  assert View.create((2, 3, 4)).minify() == View.create((24,))
  m = View.create((2, 3, 4)).permute((1, 0, 2)).minify()
  assert m.shape == (3, 2, 4)
  assert View.create((2, 3, 4), (12, 4, 2)).minify().shape == (6, 4)


def test_size_and_vars():
  assert View.create((2, 3, 4)).size() == 24 and View.create(()).size() == 1
  assert View.create((2, 3)).vars() == set()


def test_reshape_with_only_a_symbolic_offset():
  # a permuted [v]th slab of a (10, 6, 4) buffer: shape and strides are ints, only the offset is symbolic
  from tiny.shape.symbolic import Variable, sym_infer
  v = Variable("v", 0, 9)
  slab = View.create((4, 6), (1, 4), v * 24)
  r = slab.reshape((2, 2, 6))
  assert r is not None and r.shape == (2, 2, 6)
  buf = np.arange(240)
  for val in (0, 3, 9):
    def at(x: View) -> View:
      return View.create(x.shape, x.strides, sym_infer(x.offset, {v: val}), x.mask)
    assert np.array_equal(_read(at(r), buf), _read(at(slab), buf).reshape(2, 2, 6))
    assert np.array_equal(_read(at(slab), buf), buf.reshape(10, 6, 4)[val].T)


def test_reshape_keeps_symbolic_dims_and_regroups_the_int_dims():
  # a KV cache (2, 16, 12) shrunk to a Variable length n, then (n, 12) -> (n, 3, 4): one view, the int dim split
  from tiny.shape.symbolic import Variable, sym_infer
  n = Variable("n", 1, 16)
  kv = View.create((1, n, 12), (0, 12, 1), 192)
  r = kv.reshape((n, 3, 4))
  assert r is not None and r.strides == (12, 4, 1) and r.offset == 192
  # a symbolic stride on an int run: (3, 4, n) with strides (n, 0, 1) only splits the 4 (an upcast does that)
  bcast = View.create((3, 4, n), (n, 0, 1))
  split = bcast.reshape((3, 2, 2, n))
  assert split is not None and split.strides == (n, 0, 0, 1)
  # a merge across a symbolic stride is not one view
  assert bcast.reshape((12, n)) is None
  buf = np.arange(400)
  for val in (1, 5, 16):
    def at(x: View) -> View:
      return View.create(tuple(sym_infer(s, {n: val}) for s in x.shape), tuple(sym_infer(s, {n: val}) for s in x.strides),
                         sym_infer(x.offset, {n: val}), x.mask)
    want = buf[192:192 + 16 * 12].reshape(16, 12)[:val].reshape(val, 3, 4)
    assert np.array_equal(_read(at(r), buf), want)
    assert np.array_equal(_read(at(split), buf), _read(at(bcast), buf).reshape(3, 2, 2, val))


def test_reshape_around_symbolic_dims_keeps_masks():
  # a masked int dim next to a symbolic one: the mask moves with its dim through the split
  from tiny.shape.symbolic import Variable
  n = Variable("n", 1, 8)
  # columns 2..5 of a row are not a box in (2, 3) coordinates: no single view
  assert View.create((n, 6), (6, 1), 0, ((0, n), (2, 6))).reshape((n, 2, 3)) is None
  # columns 3..5 are the second half: one valid index of the outer dim, folded into the offset
  w = View.create((n, 6), (6, 1), 0, ((0, n), (3, 6)))
  rw = w.reshape((n, 2, 3))
  assert rw is not None and rw.mask == ((0, n), (1, 2), (0, 3)) and rw.strides == (6, 0, 1) and rw.offset == 3
