"""Hand-built linearized kernels, run on the PYTHON device and rendered by a CStyleLanguage subclass compiled with gcc.

Both backends are checked against numpy. The C subclass here is test-only: it renders a GPU-style kernel
(SPECIAL thread indices, shared memory, barriers) as an OpenMP parallel region, one OpenMP thread per
workgroup thread, so the generic CStyleLanguage walk is exercised end to end on a CPU.
"""
from __future__ import annotations

import ctypes
import math
import os
import shutil
import subprocess
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType, PtrDType, dtypes
from tiny.ops import BinaryOps, TernaryOps, UnaryOps
from tiny.renderer.cstyle import CStyleLanguage
from tiny.runtime.ops_python import PythonAllocator, PythonCompiler, PythonProgram, PythonRenderer

# *** a gcc renderer for the tests ***


class GccTestRenderer(CStyleLanguage):
  """GPU-style C: the launch grid position comes in as arguments, workgroup threads are OpenMP threads."""

  device = "GCCTEST"
  barrier = "#pragma omp barrier"
  smem_align = "__attribute__((aligned(16))) "
  smem_prefix = "static "  # static locals in a parallel region are shared by its threads
  smem_prefix_for_cast = False  # `static` is a storage class, not part of a pointer type
  float4 = "(float4)"
  code_for_workitem = {
    "g": lambda d: f"_g{'xyz'[d]}",
    "l": lambda d: ["(_tid%_lx)", "((_tid/_lx)%_ly)", "(_tid/(_lx*_ly))"][d],
    "i": lambda d: f"(_g{'xyz'[d]}*_l{'xyz'[d]}+" + ["(_tid%_lx)", "((_tid/_lx)%_ly)", "(_tid/(_lx*_ly))"][d] + ")",
  }
  extra_args = ["int _gx", "int _gy", "int _gz", "int _lx", "int _ly", "int _lz"]
  type_map = {dtypes.float16: "_Float16"}

  def render_vectorize(self, x: List[str], var_dtype: DType) -> str:
    return f"(({self.render_dtype(var_dtype)}){{{','.join(x)}}})"

  def render_gep(self, vec: str, idx: int, vec_dtype: DType) -> str:
    return f"{vec}[{idx}]"

  def render_kernel(self, function_name, kernel, bufs, uops, prefix=None):
    vecs = {u.dtype for u in uops if u.dtype is not None and u.dtype.count > 1 and not isinstance(u.dtype, PtrDType)}
    pre = ["#include <math.h>", "#include <stdbool.h>", "#include <omp.h>", "#define max(a,b) (((a)>(b))?(a):(b))"]
    for v in sorted(vecs, key=lambda d: d.name):
      s = v.scalar()
      pre.append(f"typedef {self.render_dtype(s)} {v.name} __attribute__((vector_size({v.itemsize}), aligned({s.itemsize})));")
    body = ["#pragma omp parallel num_threads(_lx*_ly*_lz)", "{", "  int _tid = omp_get_thread_num();", *kernel, "}"]
    return super().render_kernel(function_name, body, bufs, uops, pre)


def gcc_available() -> bool:
  return shutil.which("gcc") is not None


class GccKernel:
  """Compiles rendered source with gcc and runs it over a launch grid on numpy arrays."""

  def __init__(self, src: str, name: str):
    self.src = src
    with tempfile.TemporaryDirectory() as d:
      cpath, sopath = os.path.join(d, "k.c"), os.path.join(d, "k.so")
      with open(cpath, "w") as f:
        f.write(src)
      res = subprocess.run(["gcc", "-shared", "-O2", "-fPIC", "-fopenmp", "-fno-strict-aliasing", "-o", sopath, cpath, "-lm"],
                           capture_output=True, text=True)
      if res.returncode != 0:
        raise AssertionError(f"gcc failed:\n{res.stderr}\n{src}")
      self.lib = ctypes.CDLL(sopath)
    self.fxn = getattr(self.lib, name)

  def __call__(self, arrays: Sequence[np.ndarray], global_size=(1, 1, 1), local_size=(1, 1, 1), vals: Sequence[int] = ()):
    ptrs = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
    ints = [ctypes.c_int(v) for v in vals]
    for gz in range(global_size[2]):
      for gy in range(global_size[1]):
        for gx in range(global_size[0]):
          self.fxn(*ptrs, *ints, *(ctypes.c_int(x) for x in (gx, gy, gz, *local_size)))


