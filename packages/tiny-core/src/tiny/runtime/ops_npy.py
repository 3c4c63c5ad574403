"""NPY: numpy arrays as read-only source buffers, so `Tensor(np_array)` needs no copy until it moves to a compute device."""
from __future__ import annotations

from typing import Any

import numpy as np

from tiny.device import Allocator, BufferOptions, Compiled
from tiny.helpers import flat_mv


class NpyAllocator(Allocator):
  """The opaque handle is the numpy array itself (adopted with Buffer(..., opaque=array) or Buffer.allocate(array))."""

  def _alloc(self, size: int, options: BufferOptions) -> Any:
    return np.zeros(size, dtype=np.uint8)

  def as_buffer(self, src: np.ndarray) -> memoryview:
    return flat_mv(np.require(src, requirements="C").data)

  def copyin(self, dest: np.ndarray, src: memoryview) -> None:
    if not dest.flags.writeable or not dest.flags.c_contiguous:
      raise RuntimeError("cannot copy into an NPY buffer backed by a read-only or non-contiguous array")
    flat_mv(dest.data)[:] = src

  def copyout(self, dest: memoryview, src: np.ndarray) -> None:
    dest[:] = self.as_buffer(src)


class NpyDevice(Compiled):
  """A storage-only device: it holds numpy arrays and cannot run kernels."""

  def __init__(self, device: str = "NPY"):
    super().__init__(device, NpyAllocator(), None, None, None)
