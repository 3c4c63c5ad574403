"""Every kernel of the Metal op suite renders to MSL that clang accepts under msl_shim.h, without a Mac.

clang (>= 15, C++17) with the shim is the judge: it knows MSL's keywords, attributes, vector types and exactly the metal::
functions the renderer uses. Each optimization style's kernels are checked in one clang run (each kernel in its own
namespace); a failure re-checks them one by one to name the culprits. The negative tests prove the shim is strict enough to
matter: it rejects undeclared names, wrong component counts, bad swizzles and misspelled attributes.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List

import pytest

from tiny.backend import KernelOptError, RenderError, dtypes

from tiny_metal.opsuite import OPT_STYLES, TC_MATMULS, UNSUPPORTED, make_program, matmul_ast, suite_asts, suite_programs
from tiny_metal.renderer import MSL_HEADER, MetalRenderer, metal_tensor_cores
from tiny_metal.syntax import MSLSyntaxError, check_msl, check_msl_batch, checker_missing, find_clang

needs_clang = pytest.mark.skipif(checker_missing() is not None, reason=str(checker_missing()))


@pytest.fixture(scope="module")
def suite() -> Dict[str, Any]:
  return suite_asts()


@pytest.fixture(scope="module")
def programs(suite: Dict[str, Any]) -> Dict[str, List[Any]]:
  return {opt: suite_programs(MetalRenderer(), opt, suite) for opt in (*OPT_STYLES, "tc")}


def test_suite_is_representative(suite: Dict[str, Any], programs: Dict[str, List[Any]]) -> None:
  assert sum(len(v) for k, v in suite.items() if k not in UNSUPPORTED) >= 40
  src = "\n".join(p.src for opt in OPT_STYLES for p in programs[opt])
  for feature in ("kernel void", "[[buffer(0)]]", "const device float*", "constant int&", "[[threadgroup_position_in_grid]]",
                  "[[thread_position_in_threadgroup]]", "threadgroup __attribute__((aligned(16))) float", "threadgroup_barrier(mem_flags::mem_threadgroup);",
                  "float4 val", "(device float4*)", "half4", "bfloat", "as_type<uint>", "precise::sin(", "exp2(", "log2(", "sqrt(",
                  "half(", "long", "ulong", "uchar", "ushort", "char", "bool", "gid.y", "lid.x", "max("):
    assert feature in src, f"no kernel of the suite uses {feature}"
  assert "double" not in src
  assert any(p.vars for opt in OPT_STYLES for p in programs[opt]), "the suite has a kernel with a symbolic variable"
  gpu = programs["gpu"]
  assert sum("threadgroup_barrier" in p.src for p in gpu) >= 5, "the GPU-style opts make grouped reductions"
  assert sum(bool(p.local_size) and p.local_size[0] > 1 for p in gpu) >= 20, "the GPU-style opts use threadgroups"
  tc = "\n".join(p.src for p in programs["tc"])
  for mat in ("simdgroup_float8x8", "simdgroup_half8x8", "simdgroup_bfloat8x8", "simdgroup_multiply_accumulate(", "thread_elements()"):
    assert mat in tc


@needs_clang
@pytest.mark.parametrize("opt", [*OPT_STYLES, "tc"])
def test_suite_passes_the_syntax_check(opt: str, programs: Dict[str, List[Any]]) -> None:
  progs = programs[opt]
  assert progs and all(p.src.startswith("\n".join(MSL_HEADER)) for p in progs)
  check_msl_batch([p.src for p in progs], [p.name for p in progs])


@needs_clang
@pytest.mark.parametrize("case", ["casts", "bf16_math", "symbolic_reduce", "softmax"])
def test_one_kernel_at_a_time(case: str) -> None:
  """The path a device takes: one program, its own translation unit."""
  for ast in suite_asts([case])[case]:
    check_msl(make_program(ast, MetalRenderer(), "hand").src)


def test_tensor_cores_are_used_for_every_declared_dtype(programs: Dict[str, List[Any]]) -> None:
  declared = {(tc.dtype_in, tc.dtype_out) for tc in metal_tensor_cores()}
  assert declared == {(di, do) for _, _, _, di, do in TC_MATMULS}
  for p in programs["tc"]:
    assert p.local_size is not None and p.local_size[0] == 32, "one simdgroup (32 threads) per 8x8 tile"
    assert re.search(r"__WMMA_8_8_8_\w+\(", p.src)


def test_hand_coded_optimizations_choose_tensor_cores() -> None:
  from tiny.backend import Kernel, OptOps
  for di, do in ((dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32)):
    k = Kernel(matmul_ast(64, 64, 64, di, do), opts=MetalRenderer())
    k.hand_coded_optimizations()
    assert k.tensor_core is not None and k.applied_opts[0].op is OptOps.TC
  with pytest.raises(KernelOptError):   # 8x8x8 tiles need every dim to be a multiple of 8
    make_program(matmul_ast(12, 12, 12, dtypes.float32, dtypes.float32), MetalRenderer(), "tc")


def test_double_is_refused_with_a_clear_message(suite: Dict[str, Any]) -> None:
  assert set(UNSUPPORTED) == {"double_math"}
  for ast in suite["double_math"]:
    with pytest.raises(RenderError, match="Metal has no double"):
      make_program(ast, MetalRenderer(), "hand")
  assert dtypes.float64 not in MetalRenderer().supported_dtypes()


def test_launch_limits() -> None:
  r = MetalRenderer()
  assert (r.local_threads_max, r.shared_max, r.local_max) == (1024, 32768, (1024, 1024, 1024))
  for opt in OPT_STYLES:
    for p in suite_programs(r, opt, suite_asts(["sum_all", "softmax", "matmul"])):
      lsz = p.local_size or [1, 1, 1]
      assert lsz[0] * lsz[1] * lsz[2] <= 1024


# *** the shim is strict: each of these is a mistake a renderer could make, and clang must reject it ***

GOOD = """#include <metal_stdlib>
using namespace metal;
kernel void k(device float* data0 [[buffer(0)]], const device half* data1 [[buffer(1)]], constant int& n [[buffer(2)]],
              uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup __attribute__((aligned(16))) float temp0[64];
  int gidx0 = gid.x;
  half4 h = (*((device half4*)(data1+gidx0*4)));
  float4 v = float4(h) + float4(1.0f, 2.0f, 3.0f, float(n));
  temp0[lid.x] = precise::sin(v.x) + exp2(v.y) + as_type<float>(n);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  *((device float4*)(data0+gidx0*4)) = v.wzyx + float4(temp0[0]);
}
"""
BROKEN = {
  "undeclared name": ("exp2(v.y)", "exp22(v.y)", "undeclared identifier 'exp22'"),
  "function Metal has but the renderer never uses": ("exp2(v.y)", "cos(v.y)", "undeclared identifier 'cos'"),
  "wrong component count": ("float4(1.0f, 2.0f, 3.0f, float(n))", "float4(1.0f, 2.0f, float(n))", "wrong number of components"),
  "vector conversion between sizes": ("float4 v = float4(h)", "float4 v = float4(h.xy)", "different numbers of components"),
  "bad swizzle": ("v.wzyx", "v.wzyq", "illegal vector component name"),
  "swizzle beyond the vector": ("float4(h)", "float4(h.xyzw.xy.xyzw)", "vector component access exceeds type"),
  "misspelled attribute": ("[[buffer(1)]]", "[[bufer(1)]]", "unknown attribute 'bufer'"),
  "misspelled position attribute": ("[[threadgroup_position_in_grid]]", "[[threadgroup_position_in_grids]]", "unknown attribute"),
  "bit cast between sizes": ("as_type<float>(n)", "as_type<half>(n)", "as_type between types of different sizes"),
  "bfloat arithmetic": ("float(n))", "float(bfloat(1.0f) * bfloat(2.0f)))", "invalid operands"),
  "barrier flag": ("mem_flags::mem_threadgroup", "mem_flags::mem_threadgrup", "no member named 'mem_threadgrup'"),
}


@needs_clang
def test_the_reference_kernel_passes() -> None:
  check_msl(GOOD)


@needs_clang
@pytest.mark.parametrize("what", list(BROKEN))
def test_the_shim_rejects(what: str) -> None:
  old, new, msg = BROKEN[what]
  assert old in GOOD
  with pytest.raises(MSLSyntaxError) as e:
    check_msl(GOOD.replace(old, new, 1))
  assert msg in e.value.compiler_msg, e.value.compiler_msg
  assert "kernel.metal:" in e.value.compiler_msg and "   1 | #include <metal_stdlib>" in str(e.value)


@needs_clang
def test_a_batch_names_the_bad_kernel() -> None:
  bad = GOOD.replace("exp2(v.y)", "exp22(v.y)")
  with pytest.raises(MSLSyntaxError) as e:
    check_msl_batch([GOOD, bad, GOOD], ["first", "second", "third"])
  assert e.value.compiler_msg.startswith("second:") and "first" not in e.value.compiler_msg and "exp22" in e.value.compiler_msg


@needs_clang
def test_clang_is_new_enough() -> None:
  found = find_clang()
  assert found is not None and found[1] >= 15


@needs_clang
def test_global_id_kernels_use_thread_position_in_grid() -> None:
  """A kernel without threadgroups (dont_use_locals) indexes by thread_position_in_grid; the runtime launches it with
  one-thread threadgroups, so the grid of threadgroups is the grid of threads."""
  from tiny.backend import Kernel
  k = Kernel(suite_asts(["elementwise"])["elementwise"][0], opts=MetalRenderer())
  k.dont_use_locals = True
  p = k.to_program()
  assert p.local_size is None and "uint3 tid [[thread_position_in_grid]]" in p.src and "int idx0 = tid.x;" in p.src
  check_msl(p.src)
