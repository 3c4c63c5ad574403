"""The PYTHON device: serialisation, allocator, launch checks, tensor-core emulation against numpy matmul."""
from __future__ import annotations

import math
from typing import Any, List, Tuple

import numpy as np
import pytest

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType, PtrDType, dtypes
from tiny.ops import BinaryOps
from tiny.renderer import RegisterLayout, TensorCore
from tiny.runtime.ops_python import PythonAllocator, PythonCompiler, PythonKernelError, PythonProgram, PythonRenderer


def _renderer_tensor_cores(device: str) -> List[TensorCore]:
  """The tensor cores the device's own package declares (the emulator takes them from its renderer), or skip."""
  try:
    return list(PythonRenderer(device).tensor_cores)
  except ValueError as e:
    pytest.skip(f"tiny-{device.lower()} is not installed: {e}")


def amd_tensor_cores() -> List[TensorCore]:
  return _renderer_tensor_cores("AMD")


def metal_tensor_cores() -> List[TensorCore]:
  return _renderer_tensor_cores("METAL")


def _g(idx: int, dt: DType, mutable: bool = False) -> UOp:
  return UOp(UOps.DEFINE_GLOBAL, PtrDType(dt), (), (idx, mutable))


def _c(v: Any, dt: DType = dtypes.int32) -> UOp:
  return UOp(UOps.CONST, dt, (), v)


def _add(a: UOp, b: UOp) -> UOp:
  return UOp(UOps.ALU, dtypes.int32, (a, b), BinaryOps.ADD)


def _program(uops: List[UOp], emulate: Any = None) -> PythonProgram:
  src = PythonRenderer(emulate).render("k", uops)
  return PythonProgram("k", PythonCompiler().compile(src))


def _buf(alloc: PythonAllocator, a: np.ndarray) -> memoryview:
  b = alloc.alloc(a.nbytes)
  alloc.copyin(b, memoryview(np.ascontiguousarray(a)).cast("B"))
  return b


def _out(alloc: PythonAllocator, b: memoryview, like: np.ndarray) -> np.ndarray:
  dest = bytearray(like.nbytes)
  alloc.copyout(memoryview(dest), b)
  return np.frombuffer(dest, like.dtype).reshape(like.shape).copy()


def _copy_kernel(n: int) -> List[UOp]:
  d0, d1 = _g(0, dtypes.float32, True), _g(1, dtypes.float32)
  i = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", n))
  ld = UOp(UOps.LOAD, dtypes.float32, (d1, i))
  return [d0, d1, i, ld, UOp(UOps.STORE, None, (d0, i, ld))]


def test_allocator_roundtrip_and_views():
  alloc = PythonAllocator()
  a = np.arange(10, dtype=np.int32)
  b = _buf(alloc, a)
  np.testing.assert_array_equal(_out(alloc, b, a), a)
  # as_buffer is zero-copy: writing through it changes the buffer
  view = alloc.as_buffer(b)
  view.cast("i")[3] = 99
  assert _out(alloc, b, a)[3] == 99
  sub = alloc.offset(b, 8, 8)
  assert np.frombuffer(bytes(sub), np.int32).tolist() == [2, 99]
  alloc.free(b, a.nbytes)
  with pytest.raises(ValueError):
    alloc.alloc(-1)


def test_copy_kernel_and_timing():
  alloc = PythonAllocator()
  a = np.random.default_rng(0).standard_normal(9).astype(np.float32)
  out = np.zeros_like(a)
  bo, ba = _buf(alloc, out), _buf(alloc, a)
  prg = _program(_copy_kernel(9))
  et = prg(bo, ba, global_size=(9, 1, 1), wait=True)
  assert isinstance(et, float) and et >= 0
  assert prg(bo, ba, global_size=(9, 1, 1)) is None
  np.testing.assert_array_equal(_out(alloc, bo, out), a)


def test_compiler_rejects_foreign_source():
  from tiny.device import CompileError
  with pytest.raises(CompileError):
    PythonCompiler().compile("int main() { return 0; }")


def test_out_of_bounds_is_an_error():
  alloc = PythonAllocator()
  bo, ba = alloc.alloc(4 * 4), alloc.alloc(4 * 4)
  with pytest.raises(PythonKernelError, match="out of bounds"):
    _program(_copy_kernel(5))(bo, ba, global_size=(5, 1, 1))


