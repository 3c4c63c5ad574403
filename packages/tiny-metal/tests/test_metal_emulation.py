"""Metal kernels, as MetalRenderer's opts shape them, run on the PYTHON device emulating METAL and match numpy.

No Mac runs the MSL here, so the kernel's meaning is checked one level up: the opts Metal chose (tensor cores, threadgroups,
grouped reductions) are replayed on a PYTHON kernel that borrows Metal's tensor cores (`PythonRenderer(emulate="METAL")`,
which asks the registry for MetalRenderer's list), the two linearize to the same uops, and the PYTHON device runs them:
simdgroup tiles in the register layout Metal declares, threadgroup memory and barriers for the workgroups.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

from tiny import Tensor
from tiny.backend import Kernel, Opt, OptOps, create_schedule_with_vars, dtypes, MetaOps
from tiny.codegen.uopgraph import verify_linearized
from tiny.helpers import Context
from tiny.codegen.uops import UOps
from tiny.runtime.ops_python import PythonProgram, PythonRenderer

from tiny_metal.opsuite import matmul_ast, optimize
from tiny_metal.renderer import MetalRenderer, metal_tensor_cores


def uop_rows(k: Kernel) -> List[Tuple[Any, ...]]:
  """The linearized uops of a kernel as comparable rows (op, dtype, source positions, arg). NOOPs (placeholders that only
  order a BARRIER after its stores, and which rewrite passes may fold differently) are left out."""
  assert k.uops is not None
  uops = [u for u in k.uops.uops if u.op is not UOps.NOOP]
  index = {u: i for i, u in enumerate(uops)}
  return [(u.op, u.dtype, tuple(index[s] for s in u.src if s in index), u.arg) for u in uops]


def replay_on_python(ast: Any, metal: Kernel) -> Tuple[Kernel, Any]:
  """The same opts on a PYTHON kernel that emulates METAL; both must linearize to the same uops."""
  emulator = PythonRenderer(emulate="METAL")
  emulator.extra_matcher = MetalRenderer.extra_matcher   # Metal's own lowering too (bfloat ALUs in float)
  py = Kernel(ast, opts=emulator)
  for o in metal.applied_opts:
    py.apply_opt(o)
  prg = py.to_program()
  metal.linearize()
  assert uop_rows(py) == uop_rows(metal), "PYTHON and METAL made different kernels from the same opts"
  assert py.uops is not None
  verify_linearized(py.uops.uops)
  return py, prg


def test_renderer_declares_the_emulated_tensor_cores() -> None:
  emulated = PythonRenderer(emulate="METAL").tensor_cores
  assert emulated == MetalRenderer().tensor_cores == metal_tensor_cores()
  assert all(tc.layout for tc in emulated) and all(tc.num_threads() == 32 for tc in emulated)


# *** tensor cores ***

def test_simdgroup_layout_is_apples() -> None:
  """thread_elements() of an 8x8 simdgroup matrix, as Apple GPUs lay it out (the table MLX and others rely on): lanes 0-15
  cover rows 0-3, lanes 16-31 rows 4-7; within 16 lanes, pairs walk rows and every 8 lanes move 4 columns right; a lane's
  two elements are adjacent columns. Every element of the tile belongs to exactly one (lane, element)."""
  from tiny_metal.renderer import SIMDGROUP_8X8_LAYOUT
  row_of = [0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3]
  col_of = [0, 2, 0, 2, 0, 2, 0, 2, 4, 6, 4, 6, 4, 6, 4, 6]
  seen = set()
  for lane in range(32):
    for e in range(2):
      want = (row_of[lane % 16] + 4 * (lane // 16), col_of[lane % 16] + e)
      assert SIMDGROUP_8X8_LAYOUT.coords(lane, e) == want, (lane, e)
      seen.add(want)
  assert seen == {(r, c) for r in range(8) for c in range(8)}


def tc_operands(dtype_in: Any, m: int, n: int, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(A, B) as stored in memory and as the float64 values the hardware multiplies."""
  rng = np.random.default_rng(3)
  a, b = rng.uniform(-2, 2, (m, k)).astype(np.float32), rng.uniform(-2, 2, (k, n)).astype(np.float32)
  if dtype_in == dtypes.float32:
    return a, b, a.astype(np.float64), b.astype(np.float64)
  if dtype_in == dtypes.float16:
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    return a16, b16, a16.astype(np.float64), b16.astype(np.float64)
  # bfloat16: round to nearest even, keep the upper 16 bits
  def bits(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
  ab, bb = bits(a), bits(b)
  return ab, bb, (ab.astype(np.uint32) << 16).view(np.float32).astype(np.float64), (bb.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


OUT_NP = {dtypes.float32: np.float32, dtypes.float16: np.float16}


def from_out(raw: bytes, dtype_out: Any, shape: Tuple[int, int]) -> np.ndarray:
  if dtype_out == dtypes.bfloat16:
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
  return np.frombuffer(raw, OUT_NP[dtype_out]).astype(np.float32).reshape(shape)


@pytest.mark.parametrize("dtype_in,dtype_out", [(dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32),
                                                (dtypes.float16, dtypes.float16), (dtypes.bfloat16, dtypes.float32),
                                                (dtypes.bfloat16, dtypes.bfloat16)], ids=["f32", "f16_f32", "f16", "bf16_f32", "bf16"])
@pytest.mark.parametrize("shape,extra", [
  ((8, 8, 8), []),
  ((32, 24, 40), []),
  ((32, 32, 16), [Opt(OptOps.UPCAST, 0, 2)]),
  ((16, 32, 16), [Opt(OptOps.LOCAL, 0, 2)]),
  ((64, 64, 32), "hand"),
], ids=["one_tile", "tiles", "upcast", "local", "heuristic"])
def test_tc_matmul_on_emulated_metal(dtype_in: Any, dtype_out: Any, shape: Tuple[int, int, int], extra: Any) -> None:
  m, n, k = shape
  ast = matmul_ast(m, n, k, dtype_in, dtype_out)
  metal = Kernel(ast, opts=MetalRenderer())
  if extra == "hand":
    metal.hand_coded_optimizations()
  else:
    metal.apply_opt(Opt(OptOps.TC, 0, 0))
    for o in extra:
      metal.apply_opt(o)
  assert metal.tensor_core is not None and (metal.tensor_core.dtype_in, metal.tensor_core.dtype_out) == (dtype_in, dtype_out)
  py, prg = replay_on_python(ast, metal)
  assert py.uops is not None
  wmmas = [u for u in py.uops.uops if u.op is UOps.WMMA]
  assert wmmas and all(w.arg[0] == f"WMMA_8_8_8_{dtype_in.name}_{dtype_out.name}" and w.arg[4] == "METAL" for w in wmmas)
  assert "simdgroup_multiply_accumulate" in metal.to_program().src
  a_mem, b_mem, a, b = tc_operands(dtype_in, m, n, k)
  out = memoryview(bytearray(m * n * dtype_out.itemsize)).cast("B")
  gs, ls = prg.launch_dims({})
  assert ls is not None and ls[0] % 32 == 0, "whole simdgroups"
  PythonProgram(prg.name, prg.src.encode())(out, memoryview(a_mem.tobytes()).cast("B"), memoryview(b_mem.tobytes()).cast("B"),
                                            global_size=tuple(gs), local_size=tuple(ls))
  want = a @ b
  tol = {dtypes.float32: (1e-5, 1e-4), dtypes.float16: (2e-3, 2e-2), dtypes.bfloat16: (1e-2, 1e-1)}[dtype_out]
  np.testing.assert_allclose(from_out(out.tobytes(), dtype_out, (m, n)), want, rtol=tol[0], atol=tol[1])


# *** threadgroups and threadgroup memory ***

def run_on_emulated_metal(out: Tensor, opt: str) -> Tuple[np.ndarray, List[Any]]:
  """Schedule `out` (inputs already realized on PYTHON), shape each kernel with MetalRenderer under `opt`, replay it on
  PYTHON emulating METAL, run the kernels in order; the result and the Metal programs."""
  # scheduled as for Metal, whose renderer makes no row kernels (PYTHON's would inline softmax's max and sum)
  with Context(ROW_FUSION=0):
    sched, var_vals = create_schedule_with_vars([out.lazydata])
  progs = []
  for si in sched:
    assert si.ast.op is MetaOps.KERNEL, "inputs are realized, so only kernels are left"
    metal = optimize(Kernel(si.ast, opts=MetalRenderer()), opt)
    progs.append(metal.to_program())
    _, prg = replay_on_python(si.ast, metal)
    for b in si.bufs:
      b.ensure_allocated()
    gs, ls = prg.launch_dims(var_vals)
    PythonProgram(prg.name, prg.src.encode())(*[si.bufs[i].handle for i in prg.globals], global_size=tuple(gs),
                                              local_size=tuple(ls or (1, 1, 1)), vals=tuple(var_vals[v] for v in prg.vars))
  return sched[-1].bufs[0].numpy().reshape(out.shape), progs


RNG = np.random.default_rng(11)
X, Y = RNG.uniform(-3, 3, (24, 80)).astype(np.float32), RNG.uniform(0.5, 3, (24, 80)).astype(np.float32)
CASES: Dict[str, Tuple[Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
  "sum_rows": (lambda x, y: x.sum(axis=1), lambda x, y: x.sum(axis=1)),
  "max_cols": (lambda x, y: x.max(axis=0), lambda x, y: x.max(axis=0)),
  "sum_all": (lambda x, y: (x * y).sum(), lambda x, y: (x * y).sum()),
  "softmax": (lambda x, y: x.softmax(), lambda x, y: np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)),
  "matmul": (lambda x, y: x @ y.T, lambda x, y: x @ y.T),
  "elementwise": (lambda x, y: (x * y + 1).sqrt().log2() - y.exp2() * x.sin(), lambda x, y: np.log2(np.sqrt(x * y + 1)) - np.exp2(y) * np.sin(x)),
}


@pytest.mark.parametrize("opt", ["gpu", "hand"])
@pytest.mark.parametrize("case", list(CASES))
def test_threadgroup_kernels_on_emulated_metal(case: str, opt: str) -> None:
  fn, ref = CASES[case]
  x, y = Tensor(X, device="PYTHON").realize(), Tensor(Y, device="PYTHON").realize()
  got, progs = run_on_emulated_metal(fn(x, y), opt)
  assert any(p.local_size is not None and np.prod(p.local_size) > 1 for p in progs), "Metal runs these in threadgroups"
  if case in ("sum_rows", "max_cols", "sum_all", "softmax") and opt == "gpu":
    assert any("threadgroup_barrier" in p.src for p in progs), "a grouped reduction meets in threadgroup memory"
  with np.errstate(invalid="ignore"):
    np.testing.assert_allclose(got, ref(X.astype(np.float64), Y.astype(np.float64)), rtol=1e-4, atol=1e-4)


def test_symbolic_kernel_on_emulated_metal() -> None:
  from tiny import Variable
  v = Variable("n", 1, 24).bind(9)
  x = Tensor(X, device="PYTHON").realize()
  got, progs = run_on_emulated_metal((x.shrink(((0, v), None)) * 2).sum(axis=0), "gpu")
  assert any(p.vars for p in progs) and any("constant int& n [[buffer(" in p.src for p in progs)
  np.testing.assert_allclose(got, (X[:9].astype(np.float64) * 2).sum(axis=0), rtol=1e-5, atol=1e-4)


def test_bfloat_kernels_computed_in_float_match_the_reference() -> None:
  """Metal computes each bfloat ALU in float and rounds back (and casts bfloat<->int through float); the PYTHON reference
  device rounds after each bfloat op. The two must agree (to one bfloat rounding: double-then-float-then-bfloat rounding may
  differ from a direct one in a tie)."""
  bf = dtypes.bfloat16
  def build() -> Tensor:
    x, y = Tensor(X, device="PYTHON").cast(bf).realize(), Tensor(Y, device="PYTHON").cast(bf).realize()
    return ((x * y + x).maximum(y) - y.sqrt() * x.exp2()).cast(dtypes.float32) + (x * 3).cast(dtypes.int32).cast(bf).cast(dtypes.float32) + \
      x.max(axis=1, keepdim=True).cast(dtypes.float32)
  want = build().numpy()
  got, progs = run_on_emulated_metal(build(), "gpu")
  assert any("bfloat" in p.src for p in progs) and not any(re.search(r"bfloat \w+ = \(\w+[*+]", p.src) for p in progs)
  np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
