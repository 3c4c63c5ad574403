"""Buffers and allocators: lazy allocation, views, copies, LRU reuse and out-of-memory retry."""
import ctypes

import numpy as np
import pytest

from tiny.device import Allocator, Buffer, BufferOptions, LRUAllocator, MallocAllocator, _MallocAllocator
from tiny.dtype import dtypes
from tiny.helpers import GlobalCounters


class CountingAllocator(LRUAllocator):
  """Host memory that records every real allocation/free and can pretend to run out of memory."""

  def __init__(self, capacity=None):
    super().__init__()
    self.live, self.real_allocs, self.real_frees, self.capacity = 0, 0, 0, capacity

  def _alloc(self, size, options):
    if self.capacity is not None and self.live + size > self.capacity:
      raise MemoryError(f"out of memory: {self.live} live + {size} > {self.capacity}")
    self.live += size
    self.real_allocs += 1
    return bytearray(size)

  def _free(self, opaque, options):
    self.live -= len(opaque)
    self.real_frees += 1

  def copyin(self, dest, src):
    dest[:] = src

  def copyout(self, dest, src):
    dest[:] = src


def test_lru_reuses_freed_buffer_of_same_size_and_options():
  a = CountingAllocator()
  x = a.alloc(128)
  a.free(x, 128)
  y = a.alloc(128)
  assert y is x
  assert (a.hits, a.allocs, a.real_allocs) == (1, 1, 1)
  # a different size or different options is a miss
  a.free(y, 128)
  z = a.alloc(64)
  w = a.alloc(128, BufferOptions(host=True))
  assert z is not x and w is not x
  assert (a.hits, a.allocs, a.real_allocs) == (1, 3, 3)


def test_lru_nolru_option_really_frees():
  a = CountingAllocator()
  opts = BufferOptions(nolru=True)
  x = a.alloc(32, opts)
  a.free(x, 32, opts)
  assert a.real_frees == 1 and a.live == 0
  a.alloc(32, opts)
  assert a.hits == 0 and a.real_allocs == 2


def test_lru_frees_cache_and_retries_when_out_of_memory():
  a = CountingAllocator(capacity=100)
  bufs = [a.alloc(40), a.alloc(40)]
  for b in bufs:
    a.free(b, 40)  # cached, still counted as live device memory
  assert a.live == 80
  big = a.alloc(90)  # only fits once the cache is emptied
  assert len(big) == 90 and a.real_frees == 2 and a.live == 90


def test_lru_env_disable(monkeypatch):
  monkeypatch.setenv("LRU", "0")
  a = CountingAllocator()
  x = a.alloc(8)
  a.free(x, 8)
  assert a.real_frees == 1
  a.alloc(8)
  assert a.hits == 0


def test_allocator_rejects_bad_size():
  with pytest.raises(ValueError):
    CountingAllocator().alloc(-1)


def test_malloc_allocator_alignment_and_roundtrip():
  alloc = _MallocAllocator()
  for size in (1, 7, 64, 1000):
    buf = alloc.alloc(size)
    assert ctypes.addressof(buf) % 64 == 0
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    alloc.copyin(buf, memoryview(data.tobytes()))
    out = bytearray(size)
    alloc.copyout(memoryview(out), buf)
    np.testing.assert_array_equal(np.frombuffer(out, dtype=np.uint8), data)
    np.testing.assert_array_equal(np.frombuffer(alloc.as_buffer(buf), dtype=np.uint8), data)


def test_malloc_allocator_offset_aliases_memory():
  alloc = _MallocAllocator()
  buf = alloc.alloc(16)
  sub = alloc.offset(buf, 4, 8)
  alloc.copyin(sub, memoryview(bytes([1, 2, 3, 4])))
  out = bytearray(16)
  alloc.copyout(memoryview(out), buf)
  assert list(out) == [0] * 8 + [1, 2, 3, 4] + [0] * 4