def test_wrong_argument_counts():
  prg = _program(_copy_kernel(2))
  alloc = PythonAllocator()
  with pytest.raises(ValueError):
    prg(alloc.alloc(8), global_size=(2, 1, 1))
  with pytest.raises(ValueError):
    prg(alloc.alloc(8), alloc.alloc(8), global_size=(2, 1, 1), vals=(3,))


def test_emulation_choice(monkeypatch):
  assert PythonRenderer().device == "PYTHON" and PythonRenderer().tensor_cores == []
  monkeypatch.setenv("EMULATE_AMD", "1")
  r = PythonRenderer()
  assert r.device == "AMD"
  assert [(tc.dims, tc.dtype_in, tc.dtype_out) for tc in r.tensor_cores] == [((16, 16, 16), dtypes.half, dtypes.float),
                                                                            ((16, 16, 16), dtypes.half, dtypes.half)]
  assert PythonRenderer("METAL").tensor_cores[0].dims == (8, 8, 8)
  with pytest.raises(ValueError):
    PythonRenderer("TPU")
  monkeypatch.setenv("EMULATE_METAL", "1")
  with pytest.raises(ValueError, match="one device at a time"):
    PythonRenderer()
  monkeypatch.setenv("EMULATE_METAL", "0")
  assert PythonRenderer().device == "AMD"


def _cuda_tensor_cores() -> List[TensorCore]:
  """CUDA's tensor cores, from the registry like the emulator gets them (tiny-cuda declares them)."""
  try:
    return PythonRenderer("CUDA").tensor_cores
  except ValueError as e:
    pytest.skip(f"tiny-cuda is not installed: {e}")


def test_renderer_pickles():
  import pickle
  r = pickle.loads(pickle.dumps(PythonRenderer("AMD")))
  assert r.device == "AMD" and r.tensor_cores == amd_tensor_cores()


# *** tensor cores ***
# Register layouts written from the vendors' documentation: (lane, register element) -> (row, col).

def _ptx_m16n8k16(lane: int, e: int, which: str) -> Tuple[int, int]:
  """PTX ISA, mma.m16n8k16 fragments for .f16: groupID = laneid >> 2, threadID_in_group = laneid % 4."""
  group, tig = lane >> 2, lane % 4
  if which == "a":  # a0..a7
    row = group if e in (0, 1, 4, 5) else group + 8
    col = tig * 2 + (e & 1) + (8 if e >= 4 else 0)
  elif which == "b":  # b0..b3
    row = tig * 2 + (e & 1) + (8 if e >= 2 else 0)
    col = group
  else:  # c0..c3
    row = group if e < 2 else group + 8
    col = tig * 2 + (e & 1)
  return row, col


def _rdna3_wmma(lane: int, e: int, which: str) -> Tuple[int, int]:
  """RDNA3 WMMA, wave32: lanes 0-15 and 16-31 repeat A's rows / B's columns; D element v of a lane is row 2v + lane/16."""
  if which == "a":
    return lane % 16, e
  if which == "b":
    return e, lane % 16
  return 2 * e + lane // 16, lane % 16


def _metal_simdgroup(lane: int, e: int, which: str) -> Tuple[int, int]:
  """simdgroup_matrix<8,8>: quad rows, lane pairs hold two adjacent columns; the same layout for every operand."""
  row = [0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3][lane % 16] + (4 if lane >= 16 else 0)
  col = [0, 2, 0, 2, 0, 2, 0, 2, 4, 6, 4, 6, 4, 6, 4, 6][lane % 16] + e
  return row, col


# (device, tensor cores, doc layout, (M, N, K), elements per lane for A, B, C)
TC_CASES = [("CUDA", _cuda_tensor_cores, _ptx_m16n8k16, (16, 8, 16), (8, 4, 4)),
            ("AMD", amd_tensor_cores, _rdna3_wmma, (16, 16, 16), (16, 16, 8)),
            ("METAL", metal_tensor_cores, _metal_simdgroup, (8, 8, 8), (2, 2, 2))]

_NP = {dtypes.half: np.float16, dtypes.float: np.float32}


