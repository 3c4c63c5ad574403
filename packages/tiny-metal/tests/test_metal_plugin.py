"""The METAL plugin as installed: entry point, probe, and what asking for METAL says on this machine."""
from __future__ import annotations

import platform
import importlib.metadata
import re
import os
import subprocess
import sys

import pytest

from tiny import plugins
from tiny.registry import Device, DeviceUnavailableError
from tiny_metal import plugin


def driver_loads() -> bool:
  return platform.system() == "Darwin"


def test_entry_point_is_installed() -> None:
  eps = [ep for ep in importlib.metadata.entry_points(group="tiny") if ep.value == "tiny_metal.plugin"]
  assert [(ep.name, ep.dist.metadata["Name"] if ep.dist else None) for ep in eps] == [("metal", "tiny-metal")]


def test_probe_explains_the_situation() -> None:
  want = "tiny-metal runtime not implemented yet" if driver_loads() else "Metal needs macOS"
  assert plugin.probe() == want


def test_asking_for_metal_says_why() -> None:
  plugins.reset()
  try:
    assert "METAL" in Device._devices
    with pytest.raises(DeviceUnavailableError, match="'METAL'.*not available here: " + re.escape(plugin.probe() or "")):
      Device["metal"]
    assert "METAL" not in list(Device.get_available_devices())
  finally:
    plugins.reset()


def test_discovery_stays_cheap() -> None:
  code = "import sys; from tiny import Device; Device._devices; print(sorted(m for m in sys.modules if m.split('.')[0] in ('gpuctypes', 'tiny_metal')))"
  env = {k: v for k, v in os.environ.items() if k not in ("TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS")}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "['tiny_metal', 'tiny_metal.plugin']"   # the plugin module is imported, its toolchain is not