# *** uop builders ***

def glob(idx: int, dt: DType, mutable: bool = False) -> UOp:
  return UOp(UOps.DEFINE_GLOBAL, PtrDType(dt), (), (idx, mutable))


def const(v: Any, dt: DType = dtypes.int32) -> UOp:
  return UOp(UOps.CONST, dt, (), v)


def alu(op: Any, dt: DType, *src: UOp) -> UOp:
  return UOp(UOps.ALU, dt, tuple(src), op)


def load(buf: UOp, idx: UOp, dt: Optional[DType] = None, gate: Optional[UOp] = None, alt: Optional[UOp] = None, *extra: UOp) -> UOp:
  src = (buf, idx) + ((gate, alt) if gate is not None else ()) + extra
  return UOp(UOps.LOAD, dt or buf.dtype.base, src)


def store(buf: UOp, idx: UOp, val: UOp, gate: Optional[UOp] = None) -> UOp:
  return UOp(UOps.STORE, None, (buf, idx, val) + ((gate,) if gate is not None else ()))


def special(dim: int, name: str, size: int) -> UOp:
  return UOp(UOps.SPECIAL, dtypes.int32, (), (dim, name, size))


def linearize(*roots: UOp, after: Optional[List[UOp]] = None) -> List[UOp]:
  """Append roots (and whatever they need that is not there yet) to `after` in topological order.

  The order the test lists its roots is kept, which is all these straight-line kernels need; loop ends are
  appended by the tests themselves.
  """
  out: List[UOp] = list(after) if after is not None else []
  seen = set(out)

  def visit(u: UOp) -> None:
    if u in seen:
      return
    seen.add(u)
    for s in u.src:
      if u.op is UOps.DEFINE_ACC and s.op is UOps.RANGE:
        continue  # the accumulator is declared before its loops open
      visit(s)
    out.append(u)
  for r in roots:
    visit(r)
  return out


# *** running on both backends ***

def run_python(uops: List[UOp], arrays: Sequence[np.ndarray], global_size=(1, 1, 1), local_size=(1, 1, 1), vals: Sequence[int] = ()) -> None:
  src = PythonRenderer().render("k", uops)
  prg = PythonProgram("k", PythonCompiler().compile(src))
  alloc = PythonAllocator()
  bufs = []
  for a in arrays:
    b = alloc.alloc(a.nbytes)
    alloc.copyin(b, memoryview(a.tobytes()))
    bufs.append(b)
  prg(*bufs, global_size=global_size, local_size=local_size, vals=tuple(vals))
  for a, b in zip(arrays, bufs):
    out = bytearray(a.nbytes)
    alloc.copyout(memoryview(out), b)
    a[...] = np.frombuffer(out, dtype=a.dtype).reshape(a.shape)


def run_gcc(uops: List[UOp], arrays: Sequence[np.ndarray], global_size=(1, 1, 1), local_size=(1, 1, 1), vals: Sequence[int] = ()) -> str:
  if not gcc_available():
    pytest.skip("gcc is not installed")
  src = GccTestRenderer().render("k", uops)
  GccKernel(src, "k")(arrays, global_size, local_size, vals)
  return src


BACKENDS: Dict[str, Callable[..., Any]] = {"python": run_python, "gcc": run_gcc}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: Any) -> Callable[..., Any]:
  return BACKENDS[request.param]


# *** kernels ***

def test_elementwise(backend):
  n = 13
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  out = np.zeros(n, np.float32)
  d0, d1, d2 = glob(0, dtypes.float32, True), glob(1, dtypes.float32), glob(2, dtypes.float32)
  i = special(0, "gidx0", n)
  val = alu(BinaryOps.ADD, dtypes.float32, alu(BinaryOps.MUL, dtypes.float32, load(d1, i), load(d2, i)), const(1.5, dtypes.float32))
  val = alu(BinaryOps.MAX, dtypes.float32, val, alu(UnaryOps.NEG, dtypes.float32, val))  # |x|
  backend(linearize(store(d0, i, val)), [out, a, b], global_size=(n, 1, 1))
  np.testing.assert_allclose(out, np.abs(a * b + np.float32(1.5)), rtol=1e-6)