def _wmma_kernel(tc: Any, device: str, sizes: Tuple[int, int, int], lanes: int) -> List[UOp]:
  """Each lane gathers its fragments through index tables, runs one WMMA and scatters D."""
  na, nb, nc = sizes
  da, db, dc, dd = _g(0, tc.dtype_in), _g(1, tc.dtype_in), _g(2, tc.dtype_out), _g(3, tc.dtype_out, True)
  ia, ib, ic = _g(4, dtypes.int32), _g(5, dtypes.int32), _g(6, dtypes.int32)
  lid = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "lidx0", lanes))
  uops: List[UOp] = [da, db, dc, dd, ia, ib, ic, lid]

  def gather(buf: UOp, table: UOp, n: int, dt: DType) -> UOp:
    elems = []
    for e in range(n):
      off = _add(_c(e * lanes), lid)
      idx = UOp(UOps.LOAD, dtypes.int32, (table, off))
      val = UOp(UOps.LOAD, dt, (buf, idx))
      uops.extend([off.src[0], off, idx, val])
      elems.append(val)
    vec = UOp(UOps.VECTORIZE, dt.vec(n), tuple(elems))
    uops.append(vec)
    return vec

  a, b, c = gather(da, ia, na, tc.dtype_in), gather(db, ib, nb, tc.dtype_in), gather(dc, ic, nc, tc.dtype_out)
  arg = (str(tc), tc.dims, tc.dtype_in, tc.dtype_out, device, tc.num_threads(), (), (), tc.layout)
  w = UOp(UOps.WMMA, tc.dtype_out.vec(nc), (a, b, c), arg)
  uops.append(w)
  for e in range(nc):
    off = _add(_c(e * lanes), lid)
    idx = UOp(UOps.LOAD, dtypes.int32, (ic, off))
    g = UOp(UOps.GEP, tc.dtype_out, (w,), e)
    uops.extend([off.src[0], off, idx, g, UOp(UOps.STORE, None, (dd, idx, g))])
  return uops


