"""The capabilities record: a plugin declares what its device can do (DeviceSpec.caps), core reads it instead of device names."""
from __future__ import annotations

import types
from typing import Any, Iterator

import pytest

from tiny import plugins
from tiny.backend import DeviceCaps
from tiny.capabilities import DEFAULT_CAPS
from tiny.device import Buffer, Compiled
from tiny.dtype import dtypes
from tiny.plugins import DeviceSpec, PluginError, hookimpl
from tiny.registry import Device
from tiny.runtime.ops_python import PythonAllocator, PythonCompiler, PythonProgram, PythonRenderer


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
  for k in ("DEVICE", "TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS"):
    monkeypatch.delenv(k, raising=False)
  plugins.reset()
  yield
  plugins.reset()


class ViewAllocator(PythonAllocator):
  """PYTHON's host memory, counting zero-copy reads."""
  zero_copies = 0

  def as_buffer(self, src: memoryview) -> memoryview:
    ViewAllocator.zero_copies += 1
    return src


def spec(name: str, **kw: Any) -> DeviceSpec:
  """A working device that runs kernels on the PYTHON interpreter."""
  return DeviceSpec(name=name, allocator=lambda d: ViewAllocator(), renderer=lambda d: PythonRenderer(), compiler=lambda d: PythonCompiler(),
                    runtime=lambda d: PythonProgram, priority=-1, **kw)


def register(*specs: DeviceSpec) -> None:
  mod = types.ModuleType("caps_plugin")
  mod.TINY_PLUGIN_API = plugins.PLUGIN_API_VERSION  # type: ignore[attr-defined]
  mod.tiny_devices = hookimpl(lambda: list(specs))  # type: ignore[attr-defined]
  plugins.register(mod)


def test_default_caps_claim_nothing() -> None:
  assert DeviceCaps() == DEFAULT_CAPS
  assert (DEFAULT_CAPS.buffer_views, DEFAULT_CAPS.zero_copy, DEFAULT_CAPS.buffer_options) == (False, False, frozenset())
  register(spec("CAPSOLD"))
  assert Device.caps("CAPSOLD") == DEFAULT_CAPS and Device["CAPSOLD"].caps == DEFAULT_CAPS
  # a name no plugin provides gets the conservative defaults too
  assert Device.caps("NOSUCHDEVICE") == DEFAULT_CAPS


def test_plugin_caps_reach_the_registry_and_the_device() -> None:
  caps = DeviceCaps(buffer_views=True, zero_copy=True, buffer_options=frozenset({"nolru"}))
  register(spec("CAPSNEW", caps=caps))
  assert Device.caps("CAPSNEW") is caps and Device.caps("capsnew:0") is caps
  assert isinstance(Device["CAPSNEW"], Compiled) and Device["CAPSNEW"].caps is caps


def test_caps_on_devices_a_plugin_builds_itself() -> None:
  caps = DeviceCaps(buffer_views=True)
  register(spec("CAPSOWN", caps=caps, device_factory=lambda d: Compiled(d, ViewAllocator(), PythonRenderer(), PythonCompiler(), PythonProgram)))
  assert Device["CAPSOWN"].caps is caps


@pytest.mark.parametrize("bad,why", [
  ("fast", "caps must be a tiny.backend.DeviceCaps"),
  (DeviceCaps(buffer_views=1), "caps.buffer_views must be a bool"),  # type: ignore[arg-type]
  (DeviceCaps(buffer_options=frozenset({"pinned"})), "caps.buffer_options must be a frozenset of"),
  (DeviceCaps(buffer_options={"host"}), "caps.buffer_options must be a frozenset of"),  # type: ignore[arg-type]
  (DeviceCaps(view_alignment=12), "caps.view_alignment must be a power of two"),
  (DeviceCaps(view_alignment=0), "caps.view_alignment must be a power of two"),
  (DeviceCaps(view_alignment=True), "caps.view_alignment must be a power of two"),
])
def test_bad_caps_are_refused(bad: Any, why: str) -> None:
  with pytest.raises(PluginError, match=why):
    register(spec("CAPSBAD", caps=bad))
  assert "CAPSBAD" not in plugins.device_entries()


def test_buffer_views_follow_caps() -> None:
  from tiny.tensor import Tensor
  register(spec("CAPSVIEW", caps=DeviceCaps(buffer_views=True)), spec("CAPSNOVIEW"))
  for dev, views in (("CAPSVIEW", True), ("CAPSNOVIEW", False)):
    t = Tensor([float(i) for i in range(12)], device=dev).realize()
    assert t[4:7].lazydata.can_view() is views


@pytest.mark.parametrize("align,start,views", [(16, 4, True), (16, 7, False), (16, 2, False), (8, 2, True), (1, 7, True)])
def test_views_start_at_the_declared_alignment(align: int, start: int, views: bool) -> None:
  """A GPU faults on a float4 load that is not 16-byte aligned, so a view may only start at a multiple of view_alignment
  bytes; elsewhere the window is copied, and both read the same values."""
  import numpy as np
  from tiny.tensor import Tensor
  register(spec("CAPSALIGN", caps=DeviceCaps(buffer_views=True, view_alignment=align)))
  data = np.arange(24, dtype=np.float32)
  t = Tensor(data, device="CAPSALIGN").realize()
  w = t[start:start + 8]
  assert w.lazydata.can_view() is views
  np.testing.assert_array_equal((w.contiguous() * 2).numpy(), data[start:start + 8] * 2)


def test_zero_copy_follows_caps() -> None:
  register(spec("CAPSZC", caps=DeviceCaps(zero_copy=True)), spec("CAPSCOPY"))
  for dev, zero_copy in (("CAPSZC", True), ("CAPSCOPY", False)):
    b = Buffer(dev, 4, dtypes.float32).allocate()
    before = ViewAllocator.zero_copies
    b.as_buffer(allow_zero_copy=True)
    assert (ViewAllocator.zero_copies > before) is zero_copy
    # forcing still works where the allocator can: the caps only say whether core may choose it on its own
    b.as_buffer(force_zero_copy=True)


def test_installed_devices_declare_caps() -> None:
  assert Device.caps("DISK").buffer_views and Device.caps("PYTHON").zero_copy and not Device.caps("PYTHON").buffer_views
  entries = plugins.device_entries()
  if "CLANG" in entries:
    assert Device.caps("CLANG") == Device.caps("LLVM") and Device.caps("CLANG").buffer_views and Device.caps("CLANG").zero_copy
  if "CUDA" in entries:
    # GPU memory: views yes, but reading it on the host is a copy
    assert Device.caps("CUDA").buffer_views and not Device.caps("CUDA").zero_copy and "host" in Device.caps("CUDA").buffer_options
