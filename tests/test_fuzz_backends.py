"""Fuzzing every available device against numpy and against PYTHON (the reference interpreter): random movement chains
made contiguous and used elementwise, random reduces, and random ALU expression trees over several dtypes.

The default hypothesis profile runs a few examples (CI); HYPOTHESIS_PROFILE=fuzz runs thousands.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny.dtype import DType, dtypes
from tiny.registry import Device
from tiny.tensor import Tensor
from tiny.testing.strategies import apply_to_numpy, movement_chains, register_profiles, shapes

register_profiles()

DEVICES = list(Device.get_available_devices())
assert "PYTHON" in DEVICES, "PYTHON must always be available"


def _examples(n: int) -> int:
  """n examples in the quick run, the profile's count (thousands) under HYPOTHESIS_PROFILE=fuzz."""
  return n if os.getenv("HYPOTHESIS_PROFILE", "default") == "default" else max(n, settings().max_examples)


def _np(dt: DType) -> Any:
  return np.dtype(np.bool_) if dt == dtypes.bool else np.dtype(dt.fmt)


def _move(t: Tensor, ops: List[Tuple[str, Any]]) -> Tensor:
  for kind, arg in ops:
    if kind == "pad":
      t = t.pad(tuple(arg)) if any(b or e for b, e in arg) else t
    elif kind == "flip":
      t = t.flip(arg) if arg else t
    elif kind == "stride":
      t = t[tuple(slice(None, None, m) for m in arg)] if t.ndim else t
    else:
      t = getattr(t, kind)(arg)
  return t


def _compare(got: np.ndarray, want: np.ndarray, what: str, atol: float = 0.0, rtol: float = 0.0) -> None:
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  if np.issubdtype(want.dtype, np.floating):
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, equal_nan=True, err_msg=what)
  else:
    np.testing.assert_array_equal(got, want, err_msg=what)


# *** movement chains ***

@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=_examples(6), deadline=None)
@given(chain=movement_chains(shape=shapes(min_dims=1, max_dims=4, max_size=64), max_ops=6, max_size=128),
       op=st.sampled_from(["add", "mul", "neg_max"]))
def test_movement_chain_then_elementwise(device, chain, op):
  start, ops = chain
  base = np.arange(int(np.prod(start)), dtype=np.int32).reshape(start) + 1
  want = apply_to_numpy(base, ops, pad_value=0)
  fxn: Dict[str, Callable[[Any], Any]] = {"add": lambda x: x + 7, "mul": lambda x: x * 3, "neg_max": lambda x: (-x).maximum(x * 0 - 4)}
  want_op = {"add": want + 7, "mul": want * 3, "neg_max": np.maximum(-want, -4)}[op]

  def run(dev: str) -> Tuple[np.ndarray, np.ndarray]:
    moved = _move(Tensor(base, device=dev), ops).contiguous()
    return moved.numpy(), fxn[op](moved).numpy()

  got, got_op = run(device)
  _compare(got, want, f"{device}: contiguous after {ops}")
  _compare(got_op, want_op, f"{device}: {op} after {ops}")
  if device != "PYTHON":
    ref, ref_op = run("PYTHON")
    _compare(got, ref, f"{device} vs PYTHON: contiguous after {ops}")
    _compare(got_op, ref_op, f"{device} vs PYTHON: {op} after {ops}")


# *** reduces ***

