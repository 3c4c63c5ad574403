"""DISK: memory-mapped files as buffers. `DISK:/path/to/file` is one device per file.

Buffers are byte ranges of the mapping (views at any byte offset, so a safetensors file becomes one buffer
per tensor with no copy), bitcasts are free, and copies to a compute device read straight from the map.
"""
from __future__ import annotations

import mmap
import os
from typing import Any, Optional

from tiny.device import Allocator, BufferOptions, Compiled


class DiskBuffer:
  """`size` bytes of the device's file starting at byte `offset`."""

  def __init__(self, device: DiskDevice, size: int, offset: int = 0):
    self.device, self.size, self.offset = device, size, offset

  def __repr__(self) -> str:
    return f"<DiskBuffer {self.device.dname} size={self.size} offset={self.offset}>"

  def _buf(self) -> memoryview:
    if self.device.mem is None:
      raise RuntimeError(f"{self.device.dname} is not open")
    return memoryview(self.device.mem)[self.offset:self.offset + self.size]


class DiskAllocator(Allocator):
  """Opens (and maps) the file on the first allocation and closes it when the last buffer is freed."""

  def __init__(self, device: DiskDevice):
    self.device = device

  def _alloc(self, size: int, options: BufferOptions) -> DiskBuffer:
    self.device._might_open(size)
    return DiskBuffer(self.device, size)

  def _free(self, opaque: Any, options: BufferOptions) -> None:
    self.device._might_close()

  def as_buffer(self, src: DiskBuffer) -> memoryview:
    return src._buf()

  def copyin(self, dest: DiskBuffer, src: memoryview) -> None:
    if self.device.readonly:
      raise PermissionError(f"{self.device.filename} is opened read-only; cannot write to it")
    dest._buf()[:] = src

  def copyout(self, dest: memoryview, src: DiskBuffer) -> None:
    dest[:] = src._buf()

  def offset(self, buf: DiskBuffer, size: int, offset: int) -> DiskBuffer:
    return DiskBuffer(buf.device, size, buf.offset + offset)


class DiskDevice(Compiled):
  """A storage-only device over one file; the name after `DISK:` is the path (created if missing)."""

  def __init__(self, device: str):
    if ":" not in device or not device.split(":", 1)[1]:
      raise ValueError(f"a DISK device needs a file name, like DISK:/path/to/file; got {device!r}")
    self.filename = device.split(":", 1)[1]
    self.size: Optional[int] = None
    self.count = 0
    self.fd: Optional[int] = None
    self.mem: Any = None
    self.readonly = False
    super().__init__(device, DiskAllocator(self), None, None, None)

  def _might_open(self, size: int) -> None:
    self.count += 1
    if self.size is not None:
      if size > self.size:
        self.count -= 1
        raise RuntimeError(f"{self.filename} is mapped with {self.size} bytes; cannot allocate {size} bytes on it")
      return
    try:
      self.fd = os.open(self.filename, os.O_RDWR | os.O_CREAT)
    except PermissionError:
      self.fd, self.readonly = os.open(self.filename, os.O_RDONLY), True
    except OSError as e:
      self.count -= 1
      raise RuntimeError(f"cannot open {self.filename} for DISK: {e}") from e
    if os.fstat(self.fd).st_size < size:
      if self.readonly:
        os.close(self.fd)
        self.fd, self.count = None, self.count - 1
        raise RuntimeError(f"{self.filename} is read-only and smaller than the {size} bytes asked for")
      os.ftruncate(self.fd, size)
    self.size = size
    # mmap cannot map 0 bytes; an empty buffer needs no storage anyway
    self.mem = (mmap.mmap(self.fd, size, access=mmap.ACCESS_READ if self.readonly else mmap.ACCESS_WRITE) if size > 0 else bytearray(0))

  def _might_close(self) -> None:
    self.count -= 1
    if self.count == 0:
      if isinstance(self.mem, mmap.mmap):
        try:
          self.mem.close()
        except BufferError:
          pass  # a memoryview into the map is still alive; the map is closed when it is collected
      if self.fd is not None:
        os.close(self.fd)
      self.fd, self.mem, self.size = None, None, None
