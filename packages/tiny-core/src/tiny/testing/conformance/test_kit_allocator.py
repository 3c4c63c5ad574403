"""The device allocator: memory reused after a free holds no stale data in fresh results, buffer views (sub-buffers at
byte offsets), copyin/copyout at offsets, copies between the device and the host devices, zero-size and large buffers.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import numpy as np
import pytest

from tiny.device import Buffer, LRUAllocator
from tiny.dtype import dtypes
from tiny.registry import Device
from tiny.tensor import Tensor

from ._kit import QUICK, check, data

F32, I32, U8 = dtypes.float32, dtypes.int32, dtypes.uint8
SENTINEL = np.float32(-7777.25)   # what stale memory would show


def _fill_and_free(device: str, n: int, value: Any = SENTINEL) -> None:
  """Put a buffer of n float32 on the device full of value, then drop it (back to the allocator, or its cache)."""
  t = Tensor(np.full((n,), value, np.float32), device=device).realize()
  assert t.device == device
  del t   # reference counting frees it now (a gc.collect() per call would cost more than the whole test)


def _hits(device: str) -> int:
  alloc = Device[device].allocator
  return alloc.hits if isinstance(alloc, LRUAllocator) else -1


# results whose kernels must write every element of a buffer of 24 float32 (a size nothing else in them allocates)
N = 24
FRESH: Dict[str, Tuple[Callable[[str], Tensor], Callable[[], np.ndarray]]] = {
  "zeros": (lambda d: Tensor.zeros(N, device=d).contiguous(), lambda: np.zeros(N)),
  "masked_pad": (lambda d: Tensor(np.arange(1, 15, dtype=np.float32), device=d).pad(((4, 6),)), lambda: np.pad(np.arange(1, 15), (4, 6))),
  "sum_into": (lambda d: Tensor(np.ones((N, 5), np.float32), device=d).sum(1), lambda: np.full(N, 5.0)),
  "max_into": (lambda d: Tensor(-np.ones((N, 3), np.float32), device=d).max(1), lambda: np.full(N, -1.0)),
  "arange": (lambda d: Tensor.arange(N, device=d).float(), lambda: np.arange(N)),
  "where_const": (lambda d: (Tensor.arange(N, device=d) < 10).where(0.0, 1.0), lambda: (np.arange(N) >= 10) * 1.0),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=QUICK) if n in ("masked_pad", "sum_into") else n for n in FRESH])
def test_reused_memory_gives_fresh_results(name, tiny_device):
  build, want = FRESH[name]
  for attempt in range(3):   # the same size again and again: an LRU cache hands back the sentinel-filled memory
    _fill_and_free(tiny_device, N)
    hits = _hits(tiny_device)
    out = build(tiny_device).realize()
    check(out, want(), dt=F32, what=f"{name} in reused memory (attempt {attempt + 1})")
    if hits >= 0:
      assert _hits(tiny_device) > hits, "the LRU allocator did not reuse the freed buffer: this test did not exercise reuse"
    del out


def test_reused_memory_with_nan_and_inf_garbage(tiny_device):
  """Stale NaN/inf bits must not leak through an accumulator that starts from the old contents."""
  for value in (np.nan, np.inf, -np.inf):
    _fill_and_free(tiny_device, N, value)
    check(Tensor(np.full((N, 4), 0.5, np.float32), device=tiny_device).sum(1), np.full(N, 2.0), dt=F32, what=f"sum after {value} garbage")
    _fill_and_free(tiny_device, N, value)
    check(Tensor(np.full((N, 4), -3.0, np.float32), device=tiny_device).max(1), np.full(N, -3.0), dt=F32, what=f"max after {value} garbage")


def test_assign_into_reused_memory(tiny_device):
  _fill_and_free(tiny_device, N)
  t = Tensor.zeros(N, device=tiny_device).contiguous().realize()
  t.assign(t + Tensor.arange(N, device=tiny_device).float()).realize()
  t.assign(t * 2).realize()
  check(t, np.arange(N) * 2.0, dt=F32, what="assign chain in reused memory")


# *** raw buffers: views, offsets, copies ***

def _buffer(device: str, n: int, dt: Any = I32) -> Buffer:
  return Buffer(device, n, dt).allocate()


def _view_or_skip(b: Buffer, n: int, dt: Any, offset: int) -> Buffer:
  v = b.view(n, dt, offset)
  try:
    return v.ensure_allocated()
  except RuntimeError as e:
    if "does not support buffer views" in str(e):
      pytest.skip(f"the {b.device} allocator has no offset(): it does not support buffer views")
    raise


def _read(b: Buffer, npdt: Any) -> np.ndarray:
  """The buffer's bytes (copyout) as a numpy array of npdt."""
  raw = bytearray(b.nbytes)
  b.copyout(memoryview(raw))
  return np.frombuffer(raw, dtype=npdt)


