"""A plugin built for tiny plugin API 2.0: tiny-core 0.1 (API 1.1) must refuse it with a message saying how to fix it."""
from __future__ import annotations

from typing import List

from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "2.0"


def _never(device: str) -> None:
  raise AssertionError("a refused plugin's factories must never be called")


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """Would provide WRONGAPI."""
  return [DeviceSpec(name="WRONGAPI", allocator=_never, renderer=_never, compiler=_never, runtime=_never)]  # type: ignore[arg-type]
