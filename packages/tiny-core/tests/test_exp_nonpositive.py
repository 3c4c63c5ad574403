"""exp for arguments known to be <= 0 (softmax's x - max(x), function._exp's `nonpositive`): one exponent scaling and no
overflow clamp, which must give exactly the general exp's results, and softmax/log_softmax rows that match numpy."""
from __future__ import annotations

import numpy as np
import pytest

from tiny import Tensor
from tiny.dtype import dtypes
from tiny.tensor import F


def _nonpositive_float32_sweep(step: int) -> np.ndarray:
  """Every step-th float32 from -0.0 down past -112 (below exp's clamp), by bit pattern, plus the special values."""
  bits = np.arange(0x80000000, 0x80000000 + 0x42e00000, step, dtype=np.uint64).astype(np.uint32)
  special = np.array([-np.inf, np.nan, 0.0, -0.0, -1e-45, -87.33654, -87.33655, -103.27893, -103.97208, -104.0, -104.5, -3.4e38],
                     np.float32)
  return np.concatenate([bits.view(np.float32), special])


def test_nonpositive_exp_is_the_general_exp_bitwise() -> None:
  x = _nonpositive_float32_sweep(40009)
  general = Tensor(x).exp().numpy()
  fast = F.Exp.apply(Tensor(x), nonpositive=True).numpy()
  assert np.array_equal(general.view(np.uint32), fast.view(np.uint32))
  # and both are within an ulp of numpy (subnormal results: of the subnormal spacing)
  ref = np.exp(x.astype(np.float64))
  fin = ~np.isnan(ref)
  assert np.isnan(fast[~fin]).all()
  ulp = np.maximum(np.spacing(ref[fin].astype(np.float32)).astype(np.float64), 2.0 ** -149)
  assert (np.abs(fast[fin] - ref[fin]) / ulp).max() < 1.0


def test_nonpositive_exp_float64() -> None:
  rng = np.random.default_rng(0)
  x = np.concatenate([-rng.exponential(50, 20000), [-np.inf, np.nan, 0.0, -0.0, -708.4, -745.1, -745.2, -746.5, -1e300]])
  general = Tensor(x, dtype=dtypes.float64).exp().numpy()
  fast = F.Exp.apply(Tensor(x, dtype=dtypes.float64), nonpositive=True).numpy()
  assert np.array_equal(general.view(np.uint64), fast.view(np.uint64))
  fin = ~np.isnan(x)
  np.testing.assert_allclose(fast[fin], np.exp(x[fin]), rtol=1e-15, atol=5e-324)


def _softmax64(x: np.ndarray) -> np.ndarray:
  x = x.astype(np.float64)
  with np.errstate(invalid="ignore"):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_with_specials(log: bool) -> None:
  rng = np.random.default_rng(1)
  x = rng.normal(0, 40, (6, 256)).astype(np.float32)
  x[1, ::3] = -np.inf                    # masked entries: exactly 0
  x[2, 7] = np.nan                       # a NaN row stays NaN
  x[3, :] = -np.inf                      # all masked: NaN, as numpy
  x[4, :128] = -95.0                     # results in the subnormal range next to a max of 0
  x[4, 128:] = 0.0
  x[5, :] = rng.normal(0, 1, 256)
  out = (Tensor(x).log_softmax(-1) if log else Tensor(x).softmax(-1)).numpy()
  ref = _softmax64(x)
  if log:
    with np.errstate(divide="ignore"):
      ref = np.log(ref)
  assert np.array_equal(np.isnan(out), np.isnan(ref))
  ok = ~np.isnan(ref)
  # (softmax: exp's subnormal results carry fewer bits, which the division by the sum scales up: hence the atol)
  np.testing.assert_allclose(out[ok], ref[ok], rtol=2e-6, atol=1e-30 if not log else 1e-5)
  if not log:
    assert (out[1, ::3] == 0).all()


def test_softmax_half_and_int_inputs() -> None:
  rng = np.random.default_rng(2)
  x = rng.normal(0, 3, (4, 64)).astype(np.float16)
  np.testing.assert_allclose(Tensor(x).softmax(-1).numpy().astype(np.float64), _softmax64(x), rtol=3e-3, atol=1e-4)
  xi = rng.integers(-20, 20, (4, 64)).astype(np.int32)
  np.testing.assert_allclose(Tensor(xi).softmax(-1).numpy(), _softmax64(xi), rtol=2e-6, atol=1e-9)
