"""The tensor-core kernels the CUDA renderers emit, run on the PYTHON device emulating CUDA's mma.sync register layout.

The CUDA and PTX renderers declare `tiny_cuda.renderer.cuda_tensor_cores()`, the list the emulator takes from them, so the TC opt
makes the same kernel for all three; running it on PYTHON checks the tiling and the register layout against numpy.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, Opt, OptOps
from tiny.codegen.uopgraph import verify_linearized
from tiny.codegen.uops import UOps
from tiny.dtype import dtypes
from tiny.runtime.ops_python import PythonProgram, PythonRenderer

from tiny_cuda.opsuite import tc_matmul_ast
from tiny_cuda.ptx import PTXRenderer
from tiny_cuda.renderer import CUDARenderer


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
  """Round float32 to bfloat16 (nearest even) and return the 16-bit patterns."""
  u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
  return (b.astype(np.uint32) << 16).view(np.float32)


def operands(dtype: Any, m: int, n: int, k: int) -> List[np.ndarray]:
  """(A, B) as stored in memory and as float32 values."""
  rng = np.random.default_rng(7)
  a, b = (rng.random((m, k), np.float32) - 0.5) * 4, (rng.random((k, n), np.float32) - 0.5) * 4
  if dtype == dtypes.half:
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    return [a16, b16, a16.astype(np.float32), b16.astype(np.float32)]
  a16, b16 = to_bf16_bits(a), to_bf16_bits(b)
  return [a16, b16, from_bf16_bits(a16), from_bf16_bits(b16)]


def run_tc(dtype: Any, m: int, n: int, k: int, extra: List[Opt]) -> np.ndarray:
  kern = Kernel(tc_matmul_ast(m, n, k, dtype), opts=PythonRenderer(emulate="CUDA"))
  kern.apply_opt(Opt(OptOps.TC, 0, 0))
  for o in extra:
    kern.apply_opt(o)
  prg = kern.to_program()
  assert kern.uops is not None
  uops = kern.uops.uops
  verify_linearized(uops)
  wmmas = [u for u in uops if u.op is UOps.WMMA]
  assert wmmas and all(w.arg[0] == f"WMMA_8_16_16_{dtype.name}_float" for w in wmmas)
  a_mem, b_mem, a, b = operands(dtype, m, n, k)
  out = memoryview(bytearray(m * n * 4)).cast("B")
  gs, ls = prg.launch_dims({})
  PythonProgram(prg.name, prg.src.encode())(out, memoryview(a_mem.tobytes()).cast("B"), memoryview(b_mem.tobytes()).cast("B"),
                                            global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)))
  got = np.frombuffer(out.tobytes(), np.float32).reshape(m, n)
  np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)
  return got


def test_renderers_declare_the_emulated_tensor_cores() -> None:
  emulated = PythonRenderer(emulate="CUDA").tensor_cores
  assert CUDARenderer("sm_80").tensor_cores == emulated == PTXRenderer("sm_90").tensor_cores
  assert {(tc.dtype_in, tc.dtype_out) for tc in emulated} == {(dtypes.half, dtypes.float), (dtypes.bfloat16, dtypes.float)}


@pytest.mark.parametrize("dtype", [dtypes.half, dtypes.bfloat16], ids=["half", "bf16"])
@pytest.mark.parametrize("shape,extra", [
  ((16, 8, 16), []),
  ((64, 32, 48), []),
  ((32, 32, 32), [Opt(OptOps.UPCAST, 0, 2)]),
  ((32, 16, 32), [Opt(OptOps.LOCAL, 0, 2)]),
], ids=["one_tile", "tiles", "upcast", "local"])
def test_tc_matmul_on_emulated_cuda(dtype: Any, shape: Any, extra: List[Opt]) -> None:
  run_tc(dtype, *shape, extra)


@pytest.mark.parametrize("dtype", [dtypes.half, dtypes.bfloat16], ids=["half", "bf16"])
def test_hand_coded_optimizations_choose_tensor_cores(dtype: Any) -> None:
  for renderer in (CUDARenderer("sm_80"), PTXRenderer("sm_80"), PythonRenderer(emulate="CUDA")):
    kern = Kernel(tc_matmul_ast(32, 32, 32, dtype), opts=renderer)
    kern.hand_coded_optimizations()
    assert kern.tensor_core is not None and kern.applied_opts[0].op is OptOps.TC


@pytest.mark.parametrize("dtype", [dtypes.half, dtypes.bfloat16], ids=["half", "bf16"])
def test_cuda_renderers_get_the_same_wmma_kernel(dtype: Any) -> None:
  """The uops the CUDA renderers turn into mma.sync are the ones the emulator ran (same layout, same operand order)."""
  def wmma_args(renderer: Any) -> List[Any]:
    kern = Kernel(tc_matmul_ast(32, 16, 32, dtype), opts=renderer)
    kern.apply_opt(Opt(OptOps.TC, 0, 0))
    kern.linearize()
    assert kern.uops is not None
    return [(u.arg[:4], u.arg[5:], [s.dtype for s in u.src], u.dtype) for u in kern.uops.uops if u.op is UOps.WMMA]
  ref = wmma_args(PythonRenderer(emulate="CUDA"))
  assert ref and wmma_args(CUDARenderer("sm_80")) == ref == wmma_args(PTXRenderer("sm_80"))
  assert ref[0][2] == [dtype.vec(8), dtype.vec(4), dtypes.float.vec(4)]
