"""The public, versioned plugin contract of tiny, and plugin discovery.

A device package declares an entry point in the group ``tiny``::

    [project.entry-points.tiny]
    mychip = "tiny_mychip.plugin"

and that module holds pluggy hook implementations::

    from tiny.plugins import DeviceSpec, hookimpl
    TINY_PLUGIN_API = "1.1"

    @hookimpl
    def tiny_devices():
      return [DeviceSpec(name="MYCHIP", allocator=..., renderer=..., compiler=..., runtime=..., probe=...)]

Discovery runs on first use of ``Device`` (never at ``import tiny``). Every plugin is loaded in its own try:
a plugin that fails is recorded (see :func:`plugin_records`, ``python -m tiny doctor``) and the others go on.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import threading
import traceback
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import pluggy

from tiny.capabilities import DeviceCaps

if TYPE_CHECKING:
  from tiny.device import Allocator, Compiled, Compiler
  from tiny.renderer import Renderer

PLUGIN_API_VERSION = "1.2"
ENTRY_POINT_GROUP = "tiny"
PROJECT_NAME = "tiny"
CORE_DISTRIBUTION = "tiny-core"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

_DEVICE_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def _usable() -> Optional[str]:
  return None


@dataclass(frozen=True)
class DeviceSpec:
  """What a plugin tells tiny about one device. Every factory takes the device id ("CUDA" or "CUDA:1").

  renderer and compiler must work without the hardware. probe must be cheap and never raise: it returns None
  when the device can run here, else a short human reason ("no CUDA driver (libcuda) found").
  priority: the highest-priority available device becomes Device.DEFAULT; a negative priority marks a device
  that is never picked automatically (storage devices such as DISK, test devices) and is left out of
  Device.get_available_devices().
  device_factory, when given, builds the device object itself instead of tiny.device.Compiled.
  caps (optional, added in API 1.1) says what the device can do (buffer views, zero-copy
  host access, ...); the default claims nothing, which is always safe.
  """
  name: str
  allocator: Callable[[str], "Allocator"]
  renderer: Callable[[str], "Renderer"]
  compiler: Callable[[str], "Compiler"]
  runtime: Callable[[str], Callable[[str, bytes], Any]]
  graph: Optional[Callable[[str], Any]] = None
  priority: int = 0
  probe: Callable[[], Optional[str]] = _usable
  device_factory: Optional[Callable[[str], "Compiled"]] = None
  caps: DeviceCaps = field(default_factory=DeviceCaps)


@dataclass(frozen=True)
class RendererSpec:
  """An extra code generator for a device, chosen with a device id such as ``CUDA:PTX``.

  compiler (optional, an extension of API 1.0 that older cores ignore) is used instead of the device's own
  compiler when this renderer is chosen, for renderers whose output the device's compiler does not accept.
  """
  device: str
  name: str
  renderer: Callable[[str], "Renderer"]
  compiler: Optional[Callable[[str], "Compiler"]] = None


class TinyHookSpecs:
  """The hooks a tiny plugin may implement (pluggy project name ``tiny``)."""

  @hookspec
  def tiny_devices(self) -> List[DeviceSpec]:  # type: ignore[empty-body]
    """Return the DeviceSpecs this plugin provides. Must be cheap: no driver set-up, no heavy imports."""

  @hookspec
  def tiny_renderers(self) -> List[RendererSpec]:  # type: ignore[empty-body]
    """Return extra renderers for any device (also devices of other plugins)."""


class PluginError(RuntimeError):
  """A plugin could not be used: it failed to import, its hook raised, its API version does not fit, or it
  claims a device name another plugin already has."""


@dataclass
class PluginRecord:
  """What discovery learned about one plugin, for error messages and ``python -m tiny doctor``."""
  name: str                      # entry-point name, or the module name for builtin/registered plugins
  value: str                     # the module path ("tiny_cuda.plugin")
  source: str                    # "builtin", "entry-point" or "register"
  distribution: Optional[str] = None
  version: Optional[str] = None
  api: Optional[str] = None      # TINY_PLUGIN_API the plugin declares
  devices: List[str] = field(default_factory=list)
  renderers: List[str] = field(default_factory=list)
  error: Optional[str] = None    # one-line reason the plugin (or part of it) is not used
  traceback: Optional[str] = None
  disabled: bool = False
  warnings: List[str] = field(default_factory=list)

  @property
  def label(self) -> str:
    """'name (distribution version)' for messages."""
    dist = f" ({self.distribution} {self.version or '?'})" if self.distribution else ""
    return f"{self.name}{dist}"


@dataclass
class DeviceEntry:
  """A device known to tiny: its spec and the plugin that provided it, or the reason it is blocked."""
  name: str
  spec: Optional[DeviceSpec]
  plugin: PluginRecord
  error: Optional[str] = None    # set when the name is unusable (claimed by two plugins)


def _parse_version(v: str) -> Tuple[int, int]:
  m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(v))
  if m is None:
    raise ValueError(f"plugin API version {v!r} is not of the form 'major.minor'")
  return int(m.group(1)), int(m.group(2))


def api_compatible(plugin_api: str, core_api: str = PLUGIN_API_VERSION) -> bool:
  """True when a plugin built for plugin_api can run on a core providing core_api (same major, minor not newer)."""
  pmaj, pmin = _parse_version(plugin_api)
  cmaj, cmin = _parse_version(core_api)
  return pmaj == cmaj and pmin <= cmin


def core_version() -> str:
  """The installed tiny-core version ('unknown' when running from a source tree without metadata)."""
  try:
    return importlib.metadata.version(CORE_DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    return "unknown"


def _version_refusal(rec: PluginRecord, plugin_api: str) -> str:
  dist = rec.distribution or rec.value
  pmaj, pmin = _parse_version(plugin_api)
  cmaj, cmin = _parse_version(PLUGIN_API_VERSION)
  if (pmaj, pmin) > (cmaj, cmin):
    fix = f"pip install --upgrade {CORE_DISTRIBUTION}"
    why = "it needs a newer tiny-core"
  else:
    fix = f"pip install --upgrade {dist}"
    why = "it was built for an older tiny-core"
  return (f"plugin {rec.name!r} from {dist} {rec.version or '?'} was built for tiny plugin API {plugin_api}, but "
          f"{CORE_DISTRIBUTION} {core_version()} provides plugin API {PLUGIN_API_VERSION}; {why}. Fix: `{fix}`")


def strict() -> bool:
  """TINY_STRICT_PLUGINS=1 turns every plugin problem into an exception (for plugin authors)."""
  return os.environ.get("TINY_STRICT_PLUGINS", "0") not in ("", "0")


def disabled_names() -> List[str]:
  """Lower-cased entry-point or distribution names listed in TINY_DISABLE_PLUGINS (comma separated)."""
  return [x.strip().lower() for x in os.environ.get("TINY_DISABLE_PLUGINS", "").split(",") if x.strip()]


def _short_error(e: BaseException) -> str:
  return f"{type(e).__name__}: {e}"


def _reraise_interrupt(e: BaseException) -> None:
  """Plugin code may raise anything (SystemExit too) and that must not end the user's process; Ctrl-C still does."""
  if isinstance(e, KeyboardInterrupt):
    raise e


