"""The AMD runtime through HIP (libamdhip64), bound here with ctypes: memory, copies, code objects, kernel launch, timing.

NOTE: written against the HIP API documentation on a machine without an AMD GPU; the GPU paths have not run on hardware
yet (see the README). What does not need a GPU is unit-tested: kernarg packing, code-object reading, launch-size checks.

Only the HIP functions used here are bound, so this works with any ROCm (5.x or 6.x) that ships libamdhip64. Every call
goes through `check`, which names the call and HIP's error. All work goes to the null stream of the device, so kernels
and copies run in order; `copyout` and `synchronize` are where the host waits.
"""
from __future__ import annotations

import ctypes
import functools
import re
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tiny.backend import BufferOptions, Compiled, LRUAllocator

from tiny_amd.codeobject import KernelArg, kernel_info

HIP_LIBRARIES = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5")
HIP_MEMCPY_H2D, HIP_MEMCPY_D2H, HIP_MEMCPY_D2D = 1, 2, 3
# hipModuleLaunchKernel's `extra`: the kernel arguments as one packed buffer
HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END = 1, 2, 3
# hipDeviceProp_t changes size between ROCm releases: a buffer larger than every version of it
_DEVICE_PROP_BYTES = 8192


class HIPError(RuntimeError):
  """A HIP call failed (the message names the call and HIP's error)."""


class HIPMissing(HIPError):
  """libamdhip64 could not be loaded."""


_c = ctypes
_vp, _sz, _i, _u = _c.c_void_p, _c.c_size_t, _c.c_int, _c.c_uint
_SIGNATURES: Dict[str, List[Any]] = {
  "hipInit": [_u], "hipGetDeviceCount": [_c.POINTER(_i)], "hipSetDevice": [_i], "hipDeviceSynchronize": [],
  "hipGetDeviceProperties": [_vp, _i], "hipGetErrorString": [_i],
  "hipMalloc": [_c.POINTER(_vp), _sz], "hipFree": [_vp],
  "hipMemcpy": [_vp, _vp, _sz, _i], "hipMemcpyAsync": [_vp, _vp, _sz, _i, _vp],
  "hipModuleLoadData": [_c.POINTER(_vp), _vp], "hipModuleUnload": [_vp], "hipModuleGetFunction": [_c.POINTER(_vp), _vp, _c.c_char_p],
  "hipModuleLaunchKernel": [_vp, _u, _u, _u, _u, _u, _u, _u, _vp, _c.POINTER(_vp), _c.POINTER(_vp)],
  "hipEventCreate": [_c.POINTER(_vp)], "hipEventRecord": [_vp, _vp], "hipEventSynchronize": [_vp],
  "hipEventElapsedTime": [_c.POINTER(_c.c_float), _vp, _vp], "hipEventDestroy": [_vp],
}


@functools.lru_cache(None)
def hip() -> ctypes.CDLL:
  """libamdhip64 with the signatures of the functions used here."""
  errors = []
  for name in HIP_LIBRARIES:
    try:
      lib = ctypes.CDLL(name)
      break
    except OSError as e:
      errors.append(str(e))
  else:
    raise HIPMissing(f"no HIP runtime (libamdhip64) found: {'; '.join(errors)}")
  for fname, args in _SIGNATURES.items():
    fn = getattr(lib, fname)
    fn.argtypes, fn.restype = args, _i
  lib.hipGetErrorString.restype = _c.c_char_p
  return lib


def check(status: int, what: str) -> None:
  """Raise HIPError naming the call when a HIP call did not return hipSuccess."""
  if status != 0:
    desc = hip().hipGetErrorString(status)
    raise HIPError(f"{what} failed: HIP error {status} ({desc.decode(errors='replace') if desc else 'unknown'})")


def driver_problem() -> Optional[str]:
  """None when HIP starts and sees a GPU, else why not. Never raises."""
  try:
    check(hip().hipInit(0), "hipInit")
    if device_count() == 0:
      return "the HIP runtime sees no AMD GPU"
  except HIPError as e:
    return str(e)
  except Exception as e:  # noqa: BLE001 - a probe reports, it does not raise
    return f"starting HIP failed: {type(e).__name__}: {e}"
  return None


def device_count() -> int:
  """How many AMD GPUs HIP sees."""
  n = _c.c_int()
  check(hip().hipGetDeviceCount(_c.byref(n)), "hipGetDeviceCount")
  return n.value


def set_device(ordinal: int) -> None:
  check(hip().hipSetDevice(ordinal), f"hipSetDevice({ordinal})")


def arch_from_properties(raw: bytes) -> Optional[str]:
  """The gcnArchName ('gfx1100' or 'gfx90a:sramecc+:xnack-') in a hipDeviceProp_t, found by its shape: where the field
  sits depends on the ROCm release, its content does not."""
  m = re.search(rb"(gfx[0-9a-f]{3,4}(?::[a-z0-9]+[+-])*)\x00", raw)
  return m.group(1).decode() if m else None


