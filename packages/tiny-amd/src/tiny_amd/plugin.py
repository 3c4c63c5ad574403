"""tiny plugin entry point for AMD. Discovery imports this module, so it stays cheap: the probe only looks for the
driver, and every heavy import waits until a factory is called.

`AMD`, `AMD:1`: HIP C++ from HIPRenderer, compiled by clang (HIPCompiler) to a code object for the GPU's architecture,
run through the HIP runtime (libamdhip64). The target is `AMD_ARCH` when set, else the GPU's architecture, else gfx1100:
the renderer and compiler work without a GPU (for `Device.renderer("AMD")`, `Device.compiler("AMD")` and the PYTHON
device's `EMULATE_AMD=1`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any, List, Optional

from tiny.backend import DeviceCaps
from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "1.1"
NO_DRIVER = "no AMD GPU driver found (/dev/kfd missing, no libamdhip64)"


def _hip_loads() -> bool:
  for name in ["libamdhip64.so", "find_library"]:
    try:
      # find_library runs ldconfig, so it is only the last resort
      ctypes.CDLL(name if name != "find_library" else ctypes.util.find_library("amdhip64") or "libamdhip64-not-found")
      return True
    except OSError:
      continue
  return False


def _driver_missing() -> Optional[str]:
  """Why no AMD GPU can be driven here, or None. The runtime is HIP's: the kernel driver alone is not enough."""
  kfd, hip = os.path.exists("/dev/kfd"), _hip_loads()
  if not kfd and not hip:
    return NO_DRIVER
  if not hip:
    return "the amdgpu kernel driver is present (/dev/kfd) but the HIP runtime (libamdhip64) is not: install ROCm's HIP runtime"
  return None


def _no_clang() -> Optional[str]:
  """Why kernels cannot be compiled here, or None."""
  from tiny_amd.compiler import AMDToolchainError, find_clang
  try:
    find_clang()
    return None
  except AMDToolchainError as e:
    return str(e)


def probe() -> Optional[str]:
  """None when AMD can run here, else why not. Never raises."""
  if (why := _driver_missing()) is not None:
    return why
  try:
    from tiny_amd.runtime import driver_problem
    if (why := driver_problem()) is not None:
      return why
  except Exception as e:  # noqa: BLE001 - a probe reports, it does not raise
    return f"the HIP runtime failed to start: {type(e).__name__}: {e}"
  return _no_clang()


def _ordinal(device: str) -> int:
  """'AMD' -> 0, 'AMD:1' -> 1."""
  _, _, arg = device.partition(":")
  if arg and not arg.isdigit():
    raise ValueError(f"AMD device ids are AMD or AMD:N, got {device!r}")
  return int(arg or 0)


def _arch(device: str) -> Optional[str]:
  """The architecture of the device's GPU when HIP can tell and AMD_ARCH does not override it, else None (the renderer and
  compiler then take AMD_ARCH, or gfx1100)."""
  if os.environ.get("AMD_ARCH") or _driver_missing() is not None:
    return None
  try:
    from tiny_amd.runtime import driver_problem, gpu_arch
    return None if driver_problem() is not None else gpu_arch(_ordinal(device))
  except Exception:  # noqa: BLE001 - no usable GPU: compile for AMD_ARCH
    return None


def _renderer(device: str) -> Any:
  from tiny_amd.renderer import HIPRenderer
  return HIPRenderer(_arch(device))


def _compiler(device: str) -> Any:
  from tiny_amd.compiler import HIPCompiler
  return HIPCompiler(_arch(device))


def _allocator(device: str) -> Any:
  from tiny_amd.runtime import HIPAllocator
  return HIPAllocator(_ordinal(device))


def _runtime(device: str) -> Any:
  from tiny_amd.runtime import program_loader
  return program_loader(_ordinal(device))


def _device(device_id: str) -> Any:
  """AMD[:N] as an AMDDevice (a Compiled whose synchronize waits for the GPU)."""
  from tiny_amd.runtime import AMDDevice
  return AMDDevice(device_id, _ordinal(device_id), _renderer(device_id), _compiler(device_id))


# discrete GPU memory: sub-buffers are offsets into an allocation, host reads take a copy
AMD_CAPS = DeviceCaps(buffer_views=True, zero_copy=False)


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """The AMD device."""
  return [DeviceSpec(name="AMD", allocator=_allocator, renderer=_renderer, compiler=_compiler, runtime=_runtime, priority=70, probe=probe,
                     device_factory=_device, caps=AMD_CAPS)]
