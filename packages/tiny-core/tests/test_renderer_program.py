"""Program metadata, TensorCore descriptions, the Renderer base and CStyleLanguage spellings."""
from __future__ import annotations

import math

import pytest

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import PtrDType, dtypes
from tiny.ops import BinaryOps, UnaryOps
from tiny.renderer import Program, Renderer, TensorCore
from tiny.renderer.cstyle import CStyleLanguage, RenderError
from tiny.runtime.ops_python import PythonRenderer
from tiny.shape.symbolic import Variable


def _kernel_with_vars():
  va, vb = Variable("a", 1, 8), Variable("b", 1, 8)
  d1, d0, d2 = (UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.float32), (), (i, i == 0)) for i in (1, 0, 2))
  dvb, dva = UOp(UOps.DEFINE_VAR, dtypes.int32, (), vb), UOp(UOps.DEFINE_VAR, dtypes.int32, (), va)
  g = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "gidx0", 12))
  lx = UOp(UOps.SPECIAL, dtypes.int32, (), (1, "lidx1", 4))
  smem = UOp(UOps.DEFINE_LOCAL, PtrDType(dtypes.float32, True), (), ("temp0", 4))
  ld = UOp(UOps.LOAD, dtypes.float32, (d1, g))
  x = UOp(UOps.ALU, dtypes.float32, (ld, UOp(UOps.LOAD, dtypes.float32, (d2, dva))), BinaryOps.ADD)
  st_local = UOp(UOps.STORE, None, (smem, lx, x))
  st = UOp(UOps.STORE, None, (d0, UOp(UOps.ALU, dtypes.int32, (g, dvb), BinaryOps.ADD), x))
  uops = [d1, d0, d2, dvb, dva, g, lx, smem, ld, ld, x.src[1], x, st_local, st.src[1], st]
  return uops, va, vb


def test_program_metadata():
  uops, va, vb = _kernel_with_vars()
  p = Program("k", "src", "TEST", [1, 1, 1], [1, 1, 1], uops=uops)
  assert p.vars == [va, vb]  # sorted by name, whatever the uop order
  assert p.globals == [0, 1, 2]
  assert p.outs == [0]  # the store into shared memory is not an output
  # the SPECIALs fix the launch sizes
  assert p.global_size == [12, 1, 1] and p.local_size == [1, 4, 1]
  assert p.launch_dims({}) == ([12, 1, 1], [1, 4, 1])


def test_program_symbolic_launch_dims():
  n = Variable("n", 1, 100)
  p = Program("k", "", "TEST", [n * 2, 3, 1], None)
  assert p.launch_dims({n: 7}) == ([14, 3, 1], None)
  assert p.vars == [] and p.globals == [] and p.outs == []
  with pytest.raises(ValueError):
    p.launch_dims({})


def test_program_fused_index_drops_local_size():
  u = UOp(UOps.SPECIAL, dtypes.int32, (), (0, "idx0", 64))
  p = Program("k", "", "TEST", [1, 1, 1], [1, 1, 1], uops=[u])
  assert p.global_size == [64, 1, 1] and p.local_size is None


def test_tensor_cores():
  # the vendors' tensor cores come from their packages' renderers (PYTHON's emulate mode asks the same renderers)
  pytest.importorskip("tiny_amd", reason="tiny-amd is not installed")
  pytest.importorskip("tiny_metal", reason="tiny-metal is not installed")
  amd, metal = PythonRenderer("AMD").tensor_cores, PythonRenderer("METAL").tensor_cores
  assert [(t.dtype_in, t.dtype_out) for t in amd] == [(dtypes.half, dtypes.float), (dtypes.half, dtypes.half)]
  assert str(amd[0]) == "WMMA_16_16_16_half_float"
  # M*K, K*N and M*N elements are spread over the warp (RDNA3 wave32 keeps A and B twice)
  for tc in amd + metal:
    n, m, k = tc.dims
    a, b, c = tc.elements_per_thread()
    w = tc.num_threads()
    assert w == 32
    assert (a * w, b * w, c * w) == ((m * k, k * n, m * n) if tc not in amd else (2 * m * k, 2 * k * n, m * n))
    # the layout says where each of those elements is: every (row, col) of C exactly once
    lc = tc.register_layout()[2]
    assert sorted(lc.coords(lane, e) for lane in range(w) for e in range(lc.count)) == [(i, j) for i in range(m) for j in range(n)]
  assert amd[0].num_upcasts() == 0 and metal[0].num_upcasts() == 0
  import tiny.renderer as r
  # core declares no vendor's tensor cores: each device owns its own
  for gone in ("CUDA_TENSOR_CORES", "cuda_tensor_cores", "amd_tensor_cores"):
    with pytest.raises(AttributeError):
      getattr(r, gone)
  assert isinstance(amd[0], TensorCore)


