"""CLANG toolchain: compiler selection and errors, no files left behind, probes, the allocator."""
from __future__ import annotations

import ctypes
import glob
import os
import shutil
import tempfile
import time

import numpy as np
import pytest

from tiny.device import CompileError

from tiny_clang import plugin
from tiny_clang.compiler import ClangCompiler, find_cc
from tiny_clang.runtime import ClangAllocator, ClangProgram

if find_cc() is None:
  pytest.skip("no C compiler (clang/cc/gcc) on this machine", allow_module_level=True)

ADD1 = """
void add1(float* restrict d0, const float* restrict d1, int core, int ncores) { for (int i = core; i < 4; i += ncores) d0[i] = d1[i] + 1.0f; }
void add1_entry(const long long *a, int core, int ncores) { add1((float*)a[0], (const float*)a[1], core, ncores); }
const int add1_parallel = 1;
"""


def _run_add1(lib: bytes) -> np.ndarray:
  al = ClangAllocator()
  out, inp = al.alloc(16), al.alloc(16)
  al.copyin(inp, memoryview(np.arange(4, dtype=np.float32)).cast("B"))
  ClangProgram("add1", lib)(out, inp)
  return np.frombuffer(al.as_buffer(out), np.float32).copy()


def test_compile_and_run() -> None:
  np.testing.assert_array_equal(_run_add1(ClangCompiler().compile(ADD1)), [1, 2, 3, 4])


def test_compile_error_shows_numbered_source_and_message() -> None:
  src = "void broken(float *x) {\n  x[0] = undefined_name;\n}\n"
  with pytest.raises(CompileError) as ei:
    ClangCompiler().compile(src)
  msg = str(ei.value)
  assert "undefined_name" in ei.value.compiler_msg
  assert "   2 |   x[0] = undefined_name;" in msg, msg
  assert ei.value.src == src


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_each_compiler_works(cc: str, monkeypatch: pytest.MonkeyPatch) -> None:
  if shutil.which(cc) is None:
    pytest.skip(f"{cc} is not installed")
  monkeypatch.setenv("CC", cc)
  comp = ClangCompiler()
  assert comp.cc == [cc]
  np.testing.assert_array_equal(_run_add1(comp.compile(ADD1)), [1, 2, 3, 4])


def test_falls_back_to_cc_when_clang_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
  real_which = shutil.which
  monkeypatch.delenv("CC", raising=False)
  monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "clang" else real_which(name, *a, **k))
  if real_which("cc") is None and real_which("gcc") is None:
    pytest.skip("no cc/gcc to fall back to")
  assert find_cc() in ("cc", "gcc")
  np.testing.assert_array_equal(_run_add1(ClangCompiler().compile(ADD1)), [1, 2, 3, 4])


def test_cflags_override(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("CFLAGS", "-O0 -fPIC -DTINY_TEST_VALUE=41")
  comp = ClangCompiler()
  assert comp.flags == ["-O0", "-fPIC", "-DTINY_TEST_VALUE=41"]
  src = ADD1.replace("+ 1.0f", "+ (float)(TINY_TEST_VALUE - 40)")
  np.testing.assert_array_equal(_run_add1(comp.compile(src)), [1, 2, 3, 4])
  assert ClangCompiler().cachekey != ClangCompiler(opt_args=["-O3"]).cachekey, "flags must be part of the cache key"


def test_no_files_left_behind() -> None:
  def listing() -> set:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "*"))) | set(glob.glob("/dev/shm/*"))
  before = listing()
  for i in range(3):
    _run_add1(ClangCompiler().compile(ADD1 + f"\nint unique_{i};\n"))
  with pytest.raises(CompileError):
    ClangCompiler().compile("this is not C")
  leaked = [p for p in listing() - before if "tiny_clang" in os.path.basename(p)]
  # other processes (the other test worker) load kernels too, each through a file that lives a few microseconds: a leak
  # is a file that is still there a moment later
  time.sleep(0.5)
  assert [p for p in leaked if os.path.exists(p)] == []


def test_probes(monkeypatch: pytest.MonkeyPatch) -> None:
  assert plugin._probe_clang() is None
  monkeypatch.setenv("CC", "/nonexistent/compiler")
  reason = plugin._probe_clang()
  assert reason is not None and "C compiler" in reason
  monkeypatch.delenv("CC")
  monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
  assert "clang" in (plugin._probe_clang() or "")
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llvmlite" else real(name, *a))
  assert "pip install llvmlite" in (plugin._probe_llvm() or "")


def test_plugin_declares_its_devices() -> None:
  specs = {s.name: s for s in plugin.tiny_devices()}
  assert set(specs) == {"CLANG", "LLVM", "HCQCPU"}
  # the HCQ reference is never the default device and builds itself
  assert specs["HCQCPU"].priority < 0 and specs["HCQCPU"].device_factory is not None and specs["HCQCPU"].graph is not None
  assert plugin.TINY_PLUGIN_API == "1.2"   # row_prefetch uses tiny.backend.exec_alu (1.2)
  assert specs["CLANG"].priority > specs["LLVM"].priority > 0
  assert specs["CLANG"].graph is not None and specs["LLVM"].graph is not None


