"""MAX against a constant (tiny_clang.renderer.max_const_side): both renderers spell it with one compare, which must keep
tiny's MAX semantics (a NaN from either side wins, the first operand wins ties) for scalars and vectors, with the constant
on either side. A hand-built kernel computes out = MAX(x, c) or MAX(c, x) and is checked against tiny.ops.python_alu's
rule written out in numpy (zeros and NaN constants take the general form)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import PtrDType, dtypes
from tiny.ops import BinaryOps

from tiny_clang.renderer import max_const_side


def _max_kernel(dt: Any, lanes: int, n: int, c: float, const_first: bool) -> list:
  """out[i] = MAX(in[i], c) (or MAX(c, in[i])), `lanes` values per step."""
  g0 = UOp(UOps.DEFINE_GLOBAL, PtrDType(dt), (), (0, True))
  g1 = UOp(UOps.DEFINE_GLOBAL, PtrDType(dt), (), (1, False))
  end, zero, step = (UOp(UOps.CONST, dtypes.int32, (), v) for v in (n // lanes, 0, lanes))
  r = UOp(UOps.RANGE, dtypes.int32, (zero, end), (0, False))
  idx = UOp(UOps.ALU, dtypes.int32, (r, step), BinaryOps.MUL)
  vdt = dt.vec(lanes) if lanes > 1 else dt
  v = UOp(UOps.LOAD, vdt, (g1, idx))
  k = UOp(UOps.CONST, dt, (), c)
  kv = UOp(UOps.VECTORIZE, vdt, (k,) * lanes) if lanes > 1 else k
  y = UOp(UOps.ALU, vdt, (kv, v) if const_first else (v, kv), BinaryOps.MAX)
  st = UOp(UOps.STORE, None, (g0, idx, y))
  consts = [k, kv] if lanes > 1 else [k]
  return [g0, g1, end, zero, step, *consts, r, idx, v, y, st, UOp(UOps.ENDRANGE, None, (r,))]


def _tiny_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """tiny's MAX: a if a >= b or a is NaN, else b."""
  return np.where((a >= b) | np.isnan(a), a, b)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
@pytest.mark.parametrize("lanes", [1, 16])
@pytest.mark.parametrize("const_first", [False, True])
@pytest.mark.parametrize("c", [-104.0, 0.0, -0.0, float("inf"), float("-inf")])
def test_max_against_const(backend: Any, dt: Any, lanes: int, const_first: bool, c: float) -> None:
  npdt = np.float32 if dt == dtypes.float32 else np.float64
  rng = np.random.default_rng(3)
  special = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -104.0, -103.99, -104.01, 1.0, -1.0, 1e-40, -1e-40]
  x = np.concatenate([special, rng.normal(0, 100, 99)]).astype(npdt)
  x = np.resize(x, (len(x) + 15) // 16 * 16)
  uops = _max_kernel(dt, lanes, len(x), c, const_first)
  assert max_const_side(uops[-3]) == (None if c == 0 else 0 if const_first else 1)
  out = backend.run(uops, np.zeros_like(x), [x], name="maxc")
  cv = np.full_like(x, c)
  ref = _tiny_max(cv, x) if const_first else _tiny_max(x, cv)
  assert np.array_equal(np.isnan(out), np.isnan(ref)), f"NaN lost or made: x={x[np.isnan(out) != np.isnan(ref)]}"
  fin = ~np.isnan(ref)
  # bitwise, so that the sign of a zero is the one tiny's rule picks
  assert np.array_equal(out[fin].view(np.uint32 if npdt is np.float32 else np.uint64),
                        ref[fin].view(np.uint32 if npdt is np.float32 else np.uint64)), f"{out[fin]} vs {ref[fin]}"


@pytest.mark.parametrize("c", [float("nan"), 0.0, -0.0])
def test_nan_and_zero_consts_keep_general_max(c: float) -> None:
  """A NaN constant is not taken (the one-compare form would drop it), nor a zero (the sign a tie gives)."""
  uops = _max_kernel(dtypes.float32, 16, 16, c, False)
  assert max_const_side(uops[-3]) is None


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_max_reduce_rows_keep_nan_and_order(device: str) -> None:
  """Row maxes (the 4-vector steps and tiny_clang.renderer.cpu_matcher's regrouping of the MAX accumulator): a NaN in any of
  the first 64 positions makes its row NaN, -inf rows stay -inf, and every other row gets numpy's max."""
  from tiny import Tensor
  rng = np.random.default_rng(4)
  x = rng.normal(0, 10, (70, 4096)).astype(np.float32)
  for i in range(64):
    x[i, i * 17 % 4096 if i % 2 else i] = np.nan
  x[64, :] = -np.inf
  x[65, 4095] = 1e30
  x[66, :] = -3.0
  x[66, 1000] = -2.0
  out = Tensor(x, device=device).max(-1).numpy()
  ref = x.max(-1)
  assert np.array_equal(np.isnan(out), np.isnan(ref))
  np.testing.assert_array_equal(out[~np.isnan(ref)], ref[~np.isnan(ref)])
  sm = Tensor(x, device=device).softmax(-1).numpy()
  assert np.isnan(sm[:64]).all() and np.isnan(sm[64]).all()
  e = np.exp(x[65:].astype(np.float64) - x[65:].max(-1, keepdims=True))
  # (float32's x - max rounds by up to |x - max| * 2^-25, which exp turns into a relative error: ~1e-6 here)
  np.testing.assert_allclose(sm[65:], e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-30)
