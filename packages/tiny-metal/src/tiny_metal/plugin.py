"""tiny plugin entry point for METAL. Discovery imports this module, so it stays cheap: the probe only looks for the
driver, and every heavy import waits until a factory is called."""
from __future__ import annotations

import platform
from typing import List, NoReturn, Optional

from tiny.backend import DeviceCaps
from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "1.1"
NOT_IMPLEMENTED = "tiny-metal runtime not implemented yet"


def _driver_missing() -> Optional[str]:
  """Metal exists only on macOS."""
  return None if platform.system() == "Darwin" else "Metal needs macOS"


def probe() -> Optional[str]:
  """None when METAL can run here, else why not. Never raises."""
  return _driver_missing() or NOT_IMPLEMENTED


def _not_yet(device: str) -> NoReturn:
  raise NotImplementedError(f"{NOT_IMPLEMENTED} (asked for {device})")


# unified memory: a MTLBuffer's contents are host memory, and buffers can be bound at an offset
METAL_CAPS = DeviceCaps(buffer_views=True, zero_copy=True)


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """The METAL device."""
  return [DeviceSpec(name="METAL", allocator=_not_yet, renderer=_not_yet, compiler=_not_yet, runtime=_not_yet, priority=90, probe=probe,
                     caps=METAL_CAPS)]
