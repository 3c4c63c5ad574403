"""The HIP C++ the renderer writes, run on the host CPU and held against the PYTHON device running the same kernel.

Compiling for a GPU only proves that clang accepts the source; this checks what it computes. HIPRenderer's kernels include
no header, so the same text compiles for x86 once a small shim maps the `__builtin_amdgcn_*` thread ids to thread-local
variables, `s_barrier` to a std::barrier and the fences to nothing (`amdgpu_flat_work_group_size` is dropped; clang ignores
the other GPU-only attributes there). Each workgroup runs as one std::thread per work item, the workgroups one after
another, so the shared arrays become function statics (the one textual change the test makes to the source). Every kernel
of the op suite but the tensor-core ones (elementwise, reductions with and without GROUP, half, bfloat16, float64,
int8...int64, casts, bitcasts, threefry random, symbolic shapes) runs on random inputs, with and without the heuristic
optimizations, and must match the PYTHON device: an interpreter of the kernel's uops written independently of this renderer.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from tiny.backend import Kernel, PythonProgram, PythonRenderer, dtypes, to_function_name

from tiny_amd.opsuite import batch_source, case_names, op_suite_schedule
from tiny_amd.renderer import HIPRenderer

HOST_SHIM = """
#include <barrier>
#include <thread>
#include <vector>
#define amdgpu_flat_work_group_size(lo, hi)
static thread_local int tiny_ids[6];
static std::barrier<>* tiny_workgroup;
#define __builtin_amdgcn_workgroup_id_x() tiny_ids[0]
#define __builtin_amdgcn_workgroup_id_y() tiny_ids[1]
#define __builtin_amdgcn_workgroup_id_z() tiny_ids[2]
#define __builtin_amdgcn_workitem_id_x() tiny_ids[3]
#define __builtin_amdgcn_workitem_id_y() tiny_ids[4]
#define __builtin_amdgcn_workitem_id_z() tiny_ids[5]
#define __builtin_amdgcn_s_barrier() tiny_workgroup->arrive_and_wait()
#define __builtin_amdgcn_fence(order, scope) ((void)0)
/* on the GPU the half builtins are instructions; on x86 they become calls that libm does not provide */
extern "C" _Float16 sqrtf16(_Float16 x) { return (_Float16)__builtin_sqrtf((float)x); }
extern "C" _Float16 exp2f16(_Float16 x) { return (_Float16)__builtin_exp2f((float)x); }
extern "C" _Float16 log2f16(_Float16 x) { return (_Float16)__builtin_log2f((float)x); }
typedef void (*tiny_item)(void**, int*);
/* the launch grid: workgroups in turn, the work items of one as threads that meet at its barrier */
extern "C" void tiny_launch(tiny_item fn, void** bufs, int* vals, int g0, int g1, int g2, int l0, int l1, int l2) {
  for (int z = 0; z < g2; z++) for (int y = 0; y < g1; y++) for (int x = 0; x < g0; x++) {
    std::barrier<> wg(l0 * l1 * l2);
    tiny_workgroup = &wg;
    std::vector<std::thread> items;
    for (int k = 0; k < l2; k++) for (int j = 0; j < l1; j++) for (int i = 0; i < l0; i++)
      items.emplace_back([=] { tiny_ids[0] = x; tiny_ids[1] = y; tiny_ids[2] = z; tiny_ids[3] = i; tiny_ids[4] = j; tiny_ids[5] = k; fn(bufs, vals); });
    for (auto& t : items) t.join();
  }
}
"""
SHARED = "__attribute__((shared, aligned(16)))"
NUMPY = {dtypes.float32: np.float32, dtypes.float64: np.float64, dtypes.float16: np.float16, dtypes.bfloat16: np.uint16, dtypes.int8: np.int8,
         dtypes.uint8: np.uint8, dtypes.int16: np.int16, dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64,
         dtypes.uint64: np.uint64, dtypes.bool: np.bool_}
VAR_VALUE = 20


def host_cxx() -> str:
  # _Float16 on x86 needs clang 15 or newer
  for name in ("clang-19", "clang-18", "clang-17", "clang-16", "clang-15"):
    if (path := shutil.which(name)) is not None:
      return path
  pytest.skip("no clang-15 or newer to build the HIP kernels for the host (_Float16 support)")


def random_input(dt: Any, size: int, rng: np.random.Generator) -> np.ndarray:
  if dt == dtypes.bool:
    return rng.random(size) < 0.5
  if dt == dtypes.bfloat16:
    u = (rng.random(size, np.float32) * 4 - 2).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
  if dtypes.is_float(dt):
    return (rng.random(size) * 4 - 2).astype(NUMPY[dt])
  info = np.iinfo(NUMPY[dt])
  return rng.integers(max(info.min, -1000), min(info.max, 1000), size, dtype=NUMPY[dt], endpoint=True)


@pytest.fixture(scope="module")
def items() -> Dict[str, List[Any]]:
  return op_suite_schedule()


def host_source(prg: Any) -> str:
  """The kernel as host C++, plus `item_<name>(bufs, vals)`, which calls it with its arguments taken from two arrays."""
  fname = to_function_name(prg.name)
  params = ["void*"] * len(prg.globals) + ["int"] * len(prg.vars)
  args = [f"bufs[{i}]" for i in range(len(prg.globals))] + [f"vals[{i}]" for i in range(len(prg.vars))]
  # every pointer parameter is passed the same way on x86-64, so one function type with void* serves each kernel
  call = f"((void (*)({', '.join(params)}))&{fname})({', '.join(args)})"
  return prg.src.replace(SHARED, "static __attribute__((aligned(16)))") + f'\nextern "C" void item_{fname}(void** bufs, int* vals) {{ {call}; }}'


@pytest.fixture(scope="module")
def host_kernels(items: Dict[str, List[Any]], tmp_path_factory: Any) -> Tuple[Any, Dict[Tuple[str, int, str], Tuple[Any, Any]]]:
  """(tiny_launch, {(case, kernel index, opt): (HIP program, its item function)}) for every kernel of the suite."""
  cxx = host_cxx()
  progs: Dict[Tuple[str, int, str], Any] = {}
  for opt in ("none", "hand"):
    for case, sis in items.items():
      for i, si in enumerate(sis):
        k = Kernel(si.ast, opts=HIPRenderer("gfx90a"))   # no tensor cores: WMMA has no host twin
        if opt == "hand":
          k.hand_coded_optimizations()
        progs[(case, i, opt)] = k.to_program(name_override=f"{case}_{i}_{opt}")
  d = tmp_path_factory.mktemp("host")
  (d / "k.cpp").write_text(HOST_SHIM + batch_source([host_source(p) for p in progs.values()]))
  r = subprocess.run([cxx, "-x", "c++", "-std=c++20", "-O1", "-w", "-pthread", "-shared", "-fPIC", str(d / "k.cpp"), "-o", str(d / "k.so"),
                      "-lstdc++", "-lm"], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[:5000]
  lib = ctypes.CDLL(str(d / "k.so"))
  lib.tiny_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 6
  return lib.tiny_launch, {key: (prg, getattr(lib, f"item_{to_function_name(prg.name)}")) for key, prg in progs.items()}


def var_vals(prg: Any) -> Dict[Any, int]:
  """VAR_VALUE for every variable of the kernel: its arguments and those only in its launch sizes."""
  sizes = [d for d in list(prg.global_size or []) + list(prg.local_size or []) if not isinstance(d, int)]
  return {v: VAR_VALUE for v in list(prg.vars) + [v for d in sizes for v in d.vars()]}


def run_host(launch: Any, item: Any, prg: Any, bufs: List[np.ndarray]) -> None:
  gs, ls = prg.launch_dims(var_vals(prg))
  gs, ls = (list(gs) + [1, 1, 1])[:3], (list(ls or [1, 1, 1]) + [1, 1, 1])[:3]
  ptrs = (ctypes.c_void_p * max(1, len(prg.globals)))(*[bufs[i].ctypes.data for i in prg.globals])
  vals = (ctypes.c_int * max(1, len(prg.vars)))(*[VAR_VALUE] * len(prg.vars))
  launch(ctypes.cast(item, ctypes.c_void_p), ptrs, vals, *gs, *ls)


def run_python(si: Any, bufs: List[np.ndarray]) -> None:
  prg = Kernel(si.ast, opts=PythonRenderer()).to_program()
  mvs = [memoryview(b).cast("B") for b in bufs]
  gs, ls = prg.launch_dims(var_vals(prg))
  PythonProgram(prg.name, prg.src.encode())(*[mvs[i] for i in prg.globals], global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)),
                                            vals=tuple(VAR_VALUE for _ in prg.vars))


def as_float(dt: Any, a: np.ndarray) -> np.ndarray:
  return (a.astype(np.uint32) << 16).view(np.float32) if dt == dtypes.bfloat16 else a.astype(np.float64)


@pytest.mark.parametrize("case", case_names())
def test_host_run_matches_the_python_device(case: str, items: Dict[str, List[Any]], host_kernels: Any) -> None:
  launch, kernels = host_kernels
  keys = [k for k in kernels if k[0] == case]
  want: Dict[int, np.ndarray] = {}
  for _, i, opt in keys:
    si = items[case][i]
    prg, fn = kernels[(case, i, opt)]
    rng = np.random.default_rng(i + 7)
    ins = [random_input(b.dtype, b.size, rng) for b in si.bufs[1:]]
    out_np = NUMPY[si.bufs[0].dtype]
    if i not in want:   # the reference runs once per kernel: both opt levels get the same inputs
      py_bufs = [np.zeros(si.bufs[0].size, out_np)] + [x.copy() for x in ins]
      run_python(si, py_bufs)
      want[i] = py_bufs[0]
    host_bufs = [np.zeros(si.bufs[0].size, out_np)] + [x.copy() for x in ins]
    run_host(launch, fn, prg, host_bufs)
    dt, got, what = si.bufs[0].dtype, host_bufs[0], f"{case} kernel {i} ({opt} opts)"
    if dtypes.is_float(dt):
      tol = {dtypes.float32: 1e-5, dtypes.float64: 1e-12, dtypes.float16: 1e-2, dtypes.bfloat16: 1e-2}[dt]
      np.testing.assert_allclose(as_float(dt, got), as_float(dt, want[i]), rtol=tol, atol=tol, equal_nan=True, err_msg=what)
    else:
      np.testing.assert_array_equal(got, want[i], err_msg=what)
