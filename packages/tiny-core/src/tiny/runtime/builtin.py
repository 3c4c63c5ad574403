"""Core's own plugin: registers PYTHON, DISK and NPY through the same hook as any third-party plugin.

The device modules are imported inside the factories, so discovery stays cheap and a problem in one of them
only makes that device unavailable.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, List

from tiny.capabilities import DeviceCaps
from tiny.plugins import PLUGIN_API_VERSION, DeviceSpec, hookimpl

TINY_PLUGIN_API = PLUGIN_API_VERSION


def _lazy(module: str, attr: str, call: bool = True) -> Callable[[str], Any]:
  """A factory that imports tiny.runtime.<module> only when the device is used."""
  def factory(device: str) -> Any:
    obj = getattr(importlib.import_module(f"tiny.runtime.{module}"), attr)
    return obj() if call else obj
  factory.__qualname__ = f"{module}.{attr}"
  return factory


def _storage_only(device: str) -> Any:
  """DISK and NPY hold data; they cannot run kernels, so they have no renderer, compiler or program loader."""
  raise RuntimeError(f"{device} is a storage device and cannot run kernels")


def _device(module: str, cls: str) -> Callable[[str], Any]:
  def factory(device: str) -> Any:
    return getattr(importlib.import_module(f"tiny.runtime.{module}"), cls)(device)
  return factory


def _module_probe(module: str) -> Callable[[], Any]:
  """Available when the device module can be found (it is part of core, so only a broken install lacks it)."""
  def probe() -> Any:
    return None if importlib.util.find_spec(f"tiny.runtime.{module}") is not None else f"tiny.runtime.{module} is missing from this tiny-core"
  return probe


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """PYTHON is always there (priority 0, the fallback default); DISK and NPY are never picked automatically."""
  return [
    DeviceSpec(name="PYTHON", allocator=_lazy("ops_python", "PythonAllocator"), renderer=_lazy("ops_python", "PythonRenderer"),
               compiler=_lazy("ops_python", "PythonCompiler"), runtime=_lazy("ops_python", "PythonProgram", call=False),
               priority=0, probe=_module_probe("ops_python"), caps=DeviceCaps(buffer_views=False, zero_copy=True)),
    DeviceSpec(name="DISK", allocator=_storage_only, renderer=_storage_only, compiler=_storage_only, runtime=_storage_only,
               priority=-100, probe=_module_probe("ops_disk"), device_factory=_device("ops_disk", "DiskDevice"),
               caps=DeviceCaps(buffer_views=True, zero_copy=True, view_alignment=1)),
    DeviceSpec(name="NPY", allocator=_storage_only, renderer=_storage_only, compiler=_storage_only, runtime=_storage_only,
               priority=-100, probe=_module_probe("ops_npy"), device_factory=_device("ops_npy", "NpyDevice"), caps=DeviceCaps(zero_copy=True)),
  ]
