"""The CUDA plugin as installed: entry point, probe, the CUDA:PTX renderer hook, and what asking for CUDA says here."""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
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


def test_package_pulls_its_toolchain() -> None:
  requires = " ".join(importlib.metadata.requires("tiny-cuda") or [])
  for dep in ("tiny-core", "gpuctypes", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-nvjitlink-cu12"):
    assert dep in requires, f"tiny-cuda does not depend on {dep}: {requires}"


def test_probe_explains_the_situation() -> None:
  reason = plugin.probe()
  if not driver_loads():
    assert reason == "no CUDA driver (libcuda) found"
  else:
    assert reason is None or isinstance(reason, str)


def test_asking_for_cuda_says_why() -> None:
  if plugin.probe() is None:
    pytest.skip("a CUDA GPU is available here: the device is usable")
  plugins.reset()
  try:
    assert "CUDA" in Device._devices
    for dev in ("cuda", "CUDA:PTX", "CUDA:1"):
      with pytest.raises(DeviceUnavailableError, match="not available here: " + re.escape(plugin.probe() or "")):
        Device[dev]
    assert "CUDA" not in list(Device.get_available_devices())
  finally:
    plugins.reset()


def test_renderers_and_compilers_without_hardware() -> None:
  from tiny_cuda.compiler import NVRTCCompiler, PTXCompiler
  from tiny_cuda.ptx import PTXRenderer
  from tiny_cuda.renderer import CUDARenderer
  plugins.reset()
  try:
    assert type(Device.renderer("CUDA")) is CUDARenderer
    assert type(Device.renderer("cuda:ptx")) is PTXRenderer
    assert type(Device.renderer("CUDA:PTX:1")) is PTXRenderer
    assert type(Device.compiler("CUDA")) is NVRTCCompiler
    assert type(Device.compiler("CUDA:PTX")) is PTXCompiler
    assert Device.canonicalize("cuda:ptx:0") == "CUDA:PTX"
    assert "CUDA:PTX" in [r for rec in plugins.plugin_records() for r in rec.renderers]
  finally:
    plugins.reset()


def test_cuda_arch_env_picks_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
  if plugin.probe() is None:
    pytest.skip("a GPU is present: its compute capability wins over CUDA_ARCH")
  monkeypatch.setenv("CUDA_ARCH", "sm_86")
  plugins.reset()
  try:
    assert Device.renderer("CUDA").arch == "sm_86"
    assert Device.compiler("CUDA:PTX").arch == "sm_86"
  finally:
    plugins.reset()


def test_discovery_stays_cheap() -> None:
  code = "import sys; from tiny import Device; Device._devices; print(sorted(m for m in sys.modules if m.split('.')[0] in ('gpuctypes', 'tiny_cuda')))"
  env = {k: v for k, v in os.environ.items() if k not in ("TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS")}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "['tiny_cuda', 'tiny_cuda.plugin']"   # the plugin module is imported, its toolchain is not
