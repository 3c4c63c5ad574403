"""The compiled-program cache keys on the device kind plus the renderer (class and settings) and forgets plugins' changes."""
from __future__ import annotations

import types
from typing import Any, Iterator, List

import numpy as np
import pytest

from tiny import plugins
from tiny.engine import realize
from tiny.plugins import DeviceSpec, RendererSpec, hookimpl
from tiny.runtime import ops_python
from tiny.tensor import Tensor


class CountingRenderer(ops_python.PythonRenderer):
  """The PYTHON interpreter's renderer, recording every kernel it renders (per instance settings in `arch`)."""

  def __init__(self, arch: str, log: List[str]) -> None:
    super().__init__()
    self.arch, self._log = arch, log

  def render(self, name: str, uops: Any) -> str:
    self._log.append(self.arch)
    return super().render(name, uops)


def _plugin(log: List[str], main_arch: str = "a1") -> types.ModuleType:
  mod = types.ModuleType("p_cachekey")
  setattr(mod, "TINY_PLUGIN_API", "1.1")

  @hookimpl
  def tiny_devices() -> List[DeviceSpec]:
    return [DeviceSpec(name="CACHEKEY", allocator=lambda d: ops_python.PythonAllocator(), renderer=lambda d: CountingRenderer(main_arch, log),
                       compiler=lambda d: ops_python.PythonCompiler(), runtime=lambda d: ops_python.PythonProgram, priority=-1)]

  @hookimpl
  def tiny_renderers() -> List[RendererSpec]:
    return [RendererSpec(device="CACHEKEY", name="OTHER", renderer=lambda d: CountingRenderer("other", log))]
  setattr(mod, "tiny_devices", tiny_devices)
  setattr(mod, "tiny_renderers", tiny_renderers)
  return mod


@pytest.fixture
def fresh_plugins() -> Iterator[None]:
  plugins.reset()
  yield
  plugins.reset()


def _add_one(device: str) -> np.ndarray:
  return (Tensor([1.0, 2.0, 3.0], device=device) + 1).numpy()


def test_extra_renderer_gets_its_own_program(fresh_plugins: None) -> None:
  log: List[str] = []
  plugins.register(_plugin(log))
  np.testing.assert_array_equal(_add_one("CACHEKEY"), [2, 3, 4])
  np.testing.assert_array_equal(_add_one("CACHEKEY:OTHER"), [2, 3, 4])
  assert "other" in log, "CACHEKEY:OTHER reused the program rendered for CACHEKEY"
  # a second device of the same kind and renderer does reuse the binary
  n = len(log)
  np.testing.assert_array_equal(_add_one("CACHEKEY:1"), [2, 3, 4])
  assert len(log) == n


def test_cache_key_follows_renderer_settings() -> None:
  a, b, c = CountingRenderer("a1", []), CountingRenderer("a2", []), CountingRenderer("a1", [])
  assert a.cache_key() != b.cache_key()
  assert a.cache_key() == c.cache_key()
  assert a.cache_key() != ops_python.PythonRenderer().cache_key()


def test_plugin_reset_clears_the_cache(fresh_plugins: None) -> None:
  log: List[str] = []
  plugins.register(_plugin(log, "first"))
  _add_one("CACHEKEY")
  plugins.reset()
  plugins.register(_plugin(log, "second"))
  _add_one("CACHEKEY")
  assert log.count("second") >= 1, "after a plugin reset the device's new renderer was never asked"
  assert not any(("arch", "first") in k[1][-1] for k in realize.method_cache), "programs of the reset plugin stayed cached"
