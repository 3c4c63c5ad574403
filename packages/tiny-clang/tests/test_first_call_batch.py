"""The first call's batched compile: many kernels from one clang process (ClangCompiler.compile_many), cut into one shared
object per kernel, the same results as compiling each alone, the disk cache per kernel source, and the engine's queue."""
from __future__ import annotations

import ctypes
from typing import List, Tuple

import numpy as np
import pytest

from tiny import Tensor, helpers
from tiny.device import Compiler
from tiny.engine import realize
from tiny.registry import Device

from tiny_clang import compiler as cc_mod
from tiny_clang.compiler import ClangCompiler, batch_source, file_scope, find_cc
from tiny_clang.runtime import ClangProgram

if find_cc() is None:
  pytest.skip("no C compiler (clang/cc/gcc) on this machine", allow_module_level=True)


def scale_kernel(scale: float, name: str = "k", vec: bool = True) -> str:
  """A kernel in ClangRenderer's layout: same names in every copy (kernel, static helper, vector typedef), its own scale."""
  head = ["typedef float tiny_float4 __attribute__((vector_size(16), aligned(4)));"] if vec else []
  return "\n".join(head + [
    f"static inline float helper(float x) {{ return x * {scale!r}f; }}",
    f"void {name}(float* restrict data0, const float* restrict data1, int core, int ncores) {{",
    "  for (int i = 0; i < 16; i++) {",
    "    data0[i] = helper(data1[i]);",
    "  }",
    "}",
    f"void {name}_entry(const long long *args, int core, int ncores) {{ {name}((float*)args[0], (const float*)args[1], core, ncores); }}",
    f"const int {name}_parallel = 0;"])


def run_kernel(name: str, lib: bytes, x: np.ndarray) -> np.ndarray:
  out = np.zeros_like(x)
  ClangProgram(name, lib)(out.ctypes.data, x.ctypes.data)
  return out


X = np.arange(16, dtype=np.float32) - 3.5


def test_file_scope_reads_rendered_kernels() -> None:
  sc = file_scope(scale_kernel(2.0))
  assert sc is not None
  assert set(sc.names) == {"tiny_float4", "helper", "k", "k_entry", "k_parallel"}
  assert set(sc.exported) == {"k", "k_entry", "k_parallel"} and sc.macros == ()
  # forms the reader does not know for sure are compiled alone
  assert file_scope("#include <math.h>\n" + scale_kernel(2.0)) is None
  assert file_scope("float expf(float);\n" + scale_kernel(2.0)) is None
  assert file_scope("static int only_static(void) { return 1; }") is None   # nothing a runtime could look up
  half = file_scope("#define tiny_h2f(h) ((float)(h))\n" + scale_kernel(1.0))
  assert half is not None and half.macros == ("tiny_h2f",)


def test_file_scope_reads_attributes_before_a_definition() -> None:
  # the renderer puts min_vector_width on 512-bit kernels: such a kernel must still join a batch, not compile alone
  wide = scale_kernel(2.0).replace("void k(", "__attribute__((min_vector_width(512))) void k(")
  sc = file_scope(wide)
  assert sc is not None and set(sc.exported) == {"k", "k_entry", "k_parallel"}
  quiet = file_scope("static __attribute__((noinline)) float h(float x) { return x; }\n"
                     "__attribute__((aligned(64))) static float buf[16];\n" + scale_kernel(1.0))
  assert quiet is not None and {"h", "buf"} <= set(quiet.names) and not {"h", "buf"} & set(quiet.exported)


def _spied_compiler(monkeypatch: pytest.MonkeyPatch) -> Tuple[ClangCompiler, List[List[str]]]:
  """A batching ClangCompiler and the list its compiler/linker command lines are recorded in (skips without a linker)."""
  comp = ClangCompiler()
  if comp.ld is None:
    pytest.skip("no direct linker here: compile_many compiles one source at a time")
  runs: List[List[str]] = []
  real = cc_mod._run_to_bytes

  def spy(cmd, src, pass_fds=()):   # type: ignore[no-untyped-def]
    runs.append(cmd)
    return real(cmd, src, pass_fds)
  monkeypatch.setattr(cc_mod, "_run_to_bytes", spy)
  return comp, runs


def test_compile_many_batches_attributed_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
  comp, runs = _spied_compiler(monkeypatch)
  srcs = [scale_kernel(2.0 + i).replace("void k(", "__attribute__((min_vector_width(512))) void k(") for i in range(3)]
  libs = comp.compile_many(srcs)
  assert sum(1 for cmd in runs if cmd[0] == comp.cc[0]) == 1, "one compiler process for the whole batch"
  for i, lib in enumerate(libs):
    assert lib is not None
    np.testing.assert_array_equal(run_kernel("k", lib, X), X * np.float32(2.0 + i))


def test_batch_source_renames_each_kernel_apart() -> None:
  srcs = [scale_kernel(2.0), scale_kernel(3.0)]
  tu = batch_source(srcs, [file_scope(s) for s in srcs])   # type: ignore[misc]
  assert "#define helper tiny_b0_helper" in tu and "#define helper tiny_b1_helper" in tu and tu.count("#undef k_entry") == 2


