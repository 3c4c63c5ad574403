"""exp, exp2 and rsqrt are accurate to 2 ulp over the whole float32 range on every CPU device.

The reference is numpy in float64 rounded to float32 (float64 exp is accurate far beyond float32's precision, so that is
the correctly rounded result up to rare double-rounding ties). Errors are counted in ulps: the distance between the
two floats' positions in the ordered list of all floats, so a subnormal or an overflow to inf counts like any other miss.
The grids are dense over [-104, 89] for exp and [-151, 129] for exp2, which covers the top of the range (where
exp2(x*log2(e)) used to lose 60+ ulp), the subnormal results and the underflow to 0; each device runs the vectorized
kernels and (NOOPT) the scalar ones, which use other code (vector helpers vs libm / scalar arithmetic).
"""
from __future__ import annotations

from typing import Any, Callable, List

import numpy as np
import pytest

from tiny import Device, Tensor, dtypes
from tiny.helpers import Context

DEVICES = [d for d in Device.get_available_devices() if d in ("CLANG", "LLVM", "PYTHON")]
# (device, NOOPT): PYTHON interprets every uop itself, the optimizer changes nothing there
CONFIGS = [(d, n) for d in DEVICES for n in ((0, 1) if d != "PYTHON" else (0,))]


def ulp_diff(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """|got - want| in ulps of got's float type; NaN against NaN is 0, NaN against a number is inf."""
  it = {np.dtype(np.float16): np.int16, np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}[got.dtype]
  assert want.dtype == got.dtype

  def ordered(x: np.ndarray) -> np.ndarray:
    i = x.view(it).astype(np.int64)
    return np.where(i < 0, -(i & np.iinfo(it).max), i)  # -0.0 and 0.0 both map to 0
  d = np.abs(ordered(got) - ordered(want)).astype(np.float64)
  nan_g, nan_w = np.isnan(got), np.isnan(want)
  d[nan_g | nan_w] = np.inf
  d[nan_g & nan_w] = 0
  return d


def _grid(lo: float, hi: float, device: str, edges: List[float]) -> np.ndarray:
  """A dense float32 grid over [lo, hi], denser around the edges where the results overflow or go subnormal."""
  n = 1 << 20 if device != "PYTHON" else 2000
  parts = [np.linspace(lo, hi, n)] + [np.linspace(e - 1, e + 1, n // 8) for e in edges]
  return np.concatenate(parts).astype(np.float32)


def _check(fn: Callable[[Tensor], Tensor], ref: Callable[[np.ndarray], np.ndarray], x: np.ndarray, device: str, noopt: int,
           max_ulp: float = 2) -> None:
  with Context(NOOPT=noopt):
    got = fn(Tensor(x, device=device)).numpy()
  with np.errstate(all="ignore"):
    want = ref(x.astype(np.float64)).astype(x.dtype)
  err = ulp_diff(got, want)
  i = int(np.argmax(err))
  assert err[i] <= max_ulp, f"{err[i]} ulp at x={x[i]!r}: got {got[i]!r}, want {want[i]!r} ({int((err > max_ulp).sum())} points off)"


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, 1.0, -1.0, 3.4028235e38, -3.4028235e38], np.float32)


@pytest.mark.parametrize("device,noopt", CONFIGS)
def test_exp_float32_ulp(device: str, noopt: int) -> None:
  # 88.72284 is the first float whose exp overflows; below -87.34 results are subnormal, below -103.97 they round to 0
  x = np.concatenate([_grid(-104, 89, device, [88.72284, -87.33655, -103.97208]), SPECIAL,
                      np.float32([88.72283, 88.72284, -103.97207, -103.97209])])
  _check(lambda t: t.exp(), np.exp, x, device, noopt)


@pytest.mark.parametrize("device,noopt", CONFIGS)
def test_exp2_float32_ulp(device: str, noopt: int) -> None:
  x = np.concatenate([_grid(-151, 129, device, [128.0, -126.0, -149.0]), SPECIAL, np.float32([127.99999, 128.0, -149.0, -149.5, -150.0])])
  _check(lambda t: t.exp2(), np.exp2, x, device, noopt)


@pytest.mark.parametrize("device,noopt", CONFIGS)
def test_rsqrt_float32_ulp(device: str, noopt: int) -> None:
  # every binade from the smallest subnormal to the largest float, a few hundred points each on the compiled devices
  n = 1 << 16 if device != "PYTHON" else 2000
  x = np.concatenate([np.exp2(np.linspace(-149, 128, n, endpoint=False)).astype(np.float32), SPECIAL, np.float32([-2.0, -np.inf])])
  _check(lambda t: t.rsqrt(), lambda v: 1 / np.sqrt(v), x, device, noopt)


@pytest.mark.parametrize("device", DEVICES)
def test_rsqrt_of_subnormal_is_finite(device: str) -> None:
  # sqrt(1/x) overflowed in 1/x: 1/1e-40 is past float32's max, 1/sqrt(1e-40) = 1e20 is not
  x = np.float32([1e-40, 1e-45, 1.1754942e-38])
  got = Tensor(x, device=device).rsqrt().numpy()
  assert np.all(np.isfinite(got))
  assert ulp_diff(got, (1 / np.sqrt(x.astype(np.float64))).astype(np.float32)).max() <= 2


@pytest.mark.parametrize("device", DEVICES)
def test_special_values_match_torch(device: str) -> None:
  torch = pytest.importorskip("torch")
  tt = torch.tensor(SPECIAL)
  for name, want in (("exp", torch.exp(tt)), ("exp2", torch.exp2(tt)), ("rsqrt", torch.rsqrt(tt)), ("sigmoid", torch.sigmoid(tt))):
    got = getattr(Tensor(SPECIAL, device=device), name)().numpy()
    np.testing.assert_array_equal(np.signbit(got[np.isinf(got)]), np.signbit(want.numpy()[np.isinf(got)]), err_msg=name)
    assert ulp_diff(got, want.numpy()).max() <= 2, f"{name}: {got} vs {want.numpy()}"


@pytest.mark.parametrize("device", DEVICES)
def test_exp_float64_and_half(device: str) -> None:
  n = 100_000 if device != "PYTHON" else 1500
  x64 = np.concatenate([np.linspace(-746, 710, n), [709.782712893384, 709.7827128933841, -745.1332191019411, -745.13321910194122]])
  got = Tensor(x64, device=device, dtype=dtypes.float64).exp().numpy()
  with np.errstate(all="ignore"):
    assert ulp_diff(got, np.exp(x64)).max() <= 2
  # every finite half (computed in float32 and rounded once more)
  h = np.arange(0, 1 << 16, dtype=np.uint16).view(np.float16)
  h = h[np.isfinite(h)] if device != "PYTHON" else h[np.isfinite(h)][::16]
  for name, ref in (("exp", np.exp), ("exp2", np.exp2)):
    got = getattr(Tensor(h, device=device), name)().numpy()
    with np.errstate(all="ignore"):
      assert ulp_diff(got, ref(h.astype(np.float64)).astype(np.float16)).max() <= 1, name


def test_sigmoid_far_left_is_accurate() -> None:
  # sigmoid(x) ~ exp(x) for x << 0: it carried exp's error there
  device = DEVICES[0]
  x = np.linspace(-87, -20, 4096).astype(np.float32)
  _check(lambda t: t.sigmoid(), lambda v: 1 / (1 + np.exp(-v)), x, device, 0)


@pytest.mark.parametrize("fn", ["exp", "exp2", "rsqrt", "sigmoid"])
def test_gradients_match_torch(fn: str) -> None:
  torch = pytest.importorskip("torch")
  x = np.array([0.05, 0.5, 1.0, 2.5, 7.0, 20.0], np.float32)
  tx = Tensor(x, device=DEVICES[0], requires_grad=True)
  getattr(tx, fn)().sum().backward()
  px = torch.tensor(x, requires_grad=True)
  getattr(torch, fn)(px).sum().backward()
  assert tx.grad is not None and px.grad is not None
  np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy(), rtol=2e-6)


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "PYTHON"])
def test_padded_reduce_of_exp(device: str) -> None:
  """exp(x) has no op that is unsafe to pad (every constant in it is padded with 0 too, so a padded lane gives 0):
  padding the reduce of sum(exp(x)) must not add exp(0) = 1 per padded element."""
  from tiny.codegen.kernel import Kernel, Opt, OptOps
  from tiny.engine.realize import CompiledRunner
  from tiny.engine.schedule import create_schedule
  from tiny.ops import MetaOps
  a = np.random.default_rng(0).standard_normal((12, 15)).astype(np.float32)
  out = Tensor(a, device=device).realize().exp().sum(1)
  (si,) = [si for si in create_schedule([out.lazydata]) if si.ast.op is MetaOps.KERNEL]
  k = Kernel(si.ast, opts=Device[device].renderer)
  k.apply_opt(Opt(OptOps.PADTO, 1, 16))
  runner = CompiledRunner(k.to_program())
  for buf in si.bufs:
    buf.ensure_allocated()
  runner([si.bufs[i if isinstance(i, int) else i[0]] for i in runner.p.globals], {})
  got: Any = si.bufs[0].numpy().reshape(12)
  np.testing.assert_allclose(got, np.exp(a.astype(np.float64)).sum(1), rtol=1e-5)
