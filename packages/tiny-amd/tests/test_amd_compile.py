"""Every kernel of the op suite renders with HIPRenderer and compiles to a code object for gfx1100 and gfx90a, without a GPU.

clang (clang-16 in CI) is the judge: a kernel it rejects fails the test. To keep it fast, all kernels go into one translation
unit (each in its own namespace); when that fails, every kernel is compiled alone to name the culprits. The code objects
are checked as ELF files against LLVM's AMDGPU constants: e_machine EM_AMDGPU (224), the target in e_flags, a symbol and
a kernel descriptor for every kernel.
"""
from __future__ import annotations

import ctypes
import math
import shutil
import struct
import subprocess
from typing import Any, Dict, List

import numpy as np
import pytest

from tiny.backend import CompileError, KernelOptError, dtypes, to_function_name

from tiny_amd.codeobject import kernel_info, kernel_names, symbols
from tiny_amd.compiler import AMDToolchainError, HIPCompiler, find_clang
from tiny_amd.opsuite import batch_source, make_program, op_suite_asts, render_suite, tc_matmul_ast
from tiny_amd.renderer import BF16_STRUCT, HIPRenderer, _max, normalize_arch, sin_helper

# EF_AMDGPU_MACH (low byte of e_flags) from LLVM's AMDGPUUsage
ARCH_MACH = {"gfx1100": 0x41, "gfx90a": 0x3F}
ARCHS = list(ARCH_MACH)


def _clang_missing() -> str:
  try:
    find_clang()
    return ""
  except AMDToolchainError as e:
    return str(e)


pytestmark = pytest.mark.skipif(bool(_clang_missing()), reason=_clang_missing() or "clang found")


def elf_target(lib: bytes) -> int:
  """EF_AMDGPU_MACH of an AMD GPU code object, after checking that it is one (ELF64, e_machine 224, HSA OS ABI)."""
  assert lib[:4] == b"\x7fELF" and lib[4] == 2, "not an ELF64 file"
  assert struct.unpack_from("<H", lib, 18)[0] == 224, "e_machine is not EM_AMDGPU"
  assert lib[7] == 64, "OS ABI is not AMDGPU_HSA"
  return struct.unpack_from("<I", lib, 48)[0] & 0xFF


@pytest.fixture(scope="module")
def suite() -> Dict[str, Any]:
  return op_suite_asts()


@pytest.fixture(scope="module")
def programs(suite: Dict[str, Any]) -> Dict[str, List[Any]]:
  return {arch: render_suite(HIPRenderer(arch), "hand", suite) for arch in ARCHS}


def compile_all(arch: str, progs: List[Any]) -> bytes:
  compiler = HIPCompiler(arch)
  try:
    return compiler.compile(batch_source([p.src for p in progs]))
  except CompileError:
    failures = []
    for p in progs:
      try:
        compiler.compile(p.src)
      except CompileError as e:
        failures.append(f"{p.name}: {e.compiler_msg[:1500]}")
    raise AssertionError(f"kernels rejected for {arch}:\n" + "\n".join(failures or ["(only together: see the batch error)"]))


def check_code_object(lib: bytes, arch: str, progs: List[Any]) -> None:
  assert elf_target(lib) == ARCH_MACH[arch]
  syms = symbols(lib)
  for p in progs:
    assert p.name in syms and f"{p.name}.kd" in syms, f"kernel {p.name} is missing from the code object"
  assert kernel_names(lib) == sorted(p.name for p in progs)


