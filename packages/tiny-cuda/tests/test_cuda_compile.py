"""Every kernel of the op suite renders with both CUDA renderers and compiles to a CUBIN for sm_80 and sm_90, without a GPU.

NVRTC and nvJitLink are the judges: a kernel they reject fails the test. To keep the suite fast, the kernels of one
renderer are compiled as one module (each CUDA C kernel in its own namespace); when that fails, every kernel is
compiled alone to name the culprits. A few kernels also go through the one-kernel path the device uses.
"""
from __future__ import annotations

import re
import struct
from typing import Any, Dict, List

import pytest

from tiny.device import CompileError
from tiny.dtype import dtypes
from tiny.helpers import prod

from tiny_cuda.compiler import NVRTCCompiler, PTXCompiler, normalize_arch
from tiny_cuda.opsuite import cuda_batch_source, make_program, op_suite_asts, ptx_batch_source, render_suite, tc_matmul_ast
from tiny_cuda.ptx import PTXRenderer
from tiny_cuda.renderer import CUDARenderer

ARCHS = ["sm_80", "sm_90"]
RENDERERS = {"cuda": (CUDARenderer, NVRTCCompiler, cuda_batch_source), "ptx": (PTXRenderer, PTXCompiler, ptx_batch_source)}


def cubin_arch(lib: bytes) -> int:
  """The SM number a CUBIN was built for. CUDA 12 writes ELF OS ABI 51 with the SM in e_flags' low byte; CUDA 13 writes
  OS ABI 65 with it in the second byte (0x5a04 for sm_90)."""
  assert lib[:4] == b"\x7fELF" and lib[7] in (51, 65), "not a CUDA ELF"
  flags = struct.unpack_from("<I", lib, 0x30)[0]
  return flags & 0xFF if lib[7] == 51 else (flags >> 8) & 0xFF


@pytest.fixture(scope="module")
def suite() -> Dict[str, Any]:
  return op_suite_asts()


@pytest.fixture(scope="module")
def programs(suite: Dict[str, Any]) -> Dict[str, List[Any]]:
  return {name: render_suite(rcls("sm_80"), "hand", suite) for name, (rcls, _, _) in RENDERERS.items()}


def compile_all(kind: str, arch: str, progs: List[Any]) -> bytes:
  _, ccls, batch = RENDERERS[kind]
  compiler = ccls(arch)
  try:
    return compiler.compile(batch([p.src for p in progs]))
  except CompileError:
    failures = []
    for p in progs:
      try:
        compiler.compile(p.src)
      except CompileError as e:
        failures.append(f"{p.name}: {e.compiler_msg[:1500]}")
    raise AssertionError(f"{kind} kernels rejected for {arch}:\n" + "\n".join(failures or ["(only together: see the batch error)"]))


def test_suite_is_representative(suite: Dict[str, Any], programs: Dict[str, List[Any]]) -> None:
  assert sum(len(v) for v in suite.values()) >= 40
  cuda_src = "\n".join(p.src for p in programs["cuda"])
  for feature in ("__syncthreads();", "__shared__", "make_float4", "#include <cuda_fp16.h>", "#include <cuda_bf16.h>", "blockIdx.x",
                  "threadIdx.y", "__launch_bounds__", "tiny_half4", "long long", "double", "signed char", "bool"):
    assert feature in cuda_src, f"no kernel of the suite uses {feature}"
  ptx_src = "\n".join(p.src for p in programs["ptx"])
  for feature in ("bar.sync 0;", ".shared .align 16", "ld.global.v4.f32", "st.global.v4.f32", "ld.global.v4.b16", "cvt.rn.f16.f32",
                  "cvt.rn.bf16.f32", "ex2.approx.f32", "lg2.approx.f32", "%ctaid.x", "%tid.y", "ld.param.u32", "selp.", "div.s32", "shl.b32",
                  "xor.b32", "mul.f64", "cvt.rzi.s32.f32", "setp.neu.f32", "ld.global.u8", "mul.lo.u64", "$L_loop_"):
    assert feature in ptx_src, f"no PTX kernel of the suite uses {feature}"
  assert any(p.vars for p in programs["cuda"]), "the suite has a kernel with a symbolic variable"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", list(RENDERERS))
