"""Reductions (sum, max, min, mean, any/all) over each axis, several axes and all axes, with and without keepdim."""
from __future__ import annotations

from typing import Any, List, Tuple

import itertools

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import QUICK, check, data, quick_cases

SHAPES = [(7,), (3, 4), (2, 3, 4), (1, 5, 1), (2, 1, 3, 2)]


def _axes(shape: Tuple[int, ...]) -> List[Any]:
  nd = len(shape)
  out: List[Any] = [None] + list(range(nd)) + [-1]
  out += [c for c in itertools.combinations(range(nd), 2)] if nd >= 3 else []
  return out


CASES = [(s, ax) for s in SHAPES for ax in _axes(s)]
CASE_IDS = [f"{s}-axis{ax}" for s, ax in CASES]


@pytest.mark.parametrize("shape,axis", [pytest.param(*c, id=i, marks=QUICK if c in (((2, 3, 4), (0, 2)), ((2, 1, 3, 2), None)) else ())
                                        for c, i in zip(CASES, CASE_IDS)])
def test_sum_max_float(shape, axis, tiny_device):
  a = data(shape, dtypes.float32, seed=1)
  t = Tensor(a, device=tiny_device)
  check(t.sum(axis), a.sum(axis, dtype=np.float32), dt=dtypes.float32, atol=1e-5, rtol=1e-5, what="sum")
  check(t.max(axis), a.max(axis), dt=dtypes.float32, what="max")


@pytest.mark.parametrize("shape,axis", [pytest.param(*c, id=i, marks=QUICK if c == ((2, 3, 4), 1) else ())
                                        for c, i in zip(CASES, CASE_IDS) if len(c[0]) <= 3])
def test_sum_max_min_int(shape, axis, tiny_device):
  a = data(shape, dtypes.int32, seed=2, low=-1000, high=1000)
  t = Tensor(a, device=tiny_device)
  check(t.sum(axis), a.sum(axis), what="int sum")
  check(t.max(axis), a.max(axis), dt=dtypes.int32, what="int max")
  check(t.min(axis), a.min(axis), dt=dtypes.int32, what="int min")


@pytest.mark.parametrize("shape", quick_cases(SHAPES, lambda s: s == (2, 3, 4), ids=str))
def test_keepdim_and_mean(shape, tiny_device):
  a = data(shape, dtypes.float32, seed=3)
  t = Tensor(a, device=tiny_device)
  ax = len(shape) - 1
  check(t.sum(ax, keepdim=True), a.sum(ax, keepdims=True), atol=1e-5, rtol=1e-5, what="sum keepdim")
  check(t.max(0, keepdim=True), a.max(0, keepdims=True), what="max keepdim")
  check(t.mean(), a.mean(dtype=np.float64), atol=1e-5, rtol=1e-5, what="mean")


@pytest.mark.parametrize("dt", quick_cases([dtypes.uint8, dtypes.int8, dtypes.int64, dtypes.float16, dtypes.float64],
                                            lambda d: d in (dtypes.uint8, dtypes.float16), ids=lambda d: d.name))
def test_sum_small_dtypes_do_not_overflow(dt, tiny_device, tiny_require_dtype):
  """sum accumulates in a wide type (like numpy's default), so 64 x 100 does not wrap in int8/uint8."""
  tiny_require_dtype(dt)
  a = np.full((64,), 100 if dt != dtypes.float16 else 1.5, dtype=dt.fmt)
  got = Tensor(a, device=tiny_device).sum().numpy()
  assert float(got) == float(a.astype(np.float64).sum()), f"sum of {dt}: {got} != {a.astype(np.float64).sum()}"


@QUICK
def test_bool_reduce(tiny_device):
  a = data((3, 5), dtypes.bool, seed=4)
  a[0] = True
  a[1] = False
  t = Tensor(a, device=tiny_device)
  check(t.any(1), a.any(1), what="any")
  check(t.all(1), a.all(1), what="all")
  check(t.sum(1), a.sum(1), what="count of true")


@QUICK
def test_reduce_zero_size(tiny_device):
  a = np.zeros((3, 0), dtype=np.float32)
  t = Tensor(a, device=tiny_device)
  check(t.sum(1), a.sum(1), what="sum over an empty axis")
  check(t.sum(0), a.sum(0), what="sum of an empty tensor")


@QUICK
def test_long_reduce(tiny_device):
  """A longer reduce where devices usually split work (grouped reduce, upcast, unrolling)."""
  a = data((4, 300), dtypes.float32, seed=5, low=0, high=1)
  t = Tensor(a, device=tiny_device)
  check(t.sum(1), a.astype(np.float64).sum(1), atol=1e-3, rtol=1e-5, what="long sum")
  check(t.sum(0), a.astype(np.float64).sum(0), atol=1e-5, rtol=1e-5, what="short sum")
  check(t.max(), a.max(), what="max of all")


def test_reduce_then_elementwise_then_reduce(tiny_device):
  """Two reduces in a row with elementwise between (softmax shape)."""
  a = data((4, 6), dtypes.float32, seed=6)
  t = Tensor(a, device=tiny_device)
  e = np.exp(a - a.max(1, keepdims=True))
  check(t.softmax(1), e / e.sum(1, keepdims=True), atol=1e-6, rtol=1e-5, what="softmax")
  check((t - t.mean(0)).square().sum(0), ((a - a.mean(0)) ** 2).sum(0), atol=1e-5, rtol=1e-5, what="variance-like")
