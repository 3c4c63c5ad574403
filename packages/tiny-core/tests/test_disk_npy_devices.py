"""DISK (memory-mapped files) and NPY (zero-copy numpy) devices, through Buffers and through schedules."""
import os

import numpy as np
import pytest

from tiny.device import Buffer
from tiny.dtype import dtypes
from tiny.engine.realize import run_schedule
from tiny.engine.schedule import create_schedule
from tiny.lazy import LazyBuffer
from tiny.ops import MetaOps
from tiny.registry import Device
from tiny.runtime.ops_disk import DiskDevice


def realize(*lbs):
  run_schedule(create_schedule(list(lbs)))


def disk_file(tmp_path, data: bytes, name="weights.bin"):
  p = tmp_path / name
  p.write_bytes(data)
  return str(p)


def test_disk_buffer_writes_the_file(tmp_path):
  path = str(tmp_path / "new.bin")
  data = np.arange(8, dtype=np.int16)
  b = Buffer(f"DISK:{path}", 8, dtypes.int16)
  b.copyin(memoryview(data.tobytes()))
  Device[f"DISK:{path}"].mem.flush()
  assert os.path.getsize(path) == 16
  np.testing.assert_array_equal(np.fromfile(path, dtype=np.int16), data)
  np.testing.assert_array_equal(b.numpy(), data)


def test_disk_views_at_byte_offsets_and_bitcast_copy_to_python(tmp_path):
  rng = np.random.default_rng(0)
  floats = rng.standard_normal(6).astype(np.float32)
  ints = np.array([7, -8, 9], dtype=np.int32)
  header = b"HDR!" * 2
  path = disk_file(tmp_path, header + floats.tobytes() + ints.tobytes())
  dev = f"DISK:{path}"
  t = LazyBuffer.metaop(MetaOps.EMPTY, (os.path.getsize(path),), dtypes.uint8, dev)
  realize(t)
  f = t.shrink(((8, 8 + 24),)).cast(dtypes.float32, bitcast=True)
  i = t.shrink(((32, 44),)).cast(dtypes.int32, bitcast=True)
  assert f.shape == (6,) and i.shape == (3,)
  fp, ip = f.copy_to_device("PYTHON"), i.copy_to_device("PYTHON")
  sched = create_schedule([fp, ip])
  assert {si.ast.op for si in sched} == {MetaOps.VIEW, MetaOps.COPY}  # no kernel touches the file
  run_schedule(sched)
  np.testing.assert_array_equal(fp.buffer.numpy(), floats)
  np.testing.assert_array_equal(ip.buffer.numpy(), ints)
  # the views alias the mapped file: writing through one changes the file
  f.base.buffer.copyin(memoryview(np.full(6, 2.5, np.float32).tobytes()))
  Device[dev].mem.flush()
  np.testing.assert_array_equal(np.fromfile(path, dtype=np.float32, count=6, offset=8), np.full(6, 2.5, np.float32))


def test_disk_reshape_bitcast_last_dim(tmp_path):
  data = np.arange(12, dtype=np.uint8)
  path = disk_file(tmp_path, data.tobytes())
  t = LazyBuffer.metaop(MetaOps.EMPTY, (12,), dtypes.uint8, f"DISK:{path}")
  realize(t)
  h = t.reshape((3, 4)).cast(dtypes.uint16, bitcast=True)
  assert h.shape == (3, 2)
  out = h.copy_to_device("PYTHON")
  realize(out)
  np.testing.assert_array_equal(out.buffer.numpy().reshape(3, 2), data.view(np.uint16).reshape(3, 2))
  with pytest.raises(RuntimeError):
    t.reshape((4, 3)).cast(dtypes.uint16, bitcast=True)  # 3 bytes do not make whole uint16s
  with pytest.raises(RuntimeError):
    t.cast(dtypes.float32)  # DISK can only bitcast


def test_disk_device_ids():
  with pytest.raises(ValueError):
    DiskDevice("DISK")
  assert Device["DISK:/tmp/tiny_engine_same_file"] is Device["DISK:/tmp/tiny_engine_same_file"]


def test_disk_file_is_closed_when_buffers_die(tmp_path):
  path = disk_file(tmp_path, bytes(range(16)))
  dev = Device[f"DISK:{path}"]
  b = Buffer(f"DISK:{path}", 16, dtypes.uint8).allocate()
  v = b.view(4, dtypes.uint8, 4).allocate()
  assert dev.fd is not None and list(v.numpy()) == [4, 5, 6, 7]
  del v, b
  assert dev.fd is None and dev.count == 0