def gpu_arch(ordinal: int) -> str:
  """The bare target name of GPU `ordinal` ('gfx1100')."""
  buf = _c.create_string_buffer(_DEVICE_PROP_BYTES)
  check(hip().hipGetDeviceProperties(_c.cast(buf, _vp), ordinal), f"hipGetDeviceProperties({ordinal})")
  if (arch := arch_from_properties(buf.raw)) is None:
    raise HIPError(f"hipGetDeviceProperties({ordinal}) holds no gcnArchName")
  return arch.split(":")[0]


def synchronize(ordinal: int) -> None:
  """Wait until all work queued on GPU `ordinal` is done."""
  set_device(ordinal)
  check(hip().hipDeviceSynchronize(), "hipDeviceSynchronize")


# *** memory ***

class HIPAllocator(LRUAllocator):
  """Device memory of one GPU; opaque handles are device pointers (ints), views are pointers moved by an offset."""

  def __init__(self, ordinal: int = 0):
    self.ordinal = ordinal
    super().__init__()

  def _alloc(self, size: int, options: BufferOptions) -> Any:
    set_device(self.ordinal)
    ptr = _vp()
    check(hip().hipMalloc(_c.byref(ptr), max(1, size)), f"hipMalloc({size}) on AMD:{self.ordinal}")
    return ptr.value

  def _free(self, opaque: Any, options: BufferOptions) -> None:
    set_device(self.ordinal)
    check(hip().hipFree(_vp(opaque)), "hipFree")

  def copyin(self, dest: Any, src: memoryview) -> None:
    """Host -> device; hipMemcpy from pageable memory returns once src may be reused."""
    set_device(self.ordinal)
    src = src.cast("B") if src.format != "B" or src.ndim != 1 else src
    host = (_c.c_char * len(src)).from_buffer_copy(src) if src.readonly else (_c.c_char * len(src)).from_buffer(src)
    check(hip().hipMemcpy(_vp(dest), _c.cast(host, _vp), len(src), HIP_MEMCPY_H2D), "hipMemcpy(host -> device)")

  def copyout(self, dest: memoryview, src: Any) -> None:
    """Device -> host; waits for the kernels queued before it."""
    set_device(self.ordinal)
    dest = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    host = (_c.c_char * len(dest)).from_buffer(dest)
    check(hip().hipMemcpy(_c.cast(host, _vp), _vp(src), len(dest), HIP_MEMCPY_D2H), "hipMemcpy(device -> host)")

  def transfer(self, dest: Any, src: Any, sz: int, src_dev: Any = None, dest_dev: Any = None) -> None:
    """Device -> device, in order with the kernels (HIP copies between GPUs of one machine itself)."""
    set_device(self.ordinal)
    check(hip().hipMemcpyAsync(_vp(dest), _vp(src), sz, HIP_MEMCPY_D2D, None), "hipMemcpyAsync(device -> device)")

  def offset(self, buf: Any, size: int, offset: int) -> Any:
    """A view into a device buffer: the pointer moved by offset bytes."""
    return buf + offset


# *** kernel arguments and launch sizes ***

def default_kernargs(n_bufs: int, n_vals: int) -> Tuple[KernelArg, ...]:
  """The explicit arguments of a HIPRenderer kernel as clang lays them out: the buffer pointers (8 bytes, 8-aligned), then
  the int32 variables (4 bytes, 4-aligned)."""
  args, off = [], 0
  for size in [8] * n_bufs + [4] * n_vals:
    off = (off + size - 1) // size * size
    args.append(KernelArg(off, size, "global_buffer" if size == 8 else "by_value"))
    off += size
  return tuple(args)


def pack_kernargs(bufs: Sequence[int], vals: Sequence[int], layout: Optional[Sequence[KernelArg]] = None) -> bytes:
  """The kernarg buffer of a launch: each pointer and int at the offset the code object's metadata gives (default_kernargs
  when there is no metadata). Raises ValueError when the arguments do not match the kernel's."""
  layout = tuple(layout) if layout is not None else default_kernargs(len(bufs), len(vals))
  kinds = [a.value_kind for a in layout]
  if len(layout) != len(bufs) + len(vals) or kinds != ["global_buffer"] * len(bufs) + ["by_value"] * len(vals):
    raise ValueError(f"the kernel takes {kinds}, got {len(bufs)} buffers and {len(vals)} ints")
  out = bytearray(max((a.offset + a.size for a in layout), default=0))
  for a, v in zip(layout, list(bufs) + list(vals)):
    if a.value_kind == "global_buffer":
      struct.pack_into("<Q", out, a.offset, v)
    elif a.size == 4:
      struct.pack_into("<i", out, a.offset, v)
    else:
      raise ValueError(f"unsupported by-value argument of {a.size} bytes at offset {a.offset}")
  return bytes(out)


def launch_extra(packed: bytes) -> Tuple[Any, Tuple[Any, ...]]:
  """hipModuleLaunchKernel's `extra` array for a packed kernarg buffer: {BUFFER_POINTER, &buffer, BUFFER_SIZE, &size, END}.
  The second value holds the buffer and the size, which must stay alive until the launch call returns."""
  buf, size = _c.create_string_buffer(packed, max(1, len(packed))), _c.c_size_t(len(packed))
  extra = (_vp * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER, _c.addressof(buf), HIP_LAUNCH_PARAM_BUFFER_SIZE, _c.addressof(size), HIP_LAUNCH_PARAM_END)
  return extra, (buf, size)