@pytest.mark.parametrize("n", [2, 5])
def test_compile_many_matches_compile_alone(n: int) -> None:
  comp = ClangCompiler()
  if comp.ld is None:
    pytest.skip("no direct linker here: compile_many compiles one source at a time")
  scales = [1.5 + i for i in range(n)]
  srcs = [scale_kernel(s, vec=i % 2 == 0) for i, s in enumerate(scales)]   # equal names, helpers and typedefs in every one
  libs = comp.compile_many(srcs)
  assert all(lib is not None for lib in libs)
  for s, src, lib in zip(scales, srcs, libs):
    assert lib is not None
    got = run_kernel("k", lib, X)
    np.testing.assert_array_equal(got, X * np.float32(s))
    np.testing.assert_array_equal(got, run_kernel("k", comp.compile(src), X))
    # only the kernel's own names leave the shared object: the batch's renamed ones stay inside
    so = ClangProgram("k", lib).so
    with pytest.raises(AttributeError):
      getattr(so, "tiny_b0_k")
    assert ctypes.c_int32.in_dll(so, "k_parallel").value == 0


def test_compile_many_uses_one_compiler_process(monkeypatch: pytest.MonkeyPatch) -> None:
  comp, runs = _spied_compiler(monkeypatch)
  libs = comp.compile_many([scale_kernel(2.0 + i, name=f"k{i}") for i in range(4)])
  assert all(lib is not None for lib in libs)
  assert sum(1 for cmd in runs if cmd[0] == comp.cc[0]) == 1, "one compiler process for the whole batch"
  for i, lib in enumerate(libs):
    assert lib is not None
    np.testing.assert_array_equal(run_kernel(f"k{i}", lib, X), X * np.float32(2.0 + i))


def test_link_groups_keep_equal_names_apart() -> None:
  names = ["a", "b", "a", "a", "c", "b"]
  scopes = [file_scope(scale_kernel(1.0, name=n)) for n in names]
  groups = cc_mod.link_groups(scopes)   # type: ignore[arg-type]
  assert groups == [[0, 1, 4], [2, 5], [3]]
  for g in groups:
    assert len({names[i] for i in g}) == len(g), "no name twice in one shared object"


def test_compile_many_links_once_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
  # three kernels named apart share one link; the two named like the first get theirs: 3 runs of ld for 5 sources
  comp, runs = _spied_compiler(monkeypatch)
  names = ["k0", "k1", "k0", "k2", "k0"]
  libs = comp.compile_many([scale_kernel(2.0 + i, name=n) for i, n in enumerate(names)])
  assert sum(1 for cmd in runs if cmd[0] == comp.cc[0]) == 1
  assert sum(1 for cmd in runs if cmd[0] == comp.ld) == 3, [cmd[0] for cmd in runs]
  assert libs[0] == libs[1] == libs[3] and libs[2] != libs[0] and libs[4] not in (libs[0], libs[2])
  for i, (n, lib) in enumerate(zip(names, libs)):
    assert lib is not None
    # each kernel's own code, whatever else its shared object holds
    np.testing.assert_array_equal(run_kernel(n, lib, X), X * np.float32(2.0 + i))
    with pytest.raises(AttributeError):
      getattr(ClangProgram(n, lib).so, "tiny_b0_k0")


def test_compile_many_group_with_a_libc_caller() -> None:
  # one kernel of the group calls into libc: the group is linked against it and both kernels still work
  src = scale_kernel(3.0, name="m").replace("data0[i] = helper(data1[i]);", "data0[i] = helper(data1[i]);\n  }\n  {\n"
                                            "    __builtin_memset(data0 + (int)data1[15], 0, (int)data1[14] * sizeof(float));")
  comp = ClangCompiler()
  if comp.ld is None:
    pytest.skip("no direct linker here: compile_many compiles one source at a time")
  libs = comp.compile_many([scale_kernel(2.0), src])
  assert libs[0] is not None and libs[0] == libs[1]
  np.testing.assert_array_equal(run_kernel("k", libs[0], X), X * np.float32(2.0))
  x = np.full(16, 2.0, np.float32)
  x[14], x[15] = 3, 4
  want = x * np.float32(3.0)
  want[4:7] = 0
  np.testing.assert_array_equal(run_kernel("m", libs[0], x), want)


def test_compile_many_isolates_a_bad_source() -> None:
  comp = ClangCompiler()
  srcs = [scale_kernel(2.0), scale_kernel(3.0).replace("helper(data1[i]);", "helper(data1[i]) +;"), scale_kernel(4.0)]
  libs = comp.compile_many(srcs)
  assert libs[1] is None, "a source that does not compile gives None (compile() alone raises its error)"
  assert libs[0] is not None and libs[2] is not None
  np.testing.assert_array_equal(run_kernel("k", libs[0], X), X * np.float32(2.0))
  np.testing.assert_array_equal(run_kernel("k", libs[2], X), X * np.float32(4.0))