def test_disk_read_only_file(tmp_path, monkeypatch):
  path = disk_file(tmp_path, bytes(range(8)))
  real_open = os.open

  def no_write_open(p, flags, *args):
    # what a read-only file gives a non-root user (root ignores permission bits, so simulate it)
    if p == path and flags & os.O_RDWR:
      raise PermissionError(13, "Permission denied", p)
    return real_open(p, flags, *args)
  monkeypatch.setattr(os, "open", no_write_open)
  b = Buffer(f"DISK:{path}", 8, dtypes.uint8).allocate()
  assert list(b.numpy()) == list(range(8))
  with pytest.raises(PermissionError):
    b.copyin(memoryview(bytes(8)))
  missing = Buffer(f"DISK:{tmp_path}/missing_dir/f", 4, dtypes.uint8)  # lazy: no error until allocation
  with pytest.raises(RuntimeError, match="missing_dir"):
    missing.allocate()


def test_npy_is_zero_copy_and_copies_to_python():
  arr = np.arange(10, dtype=np.float32).reshape(2, 5) * 0.5
  lb = LazyBuffer.metaop(MetaOps.EMPTY, arr.shape, dtypes.float32, "NPY")
  lb.buffer.allocate(arr)
  del lb.srcs
  assert np.shares_memory(np.frombuffer(lb.buffer.as_buffer(allow_zero_copy=True), dtype=np.float32), arr)
  out = lb.copy_to_device("PYTHON")
  (si,) = create_schedule([out])
  assert si.ast.op is MetaOps.COPY and si.inputs == (lb.buffer,)
  run_schedule([si])
  np.testing.assert_array_equal(out.buffer.numpy(), arr.ravel())
  # the numpy array is only borrowed: dropping the buffer leaves it intact
  buf = lb.buffer
  del lb, buf
  np.testing.assert_array_equal(arr.ravel(), np.arange(10, dtype=np.float32) * 0.5)


def test_npy_non_contiguous_array_is_read_in_logical_order():
  arr = np.arange(12, dtype=np.int32).reshape(3, 4).T
  b = Buffer("NPY", 12, dtypes.int32, opaque=arr)
  np.testing.assert_array_equal(b.numpy(), np.ascontiguousarray(arr).ravel())


def test_python_to_npy_copy_roundtrip():
  src = Buffer("PYTHON", 4, dtypes.int32, initial_value=np.array([1, 2, 3, 4], np.int32).tobytes())
  dst = Buffer("NPY", 4, dtypes.int32)
  from tiny.engine.realize import BufferCopy
  BufferCopy(16, "NPY", "PYTHON")([dst.ensure_allocated(), src], {})
  np.testing.assert_array_equal(dst.numpy(), [1, 2, 3, 4])


# *** file identity: replaced/truncated files, read-only opening ***

def _replace_file(path, data: bytes):
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)  # what safe_save does: a new inode under the same name


def _opens_for_write(monkeypatch, path):
  """Records every os.open of `path` that asks for write access."""
  writes, real_open = [], os.open

  def spy(p, flags, *args):
    if os.fspath(p) == path and flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
      writes.append(flags)
    return real_open(p, flags, *args)
  monkeypatch.setattr(os, "open", spy)
  return writes


def test_disk_replaced_file_gets_a_new_mapping(tmp_path):
  path = disk_file(tmp_path, bytes(range(8)))
  old = Buffer(f"DISK:{path}", 8, dtypes.uint8).allocate()
  assert list(old.numpy()) == list(range(8))
  _replace_file(path, bytes(range(100, 116)))  # new contents, and bigger than the first mapping
  new = Buffer(f"DISK:{path}", 16, dtypes.uint8).allocate()
  assert list(new.numpy()) == list(range(100, 116))
  # the buffer made before keeps the bytes of the file it was made from
  assert list(old.numpy()) == list(range(8))
  assert list(Buffer(f"DISK:{path}", 16, dtypes.uint8).allocate().numpy()) == list(range(100, 116))
  dev = Device[f"DISK:{path}"]
  del old, new
  assert dev.count == 0 and dev.fd is None and dev.mappings == []


def test_disk_rewritten_in_place_file_is_remapped(tmp_path):
  path = disk_file(tmp_path, bytes(8))
  keep = Buffer(f"DISK:{path}", 8, dtypes.uint8).allocate()
  with open(path, "r+b") as f:  # same inode, new size and mtime
    f.write(bytes(range(1, 13)))
  os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 1_000_000))
  assert list(Buffer(f"DISK:{path}", 12, dtypes.uint8).allocate().numpy()) == list(range(1, 13))
  del keep


def test_disk_short_file_is_never_extended(tmp_path):
  data = bytes(range(10))
  path = disk_file(tmp_path, data)
  before = os.stat(path)
  b = Buffer(f"DISK:{path}", 20, dtypes.uint8).allocate()
  with pytest.raises(RuntimeError, match=r"cannot read bytes \[0, 20\).*only 10 bytes"):
    b.numpy()
  assert list(b.view(4, dtypes.uint8, 6).allocate().numpy()) == [6, 7, 8, 9]  # the bytes that exist still read
  with pytest.raises(RuntimeError, match="only 10 bytes"):
    b.view(4, dtypes.uint8, 8).allocate().numpy()
  del b
  after = os.stat(path)
  assert after.st_size == 10 and after.st_mtime_ns == before.st_mtime_ns
  with open(path, "rb") as f:
    assert f.read() == data


