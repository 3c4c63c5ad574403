"""LLVM's batched first compile (LLVMCompiler.compile_many): kernels compiled by a helper process give the very objects
compile() gives, a kernel that does not compile (or a helper that dies) costs only that kernel, the in-process path still
works, and the engine's precompile fills the disk cache per kernel source."""
from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest

from tiny import Tensor, helpers
from tiny.engine import realize
from tiny.registry import Device

pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")

from tiny_clang import compiler as cc_mod  # noqa: E402
from tiny_clang.compiler import LLVMCompiler  # noqa: E402
from tiny_clang.llvmir import lconst  # noqa: E402
from tiny_clang.runtime import LLVMProgram  # noqa: E402
from tiny_clang.settings import LLVM_WORKERS  # noqa: E402
from tiny.dtype import dtypes  # noqa: E402

X = np.arange(16, dtype=np.float32) - 3.5


def scale_ir(scale: float, name: str = "k") -> str:
  """A kernel in LLVMRenderer's layout: out[i] = in[i] * scale for 16 floats, its entry and its parallel flag."""
  return "\n".join([
    f"@{name}_parallel = constant i32 0",
    f"define void @{name}(ptr noalias align 4 %data0, ptr noalias align 4 readonly %data1, i32 %core, i32 %ncores) #0 {{",
    "entry:",
    "  br label %loop",
    "loop:",
    "  %i = phi i32 [0, %entry], [%n, %loop]",
    "  %p = getelementptr inbounds float, ptr %data1, i32 %i",
    "  %x = load float, ptr %p",
    f"  %y = fmul float %x, {lconst(scale, dtypes.float32)}",
    "  %q = getelementptr inbounds float, ptr %data0, i32 %i",
    "  store float %y, ptr %q",
    "  %n = add nsw i32 %i, 1",
    "  %c = icmp slt i32 %n, 16",
    "  br i1 %c, label %loop, label %exit",
    "exit:",
    "  ret void",
    "}",
    f"define void @{name}_entry(ptr %args, i32 %core, i32 %ncores) #0 {{",
    "  %a0 = load i64, ptr %args",
    "  %p1 = getelementptr inbounds i64, ptr %args, i64 1",
    "  %a1 = load i64, ptr %p1",
    "  %b0 = inttoptr i64 %a0 to ptr",
    "  %b1 = inttoptr i64 %a1 to ptr",
    f"  call void @{name}(ptr %b0, ptr %b1, i32 %core, i32 %ncores)",
    "  ret void",
    "}",
    "attributes #0 = { nounwind }"])


BAD_IR = "define void @bad() {\n  %x = add i32 1, %undefined\n  ret void\n}\n"


def run_kernel(name: str, lib: bytes, x: np.ndarray) -> np.ndarray:
  out = np.zeros_like(x)
  LLVMProgram(name, lib)(out.ctypes.data, x.ctypes.data)
  return out


@pytest.fixture
def worker_calls(monkeypatch: pytest.MonkeyPatch) -> List[str]:
  """Every source a helper process compiled during the test (helpers allowed even on a one-core machine)."""
  monkeypatch.setattr(LLVM_WORKERS, "value", 2)
  monkeypatch.setattr(cc_mod._WORKERS, "broken", False)
  calls: List[str] = []
  real = cc_mod._LLVMWorker.compile

  def spy(self: Any, src: str) -> Any:
    calls.append(src)
    return real(self, src)
  monkeypatch.setattr(cc_mod._LLVMWorker, "compile", spy)
  return calls


def test_batch_gives_the_objects_compile_gives(worker_calls: List[str]) -> None:
  comp = LLVMCompiler()
  scales = [1.5 + i for i in range(5)]
  srcs = [scale_ir(s, name=f"k{i}") for i, s in enumerate(scales)]
  libs = comp.compile_many(srcs)
  assert worker_calls == srcs, "a batch of 5 is compiled by a helper process"
  for i, (s, src, lib) in enumerate(zip(scales, srcs, libs)):
    assert lib is not None and lib == comp.compile(src), "bit for bit the object compiled in this process"
    np.testing.assert_array_equal(run_kernel(f"k{i}", lib, X), X * np.float32(s))


def test_a_bad_kernel_in_a_batch_costs_only_itself(worker_calls: List[str]) -> None:
  comp = LLVMCompiler()
  srcs = [scale_ir(2.0), BAD_IR, scale_ir(3.0), scale_ir(4.0)]
  libs = comp.compile_many(srcs)
  assert libs[1] is None, "a source that does not compile gives None (compile() alone raises its error)"
  for i, s in ((0, 2.0), (2, 3.0), (3, 4.0)):
    lib = libs[i]
    assert lib is not None
    np.testing.assert_array_equal(run_kernel("k", lib, X), X * np.float32(s))
  assert len(worker_calls) == 4 and cc_mod._WORKERS.idle, "the helper lived on after the bad source"
  with pytest.raises(cc_mod.CompileError):
    comp.compile(BAD_IR)