def test_kernel_calling_libc_links_against_it() -> None:
  # a runtime-sized memset is a call into libc: the link without libraries fails (-z defs), the one with them works
  src = "\n".join([
    "void z(float* restrict data0, const float* restrict data1, int core, int ncores) {",
    "  int n = (int)data1[0];",
    "  __builtin_memset(data0, 0, n * sizeof(float));",
    "}",
    "void z_entry(const long long *args, int core, int ncores) { z((float*)args[0], (const float*)args[1], core, ncores); }",
    "const int z_parallel = 0;"])
  comp = ClangCompiler()
  for lib in [comp.compile(src), *comp.compile_many([src, scale_kernel(2.0)])[:1]]:
    assert lib is not None
    out = np.ones(16, np.float32)
    ClangProgram("z", lib)(out.ctypes.data, np.full(16, 5, np.float32).ctypes.data)
    np.testing.assert_array_equal(out, [0] * 5 + [1] * 11)


def test_base_compiler_compile_many_loops_over_compile() -> None:
  class Upper(Compiler):
    def compile(self, src: str) -> bytes:
      if src == "bad":
        raise RuntimeError("does not compile")
      return src.upper().encode()
  assert Upper().compile_many(["a", "bad", "c"]) == [b"A", None, b"C"]


def _fresh_kernels(x: Tensor, salt: float) -> list:
  # distinct constants give distinct kernels; exp2/log2 pull in vector math helpers, sums reduce loops
  return [(x * (salt + i) + i).exp2() for i in range(3)] + [(x + salt).abs().log2(), (x * salt).sum(0), (x - salt).max(1)]


def test_precompile_batches_and_fills_the_disk_cache(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:   # type: ignore[no-untyped-def]
  if "CLANG" not in Device.get_available_devices():
    pytest.skip("no CLANG device")
  monkeypatch.setattr(helpers, "CACHEDB", str(tmp_path / "cache.db"), raising=False)
  comp = Device["CLANG"].compiler
  batches: List[int] = []
  real = type(comp).compile_many

  def spy(self, srcs):   # type: ignore[no-untyped-def]
    batches.append(len(srcs))
    return real(self, srcs)
  monkeypatch.setattr(type(comp), "compile_many", spy)
  monkeypatch.setattr(realize._CompileQueue, "min_batch", 3)
  a = (np.arange(64, dtype=np.float32).reshape(8, 8) - 20) / 16
  x = Tensor(a, device="CLANG").realize()
  salt = float(np.random.default_rng().integers(1, 1 << 20)) / (1 << 20)   # new kernels, whatever this process compiled before
  outs = _fresh_kernels(x, salt)
  sched = outs[0].schedule(*outs[1:])
  n = len({si.ast for si in sched})
  assert realize.precompile(list(sched)) == n
  assert sum(batches) == n and max(batches) >= 2, f"kernels compiled in batches, got {batches}"
  realize.run_schedule(sched)
  want = [np.exp2(a * np.float32(salt + i) + i) for i in range(3)] + [np.log2(np.abs(a + salt)), (a * salt).sum(0), (a - salt).max(1)]
  for o, w in zip(outs, want):
    np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-6)
  if comp.cachekey is None or helpers.CACHELEVEL < 1:
    return
  # every kernel's own binary is in the disk cache, under its own source: a new process finds them there
  for key in list(realize.method_cache):
    if key[2] in {si.ast for si in sched}:
      runner = realize.method_cache[key]
      assert comp.cache_lookup(runner.p.src) == runner.lib
  batches.clear()
  realize.method_cache.clear()
  again = _fresh_kernels(x, salt)
  sched2 = again[0].schedule(*again[1:])
  assert realize.precompile(list(sched2)) == n and batches == [], "served from the disk cache, nothing compiled"
  realize.run_schedule(sched2)
  for o, w in zip(again, want):
    np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-6)


class _CountingCompiler(Compiler):
  """Records the size of every batch it gets; builds nothing."""

  def __init__(self, min_share: int = 0) -> None:
    super().__init__(None)
    self.batches: List[int] = []
    if min_share:
      self.min_share = min_share

  def compile(self, src: str) -> bytes:
    return src.encode()

  def compile_many(self, srcs):   # type: ignore[no-untyped-def]
    self.batches.append(len(srcs))
    return [self.compile(s) for s in srcs]


@pytest.mark.parametrize("min_share, want", [(0, [1, 1, 2, 5]), (4, [4, 5])])
def test_last_sources_are_not_split_below_min_share(monkeypatch: pytest.MonkeyPatch, min_share: int, want: List[int]) -> None:
  # nothing starts while sources come (min_batch too high): every take happens after close, where the shares are cut
  monkeypatch.setattr(realize._CompileQueue, "min_batch", 100)
  comp = _CountingCompiler(min_share)
  queue = realize._CompileQueue(2)
  futs = [queue.submit(comp, f"src{i}") for i in range(9)]
  queue.close()
  queue.join()
  assert [f.result() for f in futs] == [f"src{i}".encode() for i in range(9)]
  assert sorted(comp.batches) == want, comp.batches
  assert ClangCompiler.min_share >= 2, "each CLANG batch starts a compiler process"
