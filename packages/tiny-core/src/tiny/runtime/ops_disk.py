"""DISK: memory-mapped files as buffers. `DISK:/path/to/file` is one device per file.

Buffers are byte ranges of the mapping (views at any byte offset, so a safetensors file becomes one buffer
per tensor with no copy), bitcasts are free, and copies to a compute device read straight from the map.

A file is opened and mapped read-only; it is reopened for writing only when a buffer is written to, so a file that is
only read is never written, extended or truncated, and reading past its end raises. Mappings are keyed on the file's
identity (device, inode, mtime, size): after the file is replaced or rewritten, new buffers map the new contents while
buffers still alive keep the mapping they were made from.
"""
from __future__ import annotations

import mmap
import os
from typing import Any, List, Optional, Tuple

from tiny.device import Allocator, BufferOptions, Compiled


FileIdentity = Tuple[int, int, int, int]


def _identity(st: os.stat_result) -> FileIdentity:
  return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class _Mapping:
  """One open file and its map, shared by every buffer allocated while the file had identity `ident`."""

  def __init__(self, filename: str, fd: int, writable: bool):
    self.filename, self.fd, self.writable, self.refs = filename, fd, writable, 0
    self.mem: Any = None
    self.mapped = 0
    try:
      self.ident = _identity(os.fstat(fd))
      self._remap()
    except BaseException:
      os.close(fd)
      raise

  def _remap(self) -> None:
    size, old = os.fstat(self.fd).st_size, self.mem
    # mmap cannot map 0 bytes; an empty file needs no storage anyway
    self.mem = mmap.mmap(self.fd, size, access=mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ) if size > 0 else bytearray(0)
    self.mapped = size
    self._release(old)

  @staticmethod
  def _release(mem: Any) -> None:
    if isinstance(mem, mmap.mmap):
      try:
        mem.close()
      except BufferError:
        pass  # a memoryview into the map is still alive; the map is closed when it is collected

  def read(self, offset: int, size: int) -> memoryview:
    """Bytes [offset, offset+size) of the file; raises instead of reading past its end (a truncated file)."""
    end = offset + size
    if size and end > self.mapped:
      if os.fstat(self.fd).st_size >= end:
        self._remap()  # the file grew since it was mapped
      else:
        raise RuntimeError(f"{self.filename}: cannot read bytes [{offset}, {end}): the file has only {self.mapped} bytes (truncated?)")
    # a file cut short after it was mapped would crash the process (SIGBUS) on access: check before touching the map
    if size and (now := os.fstat(self.fd).st_size) < end:
      raise RuntimeError(f"{self.filename}: cannot read bytes [{offset}, {end}): the file was truncated to {now} bytes while in use")
    return memoryview(self.mem)[offset:end]

  def write(self, offset: int, data: memoryview) -> None:
    """Write data at offset: reopens the file for writing on first use and extends it when data ends past its end."""
    if data.nbytes == 0:
      return  # nothing to write: a read-only file stays fine
    if not self.writable:
      self._open_for_write()
    end = offset + data.nbytes
    if os.fstat(self.fd).st_size < end:
      os.ftruncate(self.fd, end)
    if self.mapped < end:
      self._remap()
    memoryview(self.mem)[offset:end] = data
    self.ident = _identity(os.fstat(self.fd))  # our own write is not a change that needs a new mapping

  def _open_for_write(self) -> None:
    try:
      fd = os.open(self.filename, os.O_RDWR)
    except PermissionError as e:
      raise PermissionError(f"{self.filename} is read-only; cannot write to it") from e
    except OSError as e:
      raise RuntimeError(f"cannot open {self.filename} for writing: {e}") from e
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != self.ident[:2]:
      os.close(fd)
      raise RuntimeError(f"{self.filename} was replaced after these DISK buffers were made from it; allocate new ones to write to it")
    os.close(self.fd)
    self.fd, self.writable = fd, True
    self._remap()

  def close(self) -> None:
    self._release(self.mem)
    os.close(self.fd)
    self.mem, self.mapped = None, 0