def test_unary_math(backend):
  n = 8
  a = np.linspace(0.25, 3.0, n).astype(np.float32)
  outs = [np.zeros(n, np.float32) for _ in range(5)]
  bufs = [glob(i, dtypes.float32, True) for i in range(5)]
  src = glob(5, dtypes.float32)
  i = special(0, "gidx0", n)
  x = load(src, i)
  ops = [UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, UnaryOps.RECIP]
  stores = [store(b, i, alu(op, dtypes.float32, x)) for b, op in zip(bufs, ops)]
  backend(linearize(*stores), [*outs, a], global_size=(n, 1, 1))
  refs = [np.exp2(a), np.log2(a), np.sin(a), np.sqrt(a), 1 / a]
  for o, r in zip(outs, refs):
    np.testing.assert_allclose(o, r, rtol=1e-5)


def test_int_ops(backend):
  n = 16
  a = np.arange(-8, 8, dtype=np.int32) * 7
  b = np.array([3, -3, 5, 2, 7, -2, 4, 9] * 2, dtype=np.int32)
  outs = [np.zeros(n, np.int32) for _ in range(7)]
  bufs = [glob(k, dtypes.int32, True) for k in range(7)]
  da, db = glob(7, dtypes.int32), glob(8, dtypes.int32)
  i = special(0, "gidx0", n)
  x, y = load(da, i), load(db, i)
  vals = [alu(BinaryOps.IDIV, dtypes.int32, x, y), alu(BinaryOps.MOD, dtypes.int32, x, y), alu(BinaryOps.XOR, dtypes.int32, x, y),
          alu(BinaryOps.AND, dtypes.int32, x, y), alu(BinaryOps.OR, dtypes.int32, x, y),
          alu(BinaryOps.SHL, dtypes.int32, x, const(2)), alu(TernaryOps.MULACC, dtypes.int32, x, y, const(-3))]
  backend(linearize(*[store(bf, i, v) for bf, v in zip(bufs, vals)]), [*outs, a, b], global_size=(n, 1, 1))
  # C semantics: division truncates toward zero, the remainder takes the dividend's sign
  np.testing.assert_array_equal(outs[0], np.trunc(a / b).astype(np.int32))
  np.testing.assert_array_equal(outs[1], np.fmod(a, b))
  np.testing.assert_array_equal(outs[2], a ^ b)
  np.testing.assert_array_equal(outs[3], a & b)
  np.testing.assert_array_equal(outs[4], a | b)
  np.testing.assert_array_equal(outs[5], a << 2)
  np.testing.assert_array_equal(outs[6], a * b - 3)


def test_compare_where_cast(backend):
  n = 10
  a = np.linspace(-2.5, 2.5, n).astype(np.float32)
  out_f, out_i, out_b = np.zeros(n, np.float32), np.zeros(n, np.int32), np.zeros(n, np.bool_)
  d0, d1, d2, d3 = glob(0, dtypes.float32, True), glob(1, dtypes.int32, True), glob(2, dtypes.bool, True), glob(3, dtypes.float32)
  i = special(0, "gidx0", n)
  x = load(d3, i)
  lt = alu(BinaryOps.CMPLT, dtypes.bool, x, const(0.0, dtypes.float32))
  relu = alu(TernaryOps.WHERE, dtypes.float32, lt, const(0.0, dtypes.float32), x)
  scaled = alu(BinaryOps.MUL, dtypes.float32, x, const(3.7, dtypes.float32))
  as_int = UOp(UOps.CAST, dtypes.int32, (scaled,))
  ne = alu(BinaryOps.CMPNE, dtypes.bool, as_int, const(0))
  backend(linearize(store(d0, i, relu), store(d1, i, as_int), store(d2, i, ne)), [out_f, out_i, out_b, a], global_size=(n, 1, 1))
  np.testing.assert_allclose(out_f, np.maximum(a, 0))
  ref_int = (a * np.float32(3.7)).astype(np.int32)
  np.testing.assert_array_equal(out_i, ref_int)
  np.testing.assert_array_equal(out_b, ref_int != 0)