def _bytes(a: np.ndarray) -> memoryview:
  return memoryview(np.ascontiguousarray(a).tobytes())


@QUICK
def test_copyin_copyout_roundtrip(tiny_device):
  for n, dt, npdt in ((1, U8, np.uint8), (3, U8, np.uint8), (17, I32, np.int32), (1000, dtypes.int16, np.int16)):
    src = (np.arange(n) * 37 % 251).astype(npdt)
    b = _buffer(tiny_device, n, dt)
    b.copyin(_bytes(src))
    np.testing.assert_array_equal(_read(b, npdt), src, err_msg=f"copyin/copyout of {n} x {dt} on {tiny_device}")
    src2 = src[::-1].copy()
    b.copyin(memoryview(src2).cast("B"))   # a second copyin overwrites all of it
    np.testing.assert_array_equal(_read(b, npdt), src2, err_msg=f"second copyin of {n} x {dt} on {tiny_device}")


@QUICK
def test_views_read_and_write_at_offsets(tiny_device):
  base_np = np.arange(64, dtype=np.int32)
  b = _buffer(tiny_device, 64)
  b.copyin(_bytes(base_np))
  v = _view_or_skip(b, 10, I32, 4 * 5)
  np.testing.assert_array_equal(_read(v, np.int32), base_np[5:15], err_msg="read of a view at element 5")
  vv = _view_or_skip(v, 3, I32, 4 * 2)
  assert vv.offset == 4 * 7, "a view of a view is a view of the base at the summed offset"
  np.testing.assert_array_equal(_read(vv, np.int32), base_np[7:10], err_msg="read of a view of a view")
  # writing through views changes exactly their bytes of the base
  want = base_np.copy()
  for off, n in ((0, 4), (60, 4), (21, 9), (33, 1)):
    vals = -np.arange(1, n + 1, dtype=np.int32) * (off + 1)
    _view_or_skip(b, n, I32, 4 * off).copyin(_bytes(vals))
    want[off:off + n] = vals
  np.testing.assert_array_equal(_read(b, np.int32), want, err_msg="base after copyin through views at offsets")
  # a view may have another dtype: its bytes are the base's bytes
  u = _view_or_skip(b, 10, U8, 4 * 40 + 3)
  np.testing.assert_array_equal(_read(u, np.uint8), want.view(np.uint8)[163:173], err_msg="uint8 view at an odd byte offset")


def test_view_out_of_bounds_is_refused(tiny_device):
  b = _buffer(tiny_device, 8)
  with pytest.raises(ValueError):
    b.view(4, I32, 4 * 6)   # elements 6..9 of 8
  with pytest.raises(ValueError):
    b.view(1, I32, 32)


def test_kernels_on_views_of_realized_tensors(tiny_device):
  """Shrinks and same-size bitcasts of a realized tensor may become buffer views (no copy): kernels reading them
  see the right window, and writes to the base show through."""
  base = np.arange(40, dtype=np.float32) - 13
  t = Tensor(base, device=tiny_device).realize()
  w = t[7:31].contiguous().realize()
  check(w, base[7:31], dt=F32, what="contiguous window of a realized tensor")
  check(w.reshape(4, 6).sum(1) * 2, base[7:31].reshape(4, 6).sum(1) * 2, dt=F32, what="kernel reading the window")
  bits = t[3:11].bitcast(dtypes.int32)
  np.testing.assert_array_equal(bits.numpy(), base[3:11].view(np.int32), err_msg="bitcast window")
  check((bits + 1).bitcast(F32), (base[3:11].view(np.int32) + 1).view(np.float32), dt=F32, what="kernel on a bitcast window")