def test_suite_is_representative(suite: Dict[str, Any], programs: Dict[str, List[Any]]) -> None:
  assert sum(len(v) for v in suite.values()) >= 40
  src = "\n".join(p.src for p in programs["gfx1100"])
  for feature in ("__builtin_amdgcn_s_barrier();", "__attribute__((shared, aligned(16)))", "float4", "half4", "struct tiny_bf16 ", "tiny_bf16x",
                  "__builtin_amdgcn_workgroup_id_x()", "__builtin_amdgcn_workitem_id_y()", "amdgpu_flat_work_group_size", "long", "double",
                  "signed char", "bool", "tiny_sin_float", "tiny_sin_double", "__builtin_bit_cast", "__builtin_exp2f(", "__builtin_log2f(",
                  "__builtin_sqrtf16", "const int n", "__WMMA_16_16_16_half_float"):
    assert feature in src, f"no kernel of the suite uses {feature}"
  assert "WMMA" not in "\n".join(p.src for p in programs["gfx90a"]), "gfx90a has no RDNA3 WMMA"
  assert any(p.vars for p in programs["gfx1100"]), "the suite has a kernel with a symbolic variable"


@pytest.mark.parametrize("arch", ARCHS)
def test_suite_compiles(arch: str, programs: Dict[str, List[Any]]) -> None:
  progs = programs[arch]
  check_code_object(compile_all(arch, progs), arch, progs)


@pytest.mark.parametrize("arch", ARCHS)
def test_suite_compiles_unoptimized(arch: str, suite: Dict[str, Any]) -> None:
  progs = render_suite(HIPRenderer(arch), "none", suite)
  check_code_object(compile_all(arch, progs), arch, progs)


@pytest.mark.parametrize("case", ["half_ew", "bf16_ew", "casts", "reduce_sum", "symbolic", "float64"])
def test_one_kernel_at_a_time(case: str) -> None:
  """The path the device takes: one program, its own source, its own code object, whose metadata describes its arguments."""
  for ast in op_suite_asts([case])[case]:
    prg = make_program(ast, HIPRenderer("gfx1100"), "hand")
    lib, fname = HIPCompiler("gfx1100").compile(prg.src), to_function_name(prg.name)
    assert elf_target(lib) == 0x41 and kernel_names(lib) == [fname]
    info = kernel_info(lib)[fname]
    kinds = [a.value_kind for a in info.args]
    assert kinds == ["global_buffer"] * len(prg.globals) + ["by_value"] * len(prg.vars)
    assert info.wavefront_size == 32   # gfx11 compiles HIP for wave32


@pytest.mark.parametrize("dtype_out", [dtypes.float32, dtypes.half], ids=["half_float", "half_half"])
def test_tensor_core_kernels_compile(dtype_out: Any) -> None:
  prg = make_program(tc_matmul_ast(64, 32, 48, dtype_out), HIPRenderer("gfx1100"), "tc")
  builtin = "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32" if dtype_out == dtypes.float32 else "__builtin_amdgcn_wmma_f16_16x16x16_f16_w32"
  assert builtin in prg.src
  assert prg.local_size is not None and prg.local_size[0] == 32, "one wave32 per tensor-core tile"
  assert elf_target(HIPCompiler("gfx1100").compile(prg.src)) == 0x41
  with pytest.raises(KernelOptError):
    make_program(tc_matmul_ast(64, 32, 48, dtype_out), HIPRenderer("gfx90a"), "tc")