def test_bitcast(backend):
  a = np.array([1.0, -2.5, 3.25e-3, np.inf], dtype=np.float32)
  out = np.zeros(4, np.int32)
  d0, d1 = glob(0, dtypes.int32, True), glob(1, dtypes.float32)
  i = special(0, "gidx0", 4)
  backend(linearize(store(d0, i, UOp(UOps.BITCAST, dtypes.int32, (load(d1, i),)))), [out, a], global_size=(4, 1, 1))
  np.testing.assert_array_equal(out, a.view(np.int32))


def test_special_constants(backend):
  out = np.zeros(6, np.float32)
  d0 = glob(0, dtypes.float32, True)
  vals = [math.inf, -math.inf, math.nan, -0.5, 1e-30, 3]
  backend(linearize(*[store(d0, const(k), const(v, dtypes.float32)) for k, v in enumerate(vals)]), [out])
  np.testing.assert_array_equal(out[[0, 1, 3, 4, 5]], np.array([np.inf, -np.inf, -0.5, 1e-30, 3.0], np.float32))
  assert np.isnan(out[2])


def test_int_constants(backend):
  out32, out64, outu = np.zeros(2, np.int32), np.zeros(2, np.int64), np.zeros(2, np.uint32)
  d0, d1, d2 = glob(0, dtypes.int32, True), glob(1, dtypes.int64, True), glob(2, dtypes.uint32, True)
  st = [store(d0, const(0), const(-2**31)), store(d0, const(1), const(2**31 - 1)),
        store(d1, const(0), const(-2**63, dtypes.int64)), store(d1, const(1), const(2**40 + 3, dtypes.int64)),
        store(d2, const(0), const(2**32 - 1, dtypes.uint32)), store(d2, const(1), const(7, dtypes.uint32))]
  backend(linearize(*st), [out32, out64, outu])
  np.testing.assert_array_equal(out32, [-2**31, 2**31 - 1])
  np.testing.assert_array_equal(out64, [-2**63, 2**40 + 3])
  np.testing.assert_array_equal(outu, [2**32 - 1, 7])


def test_half_buffers(backend):
  n = 6
  a = np.array([0.1, -2.0, 65504.0, 3.14159, 1e-4, -7.5], np.float16)
  out = np.zeros(n, np.float16)
  d0, d1 = glob(0, dtypes.float16, True), glob(1, dtypes.float16)
  i = special(0, "gidx0", n)
  x = load(d1, i)
  # compute in float, round back to half on the way out
  xf = UOp(UOps.CAST, dtypes.float32, (x,))
  y = UOp(UOps.CAST, dtypes.float16, (alu(BinaryOps.MUL, dtypes.float32, xf, const(0.5, dtypes.float32)),))
  backend(linearize(store(d0, i, y)), [out, a], global_size=(n, 1, 1))
  np.testing.assert_array_equal(out, (a.astype(np.float32) * np.float32(0.5)).astype(np.float16))


def reduce_kernel(n: int, k: int, dt: DType, op: Any, init: Any) -> List[UOp]:
  """out[i] = reduce_j a[i*k + j] with an accumulator over a RANGE."""
  d0, d1 = glob(0, dt, True), glob(1, dt)
  i = special(0, "gidx0", n)
  rng = UOp(UOps.RANGE, dtypes.int32, (const(0), const(k)), (1, True))
  acc = UOp(UOps.DEFINE_ACC, dt, (const(init, dt), rng), (0,))
  idx = alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, i, const(k)), rng)
  phi = UOp(UOps.PHI, dt, (acc, alu(op, dt, acc, load(d1, idx))))
  end = UOp(UOps.ENDRANGE, None, (rng,))
  st = store(d0, i, phi)
  uops = linearize(st)
  # ENDRANGE goes right after the PHI: the loop body is everything between
  uops.insert(uops.index(phi) + 1, end)
  return uops


@pytest.mark.parametrize("dt,op,init,npred", [(dtypes.float32, BinaryOps.ADD, 0.0, np.sum), (dtypes.float32, BinaryOps.MAX, -math.inf, np.max),
                                              (dtypes.int32, BinaryOps.ADD, 0, np.sum)])
