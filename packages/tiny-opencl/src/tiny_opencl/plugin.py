"""tiny plugin entry point for OpenCL: the device `GPU` (`GPU=1` or `DEVICE=GPU` selects it; `GPU:1` is the second
OpenCL device, counting across platforms). Discovery imports this module, so it stays cheap: gpuctypes and the ICD
loader are loaded by the probe and the factories, never at import.

The renderer works anywhere (without a device it assumes half and double and OpenCL's minimum limits); the compiler
needs an OpenCL platform with the device, because OpenCL compiles in the driver.
"""
from __future__ import annotations

from typing import Any, FrozenSet, List, Optional

from tiny.backend import DeviceCaps
from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "1.1"


def probe() -> Optional[str]:
  """None when an OpenCL device can run here, else why not (no ICD loader, no platform, no device). Never raises."""
  try:
    from tiny_opencl.runtime import opencl_problem
  except Exception as e:  # noqa: BLE001 - a probe reports, it does not raise
    return f"tiny_opencl.runtime failed to import: {type(e).__name__}: {e}"
  return opencl_problem()


def ordinal(device: str) -> int:
  """'GPU' -> 0, 'GPU:1' -> 1."""
  _, _, arg = device.partition(":")
  if arg and not arg.isdigit():
    raise ValueError(f"OpenCL device ids are GPU or GPU:N, got {device!r}")
  return int(arg or 0)


def _info(device: str) -> Any:
  """The DeviceInfo of the device, or None when there is no OpenCL here (rendering only)."""
  if probe() is not None:
    return None
  from tiny_opencl.runtime import device_info
  try:
    return device_info(ordinal(device))
  except Exception:  # noqa: BLE001 - no such device: render for OpenCL's minimums
    return None


def _renderer(device: str) -> Any:
  from tiny_opencl.renderer import OpenCLRenderer
  info = _info(device)
  if info is None:
    return OpenCLRenderer()
  wg = info.max_work_group_size
  return OpenCLRenderer(fp16=info.fp16, fp64=info.fp64, local_max=tuple(min(s, wg) for s in info.max_work_item_sizes[:3]),
                        local_threads_max=wg, shared_max=info.local_mem_size)


def _compiler(device: str) -> Any:
  from tiny_opencl.compiler import CLCompiler
  from tiny_opencl.runtime import OpenCLUnavailable
  if (why := probe()) is not None:
    raise OpenCLUnavailable(f"the OpenCL compiler needs an OpenCL platform with a device: {why}")
  return CLCompiler(ordinal(device))


def _allocator(device: str) -> Any:
  from tiny_opencl.runtime import CLAllocator
  return CLAllocator(ordinal(device))


def _runtime(device: str) -> Any:
  import functools

  from tiny_opencl.runtime import CLProgram
  return functools.partial(CLProgram, ordinal(device))


def _device(device_id: str) -> Any:
  """GPU[:N] as a CLDevice (a Compiled whose synchronize waits for the queue and whose programs take buffer views)."""
  from tiny_opencl.runtime import CLDevice
  return CLDevice(device_id, ordinal(device_id), _renderer(device_id), _compiler(device_id))


def supported_dtypes(device: str = "GPU") -> FrozenSet[Any]:
  """The dtypes the device can run: never bfloat16, half only with cl_khr_fp16, double only with cl_khr_fp64. The names
  of the others are what `--tiny-skip-dtypes` takes for the conformance kit."""
  return _renderer(device).supported_dtypes()


# device memory behind handles: views are sub-buffers, which OpenCL only makes at aligned offsets, so core must not turn
# arbitrary shrinks into views; reading memory back always takes a copy
OPENCL_CAPS = DeviceCaps(buffer_views=False, zero_copy=False, buffer_options=frozenset({"nolru"}))


# below CLANG (10): an OpenCL platform is often a CPU implementation (PoCL), so it is never picked over CLANG by
# itself; GPU=1 or DEVICE=GPU chooses it
@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """The OpenCL device."""
  return [DeviceSpec(name="GPU", allocator=_allocator, renderer=_renderer, compiler=_compiler, runtime=_runtime, priority=8, probe=probe,
                     device_factory=_device, caps=OPENCL_CAPS)]