@pytest.mark.parametrize("warps", [1, 2])
@pytest.mark.parametrize("device,tcs,layout,mnk,sizes", TC_CASES, ids=[c[0] for c in TC_CASES])
def test_wmma_matches_matmul(device, tcs, layout, mnk, sizes, warps):
  m, n, k = mnk
  lanes = 32 * warps
  rng = np.random.default_rng(5)
  for tc in tcs():
    if tc.dtype_in not in _NP or tc.dtype_out not in _NP:
      continue
    assert tc.dims == (n, m, k) and tc.elements_per_thread() == sizes and tc.num_threads() == 32
    tin, tout = _NP[tc.dtype_in], _NP[tc.dtype_out]
    # warp w computes its own tile: tiles are stacked along the first axis
    A = rng.standard_normal((warps, m, k)).astype(tin)
    B = rng.standard_normal((warps, k, n)).astype(tin)
    C = rng.standard_normal((warps, m, n)).astype(tout)

    def table(which: str, cnt: int, rows: int, cols: int) -> np.ndarray:
      t = np.zeros((cnt, lanes), np.int32)
      for lane in range(lanes):
        for e in range(cnt):
          r, c = layout(lane % 32, e, which)
          t[e, lane] = (lane // 32) * rows * cols + r * cols + c
      return t
    ta, tb, tcc = table("a", sizes[0], m, k), table("b", sizes[1], k, n), table("c", sizes[2], m, n)
    alloc = PythonAllocator()
    D = np.zeros_like(C)
    bufs = [_buf(alloc, x) for x in (A, B, C, D, ta, tb, tcc)]
    _program(_wmma_kernel(tc, device, sizes, lanes))(*bufs, local_size=(lanes, 1, 1))
    got = _out(alloc, bufs[3], D)
    ref = np.einsum("wmk,wkn->wmn", A.astype(np.float64), B.astype(np.float64)) + C.astype(np.float64)
    tol = 1e-2 if tout == np.float16 else 1e-4
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("device,tcs,layout,mnk,sizes", TC_CASES, ids=[c[0] for c in TC_CASES])
def test_layout_matches_the_documented_one(device, tcs, layout, mnk, sizes):
  # the TensorCore's own layout data, evaluated on ints, is the vendor's documented fragment layout
  for tc in tcs():
    for which, lay, cnt in zip("abc", tc.register_layout(), sizes):
      assert lay.count == cnt
      assert [[lay.coords(lane, e) for e in range(cnt)] for lane in range(32)] == [[layout(lane, e, which) for e in range(cnt)] for lane in range(32)]


def test_wmma_layout_comes_with_the_uop():
  # the device name in the arg does not matter: the layout travels in the WMMA uop, from the TensorCore
  tc = amd_tensor_cores()[0]
  uops = _wmma_kernel(tc, "PYTHON", (16, 16, 8), 32)
  A = np.ones((16, 16), np.float16)
  B = np.full((16, 16), 2, np.float16)
  C = np.zeros((16, 16), np.float32)
  tabs = []
  for which, cnt, cols in (("a", 16, 16), ("b", 16, 16), ("c", 8, 16)):
    t = np.zeros((cnt, 32), np.int32)
    for lane in range(32):
      for e in range(cnt):
        r, c = _rdna3_wmma(lane, e, which)
        t[e, lane] = r * cols + c
    tabs.append(t)
  alloc = PythonAllocator()
  bufs = [_buf(alloc, x) for x in (A, B, C, np.zeros_like(C), *tabs)]
  _program(uops)(*bufs, local_size=(32, 1, 1))
  np.testing.assert_array_equal(_out(alloc, bufs[3], C), np.full((16, 16), 32, np.float32))
  # a WMMA without a layout cannot be emulated, and says so
  bare = TensorCore(tc.dims, tc.dtype_in, tc.dtype_out, tc.threads, tc.thread_local_sizes)
  with pytest.raises(PythonKernelError, match="no register layout"):
    _program(_wmma_kernel(bare, "PYTHON", (16, 16, 8), 32))(*bufs, local_size=(32, 1, 1))


def test_register_layout_checks():
  lay = RegisterLayout(2, rows=(("lane", 4, 0, 1), ("reg", 1, 2, 8)), cols=(("lane", 1, 4, 1),))
  assert lay.coords(13, 1) == (3 + 8, 1)
  with pytest.raises(ValueError):
    RegisterLayout(2, rows=(("warp", 1, 0, 1),), cols=())
  tc = amd_tensor_cores()[0]
  with pytest.raises(ValueError, match="one RegisterLayout for each"):
    TensorCore(tc.dims, tc.dtype_in, tc.dtype_out, tc.threads, tc.thread_local_sizes, layout=tc.layout[:2])
  bare = TensorCore(tc.dims, tc.dtype_in, tc.dtype_out, tc.threads, tc.thread_local_sizes)
  with pytest.raises(ValueError, match="no register layout"):
    bare.register_layout()


def test_wmma_needs_whole_warps():
  tc = metal_tensor_cores()[0]
  uops = _wmma_kernel(tc, "METAL", (2, 2, 2), 16)
  alloc = PythonAllocator()
  bufs = [alloc.alloc(4 * 64) for _ in range(4)] + [alloc.alloc(4 * 32) for _ in range(3)]
  with pytest.raises(PythonKernelError, match="multiple of 32"):
    _program(uops)(*bufs, local_size=(16, 1, 1))


# *** the interpreter's hoisted ALU equals exec_alu ***

from hypothesis import given, settings, strategies as st  # noqa: E402

from tiny.ops import TernaryOps, UnaryOps, exec_alu, python_alu  # noqa: E402
from tiny.runtime.ops_python import lane_alu  # noqa: E402


_ALU_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64,
               dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
_ARITY = {**{op: 1 for op in UnaryOps}, **{op: 2 for op in BinaryOps}, **{op: 3 for op in TernaryOps}}


def _value(dt: DType) -> Any:
  if dt == dtypes.bool:
    return st.booleans()
  if dtypes.is_int(dt):
    lo = 0 if dtypes.is_unsigned(dt) else -2 ** (8 * dt.itemsize - 1)
    return st.integers(lo, 2 ** (8 * dt.itemsize - (0 if dtypes.is_unsigned(dt) else 1)) - 1)
  return st.floats(allow_nan=True, allow_infinity=True, width=32)


@st.composite
def _alu_case(draw: Any) -> Tuple[Any, DType, Tuple[Any, ...]]:
  op = draw(st.sampled_from(sorted((o for o in python_alu if o in _ARITY), key=str)))
  # transcendental ops are only generated for floats (2**x of a huge int never finishes)
  float_only = op in (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, UnaryOps.RECIP)
  dt = draw(st.sampled_from([d for d in _ALU_DTYPES if dtypes.is_float(d) or not float_only]))
  operands = [draw(_value(dt)) for _ in range(_ARITY[op])]
  if op is TernaryOps.WHERE:
    operands[0] = draw(st.booleans())
  if op in (BinaryOps.SHL, BinaryOps.SHR):
    operands[1] = draw(st.integers(0, 8))
  return op, dt, tuple(operands)


def _same(a: Any, b: Any) -> bool:
  return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or (a == b and type(a) is type(b))


@settings(deadline=None)
@given(_alu_case())
def test_lane_alu_equals_exec_alu(case):
  op, dt, operands = case
  try:
    want: Any = exec_alu(op, dt, operands)
  except Exception as e:  # an op that is undefined for these operands must fail the same way
    with pytest.raises(type(e)):
      lane_alu(op, dt)(*operands)
    return
  assert _same(lane_alu(op, dt)(*operands), want)
