"""The CUDA plugin as installed: entry point, probe, and what asking for CUDA says on this machine."""
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
from tiny_cuda import plugin


def driver_loads() -> bool:
  for name in ("libcuda.so.1", "libcuda.so"):
    try:
      ctypes.CDLL(name)
      return True
    except OSError:
      pass
  return False


def test_entry_point_is_installed() -> None:
  eps = [ep for ep in importlib.metadata.entry_points(group="tiny") if ep.value == "tiny_cuda.plugin"]
  assert [(ep.name, ep.dist.metadata["Name"] if ep.dist else None) for ep in eps] == [("cuda", "tiny-cuda")]


def test_probe_explains_the_situation() -> None:
  want = "tiny-cuda runtime not implemented yet" if driver_loads() else "no CUDA driver (libcuda) found"
  assert plugin.probe() == want


def test_asking_for_cuda_says_why() -> None:
  plugins.reset()
  try:
    assert "CUDA" in Device._devices
    with pytest.raises(DeviceUnavailableError, match="'CUDA'.*not available here: " + re.escape(plugin.probe() or "")):
      Device["cuda"]
    assert "CUDA" not in list(Device.get_available_devices())
  finally:
    plugins.reset()


def test_discovery_stays_cheap() -> None:
  code = "import sys; from tiny import Device; Device._devices; print(sorted(m for m in sys.modules if m.split('.')[0] in ('gpuctypes', 'tiny_cuda')))"
  env = {k: v for k, v in os.environ.items() if k not in ("TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS")}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "['tiny_cuda', 'tiny_cuda.plugin']"   # the plugin module is imported, its toolchain is not
