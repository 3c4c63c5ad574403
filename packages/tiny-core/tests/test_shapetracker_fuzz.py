"""Property tests: ShapeTracker index/valid expressions against numpy applying the same movement chain."""
import numpy as np
from hypothesis import given

from tiny.helpers import prod
from tiny.shape.shapetracker import ShapeTracker
from tiny.testing.strategies import apply_to_numpy, apply_to_shapetracker, movement_chains, numpy_is_one_view, shapetracker_indices


def _reference(start, ops):
  buf = np.arange(prod(start), dtype=np.int64).reshape(start)
  return apply_to_numpy(buf, ops, pad_value=-1)


def _check_against_numpy(st, ref):
  assert st.shape == ref.shape
  idx, valid = shapetracker_indices(st)
  np.testing.assert_array_equal(valid, ref != -1)
  np.testing.assert_array_equal(np.where(valid, idx, -1), ref)


@given(movement_chains())
def test_expr_idxs_match_numpy(chain):
  start, ops = chain
  st = apply_to_shapetracker(ShapeTracker.from_shape(start), ops)
  _check_against_numpy(st, _reference(start, ops))


@given(movement_chains())
def test_simplify_keeps_expressions(chain):
  start, ops = chain
  st = apply_to_shapetracker(ShapeTracker.from_shape(start), ops)
  simple = st.simplify()
  assert len(simple.views) <= len(st.views)
  _check_against_numpy(simple, _reference(start, ops))


@given(movement_chains(allow_pad=False))
def test_numpy_views_are_one_view(chain):
  start, ops = chain
  st = apply_to_shapetracker(ShapeTracker.from_shape(start), ops)
  if numpy_is_one_view(start, ops):
    assert len(st.views) == 1, f"{ops} gave {st}"


@given(movement_chains())
def test_real_size_covers_every_valid_index(chain):
  start, ops = chain
  st = apply_to_shapetracker(ShapeTracker.from_shape(start), ops)
  ref = _reference(start, ops)
  need = int(ref.max()) + 1 if (ref != -1).any() else 0
  assert st.real_size() >= need
  if len(st.views) == 1:
    assert st.real_size() == need


@given(movement_chains())
def test_real_strides_step_the_index(chain):
  start, ops = chain
  st = apply_to_shapetracker(ShapeTracker.from_shape(start), ops)
  ref = _reference(start, ops)
  for axis, stride in enumerate(st.real_strides()):
    if stride is None or ref.shape[axis] < 2:
      continue
    a, b = np.take(ref, range(0, ref.shape[axis] - 1), axis), np.take(ref, range(1, ref.shape[axis]), axis)
    # a real stride is only reported for an unmasked axis: every step along it moves the index by the stride
    both = (a != -1) & (b != -1)
    assert np.array_equal(both, (a != -1)) and np.array_equal((b - a)[both], np.full(both.sum(), stride))
