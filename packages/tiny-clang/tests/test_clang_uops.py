"""Hand-built linearized UOp kernels (following the UOp contract) rendered for CLANG and LLVM, run, and checked against numpy
and against the PYTHON device (core's UOp interpreter) running the very same UOp list."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType, PtrDType, dtypes
from tiny.ops import BinaryOps, TernaryOps, UnaryOps
from tiny.runtime.ops_python import PythonProgram, PythonRenderer
from tiny.shape.symbolic import Variable

from tiny_clang.settings import THREADS


def glob(i: int, dt: DType, mutable: bool = False) -> UOp:
  return UOp(UOps.DEFINE_GLOBAL, PtrDType(dt), (), (i, mutable))


def const(v: Any, dt: DType = dtypes.int32) -> UOp:
  return UOp(UOps.CONST, dt, (), v)


def alu(op: Any, dt: DType, *src: UOp) -> UOp:
  return UOp(UOps.ALU, dt, tuple(src), op)


def load(buf: UOp, idx: UOp, dt: Optional[DType] = None, gate: Optional[UOp] = None, alt: Optional[UOp] = None) -> UOp:
  assert isinstance(buf.dtype, PtrDType)
  return UOp(UOps.LOAD, dt or buf.dtype.base, (buf, idx) if gate is None else (buf, idx, gate, alt))


def store(buf: UOp, idx: UOp, val: UOp, gate: Optional[UOp] = None) -> UOp:
  return UOp(UOps.STORE, None, (buf, idx, val) if gate is None else (buf, idx, val, gate))


def rng(end: UOp, axis: int = 0, reduce: bool = False, start: Optional[UOp] = None) -> UOp:
  return UOp(UOps.RANGE, dtypes.int32, (start or const(0), end), (axis, reduce))


def endr(r: UOp) -> UOp:
  return UOp(UOps.ENDRANGE, None, (r,))


def lin(*items: UOp) -> List[UOp]:
  """A linearized list: items in the given order, each preceded by those of its sources not listed yet.

  (DEFINE_ACC names the RANGEs it accumulates over but comes before them, as the UOp contract says.)"""
  out: List[UOp] = []
  seen: set = set()

  def add(u: UOp) -> None:
    if id(u) in seen:
      return
    for s in u.src:
      if not (u.op is UOps.DEFINE_ACC and s.op is UOps.RANGE):
        add(s)
    seen.add(id(u))
    out.append(u)
  for it in items:
    add(it)
  return out


def run_python(uops: List[UOp], out: np.ndarray, inputs: Sequence[np.ndarray], vals: Sequence[int] = ()) -> np.ndarray:
  """The PYTHON device's result for the same kernel (the reference interpreter of tiny-core)."""
  src = PythonRenderer().render("ref", uops)
  mvs = [memoryview(bytearray(np.ascontiguousarray(a).tobytes())) for a in [out, *inputs]]
  PythonProgram("ref", src.encode() if isinstance(src, str) else src)(*mvs, vals=tuple(vals))
  return np.frombuffer(bytes(mvs[0]), dtype=out.dtype).reshape(out.shape)


def unary_kernel(dt_in: DType, dt_out: DType, fn: Any, n: UOp) -> List[UOp]:
  """out[i] = fn(in[i]) for i < n."""
  g0, g1 = glob(0, dt_out, True), glob(1, dt_in)
  r = rng(n)
  return lin(g0, g1, r, store(g0, r, fn(load(g1, r))), endr(r))


# *** elementwise, variables, threading ***

def saxpy_kernel() -> List[UOp]:
  n = UOp(UOps.DEFINE_VAR, dtypes.int32, (), Variable("n", 1, 1 << 20))
  g0, g1, g2 = glob(0, dtypes.float32, True), glob(1, dtypes.float32), glob(2, dtypes.float32)
  r = rng(n)
  a, b = load(g1, r), load(g2, r)
  c = const(2.5, dtypes.float32)
  m = alu(BinaryOps.MUL, dtypes.float32, a, c)
  s = alu(BinaryOps.ADD, dtypes.float32, m, b)
  return lin(g0, g1, g2, n, c, r, store(g0, r, s), endr(r))


