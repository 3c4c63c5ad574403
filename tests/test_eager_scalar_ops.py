"""`Tensor <op> python scalar` fast path (tensor._with_scalar_fast_path) for + * - /: the same results, bit for bit, as
the general path (the fast path switched off), and the values numpy gives, over the awkward constants and dtypes:
signed zeros, NaN, infinities, subnormals, int wrap-around, int division, dtype promotion and bool tensors.
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Callable, List

import numpy as np
import pytest

import tiny.tensor as tensor_mod
from tiny.dtype import dtypes
from tiny.tensor import Tensor

OPS = {"add": operator.add, "radd": lambda x, c: c + x, "mul": operator.mul, "rmul": lambda x, c: c * x,
       "sub": operator.sub, "truediv": operator.truediv}
FLOAT_CONSTS: List[Any] = [2.5, -0.0, 0.0, 1.0, -1.0, 3, -2, 0, float("nan"), float("inf"), -float("inf"), 1e-40, 3e38, 0.1]
INT_CONSTS: List[Any] = [1, -1, 0, 2, 7, -3, 2**31, -2**31, 2**31 - 1, 300, -129, 2**63, 255]


def _both(monkeypatch: pytest.MonkeyPatch, make: Callable[[], Tensor]) -> tuple:
  """(fast result, general result), each realized, as (dtype, bytes)."""
  fast = make().realize()
  with monkeypatch.context() as m:
    m.setattr(tensor_mod, "scalar_binop", lambda *a: None)   # every op takes the general path
    slow = make().realize()
  return (fast.dtype, fast.numpy().tobytes()), (slow.dtype, slow.numpy().tobytes()), fast.numpy()


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64, dtypes.float16])
@pytest.mark.parametrize("op", list(OPS))
def test_float_tensors_match_the_general_path_and_numpy(op: str, dtype, monkeypatch: pytest.MonkeyPatch) -> None:
  npdt = np.dtype(dtype.fmt)
  a = np.array([1.5, -2.0, 0.0, -0.0, np.nan, np.inf, -np.inf, 1e-3, 7.25, -1e-30], dtype=npdt)
  x = Tensor(a).realize()
  for c in FLOAT_CONSTS:
    fast, slow, got = _both(monkeypatch, lambda: OPS[op](x, c))
    assert fast == slow, f"{op} {c!r} on {dtype}"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
      warnings.simplefilter("ignore")
      cv = npdt.type(c)
      if op == "truediv" and dtype != dtypes.float16:
        want = a * (npdt.type(1) / cv) if c != 0 else a * npdt.type(math.copysign(math.inf, c) if isinstance(c, float) else math.inf)
      else:
        want = OPS[op](a, cv)
    if dtype == dtypes.float16 or (op == "truediv" and dtype == dtypes.float32):
      # float16 is computed in float32 and a float32 reciprocal is rounded from a double: close, not bitwise
      np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=0, equal_nan=True)
    else:
      # by value (NaNs equal, zeros of either sign): the general path folds x + 0 and x * 1 to x and x * -1 to -x, which
      # keeps the sign of a zero or a NaN that IEEE arithmetic would change (bit for bit, the fast path is checked above)
      np.testing.assert_array_equal(got, want.astype(npdt), err_msg=f"{op} {c!r} on {dtype}")


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.uint32])
@pytest.mark.parametrize("op", list(OPS))
def test_int_tensors_wrap_like_c_and_match_the_general_path(op: str, dtype, monkeypatch: pytest.MonkeyPatch) -> None:
  npdt = np.dtype(dtype.fmt)
  a = np.array([0, 1, 5, 100, 127, 255 if dtypes.is_unsigned(dtype) else -128, 3], dtype=npdt)
  x = Tensor(a).realize()
  for c in INT_CONSTS:
    fast, slow, got = _both(monkeypatch, lambda: OPS[op](x, c))
    assert fast == slow, f"{op} {c!r} on {dtype}"
    if op == "truediv":
      assert fast[0] == dtypes.float32   # int / int is a float division
      continue
    assert fast[0] == dtype
    bits = 8 * npdt.itemsize
    wrapped = np.array(c & ((1 << bits) - 1), dtype=np.uint64).astype(npdt)   # the constant as the tensor's dtype (C cast)
    with np.errstate(over="ignore"):
      want = OPS[op](a, wrapped)
    # signed overflow is undefined in the C the kernels are written in (the general path gives what it gives there, and
    # the fast path the same, checked above): compare the elements whose exact result fits
    # (x - c is computed as x + (-c), -c wrapped: that add must fit too)
    info = np.iinfo(npdt)
    neg = int(np.array((-int(wrapped)) & ((1 << bits) - 1), dtype=np.uint64).astype(npdt))
    exact = [[OPS[op](int(v), int(wrapped))] + ([int(v) + neg] if op == "sub" else []) for v in a]
    fits = np.array([dtypes.is_unsigned(dtype) or all(info.min <= e <= info.max for e in es) for es in exact])
    assert got[fits].tobytes() == want.astype(npdt)[fits].tobytes(), f"{op} {c!r} on {dtype}"


def test_int_tensor_and_float_scalar_promote_to_float(monkeypatch: pytest.MonkeyPatch) -> None:
  x = Tensor(np.array([1, -2, 3], dtype=np.int32)).realize()
  for op in OPS:
    fast, slow, got = _both(monkeypatch, lambda: OPS[op](x, 1.5))
    assert fast == slow and fast[0] == dtypes.float32, op
    np.testing.assert_allclose(got, OPS[op](np.array([1, -2, 3], np.float32), np.float32(1.5)), rtol=1e-6)


def test_int_division_by_a_scalar_is_true_division() -> None:
  x = Tensor(np.array([7, -7, 1], dtype=np.int32)).realize()
  np.testing.assert_allclose((x / 2).numpy(), [3.5, -3.5, 0.5])
  np.testing.assert_array_equal((x // 2).numpy(), np.array([7, -7, 1]) // 2)


def test_bool_tensors_keep_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
  b = Tensor([True, False, True]).realize()
  for op in OPS:
    for c in (1, 2, 0, 1.5, -1):
      fast, slow, _ = _both(monkeypatch, lambda: OPS[op](b, c))
      assert fast == slow, f"{op} {c!r}"
  np.testing.assert_array_equal((b + 1).numpy(), np.array([True, False, True]) + 1)
  np.testing.assert_array_equal((b * 2).numpy(), np.array([True, False, True]) * 2)


def test_sub_and_div_build_the_same_kernels_as_add_and_mul(monkeypatch: pytest.MonkeyPatch) -> None:
  x = Tensor(np.arange(8, dtype=np.float32)).realize()
  assert [si.ast for si in (x - 1.5).schedule()] == [si.ast for si in (x + -1.5).schedule()]
  assert [si.ast for si in (x / 4.0).schedule()] == [si.ast for si in (x * 0.25).schedule()]
  with monkeypatch.context() as m:
    m.setattr(tensor_mod, "scalar_binop", lambda *a: None)
    slow = [si.ast for si in (x / 3.0 - 2.0).schedule()]
  assert [si.ast for si in (x / 3.0 - 2.0).schedule()] == slow


def test_gradients_take_the_general_path() -> None:
  x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  ((x - 1.0) / 4.0).sum().backward()
  assert x.grad is not None
  np.testing.assert_allclose(x.grad.numpy(), [0.25, 0.25, 0.25])


def test_eager_loop_with_sub_and_div_matches_numpy() -> None:
  a = np.random.default_rng(3).standard_normal(16).astype(np.float32)
  y, ref = Tensor(a).realize(), a.copy()
  for i in range(20):
    c = 1.0 + i / 8   # a new constant each step: the kernel that reads it from a buffer (eager_params)
    y = ((y - c) / 2.0).realize()
    ref = (ref + np.float32(-c)) * np.float32(0.5)
  assert y.numpy().tobytes() == ref.tobytes()


def test_sub_and_div_take_the_fast_path() -> None:
  x = Tensor(np.arange(4, dtype=np.float32)).realize()
  for t in (x - 2.0, x / 3.0, Tensor(np.arange(4, dtype=np.int32)).realize() - 5):
    lb = t.lazydata
    assert lb._scalar_rev is False and lb._ekey is not None, "built by lazy.scalar_binop, with an eager id"
