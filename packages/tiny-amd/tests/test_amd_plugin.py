"""The AMD plugin as installed: entry point, probe, renderer and compiler without a GPU, and what asking for AMD says here."""
from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from tiny import plugins
from tiny.registry import Device, DeviceUnavailableError
from tiny_amd import plugin
from tiny_amd.plugin import _hip_loads  # the probe's own check, so a test skips exactly when the probe says why


def test_entry_point_is_installed() -> None:
  eps = [ep for ep in importlib.metadata.entry_points(group="tiny") if ep.value == "tiny_amd.plugin"]
  assert [(ep.name, ep.dist.metadata["Name"] if ep.dist else None) for ep in eps] == [("amd", "tiny-amd")]


def test_probe_explains_the_situation() -> None:
  reason = plugin.probe()
  if not os.path.exists("/dev/kfd") and not _hip_loads():
    assert reason == "no AMD GPU driver found (/dev/kfd missing, no libamdhip64)"
  elif not _hip_loads():
    assert reason is not None and "libamdhip64" in reason
  else:
    assert reason is None or isinstance(reason, str)


def test_a_gpu_without_clang_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
  from tiny_amd import runtime
  monkeypatch.setattr(plugin, "_driver_missing", lambda: None)
  monkeypatch.setattr(runtime, "driver_problem", lambda: None)
  monkeypatch.setenv("PATH", "/nonexistent")
  monkeypatch.delenv("AMD_CLANG", raising=False)
  assert (plugin.probe() or "").startswith("no clang for AMD GPUs found")
  monkeypatch.setattr(runtime, "driver_problem", lambda: "the HIP runtime sees no AMD GPU")
  assert plugin.probe() == "the HIP runtime sees no AMD GPU"


def test_asking_for_amd_says_why() -> None:
  if plugin.probe() is None:
    pytest.skip("an AMD GPU is available here: the device is usable")
  plugins.reset()
  try:
    assert "AMD" in Device._devices
    for dev in ("amd", "AMD:1"):
      with pytest.raises(DeviceUnavailableError, match="'AMD.*not available here: " + re.escape(plugin.probe() or "")):
        Device[dev]
    assert "AMD" not in list(Device.get_available_devices())
  finally:
    plugins.reset()


def test_doctor_says_why() -> None:
  reason = plugin.probe()
  r = subprocess.run([sys.executable, "-m", "tiny", "doctor"], capture_output=True, text=True, timeout=300)
  line = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith("AMD ")), None)
  assert line is not None, r.stdout + r.stderr
  assert (f"unavailable: {reason}" in line) if reason is not None else ("available" in line and "unavailable" not in line)


def test_renderer_and_compiler_without_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
  from tiny_amd.compiler import AMDToolchainError, HIPCompiler
  from tiny_amd.renderer import HIPRenderer
  if plugin.probe() is None:
    pytest.skip("a GPU is present: without AMD_ARCH the target is its architecture, not gfx1100")
  monkeypatch.delenv("AMD_ARCH", raising=False)
  plugins.reset()
  try:
    r = Device.renderer("AMD")
    assert type(r) is HIPRenderer and r.arch == "gfx1100" and len(r.tensor_cores) == 2
    monkeypatch.setenv("AMD_ARCH", "gfx90a")
    assert Device.renderer("AMD:1").arch == "gfx90a" and Device.renderer("AMD:1").tensor_cores == []
    try:
      c = Device.compiler("AMD")
    except AMDToolchainError as e:
      pytest.skip(f"the renderer works; the compiler needs clang: {e}")
    assert type(c) is HIPCompiler and c.arch == "gfx90a"
  finally:
    plugins.reset()


def test_bad_device_ids_are_refused() -> None:
  with pytest.raises(ValueError, match="AMD or AMD:N"):
    plugin._ordinal("AMD:gfx1100")
  assert plugin._ordinal("AMD") == 0 and plugin._ordinal("AMD:2") == 2


def test_discovery_stays_cheap() -> None:
  code = "import sys; from tiny import Device; Device._devices; print(sorted(m for m in sys.modules if m.split('.')[0] in ('gpuctypes', 'tiny_amd')))"
  env = {k: v for k, v in os.environ.items() if k not in ("TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS")}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "['tiny_amd', 'tiny_amd.plugin']"   # the plugin module is imported, its toolchain is not
