"""ShapeTracker: properties, real strides, composition, inversion and symbolic shapes."""
import numpy as np
import pytest

from tiny.helpers import prod
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import NumNode, Variable, sym_infer
from tiny.shape.view import View
from tiny.testing.strategies import eval_node_numpy, shapetracker_indices


def _read(st, buf):
  idx, valid = shapetracker_indices(st)
  return np.where(valid, buf[np.clip(idx, 0, max(len(buf) - 1, 0))], -1)


def test_from_shape_properties():
  st = ShapeTracker.from_shape((2, 3, 4))
  assert st.shape == (2, 3, 4) and st.size == 24 and st.real_size() == 24 and st.contiguous and st.consecutive
  assert st.real_strides() == (12, 4, 1) and st.unit_stride_axes() == [2]
  assert ShapeTracker.from_shape((2, 0)).real_size() == 0
  offset = ShapeTracker.from_shape((4, 4)).shrink(((1, 3), (0, 4)))
  # consecutive: one unmasked row-major view, the offset allowed
  assert not offset.contiguous and offset.consecutive and offset.real_size() == 12
  assert not ShapeTracker.from_shape((4, 4)).permute((1, 0)).consecutive


def test_real_size_of_padded_and_expanded():
  assert ShapeTracker.from_shape((3, 4)).pad(((1, 1), (1, 1))).real_size() == 12
  assert ShapeTracker.from_shape((1, 4)).expand((5, 4)).real_size() == 4
  assert ShapeTracker.from_shape((4, 4)).shrink(((0, 2), (1, 3))).real_size() == 7


def test_real_strides_with_masks_and_views():
  st = ShapeTracker.from_shape((3, 4)).pad(((0, 0), (1, 1)))
  assert st.real_strides() == (4, None) and st.real_strides(ignore_valid=True) == (4, 1)
  assert not st.axis_is_masked(0) and st.axis_is_masked(1)
  e = ShapeTracker.from_shape((3, 1)).expand((3, 5)).permute((1, 0))
  assert e.real_strides() == (0, 1) and e.unit_stride_axes() == [1]
  two = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((24,))
  assert len(two.views) == 2 and two.real_strides() == (None,)


def test_expr_idxs_matches_numpy_by_hand_chain():
  buf = np.arange(24)
  st = ShapeTracker.from_shape((2, 3, 4)).permute((2, 0, 1)).reshape((4, 6)).pad(((0, 1), (1, 0))).stride((1, -1))
  want = np.pad(buf.reshape(2, 3, 4).transpose(2, 0, 1).reshape(4, 6), ((0, 1), (1, 0)), constant_values=-1)[:, ::-1]
  assert np.array_equal(_read(st, buf), want)
  assert np.array_equal(_read(st.simplify(), buf), want)


def test_expr_idxs_with_given_indices_and_expr_node():
  st = ShapeTracker.from_shape((3, 4)).permute((1, 0))
  a, b = Variable("a", 0, 3), Variable("b", 0, 2)
  idx, valid = st.expr_idxs([a, b])
  assert idx == a + b * 4 and valid == 1
  fidx, fvalid = st.expr_node("i")
  vals = eval_node_numpy(fidx, {"i": np.arange(12)})
  assert np.array_equal(vals, np.arange(12).reshape(3, 4).T.reshape(-1)) and fvalid == 1
  with pytest.raises(ValueError):
    st.expr_idxs([a])


def test_composition_and_simplify():
  buf = np.arange(24)
  first = ShapeTracker.from_shape((4, 6)).permute((1, 0))
  second = ShapeTracker.from_shape((6, 4)).shrink(((1, 5), (0, 4))).reshape((2, 2, 4))
  both = first + second
  assert len(both.views) == 1
  assert np.array_equal(_read(both, buf), buf.reshape(4, 6).T[1:5].reshape(2, 2, 4))
  stacked = ShapeTracker(first.views + second.views)
  assert stacked.simplify() == both