@st.composite
def _reduce_case(draw: st.DrawFn) -> Tuple[Tuple[int, ...], Tuple[int, ...], str, DType, bool]:
  shape = draw(shapes(min_dims=1, max_dims=4, max_size=96))
  axes = tuple(sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
  return shape, axes, draw(st.sampled_from(["sum", "max", "min"])), draw(st.sampled_from([dtypes.float32, dtypes.int32])), draw(st.booleans())


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=_examples(6), deadline=None)
@given(case=_reduce_case(), seed=st.integers(0, 2**16), permute=st.booleans())
def test_random_reduce(device, case, seed, permute):
  shape, axes, op, dt, keepdim = case
  rng = np.random.default_rng(seed)
  a = (rng.uniform(-3, 3, shape) if dt == dtypes.float32 else rng.integers(-100, 100, shape)).astype(_np(dt))
  order = tuple(reversed(range(len(shape)))) if permute else tuple(range(len(shape)))
  src = a.transpose(order)
  want = getattr(src, op)(axis=axes, keepdims=keepdim)

  def run(dev: str) -> np.ndarray:
    t = Tensor(a, device=dev).permute(order)
    return getattr(t, op)(axis=axes, keepdim=keepdim).numpy()

  got = run(device)
  tol = 1e-5 if dt == dtypes.float32 else 0.0
  _compare(got, want.astype(got.dtype) if op == "sum" else want, f"{device}: {op}{axes} of {src.shape}", atol=tol, rtol=tol)
  if device != "PYTHON":
    _compare(got, run("PYTHON"), f"{device} vs PYTHON: {op}{axes} of {src.shape}", atol=tol, rtol=tol)


# *** ALU expression trees ***

FLOAT_TREE_DTYPES = [dtypes.float32, dtypes.float64]
INT_TREE_DTYPES = [dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.uint32]

# name: (arity, numpy fxn, tiny fxn); numpy operands are arrays of the tree's dtype
FLOAT_OPS: Dict[str, Tuple[int, Callable[..., Any], Callable[..., Any]]] = {
  "add": (2, lambda a, b: a + b, lambda a, b: a + b),
  "sub": (2, lambda a, b: a - b, lambda a, b: a - b),
  "mul": (2, lambda a, b: a * b, lambda a, b: a * b),
  "max": (2, np.maximum, lambda a, b: a.maximum(b)),
  "where_lt": (2, lambda a, b: np.where(a < b, a, b * 2), lambda a, b: (a < b).where(a, b * 2)),
  "neg": (1, lambda a: -a, lambda a: -a),
  "sin": (1, np.sin, lambda a: a.sin()),
  "sqrt_abs": (1, lambda a: np.sqrt(np.abs(a)), lambda a: a.abs().sqrt()),
  "recip_1p_sq": (1, lambda a: np.reciprocal(a * a + 1), lambda a: (a * a + 1).reciprocal()),
  "exp2_sin": (1, lambda a: np.exp2(np.sin(a)), lambda a: a.sin().exp2()),
  "log2_1p_sq": (1, lambda a: np.log2(a * a + 1), lambda a: (a * a + 1).log2()),
}


def _trunc_div(a: np.ndarray, k: int) -> np.ndarray:
  q = np.abs(a.astype(np.int64)) // k
  return np.where(a < 0, -q, q).astype(a.dtype)


INT_OPS: Dict[str, Tuple[int, Callable[..., Any], Callable[..., Any]]] = {
  "add": (2, lambda a, b: a + b, lambda a, b: a + b),
  "sub": (2, lambda a, b: a - b, lambda a, b: a - b),
  "mul": (2, lambda a, b: a * b, lambda a, b: a * b),
  "max": (2, np.maximum, lambda a, b: a.maximum(b)),
  "xor": (2, lambda a, b: a ^ b, lambda a, b: a ^ b),
  "and": (2, lambda a, b: a & b, lambda a, b: a & b),
  "or": (2, lambda a, b: a | b, lambda a, b: a | b),
  "where_ne": (2, lambda a, b: np.where(a != b, a, b + b.dtype.type(1)), lambda a, b: (a != b).where(a, b + 1)),
  "idiv3": (1, lambda a: _trunc_div(a, 3), lambda a: a.idiv(3)),
  "neg": (1, lambda a: -a, lambda a: -a),
}