def check_launch_dims(global_size: Sequence[int], local_size: Sequence[int], global_max: Sequence[int], local_max: Sequence[int],
                      local_threads_max: int) -> Tuple[Tuple[int, int, int], Tuple[int, int, int]]:
  """The launch sizes padded to 3 dims, after checking them against the device's limits (ValueError names the one broken)."""
  gsz, lsz = tuple((list(global_size) + [1, 1, 1])[:3]), tuple((list(local_size) + [1, 1, 1])[:3])
  for kind, sizes, limits in (("workgroup count", gsz, global_max), ("workgroup size", lsz, local_max)):
    for dim, (s, m) in enumerate(zip(sizes, limits)):
      if not 1 <= s <= m:
        raise ValueError(f"{kind} {s} in dim {'xyz'[dim]} is outside 1..{m} (launch {list(gsz)} x {list(lsz)})")
  if (threads := lsz[0] * lsz[1] * lsz[2]) > local_threads_max:
    raise ValueError(f"a workgroup of {list(lsz)} = {threads} threads is more than the {local_threads_max} this kernel can run")
  return (gsz[0], gsz[1], gsz[2]), (lsz[0], lsz[1], lsz[2])


# *** programs ***

class HIPProgram:
  """A kernel of a code object loaded into GPU `ordinal`."""

  def __init__(self, ordinal: int, name: str, lib: bytes):
    from tiny_amd.renderer import HIPRenderer
    self.ordinal, self.name, self.lib = ordinal, name, lib
    info = kernel_info(lib).get(name)
    if info is None:
      raise HIPError(f"the code object has no kernel {name!r}")
    self.info = info
    self.limits = (HIPRenderer.global_max, HIPRenderer.local_max, min(HIPRenderer.local_threads_max, info.max_flat_workgroup_size))
    set_device(ordinal)
    self.module, self.fn = _vp(), _vp()
    # kept with the program: the runtime may read the image again after loading it
    self.image = _c.create_string_buffer(lib)
    check(hip().hipModuleLoadData(_c.byref(self.module), _c.cast(self.image, _vp)), f"hipModuleLoadData({name})")
    check(hip().hipModuleGetFunction(_c.byref(self.fn), self.module, name.encode()), f"hipModuleGetFunction({name})")

  def __call__(self, *bufs: Any, global_size: Tuple[int, ...] = (1, 1, 1), local_size: Optional[Tuple[int, ...]] = (1, 1, 1),
               vals: Tuple[int, ...] = (), wait: bool = False) -> Optional[float]:
    gsz, lsz = check_launch_dims(global_size, local_size or (1, 1, 1), *self.limits)
    # the explicit arguments only: HIP appends the hidden ones (code object v5) itself, from the kernel's metadata
    extra, _keep = launch_extra(pack_kernargs(bufs, vals, self.info.args))
    set_device(self.ordinal)

    def launch() -> None:
      check(hip().hipModuleLaunchKernel(self.fn, *gsz, *lsz, 0, None, None, extra), f"hipModuleLaunchKernel({self.name}, {gsz} x {lsz})")
    if wait:
      return _timed(launch)
    launch()
    return None

  def __del__(self) -> None:
    if getattr(self, "module", None) is not None and self.module.value:
      try:
        hip().hipModuleUnload(self.module)
      except Exception:  # noqa: BLE001 - interpreter shutdown
        pass


def _timed(launch: Any) -> float:
  """Run launch() between two events; the seconds between them."""
  st, en = _vp(), _vp()
  check(hip().hipEventCreate(_c.byref(st)), "hipEventCreate")
  check(hip().hipEventCreate(_c.byref(en)), "hipEventCreate")
  try:
    check(hip().hipEventRecord(st, None), "hipEventRecord")
    launch()
    check(hip().hipEventRecord(en, None), "hipEventRecord")
    check(hip().hipEventSynchronize(en), "hipEventSynchronize")
    ms = _c.c_float()
    check(hip().hipEventElapsedTime(_c.byref(ms), st, en), "hipEventElapsedTime")
    return ms.value * 1e-3
  finally:
    hip().hipEventDestroy(st)
    hip().hipEventDestroy(en)


def program_loader(ordinal: int) -> Any:
  """runtime(name, lib) -> HIPProgram on GPU `ordinal`."""
  return functools.partial(HIPProgram, ordinal)


class AMDDevice(Compiled):
  """AMD:N through HIP. Renderer and compiler target the GPU's architecture."""

  def __init__(self, device: str, ordinal: int, renderer: Any, compiler: Any):
    self.ordinal = ordinal
    super().__init__(device, HIPAllocator(ordinal), renderer, compiler, program_loader(ordinal))

  def synchronize(self) -> None:
    """Wait for every kernel and copy queued on this GPU."""
    synchronize(self.ordinal)
