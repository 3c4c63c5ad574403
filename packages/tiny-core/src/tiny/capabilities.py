"""What core needs to know about a device, declared by the device's plugin instead of being guessed from its name.

A plugin passes a :class:`DeviceCaps` as ``DeviceSpec(caps=...)``; core reads it through ``Device.caps(name)`` (no device
is built for that) or ``Device[name].caps``. The defaults are the conservative answer for a device core knows nothing
about: no buffer views and no zero-copy host access, so a plugin written before this record existed keeps working,
only without those shortcuts. Launch limits stay on the Renderer (``global_max``, ``local_max``, ``local_threads_max``),
because the kernel optimizer sees a device only through its renderer.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import FrozenSet, List

# the BufferOptions fields a device may say it honours (kept as names so this module needs no import of tiny.device)
BUFFER_OPTION_NAMES: FrozenSet[str] = frozenset({"image", "uncached", "cpu_access", "host", "nolru"})


@dataclass(frozen=True)
class DeviceCaps:
  """Capabilities of one device.

  buffer_views: a Buffer on this device may be a view at a byte offset into another Buffer (the allocator implements
    ``offset``), so the scheduler turns contiguous movement ops (shrink, bitcast, reshape) into views instead of copy kernels.
  zero_copy: the device's memory is host memory the allocator can hand out as a memoryview (``as_buffer``) without a copy,
    so reading a realized tensor back (``.numpy()``) need not copy. Discrete GPUs say False: mapping their memory is slow.
  buffer_options: the names of the ``BufferOptions`` fields the allocator honours; the others are accepted and ignored.
  view_alignment: the byte offsets a buffer view may start at are multiples of this. Kernels load vectors (float4) from
    a buffer's start, and GPUs fault on a vector load that is not naturally aligned, so the default, 16, is the
    widest vector a renderer emits; a device whose loads tolerate any address (the CPUs) says 1.
  """
  buffer_views: bool = False
  zero_copy: bool = False
  buffer_options: FrozenSet[str] = frozenset()
  view_alignment: int = 16

  def problems(self) -> List[str]:
    """What is wrong with this record (empty when it is fine): a plugin may build it with any values, core checks them."""
    bad: List[str] = []
    for f in fields(self):
      v = getattr(self, f.name)
      if f.name == "buffer_options":
        if not isinstance(v, frozenset) or not v <= BUFFER_OPTION_NAMES:
          bad.append(f"caps.buffer_options must be a frozenset of {sorted(BUFFER_OPTION_NAMES)}, got {v!r}")
      elif f.name == "view_alignment":
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1):
          bad.append(f"caps.view_alignment must be a power of two >= 1, got {v!r}")
      elif not isinstance(v, bool):
        bad.append(f"caps.{f.name} must be a bool, got {v!r}")
    return bad


DEFAULT_CAPS = DeviceCaps()