def disassemble(lib: bytes, arch: str, tmp_path: Any) -> str:
  """llvm-objdump's disassembly of a code object (the llvm-objdump beside the clang in use)."""
  import os
  objdump = os.path.join(os.path.dirname(os.path.realpath(find_clang())), "llvm-objdump")
  if not os.path.exists(objdump):
    pytest.skip(f"no llvm-objdump beside {find_clang()} to disassemble with")
  (tmp_path / "k.co").write_bytes(lib)
  return subprocess.run([objdump, "-d", f"--mcpu={arch}", str(tmp_path / "k.co")], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("dtype_out,instruction", [(dtypes.float32, "v_wmma_f32_16x16x16_f16"), (dtypes.half, "v_wmma_f16_16x16x16_f16")],
                         ids=["half_float", "half_half"])
def test_tensor_core_kernels_use_the_wmma_instruction(dtype_out: Any, instruction: str, tmp_path: Any) -> None:
  prg = make_program(tc_matmul_ast(32, 32, 32, dtype_out), HIPRenderer("gfx1100"), "tc")
  assert instruction in disassemble(HIPCompiler("gfx1100").compile(prg.src), "gfx1100", tmp_path)


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_memory_and_barriers_reach_the_machine_code(arch: str, tmp_path: Any) -> None:
  from tiny.backend import Kernel, Opt, OptOps
  k = Kernel(op_suite_asts(["matmul"])["matmul"][0], opts=HIPRenderer(arch))
  for o in (Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.GROUP, 0, 4)):
    k.apply_opt(o)
  prg = k.to_program()
  # 128 threads: more than one wave (32 on gfx11, 64 on gfx90a), so clang may not drop the barrier
  assert prg.local_size == [8, 4, 4]
  asm = disassemble(HIPCompiler(arch).compile(prg.src), arch, tmp_path)
  assert "s_barrier" in asm and "ds_write" in asm.replace("ds_store", "ds_write") and "ds_read" in asm.replace("ds_load", "ds_read")


def test_launch_bounds_match_the_launch(programs: Dict[str, List[Any]]) -> None:
  for p in programs["gfx1100"]:
    threads = math.prod(p.local_size or [1, 1, 1])
    assert f"amdgpu_flat_work_group_size(1, {threads})" in p.src, p.name


