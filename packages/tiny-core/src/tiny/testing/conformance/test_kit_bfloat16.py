"""bfloat16 on the device: storage, float32 <-> bfloat16 casts bit for bit (round to nearest even, against a numpy
reference written here), elementwise math and reductions within bfloat16's precision. Skipped as a whole by
--tiny-skip-dtypes=bfloat16.

numpy has no bfloat16: values go in as float32 (Tensor(..., dtype=bfloat16) casts them on the device) and come out
as float32 (exact) or as their uint16 bit patterns through bitcast."""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import QUICK, check, data

BF16 = dtypes.bfloat16
# one bfloat16 ulp is 2**-7 of the leading power of two: results rounded once may be half an ulp off, twice a full one
RTOL = 2.0 ** -7


@pytest.fixture(autouse=True)
def _needs_bfloat16(tiny_require_dtype):
  tiny_require_dtype(BF16)


def bf16_bits(x: np.ndarray) -> np.ndarray:
  """float32 -> bfloat16 bit patterns, rounding to nearest even: add 0x7FFF plus the lowest kept bit, keep the top
  16 bits. NaNs stay NaNs (quiet, sign kept) instead of rounding into infinity."""
  bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
  rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
  nan = np.isnan(np.asarray(x, dtype=np.float32))
  return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def bf16_value(bits: np.ndarray) -> np.ndarray:
  """bfloat16 bit patterns -> their exact float32 values."""
  return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
  """x (any float dtype) rounded to bfloat16, as float32: through float32 first, as the devices do."""
  return bf16_value(bf16_bits(np.asarray(x, dtype=np.float32)))


def _bits_on_device(t: Tensor) -> np.ndarray:
  assert t.dtype == BF16, f"expected a bfloat16 tensor, got {t.dtype}"
  return t.bitcast(dtypes.uint16).numpy()


def _assert_bits(got: np.ndarray, want: np.ndarray, x: np.ndarray, what: str) -> None:
  bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
  if len(bad):
    rows = "\n".join(f"  {x.reshape(-1)[i]!r} (0x{x.reshape(-1)[i:i + 1].astype(np.float32).view(np.uint32)[0]:08x}): "
                     f"got 0x{got.reshape(-1)[i]:04x}, want 0x{want.reshape(-1)[i]:04x}" for i in bad[:8])
    raise AssertionError(f"{what}: {len(bad)} of {got.size} bfloat16 bit patterns differ\n{rows}")


# float32 inputs whose rounding is each a separate case
EDGE_BITS = np.array([
  0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0x3F817FFF,   # 1.0; ties to even down / up; just above a tie
  0xBF808000, 0xBF818000,                                                   # negative ties
  0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0xFF7FFFFF,                           # the largest floats: round to inf or stay finite
  0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x80008000,               # subnormals (and their ties)
  0x00800000, 0x3DCCCCCD, 0x40490FDB, 0xC2F6E979,                           # min normal, 0.1, pi, -123.456
  0x00000000, 0x80000000, 0x7F800000, 0xFF800000,                           # zeros and infinities
], dtype=np.uint32)


@QUICK
def test_cast_from_float32_rounds_to_nearest_even(tiny_device):
  x = np.concatenate([EDGE_BITS.view(np.float32), data((64,), dtypes.float32, seed=1, low=-1e4, high=1e4),
                      data((64,), dtypes.float32, seed=2, low=-1e-3, high=1e-3)])
  got = _bits_on_device(Tensor(x, device=tiny_device).cast(BF16))
  _assert_bits(got, bf16_bits(x), x, f"float32 -> bfloat16 on {tiny_device}")


def test_cast_from_float32_of_computed_values(tiny_device):
  """The cast of a value computed in the same kernel (a register, not a load), random bit patterns included."""
  rng = np.random.default_rng(3)
  raw = rng.integers(0, 1 << 32, size=256, dtype=np.uint64).astype(np.uint32)
  raw = raw[np.isfinite(raw.view(np.float32))]
  x = raw.view(np.float32)
  got = _bits_on_device((Tensor(x, device=tiny_device) * 1.0 + 0.0).cast(BF16))
  _assert_bits(got, bf16_bits(x * np.float32(1.0) + np.float32(0.0)), x, f"computed float32 -> bfloat16 on {tiny_device}")


def test_nan_stays_nan(tiny_device):
  x = np.array([np.nan, -np.nan, 1.0], np.float32)
  back = Tensor(x, device=tiny_device).cast(BF16).float().numpy()
  assert np.isnan(back[:2]).all() and back[2] == 1.0, f"NaN -> bfloat16 -> float32 gave {back} on {tiny_device}"