def test_renderer_base():
  r = Renderer()
  assert r.device == "" and r.has_local and r.global_max == (0x8FFFFFFF,) * 3 and r.tensor_cores == []
  with pytest.raises(NotImplementedError):
    r.render("k", [])


class _C(CStyleLanguage):
  device = "T"
  kernel_prefix = "__kernel "
  buffer_prefix = "__global "
  buffer_suffix = " restrict"
  smem_prefix = "__local "
  barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
  code_for_workitem = {"g": lambda d: f"get_group_id({d})", "l": lambda d: f"get_local_id({d})", "i": lambda d: f"get_global_id({d})"}
  float4 = "(float4)"
  type_map = {dtypes.uint8: "uchar"}


def test_cstyle_render_const():
  r = _C()
  assert r.render_const(1, dtypes.float32) == "1.0f"
  assert r.render_const(0.1, dtypes.float32) == "0.1f"
  assert r.render_const(-2.5, dtypes.float32) == "(-2.5f)"
  assert r.render_const(math.inf, dtypes.float32) == "INFINITY"
  assert r.render_const(-math.inf, dtypes.float32) == "(-INFINITY)"
  assert r.render_const(math.nan, dtypes.float32) == "NAN"
  assert r.render_const(math.inf, dtypes.half) == "(half)(INFINITY)"
  assert r.render_const(2.0, dtypes.float64) == "2.0"
  assert r.render_const(True, dtypes.bool) == "1"
  assert r.render_const(7, dtypes.uint64) == "7ull"
  assert r.render_const(7, dtypes.uint8) == "(uchar)(7)"
  assert r.render_const(1.0, dtypes.float32.vec(2)) == "(float2)(1.0f,1.0f)"


def test_cstyle_kernel_signature_and_statements():
  uops, _, _ = _kernel_with_vars()
  src = _C().render("k", uops)
  # buffers in index order, then variables by name; read-only buffers are const
  assert "__kernel void k(__global float* restrict data0, const __global float* restrict data1, const __global float* restrict data2, " \
         "const int a, const int b) {" in src
  assert "int gidx0 = get_group_id(0); /* 12 */" in src and "int lidx1 = get_local_id(1); /* 4 */" in src
  assert "__local float temp0[4];" in src
  assert "temp0[lidx1] = " in src


def test_cstyle_vector_load_store_and_wmma():
  f4, h8 = dtypes.float32.vec(4), dtypes.half.vec(8)
  d0, d1 = UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.float32), (), (0, True)), UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.float32), (), (1, False))
  idx = UOp(UOps.CONST, dtypes.int32, (), 4)
  v = UOp(UOps.LOAD, f4, (d1, idx))
  st = UOp(UOps.STORE, None, (d0, idx, v))
  src = _C().render("k", [d0, d1, idx, v, st])
  assert "float4 val0 = (*((__global float4*)(data1+4)));" in src
  assert "*((__global float4*)(data0+4)) = val0;" in src
  ha = UOp(UOps.VECTORIZE, h8, tuple(UOp(UOps.CONST, dtypes.half, (), 1.0) for _ in range(8)))
  w = UOp(UOps.WMMA, f4, (ha, ha, v), ("WMMA_8_16_16_half_float", (8, 16, 16), dtypes.half, dtypes.float, "CUDA", [], (), ()))
  src = _C().render("k", [d0, d1, idx, v, *ha.src, ha, w, UOp(UOps.STORE, None, (d0, idx, w))])
  assert "float4 wmma0 = __WMMA_8_16_16_half_float(" in src


def test_cstyle_missing_op_is_a_clear_error():
  class NoSin(_C):
    code_for_op = {k: v for k, v in _C.code_for_op.items() if k is not UnaryOps.SIN}
  c = UOp(UOps.CONST, dtypes.float32, (), 1.0)
  s = UOp(UOps.ALU, dtypes.float32, (c,), UnaryOps.SIN)
  d0 = UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.float32), (), (0, True))
  i = UOp(UOps.CONST, dtypes.int32, (), 0)
  with pytest.raises(RenderError, match="SIN"):
    NoSin().render("k", [d0, c, s, i, UOp(UOps.STORE, None, (d0, i, s))])
  with pytest.raises(RenderError):
    _C().render("k", [UOp(UOps.EXPAND, dtypes.int32, (), None)])
