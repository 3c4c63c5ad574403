"""Signed integer arithmetic wraps on overflow on the CPU devices, as numpy's does (C leaves it undefined)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tiny import Tensor

from tiny_clang.compiler import find_cc

if find_cc() is None:
  pytest.skip("no C compiler (clang/cc/gcc) on this machine", allow_module_level=True)

I32 = np.array([-128, 5, 2**31 - 1, -2**31, 0, 1 << 20], dtype=np.int32)
I64 = np.array([2**62, -2**63, 2**63 - 1, -5, 0, 1 << 40], dtype=np.int64)

CASES: list = [
  ("add INT_MIN", I32, lambda x: x + (-2**31)),      # clang folded this into x | INT_MIN: -128 came back as -128
  ("add MAX", I32, lambda x: x + (2**31 - 1)),
  ("mul", I32, lambda x: x * 65537),
  ("neg", I32, lambda x: -x),
  ("square", I32, lambda x: x * x),
  ("mul add", I32, lambda x: x * 3 + 2**30),
  ("add self", I64, lambda x: x + x),
  ("mul 64", I64, lambda x: x * 1000003),
  ("neg 64", I64, lambda x: -x),
]


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("name, data, fn", CASES, ids=[c[0] for c in CASES])
def test_signed_overflow_wraps_like_numpy(device: str, name: str, data: np.ndarray, fn: Callable) -> None:
  with np.errstate(over="ignore"):
    want = fn(data)
  got = fn(Tensor(data, device=device)).numpy()
  np.testing.assert_array_equal(got, want.astype(data.dtype), err_msg=name)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_int_sum_wraps_like_numpy(device: str) -> None:
  data = np.full(4096, 2**30 + 7, dtype=np.int32)
  np.testing.assert_array_equal(Tensor(data, device=device).sum().numpy(), data.sum(dtype=np.int32))