def plugin_timeout() -> float:
  """Seconds a probe or hook may take before it is reported as hanging (TINY_PLUGIN_TIMEOUT, default 5)."""
  try:
    return max(0.01, float(os.environ.get("TINY_PLUGIN_TIMEOUT", "5")))
  except ValueError:
    return 5.0


class PluginTimeout(PluginError):
  """A plugin's probe or hook did not return in time (it keeps running in a daemon thread, its result is ignored)."""


def _bounded(fn: Callable[[], Any], what: str) -> Any:
  """fn() run in a daemon thread: its value, its exception re-raised here, or PluginTimeout when it hangs.

  A hanging probe would otherwise hang Device.DEFAULT and every program that asks for it."""
  out: Dict[str, Any] = {}

  def target() -> None:
    try:
      out["value"] = fn()
    except BaseException as e:   # handed to the caller, which decides
      out["error"] = e
  t = threading.Thread(target=target, name=f"tiny plugin: {what}", daemon=True)
  t.start()
  t.join(plugin_timeout())
  if t.is_alive():
    raise PluginTimeout(f"{what} did not return within {plugin_timeout():g} s (TINY_PLUGIN_TIMEOUT)")
  if "error" in out:
    raise out["error"]
  return out.get("value")


def _callable_or_none(x: Any) -> bool:
  return x is None or callable(x)


