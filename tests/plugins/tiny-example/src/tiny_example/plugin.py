"""The EXAMPLE device: what a third-party device plugin looks like. It reuses core's PYTHON interpreter classes, so it
runs everywhere; a real plugin would return its own allocator, renderer, compiler and program loader."""
from __future__ import annotations

from typing import Any, List

from tiny.plugins import DeviceSpec, RendererSpec, hookimpl

TINY_PLUGIN_API = "1.1"


def _python(attr: str, call: bool = True) -> Any:
  def factory(device: str) -> Any:
    from tiny import backend   # imported on use, never at discovery
    obj = getattr(backend, attr)
    return obj() if call else obj
  return factory


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """EXAMPLE has priority -1 so that it is never picked as the default device behind the user's back."""
  return [DeviceSpec(name="EXAMPLE", allocator=_python("PythonAllocator"), renderer=_python("PythonRenderer"),
                     compiler=_python("PythonCompiler"), runtime=_python("PythonProgram", call=False), priority=-1)]


@hookimpl
def tiny_renderers() -> List[RendererSpec]:
  """An extra renderer for EXAMPLE, chosen with DEVICE=EXAMPLE:ALT (here the same interpreter, to show the mechanism)."""
  return [RendererSpec(device="EXAMPLE", name="ALT", renderer=_python("PythonRenderer"))]
