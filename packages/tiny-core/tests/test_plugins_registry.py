"""The Device registry with in-process plugins (tiny.plugins.register): ids, selection, errors, versions, renderers."""
from __future__ import annotations

import importlib.metadata
import io
import types
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from tiny import plugins
from tiny.plugins import DeviceSpec, PluginError, RendererSpec, hookimpl
from tiny.registry import Device, DeviceError, DeviceUnavailableError, UnknownDeviceError


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
  for k in ("DEVICE", "TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS", "TESTHI", "TESTMID", "TESTLO"):
    monkeypatch.delenv(k, raising=False)
  plugins.reset()
  yield
  plugins.reset()


class FakeDevice:
  def __init__(self, dname: str) -> None:
    self.dname = dname


def _unused(device: str) -> Any:
  raise AssertionError(f"factory should not be called for {device}")


def dspec(name: str, priority: int = 1000, probe: Optional[str] = None, fail: Optional[Exception] = None,
          created: Optional[List[str]] = None, own_factory: bool = True, **kw: Any) -> DeviceSpec:
  """A device whose objects are FakeDevice; `created` collects the ids the factory was called with."""
  def factory(device: str) -> FakeDevice:
    if created is not None:
      created.append(device)
    if fail is not None:
      raise fail
    return FakeDevice(device)
  kw.setdefault("renderer", _unused)
  kw.setdefault("compiler", _unused)
  return DeviceSpec(name=name, allocator=_unused, runtime=_unused, priority=priority, probe=lambda: probe,
                    device_factory=factory if own_factory else None, **kw)


def make_plugin(modname: str, *specs: DeviceSpec, renderers: List[RendererSpec] = [], api: Optional[str] = "1.1",
                hook: Optional[Callable[[], Any]] = None) -> types.ModuleType:
  mod = types.ModuleType(modname)
  if api is not None:
    mod.TINY_PLUGIN_API = api  # type: ignore[attr-defined]
  mod.tiny_devices = hookimpl(hook or (lambda: list(specs)))  # type: ignore[attr-defined]
  if renderers:
    mod.tiny_renderers = hookimpl(lambda: list(renderers))  # type: ignore[attr-defined]
  return mod


# ---- ids ----

@pytest.mark.parametrize("given,want", [
  ("cuda", "CUDA"), ("cuda:0", "CUDA"), ("CUDA:1", "CUDA:1"), ("cuda:01", "CUDA:1"), ("Python", "PYTHON"),
  ("disk:/tmp/Some/File.bin", "DISK:/tmp/Some/File.bin"),
])
def test_canonicalize(given: str, want: str) -> None:
  assert Device.canonicalize(given) == want


def test_one_instance_per_id() -> None:
  created: List[str] = []
  plugins.register(make_plugin("p_one", dspec("TESTONE", created=created)))
  a = Device["testone"]
  assert a is Device["TESTONE"] is Device["TestOne:0"]
  b = Device["testone:1"]
  assert b is not a and b is Device["TESTONE:1"]
  assert created == ["TESTONE", "TESTONE:1"]
  assert (a.dname, b.dname) == ("TESTONE", "TESTONE:1")


# ---- default device ----

def _three(created: Optional[List[str]] = None, hi_fail: Optional[Exception] = None) -> None:
  plugins.register(make_plugin("p_three",
                               dspec("TESTHI", priority=1002, probe=None if hi_fail else "no hardware here", fail=hi_fail, created=created),
                               dspec("TESTMID", priority=1001, created=created), dspec("TESTLO", priority=1000, created=created)))


def test_default_is_best_available() -> None:
  _three()
  assert Device.DEFAULT == "TESTMID"
  assert Device.availability("TESTHI") == "no hardware here"
  assert Device.availability("testmid") is None
  avail = list(Device.get_available_devices())
  assert avail[:2] == ["TESTMID", "TESTLO"] and "TESTHI" not in avail


def test_default_falls_through_when_creation_raises() -> None:
  _three(hi_fail=OSError("driver exploded"))
  assert Device.DEFAULT == "TESTMID"
  assert "OSError: driver exploded" in (Device.availability("TESTHI") or "")


def test_negative_priority_is_never_default() -> None:
  plugins.register(make_plugin("p_neg", dspec("TESTNEG", priority=-5), dspec("TESTPOS", priority=-6 + 1000)))
  assert Device.DEFAULT == "TESTPOS"
  assert "TESTNEG" not in list(Device.get_available_devices())
  assert Device["TESTNEG"].dname == "TESTNEG"   # an explicit request still works


def test_device_env_choice(monkeypatch: pytest.MonkeyPatch) -> None:
  _three()
  monkeypatch.setenv("DEVICE", "testlo")
  plugins.reset()
  _three()
  assert Device.DEFAULT == "TESTLO"