def test_saxpy_with_variable(backend: Any) -> None:
  x, y = np.random.default_rng(0).random((2, 1000), dtype=np.float32)
  out = np.full(1000, -1, np.float32)
  res = backend.run(saxpy_kernel(), out, [x, y], vals=[777])
  np.testing.assert_allclose(res[:777], x[:777] * 2.5 + y[:777], rtol=1e-6)
  assert (res[777:] == -1).all(), "the kernel wrote past n"


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("n", [1, 2, 5, 1001])
def test_threading_matches_single_core(backend: Any, threads: int, n: int) -> None:
  prg, src = backend.build(saxpy_kernel(), "saxpy")
  assert prg.parallel == 1, src
  x, y = np.random.default_rng(n).random((2, 1001), dtype=np.float32)
  with THREADS.override(1):
    one = backend.run([], np.zeros(1001, np.float32), [x, y], vals=[n], prg=prg)
  with THREADS.override(threads):
    assert prg.threads() == threads
    many = backend.run([], np.zeros(1001, np.float32), [x, y], vals=[n], prg=prg)
  np.testing.assert_array_equal(one, many)
  np.testing.assert_allclose(many[:n], x[:n] * 2.5 + y[:n], rtol=1e-6)


def test_store_outside_loops_is_not_split(backend: Any) -> None:
  # a kernel that writes outside its loops must run on one core, or every core would write
  g0 = glob(0, dtypes.int32, True)
  uops = lin(g0, store(g0, const(0), const(7)))
  prg, _ = backend.build(uops)
  assert prg.parallel == 0
  with THREADS.override(2):
    np.testing.assert_array_equal(backend.run([], np.zeros(1, np.int32), [], prg=prg), [7])


# *** dtypes ***

ALL = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64,
       dtypes.float16, dtypes.float32, dtypes.float64]
NP = {dtypes.bool: np.bool_, dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16, dtypes.uint16: np.uint16,
      dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64, dtypes.uint64: np.uint64, dtypes.float16: np.float16,
      dtypes.float32: np.float32, dtypes.float64: np.float64}


def _sample(dt: DType, n: int, seed: int = 0) -> np.ndarray:
  r = np.random.default_rng(seed)
  if dt == dtypes.bool:
    return r.random(n) > 0.5
  if dtypes.is_int(dt):
    info = np.iinfo(NP[dt])
    return r.integers(max(info.min, -100), min(info.max, 100), n, endpoint=True).astype(NP[dt])
  return (r.standard_normal(n) * 4).astype(NP[dt])


@pytest.mark.parametrize("dt", ALL, ids=str)
def test_binary_ops_every_dtype(backend: Any, dt: DType) -> None:
  """a*b + max(a, b), a<b, a!=b and where(a<b, a, b) per dtype, against numpy and the PYTHON device."""
  n = 67
  a, b = _sample(dt, n, 1), _sample(dt, n, 2)
  g0, g1, g2, g3 = glob(0, dt, True), glob(1, dt), glob(2, dt), glob(3, dtypes.bool, True)
  r = rng(const(n))
  x, y = load(g1, r), load(g2, r)
  mul = alu(BinaryOps.MUL, dt, x, y)
  mx = alu(BinaryOps.MAX, dt, x, y)
  s = alu(BinaryOps.ADD, dt, mul, mx)
  lt = alu(BinaryOps.CMPLT, dtypes.bool, x, y)
  ne = alu(BinaryOps.CMPNE, dtypes.bool, x, y)
  w = alu(TernaryOps.WHERE, dt, lt, x, y)
  both = alu(BinaryOps.ADD, dt, s, w) if dt != dtypes.bool else alu(BinaryOps.OR, dt, s, w)
  flag = alu(BinaryOps.XOR, dtypes.bool, lt, ne)
  uops = lin(g0, g1, g2, g3, r, store(g0, r, both), store(g3, r, flag), endr(r))
  out, flags = np.zeros(n, NP[dt]), np.zeros(n, np.bool_)
  res = backend.run(uops, out, [a, b, flags])
  ref = run_python(uops, out, [a, b, flags])
  with np.errstate(over="ignore"):
    if dt == dtypes.bool:
      npref = (a & b) | np.maximum(a, b) | np.where(a < b, a, b)
    else:
      npref = (a * b + np.maximum(a, b)).astype(NP[dt]) + np.where(a < b, a, b)
  tol = dict(rtol=1e-2, atol=1e-2) if dt == dtypes.float16 else dict(rtol=1e-6, atol=0)
  np.testing.assert_allclose(res.astype(np.float64), npref.astype(np.float64), **tol)
  if dt in (dtypes.float32, dtypes.float64):
    # a*b+c may be one fused multiply-add (contraction is allowed): within an ulp of PYTHON's two roundings
    np.testing.assert_allclose(res, ref, rtol=1e-6)
  elif dt == dtypes.float16:
    # on CPUs with native half arithmetic (AVX512-FP16) the compiler contracts the half a*b+c into one half FMA too;
    # with the following add that is at most two half ulps (2**-9 relative) from PYTHON's per-op rounding
    np.testing.assert_allclose(res.astype(np.float64), ref.astype(np.float64), rtol=2**-8)
  else:
    np.testing.assert_array_equal(res, ref)


