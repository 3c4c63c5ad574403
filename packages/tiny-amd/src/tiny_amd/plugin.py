"""tiny plugin entry point for AMD. Discovery imports this module, so it stays cheap: the probe only looks for the
driver, and every heavy import waits until a factory is called."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import List, NoReturn, Optional

from tiny.backend import DeviceCaps
from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "1.1"
NOT_IMPLEMENTED = "tiny-amd runtime not implemented yet"


def _driver_missing() -> Optional[str]:
  """Why no AMD GPU can be driven here, or None: needs the amdgpu kernel driver (/dev/kfd) or the HIP runtime library."""
  if os.path.exists("/dev/kfd"):
    return None
  for name in ["libamdhip64.so", "find_library"]:
    try:
      # find_library runs ldconfig, so it is only the last resort
      ctypes.CDLL(name if name != "find_library" else ctypes.util.find_library("amdhip64") or "libamdhip64-not-found")
      return None
    except OSError:
      continue
  return "no AMD GPU driver found (/dev/kfd missing, no libamdhip64)"


def probe() -> Optional[str]:
  """None when AMD can run here, else why not. Never raises."""
  return _driver_missing() or NOT_IMPLEMENTED


def _not_yet(device: str) -> NoReturn:
  raise NotImplementedError(f"{NOT_IMPLEMENTED} (asked for {device})")


# discrete GPU memory: sub-buffers are offsets into an allocation, host reads take a copy
AMD_CAPS = DeviceCaps(buffer_views=True, zero_copy=False)


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """The AMD device."""
  return [DeviceSpec(name="AMD", allocator=_not_yet, renderer=_not_yet, compiler=_not_yet, runtime=_not_yet, priority=70, probe=probe,
                     caps=AMD_CAPS)]