def test_buffer_is_lazy_and_roundtrips():
  b = Buffer("PYTHON", 10, dtypes.float32)
  assert not b.is_allocated() and b.nbytes == 40
  data = np.arange(10, dtype=np.float32) * 1.5
  b.copyin(memoryview(data.tobytes()))
  assert b.is_allocated()
  np.testing.assert_array_equal(b.numpy(), data)
  out = np.empty(10, dtype=np.float32)
  b.copyout(memoryview(out).cast("B"))
  np.testing.assert_array_equal(out, data)


def test_buffer_initial_value_and_mem_counter():
  before = GlobalCounters.mem_used
  data = np.array([1, -2, 3], dtype=np.int32)
  b = Buffer("PYTHON", 3, dtypes.int32, initial_value=data.tobytes())
  assert GlobalCounters.mem_used == before + 12
  np.testing.assert_array_equal(b.numpy(), data)
  del b
  assert GlobalCounters.mem_used == before


def test_buffer_view_with_offset_shares_memory():
  base = Buffer("PYTHON", 8, dtypes.int32, initial_value=np.arange(8, dtype=np.int32).tobytes())
  v = base.view(3, dtypes.int32, 4 * 4)
  assert v.base is base and v.offset == 16
  np.testing.assert_array_equal(v.ensure_allocated().numpy(), np.arange(4, 7, dtype=np.int32))
  v.copyin(memoryview(np.array([40, 50, 60], dtype=np.int32).tobytes()))
  np.testing.assert_array_equal(base.numpy(), np.array([0, 1, 2, 3, 40, 50, 60, 7], dtype=np.int32))
  # a view of a view is a view of the base, at the summed offset; a different dtype reinterprets the bytes
  vv = v.view(2, dtypes.uint16, 4)
  assert vv.base is base and vv.offset == 20
  np.testing.assert_array_equal(vv.ensure_allocated().numpy(), np.array([50], dtype=np.int32).view(np.uint16))


def test_buffer_errors():
  b = Buffer("PYTHON", 4, dtypes.float32)
  with pytest.raises(ValueError):
    b.copyin(memoryview(bytes(8)))
  with pytest.raises(RuntimeError):
    b.copyout(memoryview(bytearray(16)))  # not allocated yet
  with pytest.raises(ValueError):
    b.view(4, dtypes.float32, 8)  # runs past the end
  with pytest.raises(TypeError):
    Buffer("PYTHON", 4, "float32")
  b.allocate()
  with pytest.raises(RuntimeError):
    b.allocate()


def test_buffer_handle_is_the_allocators_object():
  # Buffer.handle is the backend API's way to reach device memory (graph executors pass it to launch calls)
  b = Buffer("PYTHON", 4, dtypes.float32)
  with pytest.raises(RuntimeError, match="not allocated"):
    _ = b.handle
  marker = object()
  assert Buffer("PYTHON", 4, dtypes.float32, opaque=marker).handle is marker
  assert b.ensure_allocated().handle is b._buf
  with pytest.raises(AttributeError):
    b.handle = marker  # type: ignore[misc]  # read-only


def test_buffer_refcount_is_on_base():
  base = Buffer("PYTHON", 4, dtypes.float32)
  v = base.view(2, dtypes.float32, 0)
  v.ref(2)
  base.ref(1)
  assert base.lb_refcount == 3 and v.lb_refcount == 3


def test_buffer_pickle_carries_contents():
  import pickle
  data = np.array([3.0, 1.0, 4.0], dtype=np.float32)
  b = Buffer("PYTHON", 3, dtypes.float32, initial_value=data.tobytes())
  b2 = pickle.loads(pickle.dumps(b))
  assert b2 is not b
  np.testing.assert_array_equal(b2.numpy(), data)


def test_module_malloc_allocator_is_lru():
  assert isinstance(MallocAllocator, LRUAllocator) and isinstance(MallocAllocator, Allocator)


def test_device_reexport():
  from tiny.device import Device
  from tiny.registry import Device as RegistryDevice
  assert Device is RegistryDevice