def test_loop_accumulator(backend, dt, op, init, npred):
  n, k = 5, 7
  npdt = np.float32 if dt == dtypes.float32 else np.int32
  a = (np.random.default_rng(1).standard_normal(n * k) * 10).astype(npdt)
  out = np.zeros(n, npdt)
  backend(reduce_kernel(n, k, dt, op, init), [out, a], global_size=(n, 1, 1))
  np.testing.assert_allclose(out, npred(a.reshape(n, k), axis=1), rtol=1e-5)


def test_empty_loop_keeps_init(backend):
  out = np.full(3, 7, np.float32)
  a = np.ones(4, np.float32)
  uops = reduce_kernel(3, 0, dtypes.float32, BinaryOps.ADD, 0.0)
  backend(uops, [out, a], global_size=(3, 1, 1))
  np.testing.assert_array_equal(out, np.zeros(3, np.float32))


def test_nested_loops_two_accumulators(backend):
  # out[0] = sum_ij a[i, j] * b[j]; out[1] = max_ij a[i, j] over an outer and an inner loop, with a symbolic-free 2d index
  r, c = 4, 6
  rng_ = np.random.default_rng(2)
  a, b = rng_.standard_normal((r, c)).astype(np.float32), rng_.standard_normal(c).astype(np.float32)
  out = np.zeros(2, np.float32)
  d0, d1, d2 = glob(0, dtypes.float32, True), glob(1, dtypes.float32), glob(2, dtypes.float32)
  ri = UOp(UOps.RANGE, dtypes.int32, (const(0), const(r)), (0, True))
  rj = UOp(UOps.RANGE, dtypes.int32, (const(0), const(c)), (1, True))
  acc_s = UOp(UOps.DEFINE_ACC, dtypes.float32, (const(0.0, dtypes.float32), ri, rj), (0,))
  acc_m = UOp(UOps.DEFINE_ACC, dtypes.float32, (const(-math.inf, dtypes.float32), ri, rj), (1,))
  x = load(d1, alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, ri, const(c)), rj))
  phi_s = UOp(UOps.PHI, dtypes.float32, (acc_s, alu(TernaryOps.MULACC, dtypes.float32, x, load(d2, rj), acc_s)))
  phi_m = UOp(UOps.PHI, dtypes.float32, (acc_m, alu(BinaryOps.MAX, dtypes.float32, acc_m, x)))
  uops = linearize(acc_s, acc_m, ri, rj, phi_s, phi_m)
  uops += [UOp(UOps.ENDRANGE, None, (rj,)), UOp(UOps.ENDRANGE, None, (ri,))]
  uops = linearize(store(d0, const(0), phi_s), store(d0, const(1), phi_m), after=uops)
  backend(uops, [out, a, b])
  np.testing.assert_allclose(out, [np.sum(a * b[None, :]), np.max(a)], rtol=1e-5)


def test_gated_load_and_store(backend):
  # out[i] = a[i-2] if 2 <= i < n+2 else -1 (a pad); a second output is written only on even i
  n, pad = 6, 2
  total = n + 2 * pad
  a = np.arange(1, n + 1, dtype=np.float32)
  out, even = np.zeros(total, np.float32), np.full(total, 9, np.float32)
  d0, d1, d2 = glob(0, dtypes.float32, True), glob(1, dtypes.float32, True), glob(2, dtypes.float32)
  i = special(0, "gidx0", total)
  ge = alu(UnaryOps.NEG, dtypes.bool, alu(BinaryOps.CMPLT, dtypes.bool, i, const(pad)))
  lt = alu(BinaryOps.CMPLT, dtypes.bool, i, const(n + pad))
  gate = alu(BinaryOps.AND, dtypes.bool, ge, lt)
  x = load(d2, alu(BinaryOps.ADD, dtypes.int32, i, const(-pad)), dtypes.float32, gate, const(-1.0, dtypes.float32))
  is_even = alu(BinaryOps.CMPNE, dtypes.bool, alu(BinaryOps.MOD, dtypes.int32, i, const(2)), const(1))
  backend(linearize(store(d0, i, x), store(d1, i, x, is_even)), [out, even, a], global_size=(total, 1, 1))
  ref = np.pad(a, pad, constant_values=-1)
  np.testing.assert_array_equal(out, ref)
  np.testing.assert_array_equal(even, np.where(np.arange(total) % 2 == 0, ref, 9))


