"""Kept eager results (device.recycle_buffer / take_free_buffer): the Buffer of an eager result whose last user died is
handed to the next eager result of its size, but never one that anything else still reaches (a second reference, a
weak reference, a view, a JIT), and its memory counts as free.

Each test uses a size of its own, so the kept lists of one test do not feed another.
"""
from __future__ import annotations

import ctypes
import gc
import weakref
from typing import List

import numpy as np
import pytest

from tiny import device as device_mod
from tiny.dtype import dtypes
from tiny.engine.jit import TinyJit
from tiny.helpers import GlobalCounters
from tiny.registry import Device
from tiny.tensor import Tensor

CPU = [d for d in ("CLANG", "LLVM") if d in Device.get_available_devices()]
pytestmark = pytest.mark.skipif(not device_mod._KEEP_FREE, reason="this interpreter keeps no buffers (LRU=0, or a Python whose "
                                                                   "reference counts recycle_buffer was not checked on)")


@pytest.fixture(params=CPU)
def device(request: pytest.FixtureRequest) -> str:
  return str(request.param)


def _kept(dev: str, nbytes: int) -> List[device_mod.Buffer]:
  return list(device_mod._free_buffers.get((Device[dev].allocator, nbytes), []))


def _warm(x: Tensor, n: int = 4) -> Tensor:
  # the first runs of a structure take the full path; later ones its eager plan, which takes kept buffers
  y = x
  for _ in range(n):
    y = (y * 1.5 + 0.25).realize()
  return y


def test_an_eager_loop_reuses_its_result_buffers(device: str) -> None:
  a = np.random.default_rng(0).standard_normal(41).astype(np.float32)
  x = Tensor(a, device=device).realize()
  _warm(x)
  y, seen = x, set()
  ref = a.copy()
  for _ in range(12):
    y = (y * 1.5 + 0.25).realize()
    seen.add(id(y.lazydata.buffer))
    ref = ref * np.float32(1.5) + np.float32(0.25)
  assert len(seen) <= 3, "each result got a new Buffer: none was kept and handed out again"
  np.testing.assert_allclose(y.numpy(), ref, rtol=1e-6)


def test_a_buffer_still_referenced_is_not_kept(device: str) -> None:
  x = Tensor(np.arange(43, dtype=np.float32), device=device).realize()
  _warm(x)
  y = (x * 1.5 + 0.25).realize()
  held = y.lazydata.buffer
  expect = held.numpy().copy()
  del y
  assert all(b is not held for b in _kept(device, 43 * 4))
  # later results of the same size must not write into it
  _warm(x, 6)
  np.testing.assert_array_equal(held.numpy(), expect)


def test_a_weakly_referenced_buffer_is_not_kept(device: str) -> None:
  x = Tensor(np.arange(47, dtype=np.float32), device=device).realize()
  _warm(x)
  y = (x * 1.5 + 0.25).realize()
  wr = weakref.ref(y.lazydata.buffer)
  del y
  assert wr() is None, "a buffer with a weak reference (a cache keyed by it) must die, not be kept"


def test_a_view_keeps_its_base_out_of_the_kept_lists(device: str) -> None:
  x = Tensor(np.arange(53, dtype=np.float32), device=device).realize()
  _warm(x)
  y = (x * 1.5 + 0.25).realize()
  base = y.lazydata.buffer
  expect = y.numpy()[5:20].copy()
  view = base.view(15, dtypes.float32, 5 * 4).ensure_allocated()
  del y
  assert all(b is not base for b in _kept(device, 53 * 4))
  _warm(x, 6)
  np.testing.assert_array_equal(view.numpy(), expect)


def test_a_kept_buffer_serves_another_dtype_of_its_size(device: str) -> None:
  f = Tensor(np.arange(59, dtype=np.float32), device=device).realize()
  i = Tensor(np.arange(59, dtype=np.int32), device=device).realize()
  for _ in range(4):
    i = (i * 3 + 1).realize()
  _warm(f)
  y = (f * 1.5 + 0.25).realize()
  del y
  assert _kept(device, 59 * 4)
  out = (i * 3 + 1).realize()
  assert out.lazydata.buffer.dtype == dtypes.int32 and out.lazydata.buffer.size == 59
  ref = np.arange(59, dtype=np.int32)
  for _ in range(5):
    ref = ref * 3 + 1
  np.testing.assert_array_equal(out.numpy(), ref)


def test_kept_memory_counts_as_free_and_serves_other_allocations(device: str) -> None:
  x = Tensor(np.arange(61, dtype=np.float32), device=device).realize()
  _warm(x)
  gc.collect()
  before = GlobalCounters.mem_used
  y = (x * 1.5 + 0.25).realize()
  assert GlobalCounters.mem_used == before + 61 * 4
  del y
  assert GlobalCounters.mem_used == before
  assert (kept := _kept(device, 61 * 4))
  alloc = Device[device].allocator
  allocs = alloc.allocs
  # a plain allocation of that size takes the kept memory instead of asking the allocator
  b = device_mod.Buffer(device, 61, dtypes.float32).allocate()
  assert alloc.allocs == allocs
  assert ctypes.addressof(b._buf) in {ctypes.addressof(k._buf) for k in kept}
  assert GlobalCounters.mem_used == before + 61 * 4
  del b, kept
  assert GlobalCounters.mem_used == before
  device_mod.drop_free_buffers()
  assert GlobalCounters.mem_used == before and not device_mod._free_buffers


def test_jit_outputs_and_eager_results_share_memory_correctly(device: str) -> None:
  a = np.random.default_rng(1).standard_normal(67).astype(np.float32)
  x = Tensor(a, device=device).realize()
  jf = TinyJit(lambda t: (t * 2.0 + 1.0).realize())
  outs = []
  for k in range(5):
    outs.append(jf(x))
    _warm(x, 3)   # eager results of the same size, dropped at once
  for o in outs:
    np.testing.assert_allclose(o.numpy(), a * 2 + 1, rtol=1e-6)


def test_direct_call_refuses_a_raw_int_address(device: str) -> None:
  x = Tensor(np.ones(71, dtype=np.float32), device=device).realize()
  _warm(x)
  from tiny.engine import realize
  ek = (x * 1.5 + 0.25).lazydata.base._ekey
  assert ek is not None
  plan = realize._plans.get(ek[1])
  assert plan is not None and plan.direct is not None
  buf = x.lazydata.buffer
  # a raw address would reach C as a 32-bit int: the direct call declines, the argument array path converts it
  assert not plan.direct(ctypes.addressof(buf._buf), ctypes.addressof(buf._buf))


def test_a_kept_buffer_dropped_any_way_leaves_mem_used_right(device: str) -> None:
  """A kept list lost without drop_free_buffers (another thread replaced or drained it) frees its Buffers through their
  own __del__, which must not count their memory free a second time."""
  x = Tensor(np.arange(73, dtype=np.float32), device=device).realize()
  _warm(x)
  gc.collect()
  before = GlobalCounters.mem_used
  y = (x * 1.5 + 0.25).realize()
  del y
  key = (Device[device].allocator, 73 * 4)
  assert device_mod._free_buffers.get(key)
  lost = device_mod._free_buffers.pop(key)
  assert GlobalCounters.mem_used == before
  del lost
  assert GlobalCounters.mem_used == before
