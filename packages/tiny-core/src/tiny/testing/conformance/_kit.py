"""Shared helpers of the conformance kit: input data per dtype, movement chains on Tensors, comparisons against numpy."""
from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from tiny.dtype import DType, dtypes
from tiny.tensor import Tensor
from tiny.testing.pytest_plugin import quick_mode

# dtypes every device is expected to handle; a device without one says so with --tiny-skip-dtypes
FLOATS = (dtypes.float32, dtypes.float16, dtypes.float64)
SIGNED = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64)
UNSIGNED = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
INTS = SIGNED + UNSIGNED
ALL = FLOATS + INTS + (dtypes.bool,)

MovementOp = Tuple[str, Any]

# the marker of the quick subset (--tiny-quick): on a test, a pytest.param or a module (pytestmark = QUICK)
QUICK = pytest.mark.kit_quick


def quick_cases(values: Sequence[Any], is_quick: Callable[[Any], bool], ids: Optional[Callable[[Any], str]] = None,
                unpack: bool = False) -> List[Any]:
  """values as pytest.params for parametrize, the ones is_quick accepts marked as part of the quick subset.

  unpack=True spreads each (tuple) value over several argument names ("a,b"), as parametrize does with plain tuples."""
  out = []
  for v in values:
    args = tuple(v) if unpack else (v,)
    out.append(pytest.param(*args, id=ids(v) if ids is not None else None, marks=QUICK if is_quick(v) else ()))
  return out


def quick() -> bool:
  """True when the kit runs with --tiny-quick."""
  return quick_mode()


def examples(n: int) -> int:
  """n hypothesis examples for the kit's default run, a quarter of them (at least 2) under --tiny-quick, and the
  profile's (long) count under HYPOTHESIS_PROFILE=fuzz."""
  if quick():
    return max(2, n // 4)
  if os.getenv("HYPOTHESIS_PROFILE", "default") == "default":
    return n
  from hypothesis import settings
  return max(n, settings().max_examples)


def np_dtype(dt: DType) -> Any:
  """The numpy dtype of a tiny dtype."""
  return np.dtype(dt.fmt) if dt != dtypes.bool else np.dtype(np.bool_)


def data(shape: Tuple[int, ...], dt: DType, seed: int = 0, low: Optional[float] = None, high: Optional[float] = None) -> np.ndarray:
  """Random test values for dt: floats in [low, high) (default [-2, 2)); ints in [low, high] kept small enough that
  a product of two stays inside the dtype (default [-10, 10] signed, [0, 15] unsigned); bools half true."""
  rng = np.random.default_rng(seed)
  if dt == dtypes.bool:
    return rng.random(shape) < 0.5
  if dtypes.is_float(dt):
    lo, hi = (-2.0 if low is None else low), (2.0 if high is None else high)
    return rng.uniform(lo, hi, size=shape).astype(np_dtype(dt))
  lo = (0 if dtypes.is_unsigned(dt) else -10) if low is None else int(low)
  hi = (15 if dtypes.is_unsigned(dt) else 10) if high is None else int(high)
  return rng.integers(lo, hi, size=shape, endpoint=True).astype(np_dtype(dt))


def tolerance(dt: DType, transcendental: bool = False) -> Tuple[float, float]:
  """(atol, rtol) for comparing results of dtype dt with numpy."""
  if dt == dtypes.float16:
    return (2e-2, 2e-2) if transcendental else (1e-3, 1e-3)
  if dt == dtypes.float32:
    return (1e-5, 1e-5) if transcendental else (1e-6, 1e-6)
  if dt == dtypes.float64:
    return (1e-10, 1e-10)
  return (0.0, 0.0)


def check(out: Tensor, expected: Any, dt: Optional[DType] = None, atol: Optional[float] = None, rtol: Optional[float] = None,
          transcendental: bool = False, what: str = "") -> np.ndarray:
  """Assert that out (realized and read back) has expected's shape and values and dtype dt (when given)."""
  expected = np.asarray(expected)
  got = out.numpy()
  where = f"{what} on {out.device}" if what else f"on {out.device}"
  if dt is not None:
    assert out.dtype == dt, f"{where}: dtype {out.dtype}, expected {dt}"
  assert got.shape == expected.shape, f"{where}: shape {got.shape}, expected {expected.shape}"
  if expected.dtype == np.bool_ or got.dtype == np.bool_:
    np.testing.assert_array_equal(got.astype(np.bool_), expected.astype(np.bool_), err_msg=where)
  elif np.issubdtype(expected.dtype, np.floating) or np.issubdtype(got.dtype, np.floating):
    ta, tr = tolerance(dt if dt is not None else out.dtype, transcendental)
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), atol=ta if atol is None else atol,
                               rtol=tr if rtol is None else rtol, equal_nan=True, err_msg=where)
  else:
    np.testing.assert_array_equal(got.astype(np.int64) if got.dtype != np.uint64 else got, expected, err_msg=where)
  return got


def apply_to_tensor(t: Tensor, ops: Sequence[MovementOp], pad_value: float = 0.0) -> Tensor:
  """Apply a movement chain (see tiny.testing.strategies) to a Tensor."""
  for kind, arg in ops:
    if kind == "reshape":
      t = t.reshape(arg)
    elif kind == "permute":
      t = t.permute(arg)
    elif kind == "expand":
      t = t.expand(arg)
    elif kind == "pad":
      t = t.pad(tuple(arg), value=pad_value) if any(b or e for b, e in arg) else t
    elif kind == "shrink":
      t = t.shrink(tuple(arg))
    elif kind == "flip":
      t = t.flip(arg) if arg else t
    elif kind == "stride":
      t = t[tuple(slice(None, None, m) for m in arg)] if t.ndim else t
    else:
      raise ValueError(f"unknown movement op {kind}")
  return t


def arange_np(shape: Tuple[int, ...], npdt: Any = np.int32) -> np.ndarray:
  """0, 1, 2, ... in shape."""
  return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=npdt).reshape(shape)
