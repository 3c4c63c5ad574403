"""Random numbers: Threefry-2x32 against the Random123 known answers, exact streams against a numpy model of the
generator, reproducibility with manual_seed, the same stream on every installed device, and the moments of each distribution."""
import math

import numpy as np
import pytest

import tiny.function as F
from tiny.dtype import dtypes
from tiny.registry import Device
from tiny.tensor import Tensor

M32 = np.uint64(0xFFFFFFFF)


def np_threefry2x32(x0: np.ndarray, x1: np.ndarray, k0: int, k1: int):
  """Threefry-2x32, 20 rounds, as specified by Random123 (Salmon et al. 2011), on uint32 numpy arrays."""
  rot = [13, 15, 26, 6, 17, 29, 16, 24]
  ks = [np.uint32(k0), np.uint32(k1), np.uint32(k0 ^ k1 ^ 0x1BD11BDA)]
  x0, x1 = x0.astype(np.uint32) + ks[0], x1.astype(np.uint32) + ks[1]
  for r in range(20):
    x0 = x0 + x1
    x1 = (x1 << np.uint32(rot[r % 8])) | (x1 >> np.uint32(32 - rot[r % 8]))
    x1 = x1 ^ x0
    if r % 4 == 3:
      i = r // 4 + 1
      x0, x1 = x0 + ks[i % 3], x1 + ks[(i + 1) % 3] + np.uint32(i)
  return x0, x1


