"""The AMD plugin as installed: entry point, probe, and what asking for AMD says on this machine."""
from __future__ import annotations

import ctypes
import importlib.metadata
import re
import os
import subprocess
import sys

import pytest

from tiny import plugins
from tiny.registry import Device, DeviceUnavailableError
from tiny_amd import plugin


def driver_loads() -> bool:
  if os.path.exists("/dev/kfd"):
    return True
  try:
    ctypes.CDLL("libamdhip64.so")
    return True
  except OSError:
    return False


def test_entry_point_is_installed() -> None:
  eps = [ep for ep in importlib.metadata.entry_points(group="tiny") if ep.value == "tiny_amd.plugin"]
  assert [(ep.name, ep.dist.metadata["Name"] if ep.dist else None) for ep in eps] == [("amd", "tiny-amd")]


def test_probe_explains_the_situation() -> None:
  want = "tiny-amd runtime not implemented yet" if driver_loads() else "no AMD GPU driver found (/dev/kfd missing, no libamdhip64)"
  assert plugin.probe() == want


def test_asking_for_amd_says_why() -> None:
  plugins.reset()
  try:
    assert "AMD" in Device._devices
    with pytest.raises(DeviceUnavailableError, match="'AMD'.*not available here: " + re.escape(plugin.probe() or "")):
      Device["amd"]
    assert "AMD" not in list(Device.get_available_devices())
  finally:
    plugins.reset()


def test_discovery_stays_cheap() -> None:
  code = "import sys; from tiny import Device; Device._devices; print(sorted(m for m in sys.modules if m.split('.')[0] in ('gpuctypes', 'tiny_amd')))"
  env = {k: v for k, v in os.environ.items() if k not in ("TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS")}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "['tiny_amd', 'tiny_amd.plugin']"   # the plugin module is imported, its toolchain is not
