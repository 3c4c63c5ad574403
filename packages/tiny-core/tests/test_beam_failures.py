"""BEAM skips candidates that fail to compile or run, but not silently: they are counted and reported once per search."""
import pytest

import tiny.helpers as helpers
from tiny.codegen.kernel import Kernel
from tiny.engine import search
from tiny.engine.schedule import create_schedule
from tiny.helpers import Context
from tiny.ops import MetaOps
from tiny.registry import Device
from tiny.tensor import Tensor


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setattr(helpers, "CACHEDB", str(tmp_path / "cache.db"))
  monkeypatch.setenv("PARALLEL", "0")
  monkeypatch.setenv("IGNORE_BEAM_CACHE", "1")


def _sum_kernel() -> Kernel:
  out = Tensor.rand(8, 8).realize().sum(axis=1)
  si = next(si for si in create_schedule([out.lazydata]) if si.ast.op is MetaOps.KERNEL)
  return Kernel(si.ast, opts=Device[Device.DEFAULT].renderer).required_optimizations()


def test_compile_gives_the_reason(fresh_cache, monkeypatch):
  k = _sum_kernel()

  def broken(self, name_override=None):
    raise ValueError("renderer bug")
  monkeypatch.setattr(Kernel, "to_program", broken)
  res, why = search._compile((k.ast, (), k.opts.device, k.opts))
  assert res is None and why is not None and "ValueError: renderer bug" in why


def test_failed_candidates_are_counted_and_reported(fresh_cache, monkeypatch, capsys):
  k = _sum_kernel()
  real = search._compile

  def flaky(args):
    # the starting kernel compiles; every candidate with an opt fails
    return real(args) if not args[1] else (None, f"{args[1]}: CompileError: no")
  monkeypatch.setattr(search, "_compile", flaky)
  before = search.search_stats["failed"]
  with Context(DEBUG=1):
    best = search.beam_search(k, search.bufs_from_lin(k), 2)
  assert best.applied_opts == k.applied_opts
  failed = search.search_stats["failed"] - before
  assert failed > 0
  out = capsys.readouterr().out
  assert out.count(f"skipped {failed} candidate(s) that failed to compile or run") == 1 and "CompileError: no" in out