@pytest.mark.parametrize("src_dt", ALL, ids=str)
@pytest.mark.parametrize("dst_dt", [dtypes.bool, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.float16, dtypes.float32, dtypes.float64], ids=str)
def test_casts(backend: Any, src_dt: DType, dst_dt: DType) -> None:
  a = _sample(src_dt, 40, 3)
  if dtypes.is_float(src_dt) and dtypes.is_int(dst_dt):
    a = np.abs(a) if dst_dt == dtypes.uint8 else a  # float -> unsigned of a negative value is undefined in C
  uops = unary_kernel(src_dt, dst_dt, lambda x: UOp(UOps.CAST, dst_dt, (x,)), const(40))
  res = backend.run(uops, np.zeros(40, NP[dst_dt]), [a])
  with np.errstate(invalid="ignore"):
    np.testing.assert_array_equal(res, a.astype(NP[dst_dt]))


def _bf16_round(x: np.ndarray) -> np.ndarray:
  u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
  return (u.astype(np.uint32) << 16).view(np.float32)


def test_bfloat16_arithmetic(backend: Any) -> None:
  """bf16 a*b+a: loads widen, every op rounds to bf16 (round to nearest even), stores keep 16 bits."""
  bf = dtypes.bfloat16
  a32, b32 = _bf16_round(np.random.default_rng(4).standard_normal(50).astype(np.float32) * 3), _bf16_round(np.linspace(-3, 3, 50, dtype=np.float32))
  bits = lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
  g0, g1, g2 = glob(0, bf, True), glob(1, bf), glob(2, bf)
  r = rng(const(50))
  x, y = load(g1, r), load(g2, r)
  m = alu(BinaryOps.MUL, bf, x, y)
  s = alu(BinaryOps.ADD, bf, m, x)
  uops = lin(g0, g1, g2, r, store(g0, r, s), endr(r))
  res = backend.run(uops, np.zeros(50, np.uint16), [bits(a32), bits(b32)])
  ref = _bf16_round(_bf16_round(a32 * b32) + a32)
  np.testing.assert_array_equal(res, bits(ref))
  np.testing.assert_array_equal(res, run_python(uops, np.zeros(50, np.uint16), [bits(a32), bits(b32)]))


def test_half_rounds_every_op(backend: Any) -> None:
  """half (x*x)*x: the intermediate product is rounded to half, as IEEE half arithmetic does."""
  h = dtypes.float16
  a = np.linspace(-20, 20, 33).astype(np.float16)
  uops = unary_kernel(h, h, lambda x: alu(BinaryOps.MUL, h, alu(BinaryOps.MUL, h, x, x), x), const(33))
  res = backend.run(uops, np.zeros(33, np.float16), [a])
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(res, (a * a) * a)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.float32, dtypes.float64], ids=str)
@pytest.mark.parametrize("op,npfn,lo,hi", [(UnaryOps.SQRT, np.sqrt, 0.1, 9), (UnaryOps.EXP2, np.exp2, -4, 4), (UnaryOps.LOG2, np.log2, 0.1, 9),
                                           (UnaryOps.SIN, np.sin, -3, 3), (UnaryOps.RECIP, np.reciprocal, 0.5, 4), (UnaryOps.NEG, np.negative, -4, 4)])
def test_unary_float_ops(backend: Any, dt: DType, op: Any, npfn: Any, lo: float, hi: float) -> None:
  a = np.linspace(lo, hi, 45).astype(NP[dt])
  res = backend.run(unary_kernel(dt, dt, lambda x: alu(op, dt, x), const(45)), np.zeros(45, NP[dt]), [a])
  tol = 1e-3 if dt == dtypes.float16 else 1e-6
  np.testing.assert_allclose(res, npfn(a.astype(np.float64)).astype(NP[dt]), rtol=tol, atol=tol)


def test_max_keeps_nan(backend: Any) -> None:
  f = dtypes.float32
  a = np.array([np.nan, 1, -np.inf, np.inf, 0, np.nan], np.float32)
  b = np.array([1, np.nan, 0, np.nan, -0.0, np.nan], np.float32)
  g0, g1, g2 = glob(0, f, True), glob(1, f), glob(2, f)
  r = rng(const(6))
  x, y = load(g1, r), load(g2, r)
  m = alu(BinaryOps.MAX, f, x, y)
  uops = lin(g0, g1, g2, r, store(g0, r, m), endr(r))
  res = backend.run(uops, np.zeros(6, np.float32), [a, b])
  np.testing.assert_array_equal(res, np.maximum(a, b))
  np.testing.assert_array_equal(res, run_python(uops, np.zeros(6, np.float32), [a, b]))