# *** copies between the device and the host devices ***

@pytest.mark.parametrize("other", [pytest.param("PYTHON", marks=QUICK), "CLANG"])
def test_copies_between_devices(other, tiny_device):
  if other == tiny_device:
    pytest.skip(f"{other} is the device under test")
  if (reason := Device.availability(other)) is not None:
    pytest.skip(f"{other} is not available here: {reason}")
  a = data((6, 7), F32, seed=1)
  on_other = Tensor(a, device=other).realize()
  moved = on_other.to(tiny_device)
  assert moved.device == tiny_device
  check(moved, a, dt=F32, what=f"{other} -> {tiny_device}")
  back = Tensor(a, device=tiny_device).realize()
  for name, view, ref in (("permuted", lambda x: x.permute(1, 0), a.T), ("shrunk", lambda x: x[2:5, 1:6], a[2:5, 1:6]),
                          ("flipped", lambda x: x.flip(0), a[::-1]), ("whole", lambda x: x, a)):
    got = view(back).to(other)
    assert got.device == other
    check(got, ref, dt=F32, what=f"{name} view {tiny_device} -> {other}")
  check((Tensor(a, device=tiny_device) * 2).to(other).sum(0), (a * 2).sum(0), dt=F32, atol=1e-5, rtol=1e-5,
        what=f"computed on {tiny_device}, reduced on {other}")


def test_copy_kernel_into_a_second_buffer(tiny_device):
  """A copy that stays on the device (a copy kernel) lands in a buffer of its own: overwriting the source later
  leaves it alone. (t.contiguous() or t + 0 of a contiguous t would be t itself, not a copy.)"""
  a = data((5, 5), F32, seed=2)
  t = Tensor(a, device=tiny_device).realize()
  c = t.flip(0).contiguous().realize()
  assert c.lazydata.base.realized is not t.lazydata.base.realized
  t.assign(t * 0).realize()
  check(c, a[::-1], dt=F32, what="copy after its source was zeroed")
  check(t, np.zeros_like(a), dt=F32, what="the zeroed source")


# *** zero-size and large buffers ***

@QUICK
def test_zero_size_buffers(tiny_device):
  b = Buffer(tiny_device, 0, F32).allocate()
  assert b.nbytes == 0
  b.copyin(memoryview(b""))
  assert b.copyout(memoryview(bytearray(0))).nbytes == 0
  for shape in ((0,), (3, 0), (0, 4, 2)):
    t = Tensor(np.zeros(shape, np.float32), device=tiny_device)
    check(t + 1, np.zeros(shape), dt=F32, what=f"elementwise on {shape}")
    check(t.to("PYTHON") if tiny_device != "PYTHON" else t, np.zeros(shape), dt=F32, what=f"copy of {shape}")
  e = Tensor.empty(0, 5, device=tiny_device).realize()
  assert e.shape == (0, 5) and e.numpy().shape == (0, 5)
  check(Tensor(np.ones((2, 3), np.float32), device=tiny_device).cat(Tensor.zeros(0, 3, device=tiny_device), dim=0), np.ones((2, 3)),
        dt=F32, what="cat with an empty tensor")


def test_large_buffers(tiny_device):
  """16 MB in and out, and kernels reading its far end and striding across all of it."""
  n = 1 << 22
  a = np.random.default_rng(3).integers(-1000, 1000, size=n, dtype=np.int32)
  t = Tensor(a, device=tiny_device).realize()
  np.testing.assert_array_equal(t.numpy(), a, err_msg=f"16 MB round trip on {tiny_device}")
  check(t[n - 1000:] * 2, a[n - 1000:] * 2, dt=I32, what="kernel on the last 1000 elements")
  check(t.reshape(2048, 2048)[::256, ::8].sum(1), a.reshape(2048, 2048)[::256, ::8].sum(1), dt=I32, what="strided sum over 16 MB")
  raw = _buffer(tiny_device, n)
  raw.copyin(_bytes(a))
  tail = _view_or_skip(raw, 16, I32, 4 * (n - 16))
  np.testing.assert_array_equal(_read(tail, np.int32), a[-16:], err_msg="view at the end of a 16 MB buffer")