def _trees(ops: Dict[str, Tuple[int, Any, Any]], n_inputs: int) -> st.SearchStrategy[Any]:
  leaves = st.integers(0, n_inputs - 1).map(lambda i: ("in", i))

  def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    un = [k for k, v in ops.items() if v[0] == 1]
    bi = [k for k, v in ops.items() if v[0] == 2]
    return st.one_of(st.tuples(st.sampled_from(un), children), st.tuples(st.sampled_from(bi), children, children))
  return st.recursive(leaves, extend, max_leaves=6)


def _eval(tree: Any, inputs: List[Any], ops: Dict[str, Tuple[int, Any, Any]], which: int) -> Any:
  if tree[0] == "in":
    return inputs[tree[1]]
  return ops[tree[0]][which](*[_eval(t, inputs, ops, which) for t in tree[1:]])


@pytest.mark.parametrize("device", DEVICES)
def test_narrow_int_results_wrap(device):
  """An int8/uint8 result wraps to its dtype before it feeds a division or a comparison (as in numpy)."""
  a = np.array([-128, 100, 7, 127], dtype=np.int8)
  u = np.array([0, 3, 200, 255], dtype=np.uint8)
  ta, tu = Tensor(a, device=device), Tensor(u, device=device)
  _compare(ta.neg().idiv(3).numpy(), _trunc_div(-a, 3), f"{device}: -(int8) idiv 3")
  _compare((ta * ta).idiv(3).numpy(), _trunc_div(a * a, 3), f"{device}: (int8 * int8) idiv 3")
  _compare(((ta * 2) < 0).numpy(), (a * 2) < 0, f"{device}: int8 * 2 < 0")
  _compare(((tu - 5) < 10).numpy(), (u - np.uint8(5)) < 10, f"{device}: uint8 - 5 < 10")
  _compare((tu + tu).maximum(tu).numpy(), np.maximum(u + u, u), f"{device}: max(uint8 + uint8, uint8)")


@st.composite
def _tree_case(draw: st.DrawFn, device: str) -> Tuple[DType, Any, int]:
  ints = list(INT_TREE_DTYPES)
  dt = draw(st.sampled_from(FLOAT_TREE_DTYPES + ints))
  ops = FLOAT_OPS if dtypes.is_float(dt) else INT_OPS
  return dt, draw(_trees(ops, 3)), draw(st.integers(0, 2**16))


def _inputs(dt: DType, seed: int) -> List[np.ndarray]:
  rng = np.random.default_rng(seed)
  if dtypes.is_float(dt):
    return [rng.uniform(-2, 2, (4, 5)).astype(_np(dt)) for _ in range(3)]
  info = np.iinfo(_np(dt))
  lo, hi = max(int(info.min), -1000), min(int(info.max), 1000)
  return [rng.integers(lo, hi, (4, 5), endpoint=True).astype(_np(dt)) for _ in range(3)]


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=_examples(10), deadline=None)
@given(data=st.data())
def test_random_alu_tree(device, data):
  dt, tree, seed = data.draw(_tree_case(device), label="case")
  ops = FLOAT_OPS if dtypes.is_float(dt) else INT_OPS
  arrays = _inputs(dt, seed)
  with np.errstate(all="ignore"):
    want = np.asarray(_eval(tree, arrays, ops, 1))

  def run(dev: str) -> Tensor:
    return _eval(tree, [Tensor(a, device=dev) for a in arrays], ops, 2)

  out = run(device)
  assert out.dtype == dt, f"{device}: {tree} gave {out.dtype}, expected {dt}"
  got = out.numpy()
  # float trees: elementwise error grows with the values, so compare relative to the result's magnitude
  tol = {dtypes.float32: 1e-4, dtypes.float64: 1e-10}.get(dt, 0.0)
  scale = float(np.nanmax(np.abs(want[np.isfinite(want)]), initial=1.0)) if tol else 0.0
  _compare(got, want.astype(got.dtype), f"{device}: {dt} tree {tree}", atol=tol * scale, rtol=tol)
  if device != "PYTHON":
    _compare(got, run("PYTHON").numpy(), f"{device} vs PYTHON: {dt} tree {tree}", atol=tol * scale, rtol=tol)
