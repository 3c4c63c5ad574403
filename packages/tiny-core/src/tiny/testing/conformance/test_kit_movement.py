"""Movement ops (reshape, permute, expand, pad, shrink, flip, stride) and masked combinations, made contiguous on the device."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor
from tiny.testing.strategies import apply_to_numpy

from ._kit import QUICK, apply_to_tensor, arange_np, check, quick_cases

# (start shape, chain): each exercises one index/valid pattern of the ShapeTracker
CHAINS: Dict[str, Tuple[Tuple[int, ...], List[Tuple[str, Any]]]] = {
  "reshape": ((2, 3, 4), [("reshape", (6, 4))]),
  "reshape_split_merge": ((6, 4), [("reshape", (2, 3, 2, 2)), ("reshape", (3, 8))]),
  "permute": ((2, 3, 4), [("permute", (2, 0, 1))]),
  "permute_reshape": ((2, 3, 4), [("permute", (1, 2, 0)), ("reshape", (12, 2))]),
  "expand": ((3, 1), [("expand", (3, 4))]),
  "expand_permute": ((1, 3), [("expand", (4, 3)), ("permute", (1, 0))]),
  "shrink": ((5, 6), [("shrink", ((1, 4), (2, 6)))]),
  "shrink_to_empty": ((5, 6), [("shrink", ((2, 2), (0, 6)))]),
  "pad": ((3, 4), [("pad", ((1, 2), (0, 1)))]),
  "pad_1d": ((5,), [("pad", ((2, 3),))]),
  "flip_one": ((3, 4), [("flip", (1,))]),
  "flip_all": ((2, 3, 4), [("flip", (0, 1, 2))]),
  "stride_2": ((7, 6), [("stride", (2, 1))]),
  "stride_neg": ((7, 6), [("stride", (1, -2))]),
  "stride_3_neg3": ((7, 8), [("stride", (3, -3))]),
  "pad_then_shrink": ((4, 4), [("pad", ((2, 2), (1, 1))), ("shrink", ((1, 6), (0, 5)))]),
  "shrink_then_pad": ((6, 6), [("shrink", ((1, 5), (2, 4))), ("pad", ((1, 1), (2, 0)))]),
  "pad_flip": ((3, 4), [("pad", ((2, 0), (0, 1))), ("flip", (0, 1))]),
  "pad_stride": ((5, 5), [("pad", ((1, 2), (2, 1))), ("stride", (2, -3))]),
  "pad_reshape": ((2, 3), [("pad", ((0, 0), (1, 1))), ("reshape", (10,))]),
  "pad_permute_reshape": ((2, 3), [("pad", ((1, 0), (0, 1))), ("permute", (1, 0)), ("reshape", (2, 2, 3))]),
  "flip_reshape_pad": ((4, 3), [("flip", (0,)), ("reshape", (2, 6)), ("pad", ((0, 1), (1, 0)))]),
  "expand_pad_shrink": ((1, 4), [("expand", (3, 4)), ("pad", ((1, 1), (0, 0))), ("shrink", ((0, 4), (1, 3)))]),
  "stride_reshape": ((6, 4), [("stride", (2, 1)), ("reshape", (12,))]),
  "pad_pad": ((2, 2), [("pad", ((1, 0), (0, 1))), ("reshape", (9,)), ("pad", ((2, 2),))]),
  "size_one_dims": ((1, 3, 1), [("reshape", (3, 1, 1)), ("permute", (1, 2, 0)), ("expand", (2, 1, 3)), ("pad", ((0, 0), (1, 1), (0, 0)))]),
}


@pytest.mark.parametrize("name", quick_cases(list(CHAINS), lambda n: n in ("permute_reshape", "pad_stride", "flip_reshape_pad", "expand_pad_shrink",
                                                                        "stride_3_neg3", "size_one_dims")))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32, dtypes.uint8], ids=lambda d: d.name)
def test_movement_chain(name, dt, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dt)
  shape, ops = CHAINS[name]
  base = arange_np(shape, np.dtype(dt.fmt)) + 1   # 1.. so padding (0) is distinguishable from data
  want = apply_to_numpy(base, ops, pad_value=0)
  out = apply_to_tensor(Tensor(base, device=tiny_device), ops).contiguous()
  check(out, want, dt=dt, what=name)


@pytest.mark.parametrize("name", quick_cases(["pad", "pad_then_shrink", "pad_flip", "pad_stride", "pad_pad"], lambda n: n == "pad_pad"))
def test_pad_value(name, tiny_device):
  shape, ops = CHAINS[name]
  base = arange_np(shape, np.float32)
  check(apply_to_tensor(Tensor(base, device=tiny_device), ops, pad_value=-2.5).contiguous(), apply_to_numpy(base, ops, pad_value=-2.5),
        dt=dtypes.float32, what=f"{name} with pad value")


@pytest.mark.parametrize("name", quick_cases(["permute", "pad", "flip_all", "stride_neg", "pad_stride", "expand_pad_shrink"],
                                            lambda n: n == "expand_pad_shrink"))
def test_movement_feeds_elementwise_and_reduce(name, tiny_device):
  """The moved view is read inside a compute kernel (no copy in between), masked loads included."""
  shape, ops = CHAINS[name]
  base = arange_np(shape, np.float32)
  moved = apply_to_tensor(Tensor(base, device=tiny_device), ops)
  want = apply_to_numpy(base, ops, pad_value=0)
  check(moved * 2 + 1, want * 2 + 1, dt=dtypes.float32, what=f"{name} then elementwise")
  check(moved.sum(0), want.sum(0), dt=dtypes.float32, what=f"{name} then reduce")


@QUICK
def test_indexing_and_slicing(tiny_device):
  base = arange_np((4, 5, 6), np.int32)
  t = Tensor(base, device=tiny_device)
  check(t[1], base[1], what="t[1]")
  check(t[:, 2, 1:5:2], base[:, 2, 1:5:2], what="t[:, 2, 1:5:2]")
  check(t[::-1, ::2, -1], base[::-1, ::2, -1], what="t[::-1, ::2, -1]")
  check(t[..., None, 3], base[..., None, 3], what="t[..., None, 3]")


@QUICK
def test_cat_and_stack(tiny_device):
  a, b = arange_np((2, 3), np.float32), arange_np((2, 3), np.float32) + 10
  ta, tb = Tensor(a, device=tiny_device), Tensor(b, device=tiny_device)
  check(ta.cat(tb, dim=1), np.concatenate([a, b], 1), what="cat dim 1")
  check(Tensor.stack(ta, tb, dim=0), np.stack([a, b], 0), what="stack")


def test_contiguous_of_realized_view(tiny_device):
  """A realized buffer read through a permuted and then a flipped view."""
  base = arange_np((3, 4), np.int32)
  t = Tensor(base, device=tiny_device).realize()
  check(t.permute(1, 0).flip(0).contiguous(), base.T[::-1], what="permute+flip of a realized buffer")