def test_name_eq_1_choice(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("TESTLO", "1")
  _three()
  assert Device.DEFAULT == "TESTLO"


def test_two_name_eq_1_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("TESTLO", "1")
  monkeypatch.setenv("TESTMID", "1")
  _three()
  with pytest.raises(DeviceError, match="TESTMID=1"):
    Device.DEFAULT


def test_explicit_choice_fails_loudly_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DEVICE", "TESTHI")
  _three()
  with pytest.raises(DeviceUnavailableError, match="no hardware here"):
    Device.DEFAULT


def test_explicit_choice_keeps_the_original_exception(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DEVICE", "TESTHI")
  boom = OSError("driver exploded")
  _three(hi_fail=boom)
  with pytest.raises(DeviceUnavailableError, match="driver exploded") as ei:
    Device.DEFAULT
  assert ei.value.__cause__ is boom


def test_explicit_unknown_device(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("DEVICE", "NOSUCHDEV")
  _three()
  with pytest.raises(UnknownDeviceError, match="NOSUCHDEV"):
    Device.DEFAULT


def test_default_can_be_assigned() -> None:
  _three()
  Device.DEFAULT = "testlo"
  assert Device.DEFAULT == "TESTLO"
  assert Device.canonicalize(None) == "TESTLO"


# ---- errors ----

def test_unknown_device_lists_installed_and_why() -> None:
  _three()
  with pytest.raises(UnknownDeviceError) as ei:
    Device["NOSUCHDEV"]
  msg = str(ei.value)
  assert "'NOSUCHDEV'" in msg
  lines = {line.split()[0]: line for line in msg.splitlines()[1:] if line.startswith("  ")}
  assert "available" in lines["TESTMID"] and "unavailable" not in lines["TESTMID"]
  assert "unavailable: no hardware here" in lines["TESTHI"]
  assert "PYTHON" in lines   # core's builtin devices are listed too
  assert "python -m tiny doctor" in msg


def test_unavailable_device_says_why() -> None:
  _three()
  with pytest.raises(DeviceUnavailableError, match="TESTHI.*not available here: no hardware here"):
    Device["TESTHI"]


def test_duplicate_device_name_names_both_plugins() -> None:
  plugins.register(make_plugin("p_first", dspec("TESTDUP")))
  with pytest.raises(PluginError, match="TESTDUP.*p_first.*p_second"):
    plugins.register(make_plugin("p_second", dspec("TESTDUP")))
  assert Device["TESTDUP"].dname == "TESTDUP"   # the first one keeps working


def test_failed_register_leaves_no_trace() -> None:
  def boom() -> Any:
    raise ValueError("hook broke")
  with pytest.raises(PluginError, match="hook broke"):
    plugins.register(make_plugin("p_boom", hook=boom))
  with pytest.raises(PluginError, match="upper-case"):
    plugins.register(make_plugin("p_lower", dspec("lowercase")))
  with pytest.raises(PluginError, match="list of DeviceSpec"):
    plugins.register(make_plugin("p_notlist", hook=lambda: "CUDA"))
  assert not any(r.name.startswith("p_") for r in plugins.plugin_records())
  with pytest.raises(UnknownDeviceError):
    Device["lowercase"]


def test_unknown_hook_is_refused() -> None:
  mod = make_plugin("p_typo", dspec("TESTTYPO"))
  mod.tiny_devicez = hookimpl(lambda: [])  # type: ignore[attr-defined]
  with pytest.raises(PluginError, match="tiny_devicez"):
    plugins.register(mod)


# ---- plugin API versions ----

@pytest.mark.parametrize("api,ok", [("1.0", True), ("1.1", False), ("2.0", False), ("0.9", False), (" 1.0 ", True)])
def test_api_compatible(api: str, ok: bool) -> None:
  assert plugins.api_compatible(api, "1.0") is ok


def test_api_compatible_older_minor() -> None:
  assert plugins.api_compatible("1.2", "1.3") and not plugins.api_compatible("1.4", "1.3")


def test_plugins_written_for_api_1_0_still_load() -> None:
  # 1.1 added tiny.backend and 1.2 its exec_alu (both additive), so a plugin that declares 1.0 or 1.1 keeps working
  assert plugins.PLUGIN_API_VERSION == "1.2" and plugins.api_compatible("1.0") and plugins.api_compatible("1.1")
  assert not plugins.api_compatible("1.3") and not plugins.api_compatible("2.0")


@pytest.mark.parametrize("api,fix", [("2.0", "pip install --upgrade tiny-core"), ("1.7", "pip install --upgrade tiny-core"),
                                     ("0.3", "pip install --upgrade p_old")])
def test_version_refusal_message(api: str, fix: str) -> None:
  with pytest.raises(PluginError) as ei:
    plugins.register(make_plugin("p_old", dspec("TESTVER"), api=api))
  msg = str(ei.value)
  assert f"plugin API {api}" in msg and f"plugin API {plugins.PLUGIN_API_VERSION}" in msg and fix in msg
  with pytest.raises(UnknownDeviceError):
    Device["TESTVER"]


def test_missing_api_declaration_is_accepted_with_a_warning() -> None:
  rec = plugins.register(make_plugin("p_noapi", dspec("TESTNOAPI"), api=None))
  assert any("TINY_PLUGIN_API" in w for w in rec.warnings)
  assert Device["TESTNOAPI"].dname == "TESTNOAPI"


# ---- probes and strict mode ----

def test_raising_probe_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
  def bad_probe() -> Optional[str]:
    raise ZeroDivisionError("probe bug")
  plugins.register(make_plugin("p_probe", DeviceSpec(name="TESTPROBE", allocator=_unused, renderer=_unused, compiler=_unused, runtime=_unused,
                                                     priority=2000, probe=bad_probe, device_factory=FakeDevice), dspec("TESTOK")))
  assert "ZeroDivisionError: probe bug" in (Device.availability("TESTPROBE") or "")
  assert Device.DEFAULT == "TESTOK"


def test_strict_mode_makes_a_raising_probe_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("TINY_STRICT_PLUGINS", "1")
  # strict mode is about this plugin: keep whatever else is installed here out of the way
  monkeypatch.setenv("TINY_DISABLE_PLUGINS", ",".join(ep.name for ep in importlib.metadata.entry_points(group="tiny")))
  def bad_probe() -> Optional[str]:
    raise ZeroDivisionError("probe bug")
  plugins.register(make_plugin("p_probe", DeviceSpec(name="TESTPROBE", allocator=_unused, renderer=_unused, compiler=_unused, runtime=_unused,
                                                     probe=bad_probe, device_factory=FakeDevice)))
  with pytest.raises(PluginError, match="probe bug"):
    Device["TESTPROBE"]


# ---- renderers and compilers without hardware ----

def _rendering_plugin(created: List[str]) -> None:
  def tagged(tag: str) -> Callable[[str], Any]:
    def f(device: str) -> Any:
      created.append(f"{tag}:{device}")
      return (tag, device)
    return f
  plugins.register(make_plugin("p_render", dspec("TESTR", probe="no hardware here", renderer=tagged("base-r"),
                                                                compiler=tagged("base-c"), own_factory=False)))
  plugins.register(make_plugin("p_extra", renderers=[RendererSpec(device="TESTR", name="ALT", renderer=tagged("alt-r"), compiler=tagged("alt-c")),
                                                     RendererSpec(device="TESTR", name="NOCOMP", renderer=tagged("nc-r"))]))


def test_renderer_and_compiler_need_no_hardware() -> None:
  created: List[str] = []
  _rendering_plugin(created)
  assert Device.renderer("testr") == ("base-r", "TESTR")
  assert Device.compiler("testr:2") == ("base-c", "TESTR:2")
  with pytest.raises(DeviceUnavailableError):
    Device["TESTR"]


def test_extra_renderer_is_chosen_by_id() -> None:
  created: List[str] = []
  _rendering_plugin(created)
  assert Device.canonicalize("testr:alt") == "TESTR:ALT"
  assert Device.canonicalize("testr:alt:0") == "TESTR:ALT"
  assert Device.canonicalize("testr:alt:3") == "TESTR:ALT:3"
  assert Device.renderer("testr:alt:3") == ("alt-r", "TESTR:3")
  assert Device.compiler("TESTR:ALT") == ("alt-c", "TESTR")
  assert Device.compiler("TESTR:NOCOMP") == ("base-c", "TESTR")   # a renderer without its own compiler uses the device's


def test_unknown_renderer_lists_the_known_ones() -> None:
  _rendering_plugin([])
  with pytest.raises(UnknownDeviceError, match="no renderer 'NOPE'.*ALT, NOCOMP"):
    Device.renderer("TESTR:NOPE")


def test_device_env_with_renderer(monkeypatch: pytest.MonkeyPatch) -> None:
  created: List[str] = []
  plugins.register(make_plugin("p_rdev", dspec("TESTRD", created=created)))
  plugins.register(make_plugin("p_rdev_extra", renderers=[RendererSpec(device="TESTRD", name="ALT", renderer=_unused)]))
  monkeypatch.setenv("DEVICE", "testrd:alt")
  assert Device.DEFAULT == "TESTRD:ALT"
  assert created == ["TESTRD:ALT"]


def test_duplicate_renderer_names_both() -> None:
  plugins.register(make_plugin("p_r1", renderers=[RendererSpec(device="X", name="R", renderer=_unused)]))
  with pytest.raises(PluginError, match="X:R.*p_r1.*p_r2"):
    plugins.register(make_plugin("p_r2", renderers=[RendererSpec(device="X", name="R", renderer=_unused)]))


# ---- doctor, in process ----

def test_doctor_lists_registered_plugins_and_reasons() -> None:
  from tiny.__main__ import doctor
  _three()
  out = io.StringIO()
  rc = doctor(out=out)
  text = out.getvalue()
  assert rc == 0
  assert f"plugin API {plugins.PLUGIN_API_VERSION}" in text
  assert "registered module p_three" in text and "provides: TESTHI, TESTMID, TESTLO" in text
  rows: Dict[str, str] = {line.split()[0]: line for line in text.splitlines() if line.startswith("  TEST")}
  assert "unavailable: no hardware here" in rows["TESTHI"] and "priority 1001  available" in rows["TESTMID"]
  assert "default device: TESTMID" in text
