"""The vector exp2/log2 helpers (tiny_clang.vmath) of both renderers: a hand-built kernel applies EXP2/LOG2 to float32
vectors of 4, 8 and 16 lanes, checked against numpy (float64, rounded) over every binary exponent and the special values."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import PtrDType, dtypes
from tiny.ops import BinaryOps, UnaryOps

F32 = dtypes.float32


def _vector_kernel(op: Any, lanes: int, n: int) -> list:
  """out[i*lanes : (i+1)*lanes] = op(in[...]) as one vector op per step."""
  g0 = UOp(UOps.DEFINE_GLOBAL, PtrDType(F32), (), (0, True))
  g1 = UOp(UOps.DEFINE_GLOBAL, PtrDType(F32), (), (1, False))
  end, zero, step = (UOp(UOps.CONST, dtypes.int32, (), v) for v in (n // lanes, 0, lanes))
  r = UOp(UOps.RANGE, dtypes.int32, (zero, end), (0, False))
  idx = UOp(UOps.ALU, dtypes.int32, (r, step), BinaryOps.MUL)
  v = UOp(UOps.LOAD, F32.vec(lanes), (g1, idx))
  y = UOp(UOps.ALU, F32.vec(lanes), (v,), op)
  st = UOp(UOps.STORE, None, (g0, idx, y))
  return [g0, g1, end, zero, step, r, idx, v, y, st, UOp(UOps.ENDRANGE, None, (r,))]


def _inputs(op: Any) -> np.ndarray:
  rng = np.random.default_rng(1)
  if op is UnaryOps.EXP2:
    xs = [rng.uniform(-160, 140, 30000), rng.uniform(-1, 1, 10000), np.arange(-155, 131, 0.25),
          [np.nan, np.inf, -np.inf, 0.0, -0.0, 128, 127.999, -149, -150, -126.5, -151.5, -152, 129, 1e-30, -1e-30]]
  else:
    xs = [np.exp2(rng.uniform(-149, 128, 30000)), rng.uniform(0, 3, 10000), np.exp2(np.arange(-149.0, 128.0)),
          [np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1.0, 2.0, 1e-45, 1.4e-45, 1e-40, 3.4e38, np.sqrt(2), 0.70710677]]
  x = np.concatenate([np.asarray(a, np.float64) for a in xs]).astype(np.float32)
  return np.resize(x, (len(x) + 63) // 64 * 64)


@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("op", [UnaryOps.EXP2, UnaryOps.LOG2])
def test_vector_exp2_log2_match_numpy(backend: Any, op: Any, lanes: int) -> None:
  x = _inputs(op)
  uops = _vector_kernel(op, lanes, len(x))
  _, src = backend.build(uops, "vmath")
  assert ("tiny_exp2_" if op is UnaryOps.EXP2 else "tiny_log2_") in src, "the vector helper should be used, not a per-lane libm call"
  out = backend.run(uops, np.zeros_like(x), [x], name="vmath")
  with np.errstate(all="ignore"):
    ref = (np.exp2 if op is UnaryOps.EXP2 else np.log2)(x.astype(np.float64)).astype(np.float32)
  same_nan = np.isnan(out) == np.isnan(ref)
  assert same_nan.all(), f"NaN mismatch at {x[~same_nan][:5]}: {out[~same_nan][:5]} vs {ref[~same_nan][:5]}"
  fin = ~np.isnan(ref)
  assert (out[fin & np.isinf(ref)] == ref[fin & np.isinf(ref)]).all(), "infinities must be exact"
  with np.errstate(all="ignore"):
    ok = np.isclose(out, ref, rtol=3e-7, atol=1e-7 if op is UnaryOps.LOG2 else 0) | (np.abs(out - ref) <= 2e-45) | ~fin
  assert ok.all(), f"{(~ok).sum()} values off: x={x[~ok][:5]} got {out[~ok][:5]} want {ref[~ok][:5]}"