def _spec_problems(x: Any) -> List[str]:
  """What is wrong with a DeviceSpec or RendererSpec a plugin returned (empty when it is fine).

  Checked at registration so that one bad spec (priority="high") cannot break default selection for every device."""
  bad: List[str] = []
  if isinstance(x, DeviceSpec):
    if not isinstance(x.name, str) or not _DEVICE_NAME.fullmatch(x.name):
      bad.append(f"name {x.name!r} must be upper-case letters, digits and _, starting with a letter")
    if not isinstance(x.priority, int) or isinstance(x.priority, bool):
      bad.append(f"priority must be an int, got {x.priority!r}")
    for f in ("allocator", "renderer", "compiler", "runtime", "probe"):
      if not callable(getattr(x, f)):
        bad.append(f"{f} must be callable, got {getattr(x, f)!r}")
    for f in ("graph", "device_factory"):
      if not _callable_or_none(getattr(x, f)):
        bad.append(f"{f} must be callable or None, got {getattr(x, f)!r}")
    if not isinstance(x.caps, DeviceCaps):
      bad.append(f"caps must be a tiny.backend.DeviceCaps, got {x.caps!r}")
    else:
      bad.extend(x.caps.problems())
  elif isinstance(x, RendererSpec):
    for f in ("device", "name"):
      if not isinstance(getattr(x, f), str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", getattr(x, f)):
        bad.append(f"{f} {getattr(x, f)!r} must be a name of letters, digits and _, starting with a letter")
    if not callable(x.renderer):
      bad.append(f"renderer must be callable, got {x.renderer!r}")
    if not _callable_or_none(x.compiler):
      bad.append(f"compiler must be callable or None, got {x.compiler!r}")
  return bad


_warned: set = set()


def _warn_once(msg: str) -> None:
  if msg not in _warned:
    _warned.add(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


class _PluginState:
  """All discovery results. One instance per process; reset() drops it (tests)."""

  def __init__(self) -> None:
    self.pm = pluggy.PluginManager(PROJECT_NAME)
    self.pm.add_hookspecs(TinyHookSpecs)
    self.records: List[PluginRecord] = []
    self.devices: Dict[str, DeviceEntry] = {}
    self.renderers: Dict[Tuple[str, str], Tuple[RendererSpec, PluginRecord]] = {}
    self.discovered = False

  # ---- loading ----
  def _fail(self, rec: PluginRecord, what: str, e: BaseException) -> None:
    rec.error = f"{what}: {_short_error(e)}"
    rec.traceback = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if strict():
      raise PluginError(f"plugin {rec.label} failed ({rec.error}); TINY_STRICT_PLUGINS is set") from e

  def _check_api(self, rec: PluginRecord, module: ModuleType) -> Optional[str]:
    api = getattr(module, "TINY_PLUGIN_API", None)
    if api is None:
      rec.warnings.append(f"does not declare TINY_PLUGIN_API; assumed {PLUGIN_API_VERSION}")
      return None
    rec.api = str(api)
    try:
      ok = api_compatible(rec.api)
    except ValueError as e:
      return str(e)
    return None if ok else _version_refusal(rec, rec.api)

  def add_module(self, rec: PluginRecord, module: ModuleType, explicit: bool = False) -> bool:
    """Register module's hooks and take its specs. Records (in strict mode raises) any problem; explicit=True
    (register()) raises PluginError instead and leaves no trace of a plugin that cannot be used as a whole."""
    refusal = self._check_api(rec, module)
    if refusal is not None:
      rec.error = refusal
      if strict() or explicit:
        raise PluginError(refusal)
      return False
    try:
      self.pm.register(module, name=f"{rec.source}:{rec.name}")
      unknown = [hc.name for hc in (self.pm.get_hookcallers(module) or []) if hc.spec is None]
      if unknown:
        raise PluginError(f"unknown hook(s) {', '.join(unknown)}; tiny plugin API {PLUGIN_API_VERSION} has tiny_devices, tiny_renderers")
    except BaseException as e:
      _reraise_interrupt(e)
      if self.pm.is_registered(module):
        self.pm.unregister(module)
      if explicit:
        raise PluginError(f"cannot register plugin {rec.name!r}: {_short_error(e)}") from e
      self._fail(rec, "registration failed", e)
      return False
    try:
      dspecs = self._call(rec, module, "tiny_devices", DeviceSpec)
      rspecs = self._call(rec, module, "tiny_renderers", RendererSpec)
      if explicit:
        if rec.error is not None:
          raise PluginError(f"cannot register plugin {rec.name!r}: {rec.error}")
        for spec in dspecs:
          if spec.name in self.devices:
            raise PluginError(f"device {spec.name!r} is claimed by two plugins: {self.devices[spec.name].plugin.label} and {rec.label}")
        for rs in rspecs:
          if (key := (rs.device.upper(), rs.name.upper())) in self.renderers:
            raise PluginError(f"renderer {':'.join(key)!r} is provided by two plugins: {self.renderers[key][1].label} and {rec.label}")
    except BaseException:
      self.pm.unregister(module)
      raise
    self._take(rec, dspecs, rspecs)
    return True

  def _call(self, rec: PluginRecord, module: ModuleType, hook: str, kind: type) -> List[Any]:
    out: List[Any] = []
    for impl in getattr(self.pm.hook, hook).get_hookimpls():
      if impl.plugin is not module:
        continue
      try:
        res = _bounded(impl.function, f"hook {hook} of plugin {rec.label}")
        if res is None:
          continue
        if not isinstance(res, (list, tuple)) or not all(isinstance(x, kind) for x in res):
          raise PluginError(f"{hook}() must return a list of {kind.__name__}, got {res!r}")
        problems = [f"{getattr(x, 'name', '?')!r}: {p}" for x in res for p in _spec_problems(x)]
        if problems:
          raise PluginError(f"{hook}() returned bad specs: " + "; ".join(problems))
        out.extend(res)
      except BaseException as e:
        _reraise_interrupt(e)
        self._fail(rec, f"hook {hook} {'hung' if isinstance(e, PluginTimeout) else 'raised'}", e)
    return out

  def _take(self, rec: PluginRecord, dspecs: List[DeviceSpec], rspecs: List[RendererSpec]) -> None:
    for spec in dspecs:
      rec.devices.append(spec.name)
      if spec.name in self.devices:
        other = self.devices[spec.name]
        msg = (f"device {spec.name!r} is claimed by two plugins: {other.plugin.label} and {rec.label}; "
               "uninstall one or block it with TINY_DISABLE_PLUGINS")
        other.error, other.spec = msg, None
        rec.error = rec.error or msg
        other.plugin.error = other.plugin.error or msg
        if strict():
          raise PluginError(msg)
        # the device is now unusable, so the default may silently move to another one: say so where the user sees it
        _warn_once(msg + " (neither is used)")
      else:
        self.devices[spec.name] = DeviceEntry(spec.name, spec, rec)
    for rs in rspecs:
      key = (rs.device.upper(), rs.name.upper())
      rec.renderers.append(":".join(key))
      if key in self.renderers:
        msg = f"renderer {':'.join(key)!r} is provided by two plugins: {self.renderers[key][1].label} and {rec.label}"
        rec.error = rec.error or msg
        if strict():
          raise PluginError(msg)
        continue
      self.renderers[key] = (rs, rec)

  def _load_entry_point(self, ep: importlib.metadata.EntryPoint) -> None:
    dist = getattr(ep, "dist", None)
    rec = PluginRecord(name=ep.name, value=ep.value, source="entry-point",
                       distribution=dist.metadata["Name"] if dist is not None else None, version=dist.version if dist is not None else None)
    self.records.append(rec)
    blocked = disabled_names()
    if ep.name.lower() in blocked or (rec.distribution or "").lower() in blocked:
      rec.disabled = True
      return
    try:
      module = ep.load()
    except BaseException as e:
      _reraise_interrupt(e)
      self._fail(rec, "import failed", e)
      return
    if not isinstance(module, ModuleType):
      self._fail(rec, "bad entry point", PluginError(f"entry point {ep.value!r} must name a module, got {type(module).__name__}"))
      return
    self.add_module(rec, module)

  def discover(self) -> None:
    """Load core's builtin devices, then every entry point in the group ``tiny``, each in its own try."""
    if self.discovered:
      return
    self.discovered = True
    from tiny.runtime import builtin
    self.records.append(rec := PluginRecord(name="builtin", value=builtin.__name__, source="builtin",
                                            distribution=CORE_DISTRIBUTION, version=core_version()))
    self.add_module(rec, builtin)
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
      self._load_entry_point(ep)
    if strict():
      for entry in self.devices.values():
        probe_device(entry)


_lock = threading.RLock()
_state: Optional[_PluginState] = None
_generation = 0   # bumped by reset(): the registry drops its device instances and the cached default
_revision = 0     # bumped by every change of the known devices: the registry drops cached availability


def state() -> _PluginState:
  """The discovered plugins (runs discovery on first call)."""
  global _state, _revision
  with _lock:
    if _state is None:
      _state = _PluginState()
      _revision += 1
    if not _state.discovered:
      try:
        _state.discover()
      except BaseException:
        _state = None   # strict mode: fail again next time instead of half-discovered state
        raise
    return _state


def generation() -> Tuple[int, int]:
  """(generation, revision): lets the device registry notice resets and newly registered plugins."""
  return _generation, _revision


def reset() -> None:
  """Forget every discovered or registered plugin and every device instance; the next use rediscovers."""
  global _state, _generation, _revision
  with _lock:
    _state = None
    _generation += 1
    _revision += 1
    _probe_cache.clear()


def register(module: ModuleType, name: Optional[str] = None) -> PluginRecord:
  """Register an in-process plugin module (tests, notebooks). The call is explicit, so any problem raises PluginError."""
  global _revision
  with _lock:
    st = state()
    rec = PluginRecord(name=name or module.__name__, value=module.__name__, source="register")
    st.add_module(rec, module, explicit=True)
    st.records.append(rec)
    _revision += 1
    return rec


def plugin_records() -> List[PluginRecord]:
  """Every plugin discovery saw, in load order, including failed and disabled ones."""
  return list(state().records)


def device_entries() -> Dict[str, DeviceEntry]:
  """Every device name a plugin provides, including blocked ones."""
  return dict(state().devices)


def renderer_specs() -> Dict[Tuple[str, str], RendererSpec]:
  """Extra renderers keyed by (DEVICE, NAME)."""
  return {k: v[0] for k, v in state().renderers.items()}


_probe_cache: Dict[str, Optional[str]] = {}


def probe_device(entry: DeviceEntry) -> Optional[str]:
  """None when the device can run here, else why not. Never raises (unless TINY_STRICT_PLUGINS is set)."""
  if entry.error is not None or entry.spec is None:
    return entry.error or "no spec"
  if entry.name in _probe_cache:
    return _probe_cache[entry.name]
  try:
    reason = _bounded(entry.spec.probe, f"probe of device {entry.name}")
    if reason is not None and not isinstance(reason, str):
      reason = f"probe returned {reason!r} instead of None or a reason"
  except BaseException as e:
    _reraise_interrupt(e)
    if strict():
      raise PluginError(f"probe of device {entry.name} from plugin {entry.plugin.label} raised {_short_error(e)}") from e
    reason = str(e) if isinstance(e, PluginTimeout) else f"probe raised {_short_error(e)}"
    entry.plugin.warnings.append(f"probe of {entry.name} raised:\n" + "".join(traceback.format_exception(type(e), e, e.__traceback__)))
  _probe_cache[entry.name] = reason
  return reason
