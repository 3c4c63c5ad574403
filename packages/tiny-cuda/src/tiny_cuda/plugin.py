"""tiny plugin entry point for CUDA. Discovery imports this module, so it stays cheap: the probe only looks for the
driver, and every heavy import waits until a factory is called."""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import List, NoReturn, Optional

from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "1.0"
NOT_IMPLEMENTED = "tiny-cuda runtime not implemented yet"


def _driver_missing() -> Optional[str]:
  """Why the CUDA driver cannot be loaded here, or None. Loads libcuda with ctypes only: no gpuctypes, no cuInit."""
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
  return _driver_missing() or NOT_IMPLEMENTED


def _not_yet(device: str) -> NoReturn:
  raise NotImplementedError(f"{NOT_IMPLEMENTED} (asked for {device})")


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """The CUDA device."""
  return [DeviceSpec(name="CUDA", allocator=_not_yet, renderer=_not_yet, compiler=_not_yet, runtime=_not_yet, priority=80, probe=probe)]