@QUICK
def test_storage_and_cast_to_float32_are_exact(tiny_device):
  """Every bfloat16 pattern of interest stored on the device reads back, and widens to float32, unchanged."""
  rng = np.random.default_rng(4)
  bits = np.concatenate([np.arange(0, 1 << 16, 97, dtype=np.uint32), rng.integers(0, 1 << 16, 200)]).astype(np.uint16)
  bits = bits[~np.isnan(bf16_value(bits))]   # NaN payloads need not survive a float register
  t = Tensor(bits, device=tiny_device).bitcast(BF16)
  np.testing.assert_array_equal(_bits_on_device(t.contiguous()), bits, err_msg=f"bfloat16 copy on {tiny_device}")
  widened = t.cast(dtypes.float32).numpy()
  np.testing.assert_array_equal(widened.view(np.uint32), bf16_value(bits).view(np.uint32), err_msg=f"bfloat16 -> float32 on {tiny_device}")


def test_roundtrip_through_host_and_python(tiny_device):
  x = round_bf16(data((5, 7), dtypes.float32, seed=5, low=-100, high=100))
  t = Tensor(x, device=tiny_device, dtype=BF16).realize()
  assert t.dtype == BF16 and t.device == tiny_device
  np.testing.assert_array_equal(t.numpy(), x, err_msg="numpy() of a bfloat16 tensor")
  np.testing.assert_array_equal(t.to("PYTHON").numpy(), x, err_msg=f"bfloat16 copied {tiny_device} -> PYTHON")
  np.testing.assert_array_equal(Tensor(x, device="PYTHON", dtype=BF16).to(tiny_device).numpy(), x, err_msg=f"bfloat16 copied PYTHON -> {tiny_device}")


@pytest.mark.parametrize("dst", [dtypes.float16, dtypes.int32, dtypes.int8, dtypes.bool], ids=lambda d: d.name)
def test_cast_to_other_dtypes(dst, tiny_device, tiny_require_dtype):
  tiny_require_dtype(dst)
  x = round_bf16(np.array([0.0, 1.0, -2.5, 7.75, 100.5, -0.375, 3.0, 120.0], np.float32))
  want = x.astype(np.float16) if dst == dtypes.float16 else (x.astype(np.bool_) if dst == dtypes.bool else np.trunc(x).astype(dst.fmt))
  check(Tensor(x, device=tiny_device, dtype=BF16).cast(dst), want, dt=dst, atol=0, rtol=0, what=f"bfloat16 -> {dst}")


def test_cast_from_ints_and_half(tiny_device):
  i = np.array([0, 1, -7, 255, 256, 257, 1000, -32768], np.int32)
  _assert_bits(_bits_on_device(Tensor(i, device=tiny_device).cast(BF16)), bf16_bits(i.astype(np.float32)), i.astype(np.float32), "int32 -> bfloat16")
  h = np.array([0.0, 1.0, -2.0009765625, 65504.0, 6.1e-5, 0.333251953125], np.float16)
  hf = h.astype(np.float32)
  _assert_bits(_bits_on_device(Tensor(h, device=tiny_device).cast(BF16)), bf16_bits(hf), hf, "float16 -> bfloat16")


# *** arithmetic ***

BINARY = {
  "add": (lambda a, b: a + b, np.add),
  "sub": (lambda a, b: a - b, np.subtract),
  "mul": (lambda a, b: a * b, np.multiply),
  "div": (lambda a, b: a / b, np.divide),
  "maximum": (lambda a, b: a.maximum(b), np.maximum),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=QUICK) if n in ("mul", "div") else n for n in BINARY])
def test_binary(name, tiny_device):
  fxn, npfxn = BINARY[name]
  a = round_bf16(data((4, 8), dtypes.float32, seed=6, low=-8, high=8))
  b = round_bf16(data((4, 8), dtypes.float32, seed=7, low=0.25, high=8) * np.where(np.arange(32).reshape(4, 8) % 3 == 0, -1, 1))
  out = fxn(Tensor(a, device=tiny_device, dtype=BF16), Tensor(b, device=tiny_device, dtype=BF16))
  assert out.dtype == BF16, f"{name} of two bfloat16 tensors is {out.dtype}"
  exact = npfxn(a.astype(np.float64), b.astype(np.float64))
  if name in ("mul", "maximum"):
    # a product of two 8-bit significands is exact in float32: a correctly rounding device gets the bits exactly
    _assert_bits(_bits_on_device(out), bf16_bits(exact.astype(np.float32)), exact, f"bfloat16 {name}")
  else:
    check(out.float(), exact, dt=dtypes.float32, atol=1e-6, rtol=RTOL, what=f"bfloat16 {name}")


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sin", "sigmoid", "reciprocal"])
def test_unary(name, tiny_device):
  lo = 0.1 if name in ("log", "sqrt", "reciprocal") else -4.0
  a = round_bf16(data((3, 9), dtypes.float32, seed=8, low=lo, high=4))
  out = getattr(Tensor(a, device=tiny_device, dtype=BF16), name)()
  assert out.dtype == BF16
  x = a.astype(np.float64)
  refs: Dict[str, Callable[[np.ndarray], np.ndarray]] = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "sin": np.sin,
                                                         "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "reciprocal": lambda v: 1 / v}
  want = refs[name](x)
  # one rounding of the float32 result, plus the float32 approximation's own error (and sin's small values near 0)
  check(out.float(), want, dt=dtypes.float32, atol=2.0 ** -9, rtol=RTOL, what=f"bfloat16 {name}")


