"""Random movement chains (tiny.testing.strategies) on the device under test: the view is made contiguous, used in an
elementwise op and reduced, and each result equals numpy applying the same chain."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny.tensor import Tensor
from tiny.testing.strategies import apply_to_numpy, movement_chains, op_output_shape, shapes

from ._kit import apply_to_tensor, arange_np, check, examples

pytestmark = pytest.mark.kit_quick   # in the quick subset, with a quarter of the examples (see examples())


@settings(max_examples=examples(12), deadline=None)
@given(chain=movement_chains(shape=shapes(min_dims=1, max_dims=3, max_size=48), max_ops=5, max_size=96))
def test_random_movement_chain(chain, tiny_device):
  start, ops = chain
  base = arange_np(start, np.int32) + 1
  want = apply_to_numpy(base, ops, pad_value=0)
  moved = apply_to_tensor(Tensor(base, device=tiny_device), ops)
  check(moved.contiguous(), want, what=f"contiguous after {ops}")
  check(moved * 3 - 2, want * 3 - 2, what=f"elementwise after {ops}")


@settings(max_examples=examples(8), deadline=None)
@given(chain=movement_chains(shape=shapes(min_dims=1, max_dims=3, max_size=48), max_ops=4, max_size=96), data=st.data())
def test_random_movement_chain_reduce(chain, data, tiny_device):
  start, ops = chain
  shape = start
  for op in ops:
    shape = op_output_shape(shape, op)
  base = arange_np(start, np.int32) - 5
  want = apply_to_numpy(base, ops, pad_value=0)
  t = apply_to_tensor(Tensor(base, device=tiny_device), ops)
  if not shape:
    check(t.sum(), want.sum(), what=f"sum after {ops}")
    return
  axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
  check(t.sum(axis), want.sum(axis), what=f"sum({axis}) after {ops}")
  if shape[axis] > 0:
    check(t.max(axis), want.max(axis), what=f"max({axis}) after {ops}")
