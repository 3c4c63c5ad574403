"""tiny.ops: exec_alu semantics per dtype against numpy, LazyOp equality/hash/key, verify_lazyop, flop/memory estimates."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiny.dtype import dtypes
from tiny.ops import (BinaryOps, BufferOps, ConstBuffer, InvalidLazyOpError, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps,
                      exec_alu, get_lazyop_info, truncate, verify_lazyop)
from tiny.shape.shapetracker import ShapeTracker

INTS = [(dtypes.int8, np.int8), (dtypes.int16, np.int16), (dtypes.int32, np.int32), (dtypes.int64, np.int64),
        (dtypes.uint8, np.uint8), (dtypes.uint16, np.uint16), (dtypes.uint32, np.uint32), (dtypes.uint64, np.uint64)]


@pytest.mark.parametrize("dt,npdt", INTS)
@given(data=st.data())
def test_int_ops_wrap_like_numpy(dt, npdt, data) -> None:
  info = np.iinfo(npdt)
  a, b = data.draw(st.integers(int(info.min), int(info.max))), data.draw(st.integers(int(info.min), int(info.max)))
  na, nb = npdt(a), npdt(b)
  with np.errstate(all="ignore"):
    assert exec_alu(BinaryOps.ADD, dt, [a, b]) == int(na + nb)
    assert exec_alu(BinaryOps.MUL, dt, [a, b]) == int(na * nb)
    assert exec_alu(BinaryOps.XOR, dt, [a, b]) == int(na ^ nb)
    assert exec_alu(BinaryOps.MAX, dt, [a, b]) == int(max(na, nb))
    assert exec_alu(BinaryOps.CMPLT, dtypes.bool, [a, b]) == bool(na < nb)
    if b != 0:
      # C semantics: truncation toward zero, remainder has the dividend's sign
      q = exec_alu(BinaryOps.IDIV, dt, [a, b])
      assert q == int(npdt(int(np.trunc(a / b)) if abs(a) < 2**52 else (abs(a) // abs(b)) * (1 if (a < 0) == (b < 0) else -1)))
      assert exec_alu(BinaryOps.MOD, dt, [a, b]) == int(np.fmod(na, nb))


@given(st.floats(allow_nan=False, width=64), st.floats(allow_nan=False, width=64))
def test_float32_and_float16_round_like_numpy(a: float, b: float) -> None:
  with np.errstate(all="ignore"):
    for dt, npdt in ((dtypes.float32, np.float32), (dtypes.float16, np.float16), (dtypes.float64, np.float64)):
      fa, fb = float(npdt(a)), float(npdt(b))
      for op, ref in ((BinaryOps.ADD, np.add), (BinaryOps.MUL, np.multiply)):
        got, want = exec_alu(op, dt, [fa, fb]), float(ref(npdt(fa), npdt(fb)))
        assert got == want or (math.isnan(got) and math.isnan(want)), (dt, op, fa, fb, got, want)


def _bf16_ref(x: float) -> float:
  # independent definition: the nearer of the two bfloat16 neighbours of float32(x), ties to the even one
  from fractions import Fraction
  bits = struct.unpack("<I", struct.pack("<f", np.float32(x)))[0]
  lo = bits & 0xFFFF0000
  cands = [lo, lo + 0x10000]
  vals = [struct.unpack("<f", struct.pack("<I", c))[0] for c in cands]
  d = [abs(Fraction(v) - Fraction(float(np.float32(x)))) for v in vals]
  if d[0] != d[1]:
    return vals[0] if d[0] < d[1] else vals[1]
  return vals[0] if (cands[0] >> 16) % 2 == 0 else vals[1]


@given(st.floats(-1e30, 1e30, width=64))
def test_bfloat16_truncation(x: float) -> None:
  got = truncate[dtypes.bfloat16](x)
  assert got == _bf16_ref(x)
  assert struct.unpack("<I", struct.pack("<f", got))[0] & 0xFFFF == 0


def test_unary_special_values() -> None:
  f = dtypes.float32
  assert exec_alu(UnaryOps.LOG2, f, [0.0]) == -math.inf and math.isnan(exec_alu(UnaryOps.LOG2, f, [-1.0]))
  assert exec_alu(UnaryOps.EXP2, f, [1000.0]) == math.inf and exec_alu(UnaryOps.EXP2, f, [3.0]) == 8.0
  assert exec_alu(UnaryOps.RECIP, f, [0.0]) == math.inf and exec_alu(UnaryOps.RECIP, f, [-0.0]) == -math.inf
  assert math.isnan(exec_alu(UnaryOps.SQRT, f, [-1.0])) and math.isnan(exec_alu(UnaryOps.SIN, f, [math.inf]))
  assert exec_alu(UnaryOps.NEG, dtypes.bool, [True]) is False
  assert exec_alu(UnaryOps.CAST, dtypes.int32, [-2.9]) == -2 and exec_alu(UnaryOps.CAST, dtypes.uint8, [300]) == 44
  assert exec_alu(TernaryOps.WHERE, f, [False, 1.0, 2.0]) == 2.0 and exec_alu(TernaryOps.MULACC, f, [2.0, 3.0, 1.0]) == 7.0
  assert exec_alu(BinaryOps.IDIV, dtypes.int32, [7, 0]) == 0  # undefined in C; defined as 0 here
  with pytest.raises(TypeError):
    exec_alu(BinaryOps.ADD, dtypes.float32.vec(4), [1.0, 2.0])


def _st(*shape):
  return ShapeTracker.from_shape(shape)


def _sum_kernel(shape=(4, 8), axis=(1,)):
  ld = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float32, _st(*shape)))
  out_shape = tuple(1 if i in axis else s for i, s in enumerate(shape))
  red = LazyOp(ReduceOps.SUM, (LazyOp(BinaryOps.MUL, (ld, ld)),), axis)
  return LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (red,), MemBuffer(0, dtypes.float32, _st(*out_shape))),))


def test_lazyop_structural_equality_hash_and_key() -> None:
  a, b = _sum_kernel(), _sum_kernel()
  assert a is not b and a == b and hash(a) == hash(b) and a.key == b.key
  c = _sum_kernel(axis=(0,))
  assert a != c and a.key != c.key
  assert {a: 1}[b] == 1
  assert a.src[0].src[0].dtype == dtypes.float32
  assert LazyOp(BinaryOps.CMPLT, (a.src[0].src[0], a.src[0].src[0])).dtype == dtypes.bool
  assert len([x for x in a.lazyops if x.op is BufferOps.LOAD]) == 1


def test_lazyop_vars() -> None:
  from tiny.shape.symbolic import Variable
  n = Variable("n", 1, 10)
  ld = LazyOp(BufferOps.CONST, (), ConstBuffer(Variable("m", 1, 5), dtypes.int32, _st(n)))
  ast = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (ld,), MemBuffer(0, dtypes.int32, _st(n))),))
  assert [v.expr for v in ast.vars()] == ["m", "n"]


def test_verify_lazyop_accepts_and_rejects() -> None:
  sts = verify_lazyop(_sum_kernel())
  assert any(st.shape == (4, 1) for st in sts.values())
  ld = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float32, _st(4, 8)))
  ld2 = LazyOp(BufferOps.LOAD, (), MemBuffer(2, dtypes.float32, _st(4, 4)))
  bad_shape = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(BinaryOps.ADD, (ld, ld2)),), MemBuffer(0, dtypes.float32, _st(4, 8))),))
  with pytest.raises(InvalidLazyOpError):
    verify_lazyop(bad_shape)
  bad_store = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (ld,), MemBuffer(0, dtypes.float32, _st(4, 1))),))
  with pytest.raises(InvalidLazyOpError):
    verify_lazyop(bad_store)
  bad_idx = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (ld,), MemBuffer(3, dtypes.float32, _st(4, 8))),))
  with pytest.raises(InvalidLazyOpError):
    verify_lazyop(bad_idx)
  bad_arity = LazyOp(MetaOps.KERNEL, (LazyOp(BufferOps.STORE, (LazyOp(BinaryOps.ADD, (ld,)),), MemBuffer(0, dtypes.float32, _st(4, 8))),))
  with pytest.raises(InvalidLazyOpError):
    verify_lazyop(bad_arity)
  with pytest.raises(InvalidLazyOpError):
    verify_lazyop(ld)


def test_flop_and_memory_estimates() -> None:
  info = get_lazyop_info(_sum_kernel((4, 8), (1,)))
  # 32 multiplies + 32 adds; read 32 floats, write 4
  assert info.flops == 64
  assert info.mem == {1: 32 * 4, 0: 4 * 4} and info.mem_estimate == 144