def test_allocator_alignment_zero_copy_and_views() -> None:
  al = ClangAllocator()
  bufs = [al.alloc(n) for n in (1, 3, 64, 1000, 4097)]
  assert all(ctypes.addressof(b) % 64 == 0 for b in bufs)
  b = al.alloc(16)
  mv = al.as_buffer(b)
  mv[:] = bytes(range(16))
  assert bytes((ctypes.c_uint8 * 16).from_address(ctypes.addressof(b))) == bytes(range(16)), "as_buffer must not copy"
  view = al.offset(b, 8, 4)
  assert ctypes.addressof(view) == ctypes.addressof(b) + 4
  out = bytearray(8)
  al.copyout(memoryview(out), view)
  assert out == bytes(range(4, 12))
  al.copyin(view, memoryview(b"\xff" * 8))
  assert bytes(al.as_buffer(b)) == bytes(range(4)) + b"\xff" * 8 + bytes(range(12, 16))
  # freed buffers are reused by the LRU cache
  al.free(b, 16)
  assert al.alloc(16) is b


def test_large_buffers_start_on_a_huge_page_and_ask_for_huge_pages(monkeypatch: pytest.MonkeyPatch) -> None:
  from tiny_clang import runtime
  asked: list = []
  real = runtime.advise_huge_pages
  monkeypatch.setattr(runtime, "advise_huge_pages", lambda addr, size: asked.append((addr, size)) or real(addr, size))
  monkeypatch.setattr(runtime, "_use_huge_pages", True)
  al = ClangAllocator()
  small, big = al.alloc(runtime.HUGE_PAGE - 64), al.alloc(runtime.HUGE_PAGE + 100)
  assert ctypes.addressof(small) % 64 == 0 and ctypes.addressof(big) % runtime.HUGE_PAGE == 0
  assert asked == [(ctypes.addressof(big), runtime.HUGE_PAGE + 100)], "only buffers of a huge page or more ask for huge pages"
  # the whole buffer is ordinary memory: write every byte, read it back, free it
  data = np.random.default_rng(0).integers(0, 256, runtime.HUGE_PAGE + 100, dtype=np.uint8)
  al.copyin(big, memoryview(data))
  out = np.empty_like(data)
  al.copyout(memoryview(out), big)
  np.testing.assert_array_equal(out, data)
  al.free(small, runtime.HUGE_PAGE - 64)
  al.free(big, runtime.HUGE_PAGE + 100)
  al.free_cache()
  # off Linux (or switched off) a big buffer is an ordinary 64-byte-aligned one
  monkeypatch.setattr(runtime, "_use_huge_pages", False)
  asked.clear()
  assert ctypes.addressof(al.alloc(runtime.HUGE_PAGE + 100)) % 64 == 0 and not asked


def test_advise_huge_pages_covers_only_whole_huge_pages() -> None:
  from tiny_clang import runtime
  hp = runtime.HUGE_PAGE
  # no whole 2 MiB page inside: nothing to ask for
  assert runtime.advise_huge_pages(hp + 4096, hp - 8192) is False
  assert runtime.advise_huge_pages(hp, hp - 1) is False


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_sum_of_a_huge_page_buffer_matches_numpy(device: str) -> None:
  from tiny import Tensor
  from tiny_clang import runtime
  if device == "LLVM":
    pytest.importorskip("llvmlite")
  # 5 MiB of floats plus an odd tail: the split reduce on a 2 MiB aligned huge-page buffer
  x = np.random.default_rng(1).standard_normal(runtime.HUGE_PAGE * 5 // 8 + 37).astype(np.float32)
  t = Tensor(x, device=device).realize()
  np.testing.assert_allclose(t.sum().numpy(), x.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
  np.testing.assert_allclose(t.max().numpy(), x.max())
  y = x[: (len(x) // 1024) * 1024].reshape(-1, 1024)
  np.testing.assert_allclose(Tensor(y, device=device).sum(axis=0).numpy(), y.sum(axis=0), rtol=1e-4, atol=1e-3)


class _Clock:
  """perf_counter stand-in: each run (two reads) takes the next of `durations` seconds."""

  def __init__(self, durations: list) -> None:
    self.durations, self.t, self.reads = list(durations), 0.0, 0

  def __call__(self) -> float:
    self.reads += 1
    if self.reads % 2 == 0:
      self.t += self.durations.pop(0)
    return self.t


@pytest.mark.parametrize("durations, cores", [
  ([500e-6, 5e-6, 6e-6], 1),      # a slow first run (a busy machine) no longer sends a tiny kernel to the pool for good
  ([500e-6, 450e-6, 480e-6], 2),  # every run slow: worth the pool
  ([0.5], 2),                     # one run far past the threshold decides at once
])
def test_core_count_is_decided_on_the_fastest_of_the_first_runs(monkeypatch: pytest.MonkeyPatch, durations: list, cores: int) -> None:
  from tiny_clang import runtime
  monkeypatch.setattr(runtime.THREADS, "value", 0)
  monkeypatch.setattr(runtime, "num_threads", lambda: 2)
  lib = ClangCompiler().compile(ADD1)
  prog = ClangProgram("add1", lib)
  al = ClangAllocator()
  out, inp = al.alloc(16), al.alloc(16)
  clock = _Clock(durations)
  monkeypatch.setattr(runtime.time, "perf_counter", clock)
  for i in range(len(durations)):
    assert prog.auto_threads is None, f"decided after {i} runs"
    prog(out, inp)
  assert prog.auto_threads == cores