def test_int_division_truncates(backend: Any) -> None:
  """IDIV/MOD round toward zero (C semantics), as the PYTHON device's python_alu does."""
  i = dtypes.int32
  a = np.array([7, -7, 7, -7, 0, 9, -9], np.int32)
  b = np.array([2, 2, -2, -2, 3, 4, 4], np.int32)
  g0, g1, g2, g3 = glob(0, i, True), glob(1, i), glob(2, i), glob(3, i, True)
  r = rng(const(7))
  x, y = load(g1, r), load(g2, r)
  d, m = alu(BinaryOps.IDIV, i, x, y), alu(BinaryOps.MOD, i, x, y)
  uops = lin(g0, g1, g2, g3, r, store(g0, r, d), store(g3, r, m), endr(r))
  res = backend.run(uops, np.zeros(7, np.int32), [a, b, np.zeros(7, np.int32)])
  np.testing.assert_array_equal(res, np.trunc(a / b).astype(np.int32))
  np.testing.assert_array_equal(res, run_python(uops, np.zeros(7, np.int32), [a, b, np.zeros(7, np.int32)]))


@pytest.mark.parametrize("src_dt,dst_dt", [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float16, dtypes.int16),
                                           (dtypes.uint16, dtypes.float16), (dtypes.float64, dtypes.uint64)], ids=str)
def test_bitcast(backend: Any, src_dt: DType, dst_dt: DType) -> None:
  a = _sample(src_dt, 20, 5)
  uops = unary_kernel(src_dt, dst_dt, lambda x: UOp(UOps.BITCAST, dst_dt, (x,)), const(20))
  np.testing.assert_array_equal(backend.run(uops, np.zeros(20, NP[dst_dt]), [a]), a.view(NP[dst_dt]))


# *** vectors, gates, reductions ***

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.int32, dtypes.float64], ids=str)
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_vector_load_store_unaligned(backend: Any, dt: DType, offset: int) -> None:
  """float4-style loads and stores at element (not vector) alignment; lanes swapped with GEP + VECTORIZE."""
  v4 = dt.vec(4)
  g0, g1 = glob(0, dt, True), glob(1, dt)
  r = rng(const(5))
  base = alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, r, const(4)), const(offset))
  v = load(g1, base, v4)
  lanes = [UOp(UOps.GEP, dt, (v,), i) for i in (3, 2, 1, 0)]
  two = const(2, dt)
  dbl = [alu(BinaryOps.MUL, dt, lane, two) for lane in lanes]
  vec = UOp(UOps.VECTORIZE, v4, tuple(dbl))
  added = alu(BinaryOps.ADD, v4, vec, v)
  uops = lin(g0, g1, two, r, store(g0, base, added), endr(r))
  a = _sample(dt, 24, 6)
  res = backend.run(uops, np.zeros(24, NP[dt]), [a])
  ref = np.zeros(24, NP[dt])
  blocks = a[offset:offset + 20].reshape(5, 4)
  ref[offset:offset + 20] = (blocks[:, ::-1] * 2 + blocks).reshape(-1)
  np.testing.assert_array_equal(res, ref)


def test_gated_load_and_store(backend: Any) -> None:
  """out[i] = (i >= 2 ? in[i-2] : -1) for i < 10; stores gated to even i. The gated-off reads at -2, -1 never happen."""
  f = dtypes.float32
  g0, g1 = glob(0, f, True), glob(1, f)
  r = rng(const(10))
  idx = alu(BinaryOps.ADD, dtypes.int32, r, const(-2))
  gate = alu(BinaryOps.CMPLT, dtypes.bool, const(1), r)
  even = alu(BinaryOps.CMPNE, dtypes.bool, alu(BinaryOps.MOD, dtypes.int32, r, const(2)), const(1))
  x = load(g1, idx, gate=gate, alt=const(-1.0, f))
  uops = lin(g0, g1, r, store(g0, r, x, even), endr(r))
  a = np.arange(8, dtype=np.float32) + 100
  res = backend.run(uops, np.full(10, 7, np.float32), [a])
  ref = np.full(10, 7, np.float32)
  ref[0::2] = [-1, 100, 102, 104, 106]
  np.testing.assert_array_equal(res, ref)
  np.testing.assert_array_equal(res, run_python(uops, np.full(10, 7, np.float32), [a]))