def test_suite_compiles(kind: str, arch: str, programs: Dict[str, List[Any]]) -> None:
  progs = programs[kind]
  lib = compile_all(kind, arch, progs)
  assert cubin_arch(lib) == int(arch[3:])
  for p in progs:
    assert p.name.encode() in lib, f"kernel {p.name} is missing from the CUBIN"


@pytest.mark.parametrize("kind", list(RENDERERS))
def test_suite_compiles_unoptimized(kind: str, suite: Dict[str, Any]) -> None:
  progs = render_suite(RENDERERS[kind][0]("sm_80"), "none", suite)
  assert cubin_arch(compile_all(kind, "sm_80", progs)) == 80


@pytest.mark.parametrize("kind", list(RENDERERS))
@pytest.mark.parametrize("case", ["half_ew", "bf16_ew", "casts", "reduce_sum", "symbolic"])
def test_one_kernel_at_a_time(kind: str, case: str) -> None:
  """The path a device takes: one program, its own source, its own module."""
  rcls, ccls, _ = RENDERERS[kind]
  for ast in op_suite_asts([case])[case]:
    prg = make_program(ast, rcls("sm_80"), "hand")
    assert cubin_arch(ccls("sm_80").compile(prg.src)) == 80


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", list(RENDERERS))
@pytest.mark.parametrize("dtype", [dtypes.half, dtypes.bfloat16], ids=["half", "bf16"])
def test_tensor_core_kernels_compile(kind: str, arch: str, dtype: Any) -> None:
  rcls, ccls, _ = RENDERERS[kind]
  prg = make_program(tc_matmul_ast(64, 32, 48, dtype), rcls(arch), "tc")
  ptx_type = "f16" if dtype == dtypes.half else "bf16"
  assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32" in prg.src
  assert prg.local_size is not None and prg.local_size[0] == 32, "one warp per tensor-core tile"
  assert cubin_arch(ccls(arch).compile(prg.src)) == int(arch[3:])


def test_launch_bounds_match_the_launch(programs: Dict[str, List[Any]]) -> None:
  for c, p in zip(programs["cuda"], programs["ptx"]):
    lsz = c.local_size or [1, 1, 1]
    assert f"__launch_bounds__({prod(lsz)})" in c.src
    m = re.search(r"\.maxntid (\d+), (\d+), (\d+)", p.src)
    assert m is not None and prod(int(x) for x in m.groups()) == prod(p.local_size or [1, 1, 1])


def test_nvrtc_errors_show_source_and_log() -> None:
  with pytest.raises(CompileError) as e:
    NVRTCCompiler("sm_80").compile('extern "C" __global__ void k(float* a) { a[0] = undefined_thing; }')
  assert "undefined_thing" in e.value.compiler_msg and "error" in e.value.compiler_msg
  assert "   1 | extern" in str(e.value)


def test_nvjitlink_rejects_bad_ptx() -> None:
  ptx = NVRTCCompiler("sm_80", ptx=True).compile('extern "C" __global__ void k(float* a) { a[threadIdx.x] *= 3.0f; }').decode()
  assert ".target sm_80" in ptx and ".entry k" in ptx
  assert cubin_arch(PTXCompiler("sm_90").compile(ptx)) == 90   # the target is rewritten to the compiler's
  with pytest.raises(CompileError, match="rejected the PTX"):
    PTXCompiler("sm_80").compile(ptx.replace("ld.global.f32", "ld.global.q32"))
  with pytest.raises(CompileError):
    PTXCompiler("sm_80").compile("this is not PTX")


