"""Property tests: ShapeTracker index/valid expressions against numpy applying the same movement chain."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tiny.helpers import prod
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import Variable, sym_infer
from tiny.testing.strategies import (apply_to_numpy, apply_to_shapetracker, eval_node_numpy, movement_chains, numpy_is_one_view, shapes,
                                     shapetracker_indices)


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


@st.composite
def symbolic_chains(draw):
  """A start shape whose first dim becomes symbolic, and a chain of ops that only need the shape's rank."""
  start = draw(shapes(min_dims=1, max_dims=3, max_size=64))
  ops = []
  for _ in range(draw(st.integers(1, 5))):
    kind = draw(st.sampled_from(["permute", "pad", "flip"]))
    nd = len(start)
    if kind == "permute":
      ops.append(("permute", tuple(draw(st.permutations(range(nd))))))
    elif kind == "pad":
      ops.append(("pad", tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(nd))))
    else:
      ops.append(("flip", tuple(i for i in range(nd) if draw(st.booleans()))))
  return start, ops


@given(symbolic_chains(), st.integers(1, 6))
def test_symbolic_shape_chains_match_numpy_at_any_value(chain, value):
  start, ops = chain
  n = Variable("n", 1, 6)
  st_sym = apply_to_shapetracker(ShapeTracker.from_shape((n,) + start[1:]), ops)
  concrete = (value,) + start[1:]
  ref = apply_to_numpy(np.arange(prod(concrete), dtype=np.int64).reshape(concrete), ops)
  shape = tuple(sym_infer(s, {n: value}) for s in st_sym.shape)
  assert shape == ref.shape
  idx, valid = st_sym.expr_idxs()
  grids = np.indices(shape, dtype=np.int64)
  values = {f"idx{i}": grids[i] for i in range(len(shape))} | {"n": np.int64(value)}
  iv = np.broadcast_to(eval_node_numpy(idx, values), shape)
  vv = np.broadcast_to(eval_node_numpy(valid, values), shape) != 0
  np.testing.assert_array_equal(vv, ref != -1)
  np.testing.assert_array_equal(np.where(vv, iv, -1), ref)
