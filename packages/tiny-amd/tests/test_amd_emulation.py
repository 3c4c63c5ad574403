"""The kernels HIPRenderer's opts produce, run on the PYTHON device emulating AMD (`PythonRenderer(emulate="AMD")`).

The emulator takes its tensor cores from the AMD renderer through the registry (`amd_tensor_cores()`, RDNA3 WMMA in wave32),
so the TC opt builds the same kernel for both; running it on PYTHON checks the tiling and the register layout against numpy.
Op-suite kernels with GPU-style opts (LOCAL, GROUP: shared memory and barriers) are checked the same way, and the very
same opts must give HIP source that clang compiles.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest

from tiny.backend import Kernel, Opt, OptOps, PythonProgram, PythonRenderer, UOps, dtypes, to_function_name

from tiny_amd.opsuite import op_suite_schedule, tc_matmul_ast
from tiny_amd.renderer import HIPRenderer


def emulated() -> Any:
  return PythonRenderer(emulate="AMD")


def run(prg: Any, bufs: List[np.ndarray], out_index: int = 0) -> np.ndarray:
  """Run a PYTHON program over numpy buffers (in the order of the schedule's buffers); the output buffer afterwards."""
  mvs = [memoryview(bytearray(b.tobytes())).cast("B") for b in bufs]
  gs, ls = prg.launch_dims({})
  PythonProgram(prg.name, prg.src.encode())(*[mvs[i] for i in prg.globals], global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)))
  return np.frombuffer(mvs[out_index].tobytes(), bufs[out_index].dtype)


def test_renderer_declares_the_emulated_tensor_cores() -> None:
  tcs = emulated().tensor_cores
  assert tcs == HIPRenderer("gfx1100").tensor_cores
  assert {(tc.dtype_in, tc.dtype_out) for tc in tcs} == {(dtypes.half, dtypes.float), (dtypes.half, dtypes.half)}
  assert all(tc.dims == (16, 16, 16) and tc.threads and np.prod([t[1] for t in tc.threads]) == 32 for tc in tcs), "wave32 tiles"


def run_tc(dtype_out: Any, m: int, n: int, k: int, extra: List[Opt]) -> None:
  kern = Kernel(tc_matmul_ast(m, n, k, dtype_out), opts=emulated())
  kern.apply_opt(Opt(OptOps.TC, 0, 0))
  for o in extra:
    kern.apply_opt(o)
  prg = kern.to_program()
  assert kern.uops is not None
  wmmas = [u for u in kern.uops.uops if u.op is UOps.WMMA]
  assert wmmas and all(w.arg[0] == f"WMMA_16_16_16_half_{dtype_out.name}" for w in wmmas)
  rng = np.random.default_rng(11)
  a, b = (rng.random((m, k), np.float32) * 2 - 1).astype(np.float16), (rng.random((k, n), np.float32) * 2 - 1).astype(np.float16)
  out_dt = np.float32 if dtype_out == dtypes.float32 else np.float16
  got = run(prg, [np.zeros((m, n), out_dt), a, b]).reshape(m, n).astype(np.float64)
  want = a.astype(np.float64) @ b.astype(np.float64)
  if dtype_out == dtypes.float32:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
  else:
    # the accumulator is half: each WMMA rounds its 16-deep partial sum to half
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=2e-2 * (k / 16))


@pytest.mark.parametrize("dtype_out", [dtypes.float32, dtypes.half], ids=["half_float", "half_half"])
@pytest.mark.parametrize("shape,extra", [
  ((16, 16, 16), []),
  ((32, 48, 32), []),
  ((32, 32, 32), [Opt(OptOps.UPCAST, 0, 2)]),
  ((32, 32, 16), [Opt(OptOps.LOCAL, 0, 2)]),
], ids=["one_tile", "tiles", "upcast", "local"])
def test_tc_matmul_on_emulated_amd(dtype_out: Any, shape: Any, extra: List[Opt]) -> None:
  run_tc(dtype_out, *shape, extra)