def test_arch_names() -> None:
  assert [normalize_arch(a) for a in ("sm_80", "80", "sm80", "compute_90", "sm_90a")] == ["sm_80", "sm_80", "sm_80", "sm_90", "sm_90a"]
  with pytest.raises(ValueError):
    normalize_arch("volta")
  assert CUDARenderer("sm_75").tensor_cores == [] and PTXRenderer("sm_75").tensor_cores == []
  assert cubin_arch(NVRTCCompiler("86").compile('extern "C" __global__ void k(int* a) { a[0] = 1; }')) == 86


def test_cuda_arch_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("CUDA_ARCH", "sm_89")
  assert NVRTCCompiler().arch == "sm_89" and PTXCompiler().arch == "sm_89" and CUDARenderer().arch == "sm_89"
  monkeypatch.delenv("CUDA_ARCH")
  assert NVRTCCompiler().arch == "sm_80"


def test_max_keeps_nan_from_either_side(tmp_path) -> None:
  # the float MAX expression CUDA C renders is plain C: run it on the host with clang and hold it against tiny's rule
  import ctypes
  import math
  import shutil
  import subprocess
  from tiny.ops import BinaryOps, python_alu
  from tiny_cuda.renderer import _max
  cc = shutil.which("clang") or shutil.which("cc")
  if cc is None:
    pytest.skip("no C compiler (clang or cc) to run the rendered expression on the host")
  (tmp_path / "m.c").write_text(f"float m(float a, float b) {{ return {_max('a', 'b', dtypes.float32)}; }}\n")
  subprocess.run([cc, "-O2", "-shared", "-fPIC", str(tmp_path / "m.c"), "-o", str(tmp_path / "m.so")], check=True)
  m = ctypes.CDLL(str(tmp_path / "m.so")).m
  m.restype, m.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
  nan = float("nan")
  for a, b in [(1.0, 2.0), (2.0, 1.0), (nan, 1.0), (1.0, nan), (nan, nan), (-0.0, 0.0), (-math.inf, nan)]:
    want, got = python_alu[BinaryOps.MAX](a, b), m(a, b)
    assert (math.isnan(want) and math.isnan(got)) or got == want, (a, b, got, want)


def test_ptx_max_tests_for_nan() -> None:
  # PTX max.f32 drops NaNs; the renderer must select with an explicit NaN test (and the result must still assemble)
  from tiny import Tensor
  from tiny.engine.realize import get_kernel
  from tiny.engine.schedule import create_schedule
  x = Tensor([1.0, float("nan"), 3.0], device="PYTHON")
  src = get_kernel(PTXRenderer("sm_80"), create_schedule([x.max().lazydata])[-1].ast).to_program().src
  assert "setp.nan.f32" in src and "max.f32" not in src
  assert cubin_arch(PTXCompiler("sm_80").compile(src)) == 80


@pytest.mark.parametrize("dt", [dtypes.int16, dtypes.uint16], ids=lambda d: d.name)
def test_16bit_negation_never_reaches_ptxas_as_neg(dt: Any) -> None:
  """On an H100 (CUDA 13), ptxas left neg.s16 of -32768 as +32768 in the 32-bit register behind it: a division, modulo,
  shift, max or compare that followed read 32768 (-(-32768) idiv 3 gave 10922). A multiply by -1 wraps right, so both
  renderers negate 16-bit ints that way; in CUDA C it is inline PTX, because NVVM turns any spelling of -x into neg."""
  import numpy as np
  from tiny.codegen.kernel import Kernel
  from tiny.tensor import Tensor
  t = Tensor(np.array([-32768, 7], np.int16), device="PYTHON").cast(dt).contiguous().realize()
  asts = [si.ast for si in t.neg().idiv(3).schedule() if si.ast.op.name == "KERNEL"]
  assert len(asts) == 1
  for kind, (rcls, _, _) in RENDERERS.items():
    k = Kernel(asts[0], opts=rcls("sm_90")).hand_coded_optimizations()
    src = k.to_program().src
    ptx = src if kind == "ptx" else NVRTCCompiler("sm_90", ptx=True).compile(src).decode()
    assert "mul.lo.s16" in ptx and not re.search(r"\bneg\.[su]16\b", ptx), f"{kind}: a 16-bit neg reaches ptxas"