def np_rand_float32(seed: int, counter: int, n: int) -> np.ndarray:
  """The documented generator: counters (c, c + n/2) pairs keyed by the seed, 23 top bits as the mantissa of a float in [1, 2), minus 1."""
  half = (n + 1) // 2
  c1 = (np.arange(half, dtype=np.uint64) + counter).astype(np.uint32)
  c2 = (c1.astype(np.uint64) + half).astype(np.uint32)
  with np.errstate(over="ignore"):
    lo, hi = np_threefry2x32(c1, c2, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
  bits = np.concatenate([lo, hi])[:n]
  return ((bits >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)


def test_numpy_reference_matches_random123_known_answers():
  for ctr, key, want in (((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
                         ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
                         ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0))):
    with np.errstate(over="ignore"):
      got = np_threefry2x32(np.array([ctr[0]], np.uint32), np.array([ctr[1]], np.uint32), *key)
    assert (int(got[0][0]), int(got[1][0])) == want


def test_device_threefry_known_answers():
  ctrs = [(0, 0), (0xFFFFFFFF, 0xFFFFFFFF), (0x243F6A88, 0x85A308D3)]
  keys = [(0, 0), (0xFFFFFFFF, 0xFFFFFFFF), (0x13198A2E, 0x03707344)]
  want = [(0x6B200159, 0x99BA4EFE), (0x1CB996FC, 0xBB002BE7), (0xC4923A9C, 0x483DF7A0)]
  x = Tensor([c0 | (c1 << 32) for c0, c1 in ctrs], dtype=dtypes.uint64)
  k = Tensor([k0 | (k1 << 32) for k0, k1 in keys], dtype=dtypes.uint64)
  out = F.Threefry.apply(x, k).numpy()
  assert [(int(v) & 0xFFFFFFFF, int(v) >> 32) for v in out] == want


@pytest.mark.parametrize("n", [1, 2, 7, 256, 1001])
def test_rand_matches_reference_stream(n):
  Tensor.manual_seed(1234)
  first = Tensor.rand(n).numpy()
  second = Tensor.rand(3).numpy()
  np.testing.assert_equal(first, np_rand_float32(1234, 0, n))
  np.testing.assert_equal(second, np_rand_float32(1234, n, 3), err_msg="the counter advances by the number of values drawn")


def test_manual_seed_reproducible():
  Tensor.manual_seed(42)
  a, b = Tensor.rand(50).numpy(), Tensor.randn(3, 4).numpy()
  Tensor.manual_seed(42)
  a2, b2 = Tensor.rand(50).numpy(), Tensor.randn(3, 4).numpy()
  np.testing.assert_equal(a, a2)
  np.testing.assert_equal(b, b2)
  Tensor.manual_seed(43)
  assert not np.array_equal(Tensor.rand(50).numpy(), a), "another seed gives another stream"
  c, d = Tensor.rand(50).numpy(), Tensor.rand(50).numpy()
  assert not np.array_equal(c, d), "successive draws differ"
  with pytest.raises(TypeError):
    Tensor.manual_seed(1.5)


def test_same_stream_on_every_device():
  devices = list(Device.get_available_devices())
  if len(devices) < 2:
    pytest.skip(f"only {devices} installed: nothing to compare across")
  results = {}
  for dev in devices:
    Tensor.manual_seed(7)
    results[dev] = (Tensor.rand(37, device=dev).numpy(), Tensor.randn(9, device=dev).numpy(), Tensor.randint(11, low=-5, high=5, device=dev).numpy())
  ref_dev = devices[0]
  for dev, (r, n, i) in results.items():
    np.testing.assert_equal(r, results[ref_dev][0], err_msg=f"rand differs between {ref_dev} and {dev}")
    np.testing.assert_allclose(n, results[ref_dev][1], rtol=1e-5, atol=1e-6, err_msg=f"randn differs between {ref_dev} and {dev}")
    np.testing.assert_equal(i, results[ref_dev][2], err_msg=f"randint differs between {ref_dev} and {dev}")


def test_rand_shapes_and_dtypes():
  Tensor.manual_seed(0)
  assert Tensor.rand(2, 3).shape == (2, 3) and Tensor.rand((2, 3)).shape == (2, 3)
  assert Tensor.rand(0, 3).numpy().shape == (0, 3)
  assert Tensor.rand().shape == ()
  for dt in (dtypes.float16, dtypes.float32, dtypes.float64, dtypes.bfloat16):
    x = Tensor.rand(2000, dtype=dt)
    assert x.dtype == dt
    v = x.numpy().astype(np.float64)
    assert v.min() >= 0 and v.max() < 1, dt
    assert abs(v.mean() - 0.5) < 0.03, dt
  assert Tensor.rand(4, requires_grad=True).requires_grad is True


N = 20000


def test_rand_moments():
  Tensor.manual_seed(11)
  x = Tensor.rand(N).numpy().astype(np.float64)
  assert abs(x.mean() - 0.5) < 0.01
  assert abs(x.var() - 1 / 12) < 0.005
  # roughly flat histogram
  hist = np.histogram(x, bins=10, range=(0, 1))[0] / N
  assert np.all(np.abs(hist - 0.1) < 0.015)


def test_randn_normal_moments():
  Tensor.manual_seed(12)
  x = Tensor.randn(N).numpy().astype(np.float64)
  assert abs(x.mean()) < 0.03 and abs(x.std() - 1) < 0.03
  assert abs(np.mean(np.abs(x) < 1) - 0.6827) < 0.015
  y = Tensor.normal(N, mean=3.0, std=0.5).numpy().astype(np.float64)
  assert abs(y.mean() - 3.0) < 0.02 and abs(y.std() - 0.5) < 0.02
  assert Tensor.randn(5, dtype=dtypes.float16).dtype == dtypes.float16


def test_uniform_randint_moments():
  Tensor.manual_seed(13)
  u = Tensor.uniform(N, low=-3.0, high=5.0).numpy().astype(np.float64)
  assert u.min() >= -3 and u.max() < 5
  assert abs(u.mean() - 1.0) < 0.1 and abs(u.var() - 64 / 12) < 0.25
  r = Tensor.randint(N, low=-4, high=6)
  assert r.dtype == dtypes.int32
  v = r.numpy()
  assert v.min() == -4 and v.max() == 5
  counts = np.bincount(v + 4, minlength=10) / N
  assert np.all(np.abs(counts - 0.1) < 0.015)
  with pytest.raises(TypeError):
    Tensor.randint(3, low=0.5, high=2)
  with pytest.raises(ValueError):
    Tensor.randint(3, low=5, high=2)


def test_init_helpers_bounds_and_scale():
  Tensor.manual_seed(14)
  shape = (64, 32, 3, 3)
  fan_in = 32 * 9
  ku = Tensor.kaiming_uniform(*shape, a=0.0).numpy()
  bound = math.sqrt(3.0) * math.sqrt(2.0) / math.sqrt(fan_in)
  assert np.abs(ku).max() <= bound and np.abs(ku).max() > 0.95 * bound
  kn = Tensor.kaiming_normal(*shape, a=0.0).numpy()
  assert abs(kn.std() - math.sqrt(2.0 / fan_in)) < 0.005
  gu = Tensor.glorot_uniform(64, 32).numpy()
  gb = math.sqrt(6 / (64 + 32))
  assert np.abs(gu).max() <= gb and abs(gu.var() - gb ** 2 / 3) < 0.1 * gb ** 2
  su = Tensor.scaled_uniform(100, 50).numpy()
  assert np.abs(su).max() <= (100 * 50) ** -0.5


def test_multinomial():
  Tensor.manual_seed(15)
  w = Tensor([0.1, 0.0, 0.6, 0.3])
  s = w.multinomial(4000, replacement=True).numpy()
  assert s.shape == (4000,)
  freq = np.bincount(s, minlength=4) / 4000
  np.testing.assert_allclose(freq, [0.1, 0.0, 0.6, 0.3], atol=0.03)
  s2 = Tensor([[1.0, 0.0], [0.0, 1.0]]).multinomial(5, replacement=True).numpy()
  np.testing.assert_equal(s2, [[0] * 5, [1] * 5])
  with pytest.raises(NotImplementedError):
    w.multinomial(2, replacement=False)


def test_dropout_reproducible():
  x = Tensor.ones(200)
  with Tensor.train():
    Tensor.manual_seed(5)
    a = x.dropout(0.5).numpy()
    Tensor.manual_seed(5)
    b = x.dropout(0.5).numpy()
  np.testing.assert_equal(a, b)


# *** every dtype and size against the numpy model (the words of one draw come from ONE threefry per block) ***

def np_rand_bits(seed: int, counter: int, n: int) -> np.ndarray:
  """The n uint32 words of a draw: the low words of the blocks at counters (c + k, c + k + half), then their high words."""
  half = (n + 1) // 2
  c1 = (np.arange(half, dtype=np.uint64) + counter).astype(np.uint32)
  c2 = (c1.astype(np.uint64) + half).astype(np.uint32)
  with np.errstate(over="ignore"):
    lo, hi = np_threefry2x32(c1, c2, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
  return np.concatenate([lo, hi])[:n]


def np_rand(seed: int, counter: int, n: int, dt) -> np.ndarray:
  """Tensor.rand's documented mapping of the words to floats in [0, 1): the top mantissa bits of a float in [1, 2), minus 1."""
  bits = np_rand_bits(seed, counter, n)
  if dt == dtypes.float16:   # the low 16 bits of a word, their top 10 as the mantissa
    return ((bits.astype(np.uint16) >> np.uint16(6)) | np.uint16(0x3C00)).view(np.float16) - np.float16(1)
  if dt == dtypes.float64:   # a word as the top 32 of 52 mantissa bits
    return ((bits.astype(np.uint64) << np.uint64(20)) | np.uint64(0x3FF0000000000000)).view(np.float64) - 1.0
  if dt == dtypes.bfloat16:  # 7 mantissa bits, exact in bfloat16 (compared as float32 here)
    return (((bits >> np.uint32(25)) << np.uint32(16)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)
  return ((bits >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.float64, dtypes.bfloat16])
def test_rand_dtypes_match_reference_stream(dt):
  Tensor.manual_seed(2024)
  counter = 0
  for shape in [(1,), (2,), (13,), (3, 5), (2, 3, 7), (64,), (1000,), (4097,)]:
    n = math.prod(shape)
    got = Tensor.rand(*shape, dtype=dt).numpy()
    assert got.shape == shape
    want = np_rand(2024, counter, n, dt).reshape(shape)
    np.testing.assert_equal(got.astype(np.float32) if dt == dtypes.bfloat16 else got, want, err_msg=f"{dt} {shape}")
    counter += n


@pytest.mark.parametrize("n", [(1 << 16) - 1, (1 << 16) + 3])
def test_rand_large_draws_match_reference_stream(n):
  """Sizes around tiny_clang's THREEFRY_UPCAST_MIN: the scalar and the upcast (vector) kernel give the same numbers."""
  Tensor.manual_seed(99)
  np.testing.assert_equal(Tensor.rand(n).numpy(), np_rand(99, 0, n, dtypes.float32))


def test_randint_randn_dropout_follow_the_words():
  Tensor.manual_seed(31)
  u = np_rand(31, 0, 11, dtypes.float32)
  np.testing.assert_equal(Tensor.randint(11, low=-3, high=17).numpy(), (np.float32(20) * u).astype(np.int32) - 3)
  src = np_rand(31, 11, 2 * 9, dtypes.float32).reshape(2, 9).astype(np.float64)
  want = np.cos(src[0] * 2 * np.pi) * np.sqrt(-2 * np.log(1 - src[1]))
  np.testing.assert_allclose(Tensor.randn(9).numpy(), want, rtol=1e-5, atol=1e-5)
  with Tensor.train():
    out = Tensor.ones(17).contiguous().dropout(0.3).numpy()
  keep = np_rand(31, 29, 17, dtypes.float32) >= np.float32(0.3)
  np.testing.assert_equal(out != 0, keep)
  np.testing.assert_allclose(out[keep], 1 / 0.7, rtol=1e-6)


def test_rand_computes_threefry_in_one_kernel():
  """One kernel draws and converts the numbers, each block of Threefry once per word it gives (not the old lo.cat(hi),
  which ran the cipher twice over a padded range in two kernels)."""
  from tiny.engine.schedule import create_schedule
  from tiny.ops import BinaryOps, MetaOps
  Tensor.manual_seed(0)
  sched = create_schedule([Tensor.rand(13).lazydata])
  kernels = [si for si in sched if si.ast.op is MetaOps.KERNEL]
  with_threefry = [si for si in kernels if any(x.op is BinaryOps.THREEFRY for x in si.ast.lazyops)]
  assert len(with_threefry) == 1, [si.ast for si in kernels]
  assert sum(x.op is BinaryOps.THREEFRY for x in with_threefry[0].ast.lazyops) == 1
  assert with_threefry[0].outputs[0].dtype == dtypes.float32 and with_threefry[0].outputs[0].size == 13