def test_a_helper_that_died_is_replaced(worker_calls: List[str]) -> None:
  comp = LLVMCompiler()
  comp.compile_many([scale_ir(2.0 + i) for i in range(4)])   # leaves an idle helper behind
  assert cc_mod._WORKERS.idle
  for w in cc_mod._WORKERS.idle:
    w.proc.kill()
    w.proc.wait()
  libs = comp.compile_many([scale_ir(5.0), scale_ir(6.0)])
  for lib, s in zip(libs, (5.0, 6.0)):
    assert lib is not None
    np.testing.assert_array_equal(run_kernel("k", lib, X), X * np.float32(s))
  assert not cc_mod._WORKERS.broken


def test_small_batches_and_no_helpers_compile_in_process(monkeypatch: pytest.MonkeyPatch, worker_calls: List[str]) -> None:
  comp = LLVMCompiler()
  monkeypatch.setattr(cc_mod._WORKERS, "idle", [])
  monkeypatch.setattr(LLVM_WORKERS, "value", 0)
  srcs = [scale_ir(2.0 + i) for i in range(6)]
  libs = comp.compile_many(srcs)
  assert worker_calls == [] and libs == [comp.compile(s) for s in srcs]
  monkeypatch.setattr(LLVM_WORKERS, "value", 2)
  assert comp.compile_many(srcs[:2]) == libs[:2] and worker_calls == [], "two kernels do not pay for a helper's start"


def test_a_patched_compile_is_honoured(monkeypatch: pytest.MonkeyPatch, worker_calls: List[str]) -> None:
  seen: List[str] = []
  real = LLVMCompiler.compile

  def patched(self: LLVMCompiler, src: str) -> bytes:
    seen.append(src)
    return real(self, src)
  monkeypatch.setattr(LLVMCompiler, "compile", patched)
  srcs = [scale_ir(2.0 + i) for i in range(4)]
  assert all(lib is not None for lib in LLVMCompiler().compile_many(srcs))
  assert seen == srcs and worker_calls == []


def _fresh_kernels(x: Tensor, salt: float) -> list:
  # distinct constants give distinct kernels; exp2/log2 pull in vector math helpers, sums reduce loops
  return [(x * (salt + i) + i).exp2() for i in range(3)] + [(x + salt).abs().log2(), (x * salt).sum(0), (x - salt).max(1)]


def test_precompile_uses_helpers_and_the_disk_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, worker_calls: List[str]) -> None:
  if "LLVM" not in Device.get_available_devices():
    pytest.skip("no LLVM device")
  monkeypatch.setattr(helpers, "CACHEDB", str(tmp_path / "cache.db"), raising=False)
  monkeypatch.setattr(realize._CompileQueue, "min_batch", 6)
  monkeypatch.setattr(cc_mod._WORKERS, "start_batch", 1)   # every batch, however small, goes to a helper
  comp = Device["LLVM"].compiler
  a = (np.arange(64, dtype=np.float32).reshape(8, 8) - 20) / 16
  x = Tensor(a, device="LLVM").realize()
  salt = float(np.random.default_rng().integers(1, 1 << 20)) / (1 << 20)   # new kernels, whatever this process compiled before
  outs = _fresh_kernels(x, salt)
  sched = outs[0].schedule(*outs[1:])
  asts = {si.ast for si in sched}
  assert realize.precompile(list(sched)) == len(asts)
  assert len(worker_calls) == len(asts), "every kernel was compiled by a helper process"
  realize.run_schedule(sched)
  want = [np.exp2(a * np.float32(salt + i) + i) for i in range(3)] + [np.log2(np.abs(a + salt)), (a * salt).sum(0), (a - salt).max(1)]
  for o, w in zip(outs, want):
    np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-6)
  runners = [r for key, r in realize.method_cache.items() if key[0] == "LLVM" and key[2] in asts]
  for r in runners:
    assert r.lib == comp.compile(r.p.src), "the helper's object is the one this process would have built"
  if comp.cachekey is None or helpers.CACHELEVEL < 1:
    return
  for r in runners:
    assert comp.cache_lookup(r.p.src) == r.lib, "each kernel's own object is in the disk cache under its own source"
  worker_calls.clear()
  realize.method_cache.clear()
  realize._runners.clear()
  again = _fresh_kernels(x, salt)
  sched2 = again[0].schedule(*again[1:])
  assert realize.precompile(list(sched2)) == len(asts) and worker_calls == [], "served from the disk cache, nothing compiled"
  realize.run_schedule(sched2)
  for o, w in zip(again, want):
    np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_helpers(worker_calls: List[str]) -> None:
  import os
  comp = LLVMCompiler()
  srcs = [scale_ir(2.0 + i) for i in range(4)]
  libs = comp.compile_many(srcs)
  parent_helpers = {w.proc.pid for w in cc_mod._WORKERS.idle}
  assert parent_helpers, "the batch left an idle helper behind"
  pid = os.fork()
  if pid == 0:   # the child: exit status 0 when its batch is right and went to a helper of its own
    ok = False
    try:
      ok = cc_mod._WORKERS.idle == [] and comp.compile_many(srcs) == libs and \
        {w.proc.pid for w in cc_mod._WORKERS.idle}.isdisjoint(parent_helpers) and len(cc_mod._WORKERS.idle) == 1
      cc_mod._WORKERS.close()
    finally:
      os._exit(0 if ok else 1)
  _, status = os.waitpid(pid, 0)
  assert os.WEXITSTATUS(status) == 0
  assert comp.compile_many(srcs) == libs and {w.proc.pid for w in cc_mod._WORKERS.idle} == parent_helpers, "the parent's helper still works"
