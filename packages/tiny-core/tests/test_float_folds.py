"""Algebraic folds against IEEE float semantics: a fold may only fire where it keeps every float value, signed zeros, NaN and
infinities included (x + 0.0 is +0.0 for x = -0.0, x * 0.0 is NaN for x = inf, ...). Each rewrite is checked value by
value against the unrewritten graph, and the Tensor-level results bit for bit against numpy. The integer forms of the
same folds must keep firing: index math relies on them."""
from __future__ import annotations

import math
from typing import Any, List

import numpy as np
import pytest

from tiny import Tensor
from tiny.codegen.uopgraph import constant_folder, graph_rewrite
from tiny.codegen.uops import UOp, UOps
from tiny.dtype import dtypes
from tiny.ops import BinaryOps, TernaryOps, UnaryOps, exec_alu, is_add_identity

F32, F64, I32, BOOL = dtypes.float32, dtypes.float64, dtypes.int32, dtypes.bool
SPECIALS: List[float] = [-0.0, 0.0, math.inf, -math.inf, math.nan, 1.5, -2.0]


def _same(a: Any, b: Any) -> bool:
  """Equal as IEEE values with the sign of zero: NaN matches NaN, -0.0 does not match 0.0."""
  if isinstance(a, float) and isinstance(b, float):
    if math.isnan(a) or math.isnan(b):
      return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
  return bool(a == b)


def _eval(u: UOp, x: Any, c: bool = True) -> Any:
  """Value of a scalar uop graph with the VAR "x" bound to x and the bool VAR "c" to c."""
  if u.op is UOps.CONST:
    return u.arg
  if u.op is UOps.VAR:
    return {"x": x, "c": c}[u.arg]
  if u.op is UOps.CAST:
    return exec_alu(UnaryOps.CAST, u.dtype, [_eval(u.src[0], x, c)])
  assert u.op is UOps.ALU, u.op
  return exec_alu(u.arg, u.dtype, [_eval(s, x, c) for s in u.src])


def _rw(u: UOp) -> UOp:
  return graph_rewrite(UOp(UOps.SINK, None, (u,)), constant_folder).src[0]


def _x(dtype: Any = F32) -> UOp:
  return UOp(UOps.VAR, dtype, (), "x")


_C = UOp(UOps.VAR, BOOL, (), "c")


def _const(v: Any, dtype: Any = F32) -> UOp:
  return UOp(UOps.CONST, dtype, (), v)


# graphs of x whose folds have a float trap; each must keep its value for every special x (and either c)
FLOAT_GRAPHS = {
  "x + 0.0": lambda: _x().alu(BinaryOps.ADD, _const(0.0)),
  "0.0 + x": lambda: _const(0.0).alu(BinaryOps.ADD, _x()),
  "x + -0.0": lambda: _x().alu(BinaryOps.ADD, _const(-0.0)),
  "x * 1.0": lambda: _x().alu(BinaryOps.MUL, _const(1.0)),
  "x * 0.0": lambda: _x().alu(BinaryOps.MUL, _const(0.0)),
  "x + -x": lambda: _x().alu(BinaryOps.ADD, _x().alu(UnaryOps.NEG)),
  "x != x": lambda: _x().alu(BinaryOps.CMPNE, _x()),
  "x < x": lambda: _x().alu(BinaryOps.CMPLT, _x()),
  "max(0.0, x)": lambda: _const(0.0).alu(BinaryOps.MAX, _x()),
  "max(-0.0, x)": lambda: _const(-0.0).alu(BinaryOps.MAX, _x()),
  "max(2.0, x)": lambda: _const(2.0).alu(BinaryOps.MAX, _x()),
  "where(c, x, 0.0) * -2.0": lambda: _C.alu(TernaryOps.WHERE, _x(), _const(0.0)).alu(BinaryOps.MUL, _const(-2.0)),
  "where(c, x, -0.0) * 3.0": lambda: _C.alu(TernaryOps.WHERE, _x(), _const(-0.0)).alu(BinaryOps.MUL, _const(3.0)),
  "cast(where(c, x, -0.0), f64)": lambda: _C.alu(TernaryOps.WHERE, _x(), _const(-0.0)).cast(F64),
  "(x + 0.0) * 1.0 + -0.0": lambda: _x().alu(BinaryOps.ADD, _const(0.0)).alu(BinaryOps.MUL, _const(1.0)).alu(BinaryOps.ADD, _const(-0.0)),
}


@pytest.mark.parametrize("name", sorted(FLOAT_GRAPHS))
def test_float_rewrite_keeps_every_value(name: str) -> None:
  u = FLOAT_GRAPHS[name]()
  r = _rw(u)
  for x in SPECIALS:
    for c in (True, False):
      want, got = _eval(u, x, c), _eval(r, x, c)
      assert _same(got, want), f"{name} at x={x!r}, c={c}: rewritten {got!r}, IEEE {want!r} ({r})"


