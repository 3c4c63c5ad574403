"""The Device registry: device ids, the default device, and one device object per id, built from plugin specs.

Device ids are ``NAME[:RENDERER][:ARG]``: ``CUDA``, ``CUDA:1``, ``CUDA:PTX`` (an extra renderer from the
``tiny_renderers`` hook), ``DISK:/path/file``. Names are upper-cased, index 0 is dropped (``cuda:0`` -> ``CUDA``).
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

from tiny import plugins
from tiny.capabilities import DEFAULT_CAPS, DeviceCaps
from tiny.device import Compiled
from tiny.plugins import DeviceEntry, DeviceSpec, RendererSpec

if TYPE_CHECKING:
  from tiny.device import Compiler
  from tiny.renderer import Renderer


class DeviceError(RuntimeError):
  """A device was asked for that is unknown here or cannot be used here."""


class UnknownDeviceError(DeviceError):
  """No installed plugin provides this device."""


class DeviceUnavailableError(DeviceError):
  """The device is installed but cannot run here (no driver, no hardware, a broken plugin)."""


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class DeviceId:
  """A parsed device id."""
  name: str                  # "CUDA"
  renderer: Optional[str]    # "PTX" when an extra renderer was chosen
  arg: str                   # "" , "1", "/tmp/file": what follows, index 0 dropped

  @property
  def hardware(self) -> str:
    """The id the device's own factories get: the renderer choice removed ("CUDA:PTX:1" -> "CUDA:1")."""
    return self.name + (f":{self.arg}" if self.arg else "")

  def __str__(self) -> str:
    return self.name + (f":{self.renderer}" if self.renderer else "") + (f":{self.arg}" if self.arg else "")


def _describe(entry: DeviceEntry, reason: Optional[str]) -> str:
  return f"{entry.name:<8} {'available' if reason is None else 'unavailable: ' + reason}  [{entry.plugin.label}]"