def test_vector_load_store(backend):
  # float4 loads, per-element math through GEP, rebuilt with VECTORIZE and stored as a float4; plus a float4 accumulator
  n = 5
  a = np.random.default_rng(3).standard_normal(4 * n).astype(np.float32)
  out = np.zeros(4 * n, np.float32)
  f4 = dtypes.float32.vec(4)
  d0, d2 = glob(0, dtypes.float32, True), glob(1, dtypes.float32)
  i = special(0, "gidx0", n)
  base = alu(BinaryOps.MUL, dtypes.int32, i, const(4))
  v = load(d2, base, f4)
  elems = [alu(BinaryOps.MUL, dtypes.float32, UOp(UOps.GEP, dtypes.float32, (v,), k), const(float(k + 1), dtypes.float32)) for k in range(4)]
  vec = UOp(UOps.VECTORIZE, f4, tuple(elems))
  st = store(d0, base, vec)
  backend(linearize(st), [out, a], global_size=(n, 1, 1))
  np.testing.assert_allclose(out, (a.reshape(n, 4) * np.arange(1, 5, dtype=np.float32)).reshape(-1), rtol=1e-6)


def test_vector_accumulator(backend):
  # sums[0:4] = sum over rows of a (n x 4) with a float4 DEFINE_ACC, stored with one vector store
  n = 6
  a = np.random.default_rng(4).standard_normal(4 * n).astype(np.float32)
  out = np.zeros(4, np.float32)
  f4 = dtypes.float32.vec(4)
  d0, d1 = glob(0, dtypes.float32, True), glob(1, dtypes.float32)
  rng = UOp(UOps.RANGE, dtypes.int32, (const(0), const(n)), (0, True))
  acc = UOp(UOps.DEFINE_ACC, f4, (const(0.0, dtypes.float32), rng), (0,))
  v = load(d1, alu(BinaryOps.MUL, dtypes.int32, rng, const(4)), f4)
  new = UOp(UOps.VECTORIZE, f4, tuple(alu(BinaryOps.ADD, dtypes.float32, UOp(UOps.GEP, dtypes.float32, (acc,), k),
                                          UOp(UOps.GEP, dtypes.float32, (v,), k)) for k in range(4)))
  phi = UOp(UOps.PHI, f4, (acc, new))
  uops = linearize(d0, d1, acc, rng, phi)
  uops = linearize(UOp(UOps.ENDRANGE, None, (rng,)), store(d0, const(0), phi), after=uops)
  backend(uops, [out, a])
  np.testing.assert_allclose(out, a.reshape(n, 4).sum(axis=0), rtol=1e-5)


def test_shared_memory_barrier(backend):
  # each workgroup of 8 threads stages its slice in shared memory, then reads it reversed; thread 0 also sums it in a loop
  groups, lsz = 3, 8
  a = np.arange(groups * lsz, dtype=np.float32) * 1.5
  out, sums = np.zeros(groups * lsz, np.float32), np.zeros(groups, np.float32)
  d0, d1, d2 = glob(0, dtypes.float32, True), glob(1, dtypes.float32, True), glob(2, dtypes.float32)
  g, lid = special(0, "gidx0", groups), special(0, "lidx0", lsz)
  smem = UOp(UOps.DEFINE_LOCAL, PtrDType(dtypes.float32, True), (), ("temp0", lsz))
  gidx = alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, g, const(lsz)), lid)
  st_local = store(smem, lid, load(d2, gidx))
  bar = UOp(UOps.BARRIER, None, (st_local,))
  rev = alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, lid, const(-1)), const(lsz - 1))
  rd = load(smem, rev, dtypes.float32, None, None, bar)
  st_rev = store(d0, gidx, rd)
  rng = UOp(UOps.RANGE, dtypes.int32, (const(0), const(lsz)), (1, True))
  acc = UOp(UOps.DEFINE_ACC, dtypes.float32, (const(0.0, dtypes.float32), rng), (0,))
  phi = UOp(UOps.PHI, dtypes.float32, (acc, alu(BinaryOps.ADD, dtypes.float32, acc, load(smem, rng, dtypes.float32, None, None, bar))))
  uops = linearize(st_rev, acc, rng, phi)
  uops += [UOp(UOps.ENDRANGE, None, (rng,))]
  uops = linearize(store(d1, g, phi, alu(BinaryOps.CMPLT, dtypes.bool, lid, const(1))), after=uops)
  backend(uops, [out, sums, a], global_size=(groups, 1, 1), local_size=(lsz, 1, 1))
  np.testing.assert_array_equal(out, a.reshape(groups, lsz)[:, ::-1].reshape(-1))
  np.testing.assert_allclose(sums, a.reshape(groups, lsz).sum(axis=1), rtol=1e-6)


