"""The runtime pieces that can be checked without a driver: kernel argument packing and the errors on a machine without CUDA."""
from __future__ import annotations

import ctypes

import pytest

from tiny_cuda import plugin
from tiny_cuda.runtime import CUDAAllocator, CUDADriverMissing, CUDAError, KernelArgs, driver_problem


def test_kernel_args_point_at_their_values() -> None:
  args = KernelArgs((0x1000, 0xDEADBEEF00), (7, -3))
  ptrs = [args.params[i] for i in range(4)]
  assert [ctypes.c_uint64.from_address(p).value for p in ptrs[:2]] == [0x1000, 0xDEADBEEF00]
  assert [ctypes.c_int32.from_address(p).value for p in ptrs[2:]] == [7, -3]
  args.set_buf(1, 0x2000)
  assert ctypes.c_uint64.from_address(args.params[1]).value == 0x2000 and args.params[1] == ptrs[1]


def test_without_a_driver_errors_name_the_problem() -> None:
  if plugin.probe() is None:
    pytest.skip("a CUDA GPU is available here")
  assert driver_problem() == plugin.probe() == "no CUDA driver (libcuda) found"
  alloc = CUDAAllocator(0)   # building it touches nothing; using it needs the driver
  with pytest.raises(CUDADriverMissing, match="no CUDA driver"):
    alloc.alloc(64)
  assert issubclass(CUDADriverMissing, CUDAError) and issubclass(CUDAError, RuntimeError)