class _Device:
  """``Device[id]`` gives the device object for an id (one per id); ``Device.DEFAULT`` is the default device name."""

  def __init__(self) -> None:
    self._lock = threading.RLock()
    self._seen: Tuple[int, int] = (-1, -1)
    self._instances: Dict[str, Compiled] = {}
    self._by_spelling: Dict[str, Compiled] = {}   # "cuda:0" -> instance: the hot path skips parsing
    self._caps: Dict[str, DeviceCaps] = {}    # "cuda:0" -> caps: LazyBuffer asks each time a copy might become a view
    self._reasons: Dict[str, Optional[str]] = {}
    self._default: Optional[str] = None

  # ---- bookkeeping ----
  def _sync(self) -> plugins._PluginState:
    st = plugins.state()
    gen = plugins.generation()
    if gen != self._seen:
      if gen[0] != self._seen[0]:
        self._instances.clear()
        self._by_spelling.clear()
        self._default = None
      self._reasons.clear()
      self._caps.clear()
      self._seen = gen
    return st

  @property
  def _devices(self) -> List[str]:
    """Every device name an installed plugin provides (available or not)."""
    return sorted(self._sync().devices)

  # ---- ids ----
  def parse(self, device: str) -> DeviceId:
    """Split a device id into name, renderer choice and argument."""
    if not isinstance(device, str) or not device:
      raise DeviceError(f"a device id must be a non-empty string like 'CUDA:1', got {device!r}")
    name, _, rest = device.partition(":")
    name = name.upper()
    renderer = None
    if rest:
      head, _, tail = rest.partition(":")
      if _IDENT.fullmatch(head) and (name, head.upper()) in self._sync().renderers:
        renderer, rest = head.upper(), tail
    if rest.isdigit():
      rest = "" if int(rest) == 0 else str(int(rest))
    return DeviceId(name, renderer, rest)

  def canonicalize(self, device: Optional[str]) -> str:
    """'cuda:0' -> 'CUDA', 'cuda:1' -> 'CUDA:1', 'cuda:ptx' -> 'CUDA:PTX' (when installed); None -> the default device."""
    return self.DEFAULT if device is None else str(self.parse(device))

  # ---- lookup ----
  def _entry(self, name: str) -> DeviceEntry:
    st = self._sync()
    if name not in st.devices:
      raise UnknownDeviceError(self._unknown_message(name))
    return st.devices[name]

  def _spec(self, did: DeviceId) -> DeviceSpec:
    entry = self._entry(did.name)
    if entry.spec is None:
      raise DeviceUnavailableError(f"device {did.name!r} cannot be used: {entry.error}")
    if did.arg and not did.arg.isdigit() and entry.spec.device_factory is None:
      extra = sorted(r for d, r in self._sync().renderers if d == did.name)
      raise UnknownDeviceError(f"device id {str(did)!r}: {did.name} has no renderer {did.arg!r} (extra renderers installed for {did.name}: "
                               f"{', '.join(extra) or 'none'}), and {did.arg!r} is not a device index")
    return entry.spec

  def _renderer_spec(self, did: DeviceId) -> Optional[RendererSpec]:
    return None if did.renderer is None else self._sync().renderers[(did.name, did.renderer)][0]

  def renderer(self, device: str) -> Renderer:
    """The renderer for a device id, built without touching the hardware (render CUDA kernels on a laptop)."""
    did = self.parse(device)
    if (inst := self._instances.get(str(did))) is not None and hasattr(inst, "renderer"):
      return inst.renderer
    spec, rspec = self._spec(did), self._renderer_spec(did)
    return (rspec.renderer if rspec is not None else spec.renderer)(did.hardware)

  def compiler(self, device: str) -> Compiler:
    """The compiler for a device id, built without touching the hardware."""
    did = self.parse(device)
    if (inst := self._instances.get(str(did))) is not None and hasattr(inst, "compiler"):
      return inst.compiler
    spec, rspec = self._spec(did), self._renderer_spec(did)
    return (rspec.compiler if rspec is not None and rspec.compiler is not None else spec.compiler)(did.hardware)

  def caps(self, device: str) -> DeviceCaps:
    """What the device can do, from its plugin's DeviceSpec; builds nothing and touches no hardware.

    A name no plugin provides (or a blocked one) gets the conservative defaults: core assumes nothing about it."""
    if (c := self._caps.get(device)) is not None and self._seen == plugins.generation():
      return c
    with self._lock:
      self._sync()
      try:
        c = self._spec(self.parse(device)).caps
      except DeviceError:
        c = DEFAULT_CAPS
      self._caps[device] = c
      return c

  def _build(self, did: DeviceId, spec: DeviceSpec) -> Compiled:
    if spec.device_factory is not None:
      inst = spec.device_factory(str(did))
      # the spec is the authority on capabilities, also for device objects a plugin builds itself
      inst.caps = spec.caps
      return inst
    hw = did.hardware
    rspec = self._renderer_spec(did)
    renderer = (rspec.renderer if rspec is not None else spec.renderer)(hw)
    compiler = (rspec.compiler if rspec is not None and rspec.compiler is not None else spec.compiler)(hw)
    return Compiled(str(did), spec.allocator(hw), renderer, compiler, spec.runtime(hw), spec.graph(hw) if spec.graph is not None else None,
                    caps=spec.caps)

  def _try_get(self, did: DeviceId) -> Tuple[Optional[Compiled], Optional[str], Optional[BaseException]]:
    """(instance, None, None) or (None, why not, the exception if one was raised). Caches instances and reasons."""
    key = str(did)
    if key in self._instances:
      return self._instances[key], None, None
    spec = self._spec(did)
    reason = plugins.probe_device(self._entry(did.name))
    if reason is not None:
      self._reasons.setdefault(key, reason)
      return None, reason, None
    try:
      inst = self._build(did, spec)
    except BaseException as e:   # a factory that calls sys.exit() must not end the user's process
      if isinstance(e, KeyboardInterrupt):
        raise
      self._reasons.setdefault(key, reason := f"creating it raised {type(e).__name__}: {e}")
      return None, reason, e
    self._instances[key] = inst
    self._reasons[key] = None
    return inst, None, None

  def __getitem__(self, device: str) -> Compiled:
    """The device object for an id, built on first use and then reused. Raises DeviceError naming the problem."""
    if (inst := self._by_spelling.get(device)) is not None and self._seen == plugins.generation():
      return inst
    with self._lock:
      self._sync()   # forget instances of reset plugins before looking one up (parse syncs only for ids with a ':')
      did = self.parse(device)
      inst, reason, exc = self._try_get(did)
      if reason is not None:
        raise DeviceUnavailableError(self._unavailable_message(str(did), reason)) from exc
      assert inst is not None, "_try_get gives an instance or a reason"
      self._by_spelling[device] = inst
      return inst

  # ---- availability and the default ----
  def availability(self, device: str) -> Optional[str]:
    """None when the device can be used here, else why not: the probe, then creating it (except storage devices:
    negative priority with a device_factory)."""
    with self._lock:
      did = self.parse(device)
      if str(did) in self._reasons:
        return self._reasons[str(did)]
      entry = self._entry(did.name)
      if entry.spec is None:
        return entry.error
      if entry.spec.priority < 0 and entry.spec.device_factory is not None:
        return plugins.probe_device(entry)   # storage devices (DISK) need a path to be created: the probe says it all
      return self._try_get(did)[1]

  def _ranked(self) -> List[DeviceEntry]:
    st = self._sync()
    order = {n: i for i, n in enumerate(st.devices)}   # ties: load order (core's builtins first)
    return sorted((e for e in st.devices.values() if e.spec is not None), key=lambda e: (-e.spec.priority, order[e.name]))  # type: ignore[union-attr]

  def get_available_devices(self) -> Iterator[str]:
    """Names of the devices usable here, best first (devices with a negative priority are left out)."""
    for entry in self._ranked():
      if entry.spec is not None and entry.spec.priority >= 0 and self.availability(entry.name) is None:
        yield entry.name

  def _from_env(self) -> Optional[str]:
    if dev := os.environ.get("DEVICE", "").strip():
      return dev
    chosen = [n for n in self._sync().devices if os.environ.get(n, "") == "1"]
    if len(chosen) > 1:
      raise DeviceError(f"several devices chosen in the environment ({', '.join(f'{n}=1' for n in chosen)}); set only one, or DEVICE=NAME")
    return chosen[0] if chosen else None

  def _choose_default(self) -> str:
    if (want := self._from_env()) is not None:
      did = self.parse(want)
      try:
        self[str(did)]
      except DeviceError as e:
        raise type(e)(f"the device chosen in the environment ({want}) cannot be used: {e}") from (e.__cause__ or e)
      return str(did)
    for name in self.get_available_devices():
      return name
    raise DeviceUnavailableError(self._unknown_message(None))

  @property
  def DEFAULT(self) -> str:
    """DEVICE=NAME or NAME=1 from the environment (fails loudly when unusable), else the best available device."""
    if self._default is not None and self._seen == plugins.generation():
      return self._default
    with self._lock:
      self._sync()
      if self._default is None:
        self._default = self._choose_default()
      return self._default

  @DEFAULT.setter
  def DEFAULT(self, device: str) -> None:
    with self._lock:
      self._sync()
      self._default = self.canonicalize(device)

  # ---- messages ----
  def _listing(self) -> List[str]:
    st = self._sync()
    lines = [f"  {_describe(e, self._safe_reason(e))}" for e in self._ranked()] + \
            [f"  {e.name:<8} unavailable: {e.error}" for e in st.devices.values() if e.spec is None]
    failed = [r for r in st.records if r.error is not None and not r.devices]
    if failed:
      lines.append("plugins that could not be loaded:")
      lines += [f"  {r.label}: {r.error}" for r in failed]
    disabled = [r.label for r in st.records if r.disabled]
    if disabled:
      lines.append(f"disabled by TINY_DISABLE_PLUGINS: {', '.join(disabled)}")
    return lines

  def _safe_reason(self, entry: DeviceEntry) -> Optional[str]:
    try:
      return self.availability(entry.name)
    except Exception as e:   # strict mode: still describe, the caller raises anyway
      return f"{type(e).__name__}: {e}"

  def _unknown_message(self, name: Optional[str]) -> str:
    st = self._sync()
    head = "no device is available here" if name is None else f"unknown device {name!r}: no installed tiny plugin provides it"
    hint = [r for r in st.records if name is not None and r.name.lower() == name.lower() and (r.error or r.disabled)]
    lines = [head + "."]
    lines += [f"it would come from plugin {r.label}, which {'is disabled by TINY_DISABLE_PLUGINS' if r.disabled else 'failed: ' + str(r.error)}"
              for r in hint]
    lines += ["installed devices:"] + self._listing() + ["run `python -m tiny doctor` for details"]
    return "\n".join(lines)

  def _unavailable_message(self, name: str, reason: str) -> str:
    entry = self._entry(self.parse(name).name)
    return "\n".join([f"device {name!r} (from {entry.plugin.label}) is not available here: {reason}", "installed devices:"] + self._listing() +
                     ["run `python -m tiny doctor` for details"])

  def __repr__(self) -> str:
    return f"<Device registry: {', '.join(self._devices)}>"


Device = _Device()
