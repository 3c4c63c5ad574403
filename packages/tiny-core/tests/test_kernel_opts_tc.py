"""Opt(OptOps.TC): matmuls on the tensor cores the PYTHON device emulates (CUDA, AMD, Metal layouts) equal numpy."""
from __future__ import annotations

import importlib.util
from typing import List

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.uopgraph import verify_linearized
from tiny.codegen.uops import UOps
from tiny.dtype import DType, dtypes
from tiny.ops import BinaryOps, BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps
from tiny.runtime.ops_python import PythonProgram, PythonRenderer
from tiny.shape.shapetracker import ShapeTracker as ST

NP = {dtypes.half: np.float16, dtypes.float: np.float32}


def emulator(device: str) -> PythonRenderer:
  """PYTHON emulating device's tensor cores. CUDA's come from tiny-cuda's renderer (core holds no CUDA knowledge), so
  without that package installed (nox -s core) those cases skip."""
  if device == "CUDA" and importlib.util.find_spec("tiny_cuda") is None:
    pytest.skip("the CUDA tensor cores are defined by tiny-cuda, which is not installed")
  return PythonRenderer(emulate=device)


def matmul_ast(M: int, N: int, K: int, din: DType, dout: DType, cast_product: bool = False) -> LazyOp:
  """SUM(MUL(CAST(a), CAST(b))), or with cast_product the SUM(CAST(MUL(a, b))) that Tensor.matmul(acc_dtype=...) builds."""
  sa = ST.from_shape((M, K)).reshape((M, 1, K)).expand((M, N, K))
  sb = ST.from_shape((K, N)).permute((1, 0)).reshape((1, N, K)).expand((M, N, K))
  la, lb = LazyOp(BufferOps.LOAD, (), MemBuffer(1, din, sa)), LazyOp(BufferOps.LOAD, (), MemBuffer(2, din, sb))
  if din != dout and not cast_product:
    la, lb = LazyOp(UnaryOps.CAST, (la,), dout), LazyOp(UnaryOps.CAST, (lb,), dout)
  mul = LazyOp(BinaryOps.MUL, (la, lb))
  if din != dout and cast_product:
    mul = LazyOp(UnaryOps.CAST, (mul,), dout)
  red = LazyOp(ReduceOps.SUM, (mul,), (2,))
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (red,), MemBuffer(0, dout, ST.from_shape((M, N, 1)))),))


def run_matmul(emulate: str, din: DType, dout: DType, M: int, N: int, K: int, opts: List[Opt], hand_coded: bool = False,
               cast_product: bool = False) -> Kernel:
  rng = np.random.default_rng(1)
  A, B = (rng.random((M, K)) - 0.5).astype(NP[din]), (rng.random((K, N)) - 0.5).astype(NP[din])
  k = Kernel(matmul_ast(M, N, K, din, dout, cast_product), opts=emulator(emulate))
  if hand_coded:
    k.hand_coded_optimizations()
  for o in opts:
    k.apply_opt(o)
  prg = k.to_program()
  assert k.uops is not None
  verify_linearized(k.uops.uops)
  out = np.zeros((M, N), NP[dout])
  mvs = [memoryview(bytearray(out.nbytes)).cast("B")] + [memoryview(bytearray(x.tobytes())).cast("B") for x in (A, B)]
  gs, ls = prg.launch_dims({})
  PythonProgram(prg.name, prg.src.encode())(*mvs, global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)))
  got = np.frombuffer(mvs[0].tobytes(), NP[dout]).reshape(M, N).astype(np.float32)
  ref = A.astype(np.float32) @ B.astype(np.float32)
  np.testing.assert_allclose(got, ref, atol=2e-2 if dout == dtypes.half else 1e-4, rtol=1e-2)
  return k


@pytest.mark.parametrize("emulate,din,dout,shape", [
  ("METAL", dtypes.float, dtypes.float, (16, 16, 16)),
  ("METAL", dtypes.half, dtypes.float, (8, 16, 24)),
  ("CUDA", dtypes.half, dtypes.float, (32, 16, 32)),
  ("AMD", dtypes.half, dtypes.float, (32, 32, 16)),
  ("AMD", dtypes.half, dtypes.half, (16, 32, 32)),
])
def test_tc_matmul(emulate, din, dout, shape) -> None:
  k = run_matmul(emulate, din, dout, *shape, [Opt(OptOps.TC, 0, 0)])
  assert k.uops is not None and any(u.op is UOps.WMMA for u in k.uops.uops)


@pytest.mark.parametrize("opts", [
  [Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 2)],
  [Opt(OptOps.TC, 0, 0), Opt(OptOps.LOCAL, 0, 2)],
  [Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.LOCAL, 0, 2)],
  [Opt(OptOps.TC, 1, 0)],
])
def test_tc_with_more_opts(opts) -> None:
  run_matmul("METAL", dtypes.half, dtypes.float, 32, 32, 24, opts)


def test_hand_coded_picks_tensor_cores() -> None:
  k = run_matmul("CUDA", dtypes.half, dtypes.float, 32, 16, 32, [], hand_coded=True)
  assert k.tensor_core is not None


@pytest.mark.parametrize("emulate", ["CUDA", "METAL"])
def test_tc_accepts_cast_around_product(emulate) -> None:
  # half inputs accumulated in float, with the cast around the product: the tensor core computes in float, as numpy does here
  k = run_matmul(emulate, dtypes.half, dtypes.float, 32, 16, 32, [Opt(OptOps.TC, 0, 0)], cast_product=True)
  assert k.uops is not None and any(u.op is UOps.WMMA for u in k.uops.uops)
  assert run_matmul(emulate, dtypes.half, dtypes.float, 32, 16, 32, [], hand_coded=True, cast_product=True).tensor_core is not None


def test_tc_from_tensor_matmul_ast() -> None:
  from tiny.engine.schedule import create_schedule
  from tiny.tensor import Tensor
  out = Tensor.empty(64, 64, dtype=dtypes.half).matmul(Tensor.empty(64, 64, dtype=dtypes.half), acc_dtype=dtypes.float)
  k = Kernel(create_schedule([out.lazydata])[-1].ast, opts=emulator("CUDA"))
  assert k.apply_tensor_cores(1) and k.tensor_core is not None


def test_tc_rejections() -> None:
  # float32 inputs have no CUDA tensor core; 12 is not a multiple of the 16-wide tile
  with pytest.raises(KernelOptError):
    Kernel(matmul_ast(16, 16, 16, dtypes.float, dtypes.float), opts=emulator("CUDA")).apply_opt(Opt(OptOps.TC, 0, 0))
  with pytest.raises(KernelOptError):
    Kernel(matmul_ast(12, 16, 16, dtypes.half, dtypes.float), opts=emulator("CUDA")).apply_opt(Opt(OptOps.TC, 0, 0))
  k = Kernel(matmul_ast(16, 16, 16, dtypes.float, dtypes.float), opts=emulator("METAL"))
  with pytest.raises(KernelOptError):
    k.apply_opt(Opt(OptOps.TC, 99, 0))
  k.apply_opt(Opt(OptOps.TC, 0, 0))
  for bad in (Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.GROUP, 0, 2), Opt(OptOps.NOLOCALS), Opt(OptOps.TC, 0, 0)):
    with pytest.raises(KernelOptError):
      k.apply_opt(bad)
