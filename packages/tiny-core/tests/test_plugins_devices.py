"""Real devices through the registry: core's builtin PYTHON/DISK/NPY and the pip-installed tiny-example plugin.

These need the engine (tiny.device.Compiled, tiny.runtime.ops_python, ...) and, for EXAMPLE, tests/plugins/tiny-example
installed (CI installs it; elsewhere: pip install -e tests/plugins/tiny-example).
"""
from __future__ import annotations

import importlib.metadata
import os
from typing import Iterator

import numpy as np
import pytest

from tiny import plugins
from tiny.registry import Device


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
  for k in ("DEVICE", "TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS"):
    monkeypatch.delenv(k, raising=False)
  plugins.reset()
  yield
  plugins.reset()


def require_example() -> None:
  if not any(ep.name == "example" and ep.value == "tiny_example.plugin" for ep in importlib.metadata.entry_points(group="tiny")):
    msg = "tiny-example is not installed (pip install -e tests/plugins/tiny-example)"
    if os.environ.get("CI", "") not in ("", "0", "false"):
      pytest.fail(msg + "; CI must install it")
    pytest.skip(msg)


def test_python_is_always_available() -> None:
  from tiny.device import Compiled
  from tiny.runtime.ops_python import PythonAllocator, PythonCompiler, PythonRenderer
  assert Device.availability("PYTHON") is None
  dev = Device["python"]
  assert isinstance(dev, Compiled) and dev is Device["PYTHON"]
  assert isinstance(dev.allocator, PythonAllocator) and isinstance(dev.renderer, PythonRenderer) and isinstance(dev.compiler, PythonCompiler)
  assert "PYTHON" in list(Device.get_available_devices())


def test_python_is_chosen_explicitly(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("PYTHON", "1")
  assert Device.DEFAULT == "PYTHON"


def test_storage_devices_are_never_default() -> None:
  assert Device.DEFAULT not in ("DISK", "NPY")
  assert not {"DISK", "NPY"} & set(Device.get_available_devices())


def test_disk_device_is_built_by_its_factory(tmp_path) -> None:
  from tiny.runtime.ops_disk import DiskDevice
  path = tmp_path / "weights.bin"
  path.write_bytes(bytes(range(16)))
  dev = Device[f"disk:{path}"]
  assert isinstance(dev, DiskDevice) and dev is Device[f"DISK:{path}"]


def test_example_plugin_is_discovered() -> None:
  require_example()
  rec = next(r for r in plugins.plugin_records() if r.name == "example")
  assert (rec.source, rec.distribution, rec.version, rec.api, rec.error) == ("entry-point", "tiny-example", "0.1.0", "1.1", None)
  assert rec.devices == ["EXAMPLE"] and rec.renderers == ["EXAMPLE:ALT"]
  assert Device.canonicalize("example:alt") == "EXAMPLE:ALT"


def test_example_device_runs_a_kernel() -> None:
  require_example()
  from tiny.device import Compiled
  from tiny.tensor import Tensor
  dev = Device["EXAMPLE"]
  assert isinstance(dev, Compiled) and dev.dname == "EXAMPLE"
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  b = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
  out = ((Tensor(a, device="EXAMPLE") * 2 + Tensor(b, device="EXAMPLE")).relu().sum(axis=1)).numpy()
  np.testing.assert_allclose(out, np.maximum(a * 2 + b, 0).sum(axis=1), rtol=1e-6)