@pytest.mark.parametrize("dtype_out", [dtypes.float32, dtypes.half], ids=["half_float", "half_half"])
def test_hip_renderer_gets_the_emulated_wmma_kernel(dtype_out: Any) -> None:
  """The uops HIPRenderer turns into __builtin_amdgcn_wmma_* are the ones the emulator ran (same layout, same operands)."""
  def wmma_args(renderer: Any) -> List[Any]:
    kern = Kernel(tc_matmul_ast(32, 16, 32, dtype_out), opts=renderer)
    kern.apply_opt(Opt(OptOps.TC, 0, 0))
    kern.linearize()
    assert kern.uops is not None
    return [(u.arg[:4], u.arg[5:], [s.dtype for s in u.src], u.dtype) for u in kern.uops.uops if u.op is UOps.WMMA]
  ref = wmma_args(emulated())
  assert ref and wmma_args(HIPRenderer("gfx1100")) == ref
  assert ref[0][2] == [dtypes.half.vec(16), dtypes.half.vec(16), dtype_out.vec(8)]


def test_hand_coded_optimizations_choose_tensor_cores() -> None:
  for renderer in (HIPRenderer("gfx1100"), emulated()):
    kern = Kernel(tc_matmul_ast(32, 32, 32), opts=renderer)
    kern.hand_coded_optimizations()
    assert kern.tensor_core is not None and kern.applied_opts[0].op is OptOps.TC
  kern = Kernel(tc_matmul_ast(32, 32, 32), opts=HIPRenderer("gfx90a"))
  kern.hand_coded_optimizations()
  assert kern.tensor_core is None


# *** op-suite kernels with workgroup-local opts ***

def reference(case: str, ins: List[np.ndarray]) -> np.ndarray:
  if case == "reduce_sum":
    return ins[0].reshape(64, 96).sum(axis=1)
  if case == "reduce_max":
    return ins[0].reshape(96, 64).max(axis=0)
  if case == "matmul":
    return (ins[0].reshape(64, 64).astype(np.float64) @ ins[1].reshape(64, 64).astype(np.float64)).reshape(-1)
  raise KeyError(case)


LOCAL_CASES = {
  "reduce_sum": [Opt(OptOps.GROUP, 0, 16), Opt(OptOps.LOCAL, 0, 4)],
  "reduce_max": [Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.LOCAL, 0, 8)],
  "matmul": [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 1, 4), Opt(OptOps.GROUP, 0, 4), Opt(OptOps.UPCAST, 0, 2)],
  "matmul_hand": [],
}


@pytest.mark.parametrize("case", list(LOCAL_CASES))
def test_suite_kernels_with_locals_on_emulated_amd(case: str) -> None:
  from tiny_amd.compiler import AMDToolchainError, HIPCompiler
  from tiny_amd.codeobject import kernel_names
  name = case.replace("_hand", "")
  (si,) = op_suite_schedule([name])[name]
  renderers = [emulated(), HIPRenderer("gfx1100")]
  kerns = [Kernel(si.ast, opts=r) for r in renderers]
  for k in kerns:
    if LOCAL_CASES[case]:
      for o in LOCAL_CASES[case]:
        k.apply_opt(o)
    else:
      k.hand_coded_optimizations()
  assert kerns[0].applied_opts == kerns[1].applied_opts
  assert any(o.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP) for o in kerns[0].applied_opts), "the kernel uses workgroup-local opts"
  prg, hip = kerns[0].to_program(), kerns[1].to_program()
  rng = np.random.default_rng(5)
  ins = [(rng.random(b.size, np.float32) * 2 - 1).astype(np.float32) for b in si.bufs[1:]]
  got = run(prg, [np.zeros(si.bufs[0].size, np.float32)] + ins)
  np.testing.assert_allclose(got, reference(name, ins), rtol=1e-5, atol=1e-5)
  if any(o.op in (OptOps.GROUP, OptOps.GROUPTOP) for o in kerns[1].applied_opts):
    assert "__attribute__((shared" in hip.src and "__builtin_amdgcn_s_barrier" in hip.src
  try:
    compiler = HIPCompiler("gfx1100")
  except AMDToolchainError as e:
    pytest.skip(f"the emulated kernel matched numpy; compiling its HIP twin needs clang: {e}")
  assert kernel_names(compiler.compile(hip.src)) == [to_function_name(hip.name)]
