"""tiny plugin entry point for CUDA. Discovery imports this module, so it stays cheap: the probe only loads the driver
library, and every heavy import waits until a factory is called.

- `CUDA`, `CUDA:1`: CUDA C rendered by CUDARenderer, compiled by NVRTC for the GPU's compute capability.
- `CUDA:PTX`, `CUDA:PTX:1`: PTX from PTXRenderer, assembled by nvJitLink.
Renderers and compilers work without a GPU (for `Device.renderer("CUDA")` / `Device.compiler("CUDA:PTX")`): they then
target `CUDA_ARCH` (default sm_80). Allocator, runtime and graph need the driver.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, List, Optional

from tiny.backend import DeviceCaps
from tiny.plugins import DeviceSpec, RendererSpec, hookimpl

TINY_PLUGIN_API = "1.1"


def _driver_missing() -> Optional[str]:
  """Why the CUDA driver cannot be loaded here, or None. ctypes only: no gpuctypes, no cuInit."""
  for name in ["libcuda.so.1", "libcuda.so", "nvcuda.dll", "find_library"]:
    try:
      # find_library runs ldconfig, so it is only the last resort
      ctypes.CDLL(name if name != "find_library" else ctypes.util.find_library("cuda") or "libcuda-not-found")
      return None
    except OSError:
      continue
  return "no CUDA driver (libcuda) found"


def probe() -> Optional[str]:
  """None when CUDA can run here, else why not. Never raises."""
  if (why := _driver_missing()) is not None:
    return why
  try:
    from tiny_cuda.runtime import device_count, driver_problem
    if (why := driver_problem()) is not None:
      return why
    if device_count() == 0:
      return "the CUDA driver sees no GPU"
  except Exception as e:  # noqa: BLE001 - a probe reports, it does not raise
    return f"the CUDA driver failed to start: {type(e).__name__}: {e}"
  return None


def _ordinal(device: str) -> int:
  """'CUDA' -> 0, 'CUDA:1' -> 1."""
  _, _, arg = device.partition(":")
  if arg and not arg.isdigit():
    raise ValueError(f"CUDA device ids are CUDA, CUDA:N, CUDA:PTX or CUDA:PTX:N, got {device!r}")
  return int(arg or 0)


def _arch(device: str) -> Optional[str]:
  """The compute capability of the device's GPU when the driver can tell, else None (CUDA_ARCH / sm_80 then)."""
  if _driver_missing() is not None:
    return None
  try:
    from tiny_cuda.runtime import compute_capability, driver_problem
    return None if driver_problem() is not None else compute_capability(_ordinal(device))
  except Exception:  # noqa: BLE001 - no usable GPU: compile for CUDA_ARCH
    return None


def _renderer(device: str) -> Any:
  from tiny_cuda.renderer import CUDARenderer
  return CUDARenderer(_arch(device))


def _compiler(device: str) -> Any:
  from tiny_cuda.compiler import NVRTCCompiler
  return NVRTCCompiler(_arch(device))


def _ptx_renderer(device: str) -> Any:
  from tiny_cuda.ptx import PTXRenderer
  return PTXRenderer(_arch(device))


def _ptx_compiler(device: str) -> Any:
  from tiny_cuda.compiler import PTXCompiler
  return PTXCompiler(_arch(device))


def _allocator(device: str) -> Any:
  from tiny_cuda.runtime import CUDAAllocator
  return CUDAAllocator(_ordinal(device))


def _runtime(device: str) -> Any:
  from tiny_cuda.runtime import program_loader
  return program_loader(_ordinal(device))


def _graph(device: str) -> Any:
  from tiny_cuda.graph import CUDAGraph
  return CUDAGraph


def _device(device_id: str) -> Any:
  """CUDA[:PTX][:N] as a CUDADevice (a Compiled whose synchronize waits for the GPU)."""
  from tiny import plugins
  from tiny.backend import Device
  from tiny_cuda.runtime import CUDADevice
  did = Device.parse(device_id)
  hw = did.hardware
  ordinal = _ordinal(hw)
  if did.renderer is None:
    renderer, compiler = _renderer(hw), _compiler(hw)
  else:
    rspec = plugins.renderer_specs()[(did.name, did.renderer)]
    renderer = rspec.renderer(hw)
    compiler = rspec.compiler(hw) if rspec.compiler is not None else _compiler(hw)
  return CUDADevice(str(did), ordinal, renderer, compiler, _graph(hw))


# device memory: sub-buffers are pointer offsets, but reading it on the host always takes a copy
CUDA_CAPS = DeviceCaps(buffer_views=True, zero_copy=False, buffer_options=frozenset({"host", "nolru"}))


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """The CUDA device."""
  return [DeviceSpec(name="CUDA", allocator=_allocator, renderer=_renderer, compiler=_compiler, runtime=_runtime, graph=_graph,
                     priority=80, probe=probe, device_factory=_device, caps=CUDA_CAPS)]


@hookimpl
def tiny_renderers() -> List[RendererSpec]:
  """CUDA:PTX: PTX straight from the uops, assembled with nvJitLink."""
  return [RendererSpec(device="CUDA", name="PTX", renderer=_ptx_renderer, compiler=_ptx_compiler)]