def test_compiling_leaves_nothing_in_tmpdir(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
  """clang's HIP driver leaves a scratch folder behind per stdin compile; a long session must not fill /tmp with them."""
  import tempfile
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  monkeypatch.setattr(tempfile, "tempdir", None)   # tempfile caches the folder it found first
  prg = make_program(op_suite_asts(["reduce_sum"])["reduce_sum"][0], HIPRenderer("gfx1100"), "hand")
  assert elf_target(HIPCompiler("gfx1100").compile(prg.src)) == 0x41
  assert list(tmp_path.iterdir()) == []


def test_compile_errors_show_source_and_log() -> None:
  with pytest.raises(CompileError) as e:
    HIPCompiler("gfx1100").compile('extern "C" __attribute__((global)) void k(float* a) { a[0] = undefined_thing; }')
  assert "undefined_thing" in e.value.compiler_msg and "error" in e.value.compiler_msg
  assert "   1 | extern" in str(e.value)


def test_arch_names(monkeypatch: pytest.MonkeyPatch) -> None:
  assert [normalize_arch(a) for a in ("gfx1100", "GFX90A", "gfx90a:sramecc+:xnack-")] == ["gfx1100", "gfx90a", "gfx90a"]
  with pytest.raises(ValueError):
    normalize_arch("navi31")
  monkeypatch.setenv("AMD_ARCH", "gfx90a")
  assert HIPRenderer().arch == HIPCompiler().arch == "gfx90a" and HIPRenderer().tensor_cores == []
  monkeypatch.delenv("AMD_ARCH")
  assert HIPRenderer().arch == HIPCompiler().arch == "gfx1100" and len(HIPRenderer().tensor_cores) == 2
  assert elf_target(HIPCompiler("gfx1030").compile('extern "C" __attribute__((global)) void k(int* a) { a[0] = 1; }')) == 0x36


def test_no_clang_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("PATH", "/nonexistent")
  monkeypatch.delenv("AMD_CLANG", raising=False)
  with pytest.raises(AMDToolchainError, match="no clang for AMD GPUs found.*clang-16"):
    HIPCompiler("gfx1100")


def test_a_clang_without_its_lld_is_passed_over(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
  (tmp_path / "clang-15").write_text("#!/bin/sh\nexit 1\n")
  (tmp_path / "clang-15").chmod(0o755)
  monkeypatch.setenv("PATH", str(tmp_path))
  monkeypatch.delenv("AMD_CLANG", raising=False)
  with pytest.raises(AMDToolchainError, match="clang-15 found, but not the lld of the same version"):
    find_clang()
  (tmp_path / "lld").write_text("")
  assert find_clang() == str(tmp_path / "clang-15")


# *** the prelude's helpers are plain C++: run them on the host and hold them against Python's math ***

def host_library(tmp_path: Any, code: str) -> ctypes.CDLL:
  cc = shutil.which("clang") or shutil.which("clang-16") or shutil.which("c++")
  if cc is None:
    pytest.skip("no host C++ compiler (clang or c++) to run the prelude's helpers")
  (tmp_path / "h.cpp").write_text("#define TINY_DEVICE inline\n" + code)
  subprocess.run([cc, "-x", "c++", "-std=c++17", "-O2", "-shared", "-fPIC", str(tmp_path / "h.cpp"), "-o", str(tmp_path / "h.so")], check=True)
  return ctypes.CDLL(str(tmp_path / "h.so"))


def test_sin_helpers_match_math(tmp_path: Any) -> None:
  lib = host_library(tmp_path, sin_helper("float") + "\n" + sin_helper("double") + '\nextern "C" float sf(float x) { return tiny_sin_float(x); }\n'
                     'extern "C" double sd(double x) { return tiny_sin_double(x); }\n')
  lib.sf.restype, lib.sf.argtypes = ctypes.c_float, [ctypes.c_float]
  lib.sd.restype, lib.sd.argtypes = ctypes.c_double, [ctypes.c_double]
  xs = np.concatenate([np.linspace(-20, 20, 2001), [0.0, -0.0, 1e-30, math.pi, 1000.5, -12345.678]])
  for x in xs:
    want = math.sin(float(np.float32(x)))
    assert abs(lib.sf(float(x)) - want) <= 2e-6 * max(1.0, abs(float(x)) / 100), x
    assert abs(lib.sd(float(x)) - math.sin(float(x))) <= 1e-14 * max(1.0, abs(float(x))), x
  assert all(math.isnan(lib.sf(v)) and math.isnan(lib.sd(v)) for v in (math.inf, -math.inf, math.nan))


def test_bf16_rounds_to_nearest_even(tmp_path: Any) -> None:
  lib = host_library(tmp_path, BF16_STRUCT + '\nextern "C" unsigned short to_bf16(float x) { return tiny_bf16(x).bits; }\n'
                     'extern "C" float from_bf16(unsigned short b) { tiny_bf16 v; v.bits = b; return (float)v; }\n')
  lib.to_bf16.restype, lib.to_bf16.argtypes = ctypes.c_ushort, [ctypes.c_float]
  lib.from_bf16.restype, lib.from_bf16.argtypes = ctypes.c_float, [ctypes.c_ushort]
  rng = np.random.default_rng(3)
  xs = np.concatenate([rng.standard_normal(500).astype(np.float32) * 100, np.array([1.00390625, 1.01171875, -2.0, 0.0, 65504.0], np.float32)])
  for x in xs:
    u = int(np.float32(x).view(np.uint32))
    want = (u + 0x7FFF + ((u >> 16) & 1)) >> 16   # round half to even on the dropped 16 bits
    assert lib.to_bf16(float(x)) == want, x
    assert lib.from_bf16(want) == float(np.uint32(want << 16).view(np.float32))
  assert math.isnan(lib.from_bf16(lib.to_bf16(math.nan)))


def test_max_keeps_nan_from_either_side(tmp_path: Any) -> None:
  from tiny.ops import BinaryOps, python_alu
  lib = host_library(tmp_path, f'extern "C" float m(float a, float b) {{ return {_max("a", "b", dtypes.float32)}; }}\n')
  lib.m.restype, lib.m.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
  nan = float("nan")
  for a, b in [(1.0, 2.0), (2.0, 1.0), (nan, 1.0), (1.0, nan), (nan, nan), (-math.inf, nan)]:
    want, got = python_alu[BinaryOps.MAX](a, b), lib.m(a, b)
    assert (math.isnan(want) and math.isnan(got)) or got == want, (a, b, got, want)