def reduce_kernel(rows: int, cols: int, op: Any = BinaryOps.ADD, init: float = 0.0, unroll: int = 1) -> List[UOp]:
  """out[i] = reduce_j in[i, j] with a DEFINE_ACC/PHI accumulator, the reduce loop optionally unrolled `unroll` times."""
  f = dtypes.float32
  g0, g1 = glob(0, f, True), glob(1, f)
  r0 = rng(const(rows))
  r1 = rng(const(cols // unroll), axis=1, reduce=True)
  acc = UOp(UOps.DEFINE_ACC, f, (const(init, f), r1), (0,))
  row = alu(BinaryOps.MUL, dtypes.int32, r0, const(cols))
  val: UOp = acc
  for k in range(unroll):
    col = alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, r1, const(unroll)), const(k))
    val = alu(op, f, val, load(g1, alu(BinaryOps.ADD, dtypes.int32, row, col)))
  phi = UOp(UOps.PHI, f, (acc, val))
  return lin(g0, g1, r0, row, acc, r1, phi, endr(r1), store(g0, r0, phi), endr(r0))


@pytest.mark.parametrize("unroll", [1, 4])
@pytest.mark.parametrize("op,init,npfn", [(BinaryOps.ADD, 0.0, np.sum), (BinaryOps.MAX, -np.inf, np.max)])
def test_reduction(backend: Any, unroll: int, op: Any, init: float, npfn: Any) -> None:
  a = np.random.default_rng(7).standard_normal((6, 1024)).astype(np.float32)
  uops = reduce_kernel(6, 1024, op, init, unroll)
  prg, src = backend.build(uops)
  res = backend.run([], np.zeros(6, np.float32), [a], prg=prg)
  np.testing.assert_allclose(res, npfn(a.astype(np.float64), axis=1), rtol=1e-5, atol=1e-4)
  if backend.name == "CLANG" and op is BinaryOps.ADD:
    assert "#pragma omp simd reduction(+:acc0)" in src, src
  if backend.name == "CLANG" and op is BinaryOps.MAX:
    assert "#pragma omp simd" not in src, "max reductions must keep NaN semantics: no OpenMP reduction"


def test_max_reduction_keeps_nan(backend: Any) -> None:
  a = np.random.default_rng(8).standard_normal((3, 64)).astype(np.float32)
  a[1, 17] = np.nan
  res = backend.run(reduce_kernel(3, 64, BinaryOps.MAX, -np.inf, 4), np.zeros(3, np.float32), [a])
  np.testing.assert_array_equal(np.isnan(res), [False, True, False])


_fuzz_cache: Dict[Any, Any] = {}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.sampled_from([1, 3, 8]), cols=st.sampled_from([4, 12, 64]), threads=st.integers(1, 4))
def test_reduction_fuzz_threads(make_backend: Any, rows: int, cols: int, threads: int) -> None:
  for name in ("CLANG", "LLVM"):
    if (name, rows, cols) not in _fuzz_cache:
      be = make_backend(name)
      _fuzz_cache[(name, rows, cols)] = (be, be.build(reduce_kernel(rows, cols, unroll=4))[0])
    be, prg = _fuzz_cache[(name, rows, cols)]
    a = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32)
    with THREADS.override(threads):
      res = be.run([], np.zeros(rows, np.float32), [a], prg=prg)
    np.testing.assert_allclose(res, a.sum(1), rtol=1e-5, atol=1e-5)


def test_if_endif(backend: Any) -> None:
  i = dtypes.int32
  g0 = glob(0, i, True)
  r = rng(const(8))
  cond = alu(BinaryOps.CMPLT, dtypes.bool, r, const(3))
  iff = UOp(UOps.IF, None, (cond,))
  uops = lin(g0, r, iff, store(g0, r, r), UOp(UOps.ENDIF, None, (iff,)), endr(r))
  np.testing.assert_array_equal(backend.run(uops, np.full(8, -1, np.int32), []), [0, 1, 2, -1, -1, -1, -1, -1])


def test_special_values_constants(backend: Any) -> None:
  f = dtypes.float32
  g0 = glob(0, f, True)
  vals = [np.inf, -np.inf, np.nan, -0.0, 1e-45, 3.4028235e38]
  uops = lin(g0, *[store(g0, const(k), const(v, f)) for k, v in enumerate(vals)])
  res = backend.run(uops, np.zeros(len(vals), np.float32), [])
  np.testing.assert_array_equal(res, np.array(vals, np.float32))
  assert np.signbit(res[3])