TRUNCATE_WHILE_MAPPED = """
import os, sys
from tiny.device import Buffer
from tiny.dtype import dtypes
path = sys.argv[1]
b = Buffer(f"DISK:{path}", 3 * 4096, dtypes.uint8).allocate()
assert b.numpy()[-1] == 7
os.truncate(path, 100)  # another program cuts the file short while we hold it
try:
  b.numpy()
except RuntimeError as e:
  print("raised:", e)
"""


def test_disk_file_truncated_while_mapped_raises_instead_of_crashing(tmp_path):
  import subprocess
  import sys
  path = disk_file(tmp_path, bytes([7]) * (3 * 4096))
  # in a subprocess: touching the cut-off pages of the map would kill the process with SIGBUS
  p = subprocess.run([sys.executable, "-c", TRUNCATE_WHILE_MAPPED, path], capture_output=True, text=True, timeout=60)
  assert p.returncode == 0, p.stderr
  assert "raised:" in p.stdout and "truncated to 100 bytes" in p.stdout


def test_disk_load_never_opens_the_file_for_writing(tmp_path, monkeypatch):
  data = np.arange(16, dtype=np.float32)
  path = disk_file(tmp_path, data.tobytes())
  before = os.stat(path)
  writes = _opens_for_write(monkeypatch, path)
  t = LazyBuffer.metaop(MetaOps.EMPTY, (64,), dtypes.uint8, f"DISK:{path}")
  realize(t)
  out = t.cast(dtypes.float32, bitcast=True).copy_to_device("PYTHON")
  realize(out)
  np.testing.assert_array_equal(out.buffer.numpy(), data)
  assert Device[f"DISK:{path}"].readonly and writes == []
  del t, out
  after = os.stat(path)
  assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)
  with open(path, "rb") as f:
    assert f.read() == data.tobytes()


def test_disk_chmod_read_only_file_loads(tmp_path):
  path = disk_file(tmp_path, bytes(range(32)))
  os.chmod(path, 0o444)
  try:
    before = os.stat(path)
    b = Buffer(f"DISK:{path}", 32, dtypes.uint8).allocate()
    assert list(b.view(8, dtypes.uint8, 24).allocate().numpy()) == list(range(24, 32))
    if os.geteuid() != 0:  # root may write anyway
      with pytest.raises(PermissionError, match="read-only"):
        b.copyin(memoryview(bytes(32)))
    del b
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
  finally:
    os.chmod(path, 0o644)


def test_disk_writes_reopen_the_file_and_extend_it(tmp_path):
  path = disk_file(tmp_path, bytes(range(8)))
  dev = Device[f"DISK:{path}"]
  b = Buffer(f"DISK:{path}", 8, dtypes.uint8).allocate()
  view = b.view(4, dtypes.uint8, 2).allocate()
  assert dev.readonly and list(view.numpy()) == [2, 3, 4, 5]
  view.copyin(memoryview(bytes([40, 41, 42, 43])))
  assert not dev.readonly
  assert list(b.numpy()) == [0, 1, 40, 41, 42, 43, 6, 7]
  with open(path, "rb") as f:
    assert f.read() == bytes([0, 1, 40, 41, 42, 43, 6, 7])
  # a buffer that reaches past the end: reading fails, writing is asked for and grows the file
  big = Buffer(f"DISK:{path}", 12, dtypes.uint8).allocate()
  with pytest.raises(RuntimeError, match="only 8 bytes"):
    big.numpy()
  big.copyin(memoryview(bytes(range(50, 62))))
  assert os.path.getsize(path) == 12 and list(big.numpy()) == list(range(50, 62))
  # writing through a DISK Tensor (assign) works on an existing file too
  from tiny.tensor import Tensor
  t = Tensor.empty(12, dtype=dtypes.uint8, device=f"disk:{path}")
  t[2:6].assign(Tensor(np.array([9, 8, 7, 6], np.uint8), device="NPY"))
  with open(path, "rb") as f:
    assert f.read() == bytes([50, 51, 9, 8, 7, 6]) + bytes(range(56, 62))


def test_disk_write_to_replaced_file_through_old_buffer_raises(tmp_path):
  path = disk_file(tmp_path, bytes(4))
  old = Buffer(f"DISK:{path}", 4, dtypes.uint8).allocate()
  old.numpy()
  _replace_file(path, b"new!")
  with pytest.raises(RuntimeError, match="was replaced"):
    old.copyin(memoryview(b"old!"))
  with open(path, "rb") as f:
    assert f.read() == b"new!"