def test_if_block_and_local_dims(backend):
  # a 2d workgroup (4 x 2) inside a 2d grid; only threads with lidx1 == 0 store, inside an IF block
  gx, gy, lx, ly = 3, 2, 4, 2
  out = np.full((gy, ly, gx, lx), -1, np.int32)
  d0 = glob(0, dtypes.int32, True)
  g0, g1, l0, l1 = special(0, "gidx0", gx), special(1, "gidx1", gy), special(0, "lidx0", lx), special(1, "lidx1", ly)
  # flat index of out[g1, l1, g0, l0]
  idx = alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, g1, const(ly * gx * lx)),
            alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, l1, const(gx * lx)),
                alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, g0, const(lx)), l0)))
  val = alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, g0, const(100)), alu(BinaryOps.MUL, dtypes.int32, g1, const(10)))
  val = alu(BinaryOps.ADD, dtypes.int32, val, l0)
  cond = alu(BinaryOps.CMPLT, dtypes.bool, l1, const(1))
  iff = UOp(UOps.IF, None, (cond,))
  st = store(d0, idx, val)
  uops = linearize(d0, g0, g1, l0, l1, cond, iff, idx, val, st)
  uops.append(UOp(UOps.ENDIF, None, (iff,)))
  backend(uops, [out], global_size=(gx, gy, 1), local_size=(lx, ly, 1))
  ref = np.full((gy, ly, gx, lx), -1, np.int32)
  for a in range(gy):
    for c in range(gx):
      for d in range(lx):
        ref[a, 0, c, d] = c * 100 + a * 10 + d
  np.testing.assert_array_equal(out, ref)


def test_symbolic_variable(backend):
  symbolic = pytest.importorskip("tiny.shape.symbolic", reason="tiny.shape.symbolic (shape helper) is not there yet")
  n = 10
  var_b, var_a = symbolic.Variable("b", 1, 10), symbolic.Variable("a", 1, 10)
  a = np.arange(n, dtype=np.int32)
  out = np.zeros(n, np.int32)
  d0, d1 = glob(0, dtypes.int32, True), glob(1, dtypes.int32)
  vb, va = UOp(UOps.DEFINE_VAR, dtypes.int32, (), var_b), UOp(UOps.DEFINE_VAR, dtypes.int32, (), var_a)
  i = special(0, "gidx0", n)
  val = alu(BinaryOps.ADD, dtypes.int32, alu(BinaryOps.MUL, dtypes.int32, load(d1, i), vb), va)
  # the variables are passed sorted by name: a first, then b
  backend(linearize(d0, d1, vb, va, store(d0, i, val)), [out, a], global_size=(n, 1, 1), vals=(3, 5))
  np.testing.assert_array_equal(out, a * 5 + 3)


# *** kernels from the kernel compiler (Kernel -> linearized uops), rendered for gcc ***