class DiskBuffer:
  """`size` bytes of a mapped file starting at byte `offset`."""

  def __init__(self, device: DiskDevice, size: int, offset: int = 0, mapping: Optional[_Mapping] = None):
    self.device, self.size, self.offset = device, size, offset
    self.mapping = mapping

  def __repr__(self) -> str:
    return f"<DiskBuffer {self.device.dname} size={self.size} offset={self.offset}>"

  def _buf(self) -> memoryview:
    if self.mapping is None or self.mapping.mem is None:
      raise RuntimeError(f"{self.device.dname} is not open")
    return self.mapping.read(self.offset, self.size)

  def _write(self, src: memoryview) -> None:
    if self.mapping is None or self.mapping.mem is None:
      raise RuntimeError(f"{self.device.dname} is not open")
    if src.nbytes != self.size:
      raise ValueError(f"cannot write {src.nbytes} bytes into a DISK buffer of {self.size} bytes")
    self.mapping.write(self.offset, src)


class DiskAllocator(Allocator):
  """Maps the file on allocation (sharing the mapping while the file is unchanged); a mapping closes with its last buffer."""

  def __init__(self, device: DiskDevice):
    self.device = device

  def alloc(self, size: int, options: Optional[BufferOptions] = None) -> DiskBuffer:
    if not isinstance(size, int) or size < 0:
      raise ValueError(f"alloc size must be a non-negative int, got {size!r}")
    # no rounding up of empty buffers: that would be a byte past the end of an empty file
    return self._alloc(size, options if options is not None else BufferOptions())

  def _alloc(self, size: int, options: BufferOptions) -> DiskBuffer:
    return DiskBuffer(self.device, size, 0, self.device._acquire(size))

  def _free(self, opaque: Any, options: BufferOptions) -> None:
    if opaque.mapping is not None:
      self.device._release(opaque.mapping)

  def as_buffer(self, src: DiskBuffer) -> memoryview:
    return src._buf()

  def copyin(self, dest: DiskBuffer, src: memoryview) -> None:
    dest._write(src)

  def copyout(self, dest: memoryview, src: DiskBuffer) -> None:
    dest[:] = src._buf()

  def offset(self, buf: DiskBuffer, size: int, offset: int) -> DiskBuffer:
    return DiskBuffer(buf.device, size, buf.offset + offset, buf.mapping)


class DiskDevice(Compiled):
  """A storage-only device over one file; the name after `DISK:` is the path (a missing file is created, at the size of
  the first buffer allocated on it)."""

  def __init__(self, device: str):
    if ":" not in device or not device.split(":", 1)[1]:
      raise ValueError(f"a DISK device needs a file name, like DISK:/path/to/file; got {device!r}")
    self.filename = device.split(":", 1)[1]
    self.current: Optional[_Mapping] = None
    self.mappings: List[_Mapping] = []
    super().__init__(device, DiskAllocator(self), None, None, None)

  # the current mapping's state (None when the file is not open), for callers that flush or inspect it
  @property
  def mem(self) -> Any:
    return self.current.mem if self.current is not None else None

  @property
  def fd(self) -> Optional[int]:
    return self.current.fd if self.current is not None else None

  @property
  def readonly(self) -> bool:
    return self.current is None or not self.current.writable

  @property
  def count(self) -> int:
    """Buffers allocated on this file and still alive, over all its mappings."""
    return sum(m.refs for m in self.mappings)

  def _acquire(self, size: int) -> _Mapping:
    """The mapping a new buffer of `size` bytes uses: the current one while the file is unchanged, else a fresh one."""
    try:
      st: Optional[os.stat_result] = os.stat(self.filename)
    except FileNotFoundError:
      st = None
    except OSError as e:
      raise RuntimeError(f"cannot open {self.filename} for DISK: {e}") from e
    if st is not None and self.current is not None and self.current.ident == _identity(st):
      self.current.refs += 1
      return self.current
    try:
      if st is None:
        # a new file is ours to write: create it at the buffer's size
        fd = os.open(self.filename, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        try:
          os.ftruncate(fd, size)
        except OSError:
          os.close(fd)
          raise
        m = _Mapping(self.filename, fd, writable=True)
      else:
        m = _Mapping(self.filename, os.open(self.filename, os.O_RDONLY), writable=False)
    except FileExistsError:
      return self._acquire(size)  # created by someone else since the stat: map theirs
    except OSError as e:
      raise RuntimeError(f"cannot open {self.filename} for DISK: {e}") from e
    m.refs = 1
    self.current = m
    self.mappings.append(m)
    return m

  def _release(self, m: _Mapping) -> None:
    m.refs -= 1
    if m.refs == 0:
      m.close()
      self.mappings.remove(m)
      if self.current is m:
        self.current = None