def test_mixed_with_float32_promotes(tiny_device):
  a = round_bf16(data((6,), dtypes.float32, seed=9))
  b = data((6,), dtypes.float32, seed=10)
  out = Tensor(a, device=tiny_device, dtype=BF16) * Tensor(b, device=tiny_device)
  assert out.dtype == dtypes.float32, f"bfloat16 * float32 should be float32, got {out.dtype}"
  check(out, a.astype(np.float64) * b, dt=dtypes.float32, atol=1e-6, rtol=1e-6, what="bfloat16 * float32")


@QUICK
def test_reductions(tiny_device):
  a = round_bf16(data((6, 40), dtypes.float32, seed=11, low=-4, high=4))
  t = Tensor(a, device=tiny_device, dtype=BF16)
  x = a.astype(np.float64)
  # max picks one of the inputs: exact
  np.testing.assert_array_equal(_bits_on_device(t.max(1)), bf16_bits(a.max(1)), err_msg="bfloat16 max")
  np.testing.assert_array_equal(_bits_on_device(t.min(0)), bf16_bits(a.min(0)), err_msg="bfloat16 min")
  # sums accumulate wider and round once at the end: within one bfloat16 ulp of the exact sum (relative to its terms)
  s = t.sum(1)
  assert s.dtype == BF16, f"sum of bfloat16 is {s.dtype}"
  check(s.float(), x.sum(1), dt=dtypes.float32, atol=RTOL * np.abs(x).sum(1).max() / 8, rtol=RTOL, what="bfloat16 sum")
  check(t.mean(0).float(), x.mean(0), dt=dtypes.float32, atol=RTOL, rtol=RTOL, what="bfloat16 mean")
  check(t.sum().float(), x.sum(), dt=dtypes.float32, atol=RTOL * np.abs(x).sum() / 16, rtol=RTOL, what="bfloat16 sum of all")


def test_long_sum_does_not_accumulate_in_bfloat16(tiny_device):
  """4096 ones: a bfloat16 accumulator gets stuck at 256 (256 + 1 rounds back to 256); the sum must be 4096."""
  got = Tensor(np.ones(4096, np.float32), device=tiny_device, dtype=BF16).sum()
  assert got.dtype == BF16
  assert float(got.numpy()) == 4096.0, f"sum of 4096 bfloat16 ones is {got.numpy()} on {tiny_device}"


def test_matmul(tiny_device):
  a, b = round_bf16(data((5, 16), dtypes.float32, seed=12)), round_bf16(data((16, 3), dtypes.float32, seed=13))
  out = Tensor(a, device=tiny_device, dtype=BF16) @ Tensor(b, device=tiny_device, dtype=BF16)
  assert out.dtype == BF16
  want = a.astype(np.float64) @ b.astype(np.float64)
  check(out.float(), want, dt=dtypes.float32, atol=RTOL * (np.abs(a) @ np.abs(b)).max() / 4, rtol=RTOL, what="bfloat16 matmul")


def test_where_and_compare(tiny_device):
  a = round_bf16(data((3, 7), dtypes.float32, seed=14))
  b = round_bf16(data((3, 7), dtypes.float32, seed=15))
  b[0] = a[0]
  ta, tb = Tensor(a, device=tiny_device, dtype=BF16), Tensor(b, device=tiny_device, dtype=BF16)
  check(ta < tb, a < b, dt=dtypes.bool, what="bfloat16 <")
  check(ta == tb, a == b, dt=dtypes.bool, what="bfloat16 ==")
  out = (ta > 0).where(ta, tb)
  np.testing.assert_array_equal(_bits_on_device(out), bf16_bits(np.where(a > 0, a, b)), err_msg="bfloat16 where")


def test_arange(tiny_device):
  for start, stop, step in ((0, 300, 37), (0, 3000, 7), (2040, 2060, 3)):
    want = bf16_bits(np.arange(start, stop, step).astype(np.float32))
    got = _bits_on_device(Tensor.arange(start, stop, step, dtype=BF16, device=tiny_device))
    _assert_bits(got, want, np.arange(start, stop, step).astype(np.float32), f"arange({start}, {stop}, {step}) in bfloat16")
