"""BEAM search: the chosen opts are valid, the kernel is correct (numpy), and a second search comes from the disk cache."""
import numpy as np
import pytest

import tiny.helpers as helpers
from tiny.engine import search
from tiny.engine.realize import get_kernel
from tiny.engine.schedule import create_schedule
from tiny.helpers import Context
from tiny.ops import MetaOps
from tiny.tensor import Tensor


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setattr(helpers, "CACHEDB", str(tmp_path / "cache.db"))
  monkeypatch.setenv("PARALLEL", "0")
  yield


def _matmul_ast():
  a, b = Tensor.rand(16, 16).realize(), Tensor.rand(16, 16).realize()
  out = a @ b
  sched = [si for si in create_schedule([out.lazydata]) if si.ast.op is MetaOps.KERNEL]
  assert len(sched) == 1
  return a, b, out, sched[0]


def test_beam_result_is_valid_and_correct(fresh_cache):
  from tiny.codegen.kernel import Kernel
  from tiny.registry import Device
  a, b, out, si = _matmul_ast()
  with Context(BEAM=2):
    k = get_kernel(Device[Device.DEFAULT].renderer, si.ast)
  # the opts replay cleanly on a fresh kernel: each one is valid
  k2 = Kernel(si.ast, opts=Device[Device.DEFAULT].renderer)
  for o in k.applied_opts:
    k2.apply_opt(o)
  assert k2.applied_opts == k.applied_opts
  from tiny.engine.realize import CompiledRunner
  runner = CompiledRunner(k.to_program())
  for buf in si.bufs:
    buf.ensure_allocated()
  runner([si.bufs[i if isinstance(i, int) else i[0]] for i in runner.p.globals], {})
  np.testing.assert_allclose(si.bufs[0].numpy().reshape(16, 16), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4)


def test_second_search_comes_from_cache(fresh_cache):
  from tiny.registry import Device
  _, _, _, si = _matmul_ast()
  with Context(BEAM=2):
    k1 = get_kernel(Device[Device.DEFAULT].renderer, si.ast)
  compiled_before, hits_before = search.search_stats["compiled"], search.search_stats["cache_hits"]
  with Context(BEAM=2):
    k2 = get_kernel(Device[Device.DEFAULT].renderer, si.ast)
  assert search.search_stats["compiled"] == compiled_before, "a cached search must not compile candidates"
  assert search.search_stats["cache_hits"] == hits_before + 1
  assert k2.applied_opts == k1.applied_opts


def test_unusable_cached_opts_are_not_replayed():
  from tiny.codegen.kernel import Kernel, Opt, OptOps
  from tiny.registry import Device
  _, _, _, si = _matmul_ast()
  fresh = Kernel(si.ast, opts=Device[Device.DEFAULT].renderer)
  # another version's entry, a hand-edited one, or garbage: a miss, so the search runs and overwrites it
  for bad in ([["NOT_AN_OPT", 0, 4]], [["UPCAST", 99, 7]], [["UPCAST", "0", 4]], [["UPCAST", True, 4]], {"not": "a list"}, [[1, 2]], None):
    assert search._from_cache(fresh, bad) is None, bad
  good = search._from_cache(fresh, [["UPCAST", 0, 4]])
  assert good is not None and good.applied_opts == [Opt(OptOps.UPCAST, 0, 4)] and fresh.applied_opts == []


def test_beam_on_a_renderer_variant_uses_the_variants_compiler(fresh_cache, monkeypatch):
  """A renderer variant (like CUDA:PTX) has its own compiler: BEAM must compile and time its candidates with it, not with
  the plain device's (which rejects the variant's source, so nothing would be timed)."""
  import types
  from typing import List

  from tiny import plugins
  from tiny.device import CompileError
  from tiny.plugins import DeviceSpec, RendererSpec, hookimpl
  from tiny.runtime import ops_python

  class TaggedRenderer(ops_python.PythonRenderer):
    def render(self, name, uops):
      return "VARIANT" + super().render(name, uops)

  class PlainCompiler(ops_python.PythonCompiler):
    def compile(self, src):
      if src.startswith("VARIANT"):
        raise CompileError("the plain compiler cannot read the variant's source", src)
      return super().compile(src)

  class VariantCompiler(ops_python.PythonCompiler):
    def compile(self, src):
      assert src.startswith("VARIANT")
      return super().compile(src[len("VARIANT"):])

  mod = types.ModuleType("p_beamvariant")
  setattr(mod, "TINY_PLUGIN_API", "1.1")
  setattr(mod, "tiny_devices", hookimpl(lambda: [DeviceSpec(name="BEAMV", allocator=lambda d: ops_python.PythonAllocator(),
                                                              renderer=lambda d: ops_python.PythonRenderer(), compiler=lambda d: PlainCompiler(),
                                                              runtime=lambda d: ops_python.PythonProgram, priority=-1)]))
  specs: List[RendererSpec] = [RendererSpec(device="BEAMV", name="ALT", renderer=lambda d: TaggedRenderer(), compiler=lambda d: VariantCompiler())]
  setattr(mod, "tiny_renderers", hookimpl(lambda: specs))
  monkeypatch.setenv("IGNORE_BEAM_CACHE", "1")
  plugins.reset()
  try:
    plugins.register(mod)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    before = search.search_stats["timed"]
    with Context(BEAM=2):
      out = (Tensor(a, device="BEAMV:ALT") * 3 - 1).max(1).numpy()
    assert search.search_stats["timed"] > before, "BEAM timed no candidate of the variant"
    np.testing.assert_array_equal(out, (a * 3 - 1).max(1))
  finally:
    plugins.reset()