def test_reshape_that_needs_two_views():
  buf = np.arange(12)
  st = ShapeTracker.from_shape((3, 4)).permute((1, 0)).reshape((12,))
  assert len(st.views) == 2 and st.views[-1].contiguous
  assert np.array_equal(_read(st, buf), buf.reshape(3, 4).T.reshape(12))
  assert st.simplify() == st


def test_invert():
  st = ShapeTracker.from_shape((2, 3, 4)).permute((2, 0, 1)).stride((1, -1, 1))
  inv = st.invert((2, 3, 4))
  assert inv is not None and inv.shape == (2, 3, 4)
  assert np.array_equal(_read(st + inv, np.arange(24)), np.arange(24).reshape(2, 3, 4))
  assert ShapeTracker.from_shape((3, 1)).expand((3, 4)).invert((3, 1)) is None


def test_errors_reach_the_user():
  st = ShapeTracker.from_shape((2, 3))
  for bad in (lambda: st.reshape((5,)), lambda: st.permute((1, 1)), lambda: st.pad(((0, 1),)), lambda: st.shrink(((0, 3), (0, 3))),
              lambda: st.expand((2, 3, 4)), lambda: st.stride((0, 1)), lambda: st.reshape((-2, -3))):
    with pytest.raises(ValueError):
      bad()


def test_symbolic_shapes():
  i = Variable("i", 1, 10)
  ib = i.bind(3)
  st = ShapeTracker.from_shape((ib, 4))
  assert st.shape == (ib, 4) and st.vars() == {ib} and st.var_vals == {i: 3}
  unbound, var_vals = st.unbind()
  assert unbound.shape == (i, 4) and var_vals == {i: 3}
  assert st.size == 40 and sym_infer(prod(st.shape), st.var_vals) == 12
  # contiguous int tracker to a symbolic shape and back
  st2 = ShapeTracker.from_shape((3, 4)).reshape((ib, 4))
  assert st2.shape == (ib, 4) and len(st2.views) == 1
  assert st2.reshape((ib * 4,)).shape == (ib * 4,)
  idx, valid = ShapeTracker.from_shape((i, 4)).permute((1, 0)).expr_idxs()
  vals = {"idx0": np.arange(4)[:, None], "idx1": np.arange(3)[None, :], "i": np.int64(3)}
  assert np.array_equal(eval_node_numpy(idx, vals), np.arange(12).reshape(3, 4).T) and valid == 1
  strides = ShapeTracker.from_shape((i, 4, i)).views[0].strides
  assert strides[1] == i and strides[0] == i * 4


def test_symbolic_reshape_of_non_contiguous_int_view():
  ib = Variable("i", 1, 10).bind(3)
  st = ShapeTracker.from_shape((4, 3)).permute((1, 0))
  assert st.reshape((ib, 4)).views[-1].strides == (1, 3)
  with pytest.raises(ValueError):
    st.reshape((ib * 4,))


def test_symbolic_two_views():
  i = Variable("i", 1, 10)
  st = ShapeTracker.from_shape((i, 4)).permute((1, 0)).reshape((i * 4,))
  assert len(st.views) == 2
  idx, valid = st.expr_idxs()
  for iv in (1, 3, 7):
    vals = {"idx0": np.arange(iv * 4), "i": np.int64(iv)}
    assert np.array_equal(eval_node_numpy(idx, vals), np.arange(iv * 4).reshape(iv, 4).T.reshape(-1)), iv
  assert valid == 1


def test_symbolic_pad_and_shrink():
  i = Variable("i", 1, 10)
  st = ShapeTracker.from_shape((i, 4)).pad(((1, 1), (0, 0)))
  assert st.shape[0] == i + 2
  idx, valid = st.expr_idxs()
  for iv in (1, 3):
    for p in range(iv + 2):
      assert sym_infer(valid, {Variable("idx0", 0, i + 1): p, Variable("idx1", 0, 3): 2, i: iv}) == int(1 <= p <= iv)
  shr = ShapeTracker.from_shape((i, 4)).shrink(((0, i), (1, 3)))
  assert shr.shape == (i, 2)


def test_views_are_views():
  st = ShapeTracker.from_shape((2, 2))
  assert isinstance(st.views[0], View) and NumNode(2) == st.shape[0]