def test_identities_that_hold_for_floats_still_fold() -> None:
  x = _x()
  assert _rw(x.alu(BinaryOps.ADD, _const(-0.0))) is x
  assert _rw(x.alu(BinaryOps.MUL, _const(1.0))) is x
  assert _rw(x.alu(BinaryOps.MAX, x)) is x
  # a nonzero constant still goes right (x86's max against a constant wants it there)
  assert _rw(_const(2.0).alu(BinaryOps.MAX, x)).src[1].op is UOps.CONST


def test_integer_identities_still_fold() -> None:
  # index math depends on these: they must not be lost with the float fixes
  i = _x(I32)
  assert _rw(i.alu(BinaryOps.ADD, _const(0, I32))) is i
  assert _rw(_const(0, I32).alu(BinaryOps.ADD, i)) is i
  assert _rw(i.alu(BinaryOps.MUL, _const(1, I32))) is i
  assert _rw(i.alu(BinaryOps.MUL, _const(0, I32))).op is UOps.CONST
  assert _rw(_const(0, I32).alu(BinaryOps.MAX, i)).src[1].op is UOps.CONST


def test_is_add_identity() -> None:
  assert is_add_identity(0, I32) and is_add_identity(False, BOOL) and is_add_identity(-0.0, F32) and is_add_identity(-0.0, F64)
  assert is_add_identity(-0.0, dtypes.float16) and is_add_identity(-0.0, F32.vec(4))
  assert not is_add_identity(0.0, F32) and not is_add_identity(0, F32) and not is_add_identity(1, I32)
  assert not is_add_identity(math.nan, F32) and not is_add_identity(0.0, F32.vec(4))


# *** the same through Tensors, bit for bit against numpy ***

def _bits_equal(got: np.ndarray, want: np.ndarray) -> bool:
  return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes() or \
    (np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)])) and
     np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)]))


VALUES = np.array(SPECIALS, dtype=np.float32)
TENSOR_CASES: dict = {
  "x + 0": (lambda x: x + 0, lambda x: x + np.float32(0)),
  "0 + x": (lambda x: 0 + x, lambda x: np.float32(0) + x),
  "x + 0.0 tensor": (lambda x: x + Tensor.zeros(*x.shape), lambda x: x + np.zeros_like(x)),
  "x + -0.0": (lambda x: x + (-0.0), lambda x: x + np.float32(-0.0)),
  "x - 0": (lambda x: x - 0, lambda x: x - np.float32(0)),
  "x - -0.0": (lambda x: x - (-0.0), lambda x: x - np.float32(-0.0)),
  "0 - x": (lambda x: 0 - x, lambda x: np.float32(0) - x),
  "x * 1": (lambda x: x * 1, lambda x: x * np.float32(1)),
  "x * -1": (lambda x: x * -1, lambda x: x * np.float32(-1)),
  "x * 0": (lambda x: x * 0, lambda x: x * np.float32(0)),
  "x / 1": (lambda x: x / 1, lambda x: x / np.float32(1)),
  "x - x": (lambda x: x - x, lambda x: x - x),
  "x * 1 + 0": (lambda x: x * 1 + 0, lambda x: x * np.float32(1) + np.float32(0)),
  "where(x > 0, x, 0) * -2": (lambda x: (x > 0).where(x, 0) * -2, lambda x: np.where(x > 0, x, np.float32(0)) * np.float32(-2)),
  "where(x > 0, x, -0.0) as f64": (lambda x: (x > 0).where(x, -0.0).cast(dtypes.float64),
                                   lambda x: np.where(x > 0, x, np.float32(-0.0)).astype(np.float64)),
  "half x + 0": (lambda x: x.cast(dtypes.float16) + 0, lambda x: x.astype(np.float16) + np.float16(0)),
}


@pytest.mark.parametrize("name", sorted(TENSOR_CASES))
def test_tensor_matches_numpy_bitwise(name: str) -> None:
  tiny_fn, np_fn = TENSOR_CASES[name]
  with np.errstate(all="ignore"):
    want = np.asarray(np_fn(VALUES))
  got = tiny_fn(Tensor(VALUES)).numpy()
  assert _bits_equal(got, want), f"{name}: tiny {got!r}, numpy {want!r}"


@pytest.mark.parametrize("name", ["x + 0", "0 + x", "x - -0.0", "0 - x", "x * 1 + 0"])
def test_tensor_folds_of_a_lazy_constant(name: str) -> None:
  # a constant input folds in the lazy graph (exec_alu) and in codegen: the same values as numpy
  tiny_fn, np_fn = TENSOR_CASES[name]
  for v in SPECIALS:
    with np.errstate(all="ignore"):
      want = np.asarray(np_fn(np.float32(v)))
    got = tiny_fn(Tensor(v, dtype=dtypes.float32)).numpy()
    assert _bits_equal(np.asarray(got), want.astype(got.dtype)), f"{name} at {v!r}: tiny {got!r}, numpy {want!r}"


def test_int_tensor_add_zero_is_still_free() -> None:
  # x + 0 of an int tensor is x itself: no kernel, no new buffer
  x = Tensor(np.arange(6, dtype=np.int32))
  assert (x + 0).lazydata is x.lazydata
  f = Tensor(VALUES)
  assert (f + (-0.0)).lazydata is f.lazydata
  assert (f + 0.0).lazydata is not f.lazydata


