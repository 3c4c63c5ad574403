"""tiny plugin entry point for METAL. Discovery imports this module, so it stays cheap: the probe only asks which OS this
is (and, on macOS, for the default MTLDevice), and every heavy import waits until a factory is called.

- renderer: MetalRenderer (MSL 3.1) everywhere, so `Device.renderer("METAL")` renders Metal kernels on any machine, and the
  PYTHON device emulates Metal's simdgroup tensor cores from it (`EMULATE_METAL=1`).
- compiler: on a Mac with a Metal device, Metal's compiler (`MetalCompiler`); elsewhere `MSLSyntaxCompiler`, which
  syntax-checks the kernel with clang and msl_shim.h and returns the source bytes (what a Mac would load), or raises
  CompileError when it cannot check.
- allocator, runtime, device: macOS only (Objective-C runtime through ctypes, tiny_metal.runtime); the JIT's graph is
  MetalGraph (an indirect command buffer, tiny_metal.graph).
"""
from __future__ import annotations

import platform
from typing import Any, List, Optional

from tiny.backend import DeviceCaps
from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "1.1"
NEEDS_MACOS = "Metal needs macOS"


def _on_macos() -> bool:
  return platform.system() == "Darwin"


def probe() -> Optional[str]:
  """None when METAL can run here, else why not. Never raises."""
  if not _on_macos():
    return NEEDS_MACOS
  try:
    from tiny_metal.runtime import metal_problem
    return metal_problem()
  except Exception as e:  # noqa: BLE001 - a probe reports, it does not raise
    return f"Metal failed to start: {type(e).__name__}: {e}"


def _needs_macos(device: str) -> None:
  if not _on_macos():
    raise RuntimeError(f"{device}: {NEEDS_MACOS}; off macOS only the renderer and the MSL syntax check are available")


def _renderer(device: str) -> Any:
  from tiny_metal.renderer import MetalRenderer
  return MetalRenderer()


def _compiler(device: str) -> Any:
  # a compiler must work without the hardware: a Mac without a usable Metal device gets the syntax check too
  if _on_macos() and probe() is None:
    from tiny_metal.compiler import MetalCompiler
    return MetalCompiler()
  from tiny_metal.compiler import MSLSyntaxCompiler
  return MSLSyntaxCompiler()


def _allocator(device: str) -> Any:
  # only for a registry that builds the device from parts; the device factory's allocator also waits for kernels in flight
  _needs_macos(device)
  from tiny_metal.runtime import MetalAllocator, device_handle
  return MetalAllocator(device_handle(), lambda: None)


def _runtime(device: str) -> Any:
  _needs_macos(device)
  from tiny_metal.runtime import MetalDevice
  return MetalDevice(device, _renderer(device), _compiler(device)).runtime


def _graph(device: str) -> Any:
  from tiny_metal.graph import MetalGraph
  return MetalGraph


def _device(device_id: str) -> Any:
  """METAL as a MetalDevice: one queue, copies that wait for the kernels in flight, synchronize, MetalGraph for the JIT."""
  _needs_macos(device_id)
  from tiny_metal.runtime import MetalDevice
  return MetalDevice(device_id, _renderer(device_id), _compiler(device_id), graph=_graph(device_id))


# unified memory: a MTLBuffer's contents are host memory, and buffers can be bound at an offset
METAL_CAPS = DeviceCaps(buffer_views=True, zero_copy=True)


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """The METAL device."""
  return [DeviceSpec(name="METAL", allocator=_allocator, renderer=_renderer, compiler=_compiler, runtime=_runtime, graph=_graph, priority=90,
                     probe=probe, device_factory=_device, caps=METAL_CAPS)]
