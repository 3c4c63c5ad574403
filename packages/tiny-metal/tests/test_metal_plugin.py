"""The METAL plugin as installed: entry point, probe, factories, and what asking for METAL says on this machine."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys

import pytest

from tiny import plugins
from tiny.backend import CompileError
from tiny.registry import Device, DeviceUnavailableError
from tiny_metal import plugin

ON_MACOS = platform.system() == "Darwin"
off_macos = pytest.mark.skipif(ON_MACOS, reason="checks how METAL declines off macOS")


def test_entry_point_is_installed() -> None:
  eps = [ep for ep in importlib.metadata.entry_points(group="tiny") if ep.value == "tiny_metal.plugin"]
  assert [(ep.name, ep.dist.metadata["Name"] if ep.dist else None) for ep in eps] == [("metal", "tiny-metal")]


def test_probe_explains_the_situation() -> None:
  why = plugin.probe()
  if ON_MACOS:
    assert why is None or why.startswith("Metal failed to start")
  else:
    assert why == "Metal needs macOS"


@off_macos
def test_asking_for_metal_says_why() -> None:
  plugins.reset()
  try:
    assert "METAL" in Device._devices
    with pytest.raises(DeviceUnavailableError, match="'METAL'.*not available here: " + re.escape("Metal needs macOS")):
      Device["metal"]
    assert "METAL" not in list(Device.get_available_devices())
  finally:
    plugins.reset()


def test_renderer_works_everywhere() -> None:
  from tiny_metal.renderer import MetalRenderer
  r = Device.renderer("METAL")
  assert isinstance(r, MetalRenderer) and r.device == "METAL" and len(r.tensor_cores) == 5
  assert Device.caps("METAL").zero_copy and Device.caps("METAL").buffer_views


@off_macos
def test_compiler_off_macos_checks_syntax_and_returns_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
  from tiny_metal import syntax
  from tiny_metal.compiler import MSLSyntaxCompiler
  from tiny_metal.opsuite import make_program, suite_asts
  comp = Device.compiler("METAL")
  assert isinstance(comp, MSLSyntaxCompiler)
  prg = make_program(suite_asts(["unary_math"])["unary_math"][0], Device.renderer("METAL"), "hand")
  assert "exp2(" in prg.src
  if syntax.checker_missing() is None:
    assert comp.compile(prg.src) == prg.src.encode()
    with pytest.raises(CompileError, match="undeclared identifier 'exp22'"):
      comp.compile(prg.src.replace("exp2(", "exp22(", 1))
  # without a checker the compiler says so instead of passing the kernel unchecked
  monkeypatch.setenv("TINY_MSL_CLANG", "no-such-clang-binary")
  syntax.find_clang.cache_clear()
  try:
    with pytest.raises(CompileError, match=r"cannot check Metal kernels here: no clang >= 15.*only on macOS"):
      comp.compile(prg.src)
  finally:
    monkeypatch.delenv("TINY_MSL_CLANG")
    syntax.find_clang.cache_clear()


@off_macos
def test_runtime_factories_need_macos() -> None:
  spec = next(s for s in plugin.tiny_devices() if s.name == "METAL")
  for factory in (spec.allocator, spec.runtime, spec.device_factory):
    assert factory is not None
    with pytest.raises(RuntimeError, match="METAL: Metal needs macOS"):
      factory("METAL")


def test_emulate_metal_from_the_environment() -> None:
  code = "from tiny.runtime.ops_python import PythonRenderer; r = PythonRenderer(); print(r.device, len(r.tensor_cores))"
  env = {**os.environ, "EMULATE_METAL": "1"}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.split() == ["METAL", "5"]


def test_discovery_stays_cheap() -> None:
  code = "import sys; from tiny import Device; Device._devices; print(sorted(m for m in sys.modules if m.split('.')[0] in ('gpuctypes', 'tiny_metal')))"
  env = {k: v for k, v in os.environ.items() if k not in ("TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS")}
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  want = ['tiny_metal', 'tiny_metal.plugin'] if not ON_MACOS else ['tiny_metal', 'tiny_metal.plugin', 'tiny_metal.renderer', 'tiny_metal.runtime']
  assert r.stdout.strip() == str(want)   # off macOS the plugin module is imported, its toolchain is not
