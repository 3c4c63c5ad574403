"""Integer division and remainder of sums that wrap around an unsigned dtype: the symbolic folds may not split them.

(x + 2) // 2 is x // 2 + 1 only while x + 2 does not wrap; uint8 254 + 2 is 0, and 0 // 2 is 0, not 128. The folds used to
split such sums (hypothesis found it in the rule tests): every case here is checked against numpy's wrapping arithmetic."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from tiny.registry import Device
from tiny.tensor import Tensor

CASES: "dict[str, Callable]" = {
  "(x+2)//2": lambda x, c: (x + c(2)) // c(2),
  "(x+4)//2": lambda x, c: (x + c(4)) // c(2),
  "(2-x)//2": lambda x, c: (c(2) - x) // c(2),
  "(x*4)//2": lambda x, c: (x * c(4)) // c(2),
  "(x*4+2)//2": lambda x, c: (x * c(4) + c(2)) // c(2),
  "(x+3)%2": lambda x, c: (x + c(3)) % c(2),
  "(x*6+1)%3": lambda x, c: (x * c(6) + c(1)) % c(3),
  "x//16//32": lambda x, c: x // c(16) // c(32),
}


@pytest.mark.parametrize("device", ["PYTHON", "CLANG"])
@pytest.mark.parametrize("dt", [np.uint8, np.uint16, np.uint32])
@pytest.mark.parametrize("case", list(CASES))
def test_wrapping_unsigned_division_matches_numpy(device: str, dt: type, case: str) -> None:
  if reason := Device.availability(device):
    pytest.skip(f"{device} is not available: {reason}")
  top = np.iinfo(dt).max
  xn = np.array([0, 1, 2, 3, 7, top // 2, top // 4 + 1, top - 3, top - 1, top], dtype=dt)
  fn = CASES[case]
  with np.errstate(over="ignore"):
    want = fn(xn, dt)
  got = fn(Tensor(xn, device=device), int).numpy()
  np.testing.assert_array_equal(got, want)
