"""NaN, inf and signed zero as torch has them, on every device that computes, under NOOPT and the default heuristic.

Floats are compared bit for bit where it matters: the same NaN positions, the same values elsewhere and the same sign
bit on every non-NaN element (np.signbit tells -0.0 from +0.0). The sign of a NaN is not compared: torch does not fix it.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

from tiny.codegen.uopgraph import constant_folder, graph_rewrite
from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType, dtypes
from tiny.helpers import Context
from tiny.ops import BinaryOps, UnaryOps, exec_alu
from tiny.registry import Device
from tiny.shape.symbolic import Variable
from tiny.tensor import Tensor

torch = pytest.importorskip("torch")

COMPUTE = [d for d in ("CLANG", "LLVM", "PYTHON") if d in Device.get_available_devices()]
OPT_MODES = {"noopt": {"NOOPT": 1}, "heuristic": {"NOOPT": 0}}
FLOATS: Dict[str, Tuple[DType, Any, Any]] = {"float16": (dtypes.float16, np.float16, torch.float16), "float32": (dtypes.float32, np.float32, torch.float32),
          "float64": (dtypes.float64, np.float64, torch.float64)}
nan, inf = math.nan, math.inf
# every kind of special value next to ordinary ones, the halves that round to even, and values in (-1, 0) that round to -0.0
SPECIALS = [0.0, -0.0, nan, inf, -inf, 1.5, -1.5, 2.5, -2.5, 0.5, -0.5, 0.4, -0.4, 0.7, -0.7, 3.0, -3.0, 1e-30, -1e-30]


@pytest.fixture(params=COMPUTE)
def device(request: pytest.FixtureRequest) -> str:
  return str(request.param)


@pytest.fixture(params=list(OPT_MODES))
def mode(request: pytest.FixtureRequest) -> Dict[str, int]:
  return OPT_MODES[str(request.param)]


def assert_same(got: np.ndarray, want: np.ndarray, what: str, rtol: float = 0.0, signs: bool = True) -> None:
  """Same shape, NaN where want has NaN, equal (within rtol) elsewhere, and (signs) the same sign bit on every non-NaN."""
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  if not np.issubdtype(want.dtype, np.floating):
    np.testing.assert_array_equal(got, want, err_msg=what)
    return
  g, w = got.astype(np.float64), want.astype(np.float64)
  np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}: NaN positions")
  ok = ~np.isnan(w)
  np.testing.assert_allclose(g[ok], w[ok], rtol=rtol, atol=0, err_msg=what)
  if signs:
    np.testing.assert_array_equal(np.signbit(g[ok]), np.signbit(w[ok]), err_msg=f"{what}: sign bits (-0.0 vs +0.0)")


def both(data: Any, np_dt: Any, tiny_dt: DType, torch_dt: Any, device: str, requires_grad: bool = False) -> tuple:
  arr = np.array(data, dtype=np_dt)
  return (Tensor(arr, dtype=tiny_dt, device=device, requires_grad=requires_grad),
          torch.tensor(arr, dtype=torch_dt, requires_grad=requires_grad))


# *** argmax / argmin / max / min ***

ARG_CASES: List[Any] = [
  [1.0, nan, 3.0, nan, 2.0],               # the first NaN, not one past the end
  [nan, 5.0, nan],
  [1.0, 3.0, 3.0, 2.0],                    # ties: the first maximum
  [-inf, nan, inf],
  [[1.0, nan, 3.0, 0.0], [4.0, 5.0, 6.0, 6.0], [nan, 1.0, nan, 7.0]],
  [[nan, nan], [-0.0, 0.0]],
]


@pytest.mark.parametrize("case", range(len(ARG_CASES)))
def test_argmax_argmin_pick_the_first_nan(device: str, mode: Dict[str, int], case: int) -> None:
  data = ARG_CASES[case]
  with Context(**mode):
    t, tt = both(data, np.float32, dtypes.float32, torch.float32, device)
    for fn in ("argmax", "argmin"):
      assert_same(getattr(t, fn)().numpy(), getattr(tt, fn)().numpy().astype(np.int32), f"{fn}({data})")
      for axis in range(t.ndim):
        for keepdim in (False, True):
          assert_same(getattr(t, fn)(axis, keepdim).numpy(), getattr(tt, fn)(axis, keepdim).numpy().astype(np.int32),
                      f"{fn}({data}, axis={axis}, keepdim={keepdim})")


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_argmax_nan_other_floats(device: str, mode: Dict[str, int], dtype: str) -> None:
  tiny_dt, np_dt, torch_dt = FLOATS[dtype]
  data = [[1.0, nan, 3.0, nan], [2.0, 2.0, -inf, 1.0]]
  with Context(**mode):
    t, tt = both(data, np_dt, tiny_dt, torch_dt, device)
    assert_same(t.argmax(1).numpy(), tt.argmax(1).numpy().astype(np.int32), f"{dtype} argmax")
    assert_same(t.argmin(0).numpy(), tt.argmin(0).numpy().astype(np.int32), f"{dtype} argmin")


@pytest.mark.parametrize("dtype", list(FLOATS))
def test_max_min_reductions_propagate_nan(device: str, mode: Dict[str, int], dtype: str) -> None:
  tiny_dt, np_dt, torch_dt = FLOATS[dtype]
  # rows long enough for the vectorized (compare + blend) reduce, with the NaN in different lanes
  rng = np.random.default_rng(0)
  data = rng.standard_normal((6, 37)).astype(np_dt)
  for row, col in enumerate((0, 5, 31, 36)):
    data[row, col] = nan
  data[4, 3], data[5, 9] = inf, -inf
  with Context(**mode):
    t, tt = both(data, np_dt, tiny_dt, torch_dt, device)
    assert_same(t.max(1).numpy(), tt.amax(1).numpy(), f"{dtype} max(1)")
    assert_same(t.min(1).numpy(), tt.amin(1).numpy(), f"{dtype} min(1)")
    assert_same(t.max(0).numpy(), tt.amax(0).numpy(), f"{dtype} max(0)")
    assert_same(t.max().numpy(), tt.max().numpy(), f"{dtype} max()")
    assert_same(t[4:].min().numpy(), tt[4:].min().numpy(), f"{dtype} min() without NaN")


def test_max_backward_with_nan(device: str, mode: Dict[str, int]) -> None:
  data = [[1.0, nan, 3.0, nan], [2.0, 4.0, 4.0, 1.0], [0.0, -1.0, 0.0, -0.0]]
  with Context(**mode):
    t, tt = both(data, np.float32, dtypes.float32, torch.float32, device, requires_grad=True)
    t.max(1).sum().backward()
    # torch's full max() shares the gradient between ties and between NaNs; its amax(1) gives NaN to a whole row with
    # a NaN, and max(1) all to one index
    sum(row.max() for row in tt).backward()
    assert t.grad is not None
    assert_same(t.grad.numpy(), tt.grad.numpy(), "max(1) backward")


# *** folds that are wrong for floats ***

FOLD_DATA = [1.0, nan, inf, -inf, -2.0, 0.0, -0.0]


@pytest.mark.parametrize("dtype", list(FLOATS))
def test_no_unsafe_float_folds(device: str, mode: Dict[str, int], dtype: str) -> None:
  tiny_dt, np_dt, torch_dt = FLOATS[dtype]
  cases: Dict[str, Callable[[Any], Any]] = {
    "x*0": lambda x: x * 0, "0*x": lambda x: 0 * x, "x*0.0": lambda x: x * 0.0, "x*(-0.0)": lambda x: x * -0.0,
    "x-x": lambda x: x - x, "x/x": lambda x: x / x, "x*1": lambda x: x * 1, "x*-1": lambda x: x * -1,
    "x+(-0.0)": lambda x: x + -0.0, "(x*0)*2": lambda x: (x * 0) * 2,
  }
  with Context(**mode):
    t, tt = both(FOLD_DATA, np_dt, tiny_dt, torch_dt, device)
    for name, fn in cases.items():
      assert_same(fn(t).numpy(), fn(tt).numpy(), f"{dtype} {name}")
    # a zeros tensor times x, in one kernel with x
    assert_same((Tensor.zeros(len(FOLD_DATA), dtype=tiny_dt, device=device) * t).numpy(), (torch.zeros_like(tt) * tt).numpy(),
                f"{dtype} zeros*x")


def test_int_times_zero_still_folds(device: str) -> None:
  # index math needs x*0 -> 0 for ints: the product is a constant before anything runs
  x = Tensor([3, -7, 2**30], dtype=dtypes.int32, device=device)
  y = x * 0
  assert y.lazydata.base.is_unrealized_const() and y.lazydata.base.arg == 0
  np.testing.assert_array_equal(y.numpy(), np.zeros(3, np.int32))


def _eval(u: UOp, env: Dict[str, Any]) -> Any:
  """Value of a scalar uop graph of constants, DEFINE_VARs, ALU ops and casts."""
  assert u.dtype is not None
  if u.op is UOps.CONST:
    return u.arg
  if u.op is UOps.DEFINE_VAR:
    return env[u.arg.expr]
  if u.op is UOps.CAST:
    return exec_alu(UnaryOps.CAST, u.dtype, [_eval(u.src[0], env)])
  assert u.op is UOps.ALU, f"the rewrite left a {u.op}"
  return exec_alu(u.arg, u.dtype, [_eval(s, env) for s in u.src])


def test_loop_collapse_of_an_empty_box_is_zero_for_inf() -> None:
  # sum over r in [0, 8) of (r < g ? x : 0) collapses to x * (number of r below g): g == 0 must still give 0 for x = inf
  g = UOp(UOps.DEFINE_VAR, dtypes.int32, (), Variable("g", 0, 8))
  x = UOp(UOps.DEFINE_VAR, dtypes.float32, (), Variable("x", 0, 1))
  r = UOp(UOps.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 8)), (0, True))
  red = UOp(UOps.REDUCE, dtypes.float32, (r.lt(g).where(x, UOp.const(dtypes.float32, 0.0)), r), BinaryOps.ADD)
  out = graph_rewrite(UOp(UOps.SINK, None, (red,)), constant_folder).src[0]
  assert not any(p.op is UOps.RANGE for p in (out, *out.sparents)), "the loop was not collapsed"
  for gv in (0, 3, 8):
    for xv in (inf, -inf, 1.5):
      want = sum(xv if i < gv else 0.0 for i in range(8))
      got = _eval(out, {"g": gv, "x": xv})
      assert got == want, f"g={gv} x={xv}: {got} != {want}"
  assert math.isnan(_eval(out, {"g": 2, "x": nan}))


# *** maximum / minimum / relu ***

def test_maximum_minimum_propagate_nan_from_either_side(device: str, mode: Dict[str, int]) -> None:
  a = [0.0, nan, 2.0, -inf, inf, nan, 1.0, -3.0]
  b = [1.0, 1.0, nan, 1.0, 1.0, nan, 1.0, -0.5]
  with Context(**mode):
    ta, tta = both(a, np.float32, dtypes.float32, torch.float32, device)
    tb, ttb = both(b, np.float32, dtypes.float32, torch.float32, device)
    for name in ("maximum", "minimum"):
      assert_same(getattr(ta, name)(tb).numpy(), getattr(torch, name)(tta, ttb).numpy(), f"{name}(a, b)")
      assert_same(getattr(tb, name)(ta).numpy(), getattr(torch, name)(ttb, tta).numpy(), f"{name}(b, a)")
    assert_same(ta.maximum(0.0).numpy(), torch.clamp_min(tta, 0.0).numpy(), "maximum(a, 0)")
    assert_same(ta.clip(-1.0, 1.0).numpy(), tta.clip(-1.0, 1.0).numpy(), "clip")


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_backward_with_nan(device: str, mode: Dict[str, int], name: str) -> None:
  a = [1.0, nan, 3.0, 2.0, -1.0]
  b = [2.0, 2.0, nan, 2.0, nan]
  with Context(**mode):
    ta, tta = both(a, np.float32, dtypes.float32, torch.float32, device, requires_grad=True)
    tb, ttb = both(b, np.float32, dtypes.float32, torch.float32, device, requires_grad=True)
    getattr(ta, name)(tb).sum().backward()
    getattr(torch, name)(tta, ttb).sum().backward()
    assert ta.grad is not None and tb.grad is not None
    ga, gb = ta.grad.numpy(), tb.grad.numpy()
  assert np.isfinite(ga).all() and np.isfinite(gb).all()
  # where neither side is NaN: torch's values (0/1, and 0.5 each on the tie)
  clean = ~(np.isnan(a) | np.isnan(b))
  # (the sign of a zero gradient is not part of the contract)
  assert_same(ga[clean], tta.grad.numpy()[clean], f"{name} grad a", signs=False)
  assert_same(gb[clean], ttb.grad.numpy()[clean], f"{name} grad b", signs=False)
  # where one side is NaN the result is that NaN: it gets the gradient, the other side's value did not matter
  # (torch gives 1 to both there)
  np.testing.assert_array_equal(ga[~clean], np.isnan(np.array(a))[~clean].astype(np.float32))
  np.testing.assert_array_equal(gb[~clean], (np.isnan(np.array(b)) & ~np.isnan(np.array(a)))[~clean].astype(np.float32))


def test_relu_nan_and_signed_zero(device: str, mode: Dict[str, int]) -> None:
  data = np.array(SPECIALS * 4, dtype=np.float32)   # long enough for the vector MAX
  with Context(**mode):
    t, tt = both(data, np.float32, dtypes.float32, torch.float32, device, requires_grad=True)
    out, tout = t.relu(), tt.relu()
    assert_same(out.numpy(), tout.detach().numpy(), "relu")
    out.sum().backward()
    tout.sum().backward()
    assert t.grad is not None
    assert_same(t.grad.numpy(), tt.grad.numpy(), "relu backward")


# *** signed zero ***

UNARY: Dict[str, Callable[[Any], Any]] = {
  "abs": lambda x: x.abs(), "sign": lambda x: x.sign(), "trunc": lambda x: x.trunc(), "floor": lambda x: x.floor(),
  "ceil": lambda x: x.ceil(), "round": lambda x: x.round(), "relu": lambda x: x.relu(), "neg": lambda x: -x,
}


@pytest.mark.parametrize("dtype", list(FLOATS))
def test_unary_signed_zero_nan_inf(device: str, mode: Dict[str, int], dtype: str) -> None:
  tiny_dt, np_dt, torch_dt = FLOATS[dtype]
  with Context(**mode):
    t, tt = both(SPECIALS, np_dt, tiny_dt, torch_dt, device)
    for name, fn in UNARY.items():
      assert_same(fn(t).numpy(), fn(tt).numpy(), f"{dtype} {name}")


@pytest.mark.parametrize("dtype", list(FLOATS))
def test_tanh_near_zero(device: str, mode: Dict[str, int], dtype: str) -> None:
  tiny_dt, np_dt, torch_dt = FLOATS[dtype]
  # tanh(x) rounds to x this close to 0 (|x| well below sqrt(eps)); -0.0 stays -0.0
  tiny_x = float(np.sqrt(np.finfo(np_dt).eps)) / 8
  data = [0.0, -0.0, 1e-30, -1e-30, tiny_x, -tiny_x, tiny_x / 3, -tiny_x / 1000, nan, inf, -inf]
  with Context(**mode):
    t, tt = both(data, np_dt, tiny_dt, torch_dt, device)
    assert_same(t.tanh().numpy(), tt.tanh().numpy(), f"{dtype} tanh", rtol=float(np.finfo(np_dt).eps))


@pytest.mark.parametrize("dtype", list(FLOATS))
def test_round_exact_halves_and_large_values(device: str, mode: Dict[str, int], dtype: str) -> None:
  tiny_dt, np_dt, torch_dt = FLOATS[dtype]
  finfo = np.finfo(np_dt)
  big = 2.0 ** finfo.nmant   # from here on every float is whole
  # the float just below 0.5 (x + 0.5 rounds up to 1 there), odd and even values around 2^mant, and halves next to them
  data = [float(np.nextafter(np_dt(0.5), np_dt(0))), -float(np.nextafter(np_dt(0.5), np_dt(0))), big - 0.5, -(big - 0.5),
          big - 1.5, big + 1, -(big + 1), big / 2 + 0.5, 1e4, -1e4, 0.5000001 if dtype != "float16" else 0.5009765625]
  with Context(**mode):
    t, tt = both(data, np_dt, tiny_dt, torch_dt, device)
    for name in ("round", "trunc", "floor", "ceil"):
      assert_same(UNARY[name](t).numpy(), UNARY[name](tt).numpy(), f"{dtype} {name}")


def test_abs_sign_backward(device: str, mode: Dict[str, int]) -> None:
  data = [1.0, nan, -0.0, 0.0, -1.0, inf, -inf]
  with Context(**mode):
    for name in ("abs", "sign"):
      t, tt = both(data, np.float32, dtypes.float32, torch.float32, device, requires_grad=True)
      UNARY[name](t).sum().backward()
      UNARY[name](tt).sum().backward()
      assert t.grad is not None
      got, want = t.grad.numpy(), tt.grad.numpy()
      # 0 at the zeros (torch's sgn(0)); at the NaN tiny's abs passes the gradient on (torch gives 0), finite either way
      assert np.isfinite(got).all(), f"{name} backward {got}"
      keep = ~np.isnan(np.array(data)) if name == "abs" else np.ones(len(data), bool)
      assert_same(got[keep], want[keep], f"{name} backward", signs=False)


def test_pow_zero_of_inf_and_nan(device: str, mode: Dict[str, int]) -> None:
  data = [inf, -inf, nan, 0.0, -0.0, 2.0]
  with Context(**mode):
    t, tt = both(data, np.float32, dtypes.float32, torch.float32, device, requires_grad=True)
    (t ** 0).sum().backward()
    (tt ** 0).sum().backward()
    assert_same((t ** 0).numpy(), (tt ** 0).detach().numpy(), "x ** 0")
    assert t.grad is not None
    assert_same(t.grad.numpy(), tt.grad.numpy(), "x ** 0 backward")



# *** sums of negative zeros: numpy and torch start a sum at +0.0, so a sum of only -0.0 is +0.0 ***

NEG_ZERO_SUMS: List[Tuple[str, Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = [
  ("size-1 axis", lambda t: t.reshape(12, 1).sum(1), lambda a: a.reshape(12, 1).sum(1)),
  ("one element", lambda t: t[:1].sum(), lambda a: a[:1].sum()),
  ("all (unrolled)", lambda t: t.reshape(3, 4).sum(), lambda a: a.reshape(3, 4).sum()),
  ("axis 0", lambda t: t.reshape(3, 4).sum(0), lambda a: a.reshape(3, 4).sum(0)),
  ("axis 1", lambda t: t.reshape(3, 4).sum(1), lambda a: a.reshape(3, 4).sum(1)),
  ("no axis", lambda t: t.sum(axis=()), lambda a: np.sum(a, axis=())),
  ("0-d", lambda t: t[0].sum(), lambda a: a[0].sum()),
  ("mean", lambda t: t.reshape(3, 4).mean(1), lambda a: a.reshape(3, 4).mean(1)),
  ("matmul", lambda t: t.reshape(3, 4) @ Tensor.ones(4, 2, dtype=t.dtype, device=t.device), lambda a: a.reshape(3, 4) @ np.ones((4, 2), a.dtype)),
  ("where", lambda t: (t > 1).where(t, t).reshape(3, 4).sum(1), lambda a: np.where(a > 1, a, a).reshape(3, 4).sum(1)),
  ("padded", lambda t: t.reshape(3, 4).pad(((1, 1), None)).sum(0), lambda a: np.pad(a.reshape(3, 4), ((1, 1), (0, 0))).sum(0)),
  ("long rows", lambda t: t.reshape(1, 12).expand(64, 12).reshape(16, 48).sum(1), lambda a: np.broadcast_to(a.reshape(1, 12), (64, 12)).reshape(16, 48).sum(1)),
  ("times -1", lambda t: (t.abs() * -1).reshape(3, 4).sum(1), lambda a: (np.abs(a) * -1).reshape(3, 4).sum(1)),
]


@pytest.mark.parametrize("case", [c[0] for c in NEG_ZERO_SUMS])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_sum_of_negative_zeros_is_positive_zero(device: str, mode: Dict[str, int], dtype: str, case: str) -> None:
  tiny_dt, np_dt, _ = FLOATS[dtype]
  _, fn, np_fn = next(c for c in NEG_ZERO_SUMS if c[0] == case)
  a = np.full(12, -0.0, dtype=np_dt)
  with Context(**mode):
    got = fn(Tensor(a, dtype=tiny_dt, device=device)).numpy()
  assert_same(got, np.asarray(np_fn(a)), f"{case} {dtype}")


@pytest.mark.parametrize("shape,axis", [((4, 5), None), ((4, 5), 1), ((3, 1), 1), ((2, 3, 1), (1, 2))])
def test_sum_of_a_negative_zero_constant(device: str, shape: tuple, axis: Any) -> None:
  # the lazy constant fold (a constant's sum is the constant times the count) and codegen's folds of a constant
  want = np.full(shape, -0.0, np.float32).sum(axis)
  assert_same(Tensor.full(shape, -0.0, device=device).sum(axis).numpy(), np.asarray(want), "const sum")
  assert_same((-Tensor.zeros(*shape, device=device)).sum(axis).numpy(), np.asarray(want), "-zeros sum")
  arange = Tensor.arange(int(np.prod(shape)), device=device).float().reshape(shape) * -0.0
  assert_same(arange.sum(axis).numpy(), np.asarray(want), "arange * -0.0 sum")


def test_sum_of_signed_zeros_keeps_values(device: str, mode: Dict[str, int]) -> None:
  # the +0.0 the sum starts from changes nothing else: mixed zeros, NaN and infinities as numpy has them
  a = np.array([[-0.0, 0.0, -0.0], [-0.0, -0.0, -0.0], [nan, -0.0, 1.0], [inf, -inf, -0.0], [-1e-30, 1e-30, -0.0], [-2.5, -0.0, -0.0]], np.float32)
  with Context(**mode):
    assert_same(Tensor(a, device=device).sum(1).numpy(), a.sum(1), "mixed rows")
    assert_same(Tensor(a, device=device).sum(0).numpy(), a.sum(0), "mixed columns")


def test_gather_and_loop_collapse_of_negative_zero(device: str) -> None:
  # a gather lowers to a one-hot sum that index collapse reads as one element: that is a copy, and keeps -0.0 as torch's
  # indexing does; a windowed constant sum loop-collapses to the constant times a count, which starts at +0.0
  src = np.full(6, -0.0, np.float32)
  idx = np.array([0, 3, 5], np.int32)
  assert_same(Tensor(src, device=device)[Tensor(idx, device=device)].numpy(), torch.tensor(src)[torch.tensor(idx).long()].numpy(), "gather")
  assert_same(Tensor.full((1, 4), -0.0, device=device).pad(((0, 0), (2, 2)), value=-0.0).sum(1).numpy(), np.full((1, 8), -0.0, np.float32).sum(1),
              "padded -0.0 constant sum")
  # a box of a -0.0 constant: loop collapse's count times the constant
  box = (Tensor.arange(8, device=device) < 5).where(Tensor.full((8,), -0.0, device=device), 0.0)
  assert_same(box.sum().numpy(), np.where(np.arange(8) < 5, -0.0, 0.0).astype(np.float32).sum(), "box sum")