def _codegen_cases() -> Dict[str, Tuple[Any, List[np.ndarray], np.ndarray]]:
  from tiny.ops import BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
  from tiny.shape.shapetracker import ShapeTracker as ST
  f32 = dtypes.float32
  r = np.random.default_rng(7)

  def ld(i: int, st: Any) -> Any:
    return LazyOp(BufferOps.LOAD, (), MemBuffer(i, f32, st))

  def kern(val: Any, shape: Tuple[int, ...]) -> Any:
    return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (val,), MemBuffer(0, f32, ST.from_shape(shape))),))
  a, b = r.random((8, 12), dtype=np.float32), r.random((12, 4), dtype=np.float32)
  sa = ST.from_shape((8, 12)).reshape((8, 1, 12)).expand((8, 4, 12))
  sb = ST.from_shape((12, 4)).permute((1, 0)).reshape((1, 4, 12)).expand((8, 4, 12))
  mm = LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (ld(1, sa), ld(2, sb))),), (2,))
  x = r.random((6, 8), dtype=np.float32) - 0.5
  sp = ST.from_shape((6, 8)).pad(((1, 2), (0, 3)))
  padded = LazyOp(UnaryOps.EXP2, (ld(1, sp),))
  e = r.random((16, 8), dtype=np.float32)
  s = ST.from_shape((16, 8))
  return {
    "matmul": (kern(mm, (8, 4, 1)), [a, b], (a @ b)[:, :, None]),
    "pad_max": (kern(LazyOp(ReduceOps.MAX, (padded,), (1,)), (9, 1)), [x], np.exp2(np.pad(x, ((1, 2), (0, 3)))).max(1, keepdims=True)),
    "elementwise": (kern(LazyOp(TernaryOps.WHERE, (LazyOp(BinaryOps.CMPLT, (ld(1, s), ld(2, s))), ld(1, s), ld(2, s))), (16, 8)),
                    [e, e[::-1].copy()], np.where(e < e[::-1], e, e[::-1])),
  }


def _opt_lists() -> List[Any]:
  from tiny.codegen.kernel import Opt, OptOps
  return [[], "hand", [Opt(OptOps.UPCAST, 0, 4)], [Opt(OptOps.UNROLL, 0, 4)], [Opt(OptOps.LOCAL, 0, 2)], [Opt(OptOps.GROUP, 0, 4)],
          [Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.UPCAST, 0, 2)], [Opt(OptOps.GROUPTOP, 0, 4), Opt(OptOps.UPCAST, 0, 4)],
          [Opt(OptOps.UPCAST, 0, 3)], [Opt(OptOps.UNROLL, 0, 0)], [Opt(OptOps.LOCAL, 0, 3), Opt(OptOps.UNROLL, 0, 0)]]


@pytest.mark.parametrize("case", ["matmul", "pad_max", "elementwise"])
def test_codegen_kernels_through_gcc(case):
  kernel_mod = pytest.importorskip("tiny.codegen.kernel", reason="the kernel compiler (codegen helper) is not there")
  from tiny.helpers import to_function_name
  if not gcc_available():
    pytest.skip("gcc is not installed")
  ast, ins, ref = _codegen_cases()[case]
  ran = 0
  for opts in _opt_lists():
    k = kernel_mod.Kernel(ast, opts=GccTestRenderer())
    try:
      if opts == "hand":
        k.hand_coded_optimizations()
      else:
        for o in opts:
          k.apply_opt(o)
    except kernel_mod.KernelOptError:
      continue
    p = k.to_program()
    out = np.zeros(ref.shape, np.float32)
    gs, ls = p.launch_dims({})
    GccKernel(p.src, to_function_name(p.name))([out, *ins], gs, ls or [1, 1, 1])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=f"{case} with {opts}\n{p.src}")
    ran += 1
  assert ran >= 3  # the unoptimized kernel, the heuristic and at least one explicit opt


def test_loop_bound_depends_on_thread(backend):
  # out[i] = sum_{j < i} a[j]: every thread runs its own trip count (workgroups that run together must not share one)
  n = 9
  a = np.arange(1, n + 1, dtype=np.int32) * 3
  out = np.full(n, -1, np.int32)
  d0, d1 = glob(0, dtypes.int32, True), glob(1, dtypes.int32)
  i = special(0, "gidx0", n)
  rng = UOp(UOps.RANGE, dtypes.int32, (const(0), i), (1, True))
  acc = UOp(UOps.DEFINE_ACC, dtypes.int32, (const(0), rng), (0,))
  phi = UOp(UOps.PHI, dtypes.int32, (acc, alu(BinaryOps.ADD, dtypes.int32, acc, load(d1, rng))))
  uops = linearize(d0, d1, i, acc, rng, phi)
  uops = linearize(UOp(UOps.ENDRANGE, None, (rng,)), store(d0, i, phi), after=uops)
  backend(uops, [out, a], global_size=(n, 1, 1))
  np.testing.assert_array_equal(out, np.concatenate([[0], np.cumsum(a)[:-1]]))
