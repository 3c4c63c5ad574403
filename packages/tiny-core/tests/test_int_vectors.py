"""Integer vector code on CPU renderers: int loads/stores folded into vectors, threefry's rounds packed into vector ops,
and the folding of threefry's uint32 pairs packed into a uint64 and unpacked right away. Results against numpy, a pure
Python threefry, and random numbers stored from before these changes (the same seed must keep giving the same numbers)."""
from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest

from tiny.codegen.symbolic_rules import constant_folder
from tiny.codegen.uops import UOp, UOps, graph_rewrite
from tiny.dtype import dtypes
from tiny.ops import BinaryOps, threefry2x32
from tiny.shape.symbolic import Variable
from tiny.tensor import Tensor

pytest.importorskip("tiny_clang")

U32, U64 = dtypes.uint32, dtypes.uint64
# Tensor.manual_seed(42); Tensor.rand(37) as float32 bits, from the code before int vectors (HEAD ddb79ec)
SEED42_RAND37 = [0x3f7e1e14, 0x3f7cc568, 0x3f69fae8, 0x3d3f3260, 0x3dea2230, 0x3e9578dc, 0x3f524a02, 0x3f6b3fb2, 0x3f1bef4c,
                 0x3f3a7296, 0x3f41173e, 0x3f522c64, 0x3ea17c4c, 0x3f3e871a, 0x3dfc7230, 0x3df02790, 0x3f1be94c, 0x3f6fa2f6,
                 0x3f0ee33c, 0x3e1f9eb0, 0x3f0b8470, 0x3ea1b374, 0x3f579a46, 0x3eebf314, 0x3f60f8da, 0x3f686e7c, 0x3e753400,
                 0x3ec48c14, 0x3f273f0c, 0x3f66fe9a, 0x3e514228, 0x3f4e9f6e, 0x3e0bbfa0, 0x3f75fe8c, 0x3dba5040, 0x3e32a840,
                 0x3f5fbc50]
# then Tensor.rand(5, dtype=float64) as float64 bits
SEED42_RAND5_F64 = [0x3fdc2afcc1800000, 0x3fb74c1f8a000000, 0x3fbbe602b1000000, 0x3fc401996c800000, 0x3fdb522899c00000]


@pytest.fixture(params=["CLANG", "LLVM"])
def dev(request: Any) -> str:
  from tiny.registry import Device
  if reason := Device.availability(request.param):
    pytest.skip(f"{request.param} is not available: {reason}")
  return request.param


def _python_rand(num: int, seed: int, counter: int = 0) -> np.ndarray:
  """Tensor.rand's float32 numbers computed in plain Python: threefry of (counter pairs), low words then high words."""
  half = (num + 1) // 2
  words: List[List[int]] = [[], []]
  for i in range(half):
    c1 = (counter + i) & 0xFFFFFFFF
    c2 = (c1 + half) & 0xFFFFFFFF
    x = threefry2x32((c2 << 32) | c1, seed % (1 << 64))
    words[0].append(x & 0xFFFFFFFF)
    words[1].append(x >> 32)
  bits = np.array((words[0] + words[1])[:num], dtype=np.uint32)
  return ((bits >> 9) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)


def test_rand_keeps_its_numbers(dev: str) -> None:
  """The same seed gives the same bits as before (float32, then float64 from the advanced counter)."""
  Tensor.manual_seed(42)
  a = Tensor.rand(37, device=dev).numpy()
  b = Tensor.rand(5, device=dev, dtype=dtypes.float64).numpy()
  assert [int(x) for x in a.view(np.uint32)] == SEED42_RAND37
  assert [int(x) for x in b.view(np.uint64)] == SEED42_RAND5_F64


@pytest.mark.parametrize("num", [1, 2, 7, 8, 9, 16, 33, 100, 257, 1030])
def test_rand_matches_python_threefry(dev: str, num: int) -> None:
  """Every size (vector tails, odd counts) against a Python threefry."""
  Tensor.manual_seed(7 + num)
  got = Tensor.rand(num, device=dev).numpy()
  np.testing.assert_array_equal(got.view(np.uint32), _python_rand(num, 7 + num).view(np.uint32))


def test_threefry_kernel_is_vector_code() -> None:
  """On CLANG, the rand kernels of large draws are uint32 vector code, with no uint64 pack/unpack left (smaller draws stay
  scalar: tiny_clang.heuristics.small_threefry)."""
  from tiny.engine.realize import get_kernel
  from tiny.registry import Device
  from tiny_clang.renderer import host_simd_bytes
  if reason := Device.availability("CLANG"):
    pytest.skip(f"CLANG is not available: {reason}")
  Tensor.manual_seed(3)
  srcs = [get_kernel(Device["CLANG"].renderer, si.ast).to_program().src for si in Tensor.rand(64, 1024, device="CLANG").schedule()
          if si.ast.op is not None and "THREEFRY" in str(si.ast)]
  assert srcs
  # the width is the heuristic's choice for this host (8 on AVX2; AVX-512 hosts keep 4): any uint32 vector will do
  widths = [n for n in (4, 8, 16) if n <= host_simd_bytes() // 4]
  for src in srcs:
    assert any(f"tiny_unsigned_int{n} " in src for n in widths) and "4294967296" not in src, src[:3000]


@pytest.mark.parametrize("dt", [np.int32, np.int64, np.uint32, np.uint64])
@pytest.mark.parametrize("n", [64, 100, 13])
def test_int_elementwise_vs_numpy(dev: str, dt: Any, n: int) -> None:
  """Vector int kernels (division and remainder by constants, bit ops, wraparound, casts) against numpy."""
  rng = np.random.default_rng(n)
  signed = np.issubdtype(dt, np.signedinteger)
  lo = np.iinfo(dt).min // 2 if signed else 0
  x = rng.integers(lo, np.iinfo(dt).max // 2, size=n, dtype=dt)
  t = Tensor(x, device=dev)
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(((t * 7 + 3) // 5).numpy(), (x * dt(7) + dt(3)) // dt(5))
    np.testing.assert_array_equal((t % 9).numpy(), x % dt(9))
    np.testing.assert_array_equal(((t ^ (t // 8)) & 0xFFFF).numpy(), (x ^ (x // dt(8))) & dt(0xFFFF))
  np.testing.assert_array_equal(t.cast(dtypes.int32).cast(dtypes.int64).numpy(), x.astype(np.int32).astype(np.int64))


def test_int_arange_offsets_and_padding(dev: str) -> None:
  """Consecutive indices (b, b+1, ... packed as b + (0, 1, ...)) and a padded concatenation (one condition for all
  lanes of an iteration: a select of whole vectors)."""
  a = Tensor.arange(40, device=dev, dtype=dtypes.uint32) * 3 + 5
  b = Tensor.arange(24, device=dev, dtype=dtypes.uint32) // 3
  got = (a.cat(b) * 2654435761 // 7).numpy()
  want = (np.concatenate([np.arange(40, dtype=np.uint32) * np.uint32(3) + np.uint32(5), np.arange(24, dtype=np.uint32) // np.uint32(3)])
          * np.uint32(2654435761)) // np.uint32(7)
  np.testing.assert_array_equal(got, want)


def _var(name: str, dtype: Any, hi: int) -> UOp:
  return UOp(UOps.DEFINE_VAR, dtype, (), Variable(name, 0, hi))


def _fold(u: UOp) -> UOp:
  return graph_rewrite(u, constant_folder)


def test_unpack_of_a_pack_folds() -> None:
  """(hi*2**32 | lo) // 2**32 is hi and (hi*2**32 | lo) & 0xffffffff is lo, with the casts around them gone."""
  hi, lo = _var("hi", U32, 2**32 - 1), _var("lo", U32, 2**32 - 1)
  pack = (hi.cast(U64) * (1 << 32)).alu(BinaryOps.OR, lo.cast(U64))
  assert _fold(((pack // (1 << 32)) & 0xFFFFFFFF).cast(U32)) is hi
  assert _fold((pack & 0xFFFFFFFF).cast(U32)) is lo
  # an ADD places the halves side by side too
  assert _fold(((hi.cast(U64) * (1 << 32) + lo.cast(U64)) // (1 << 32)).cast(U32)) is hi
  # and a padded pack, where(c, hi*2**32, 0) | lo, unpacks to where(c, hi, 0)
  c = _var("c", dtypes.int32, 10).lt(5)
  padded = c.where(hi.cast(U64) * (1 << 32), 0).alu(BinaryOps.OR, lo.cast(U64))
  got = _fold((padded // (1 << 32)).cast(U32))
  assert got.op is UOps.ALU and got.src[0] is c and got.src[1] is hi, got


def test_unpack_needs_disjoint_halves() -> None:
  """No fold when lo may reach into hi's bits, or hi*c may wrap around."""
  hi = _var("hi", U64, 2**40)
  lo = _var("lo", U64, 2**33)
  pack = (hi * (1 << 32)).alu(BinaryOps.OR, lo)
  assert _fold(pack // (1 << 32)).op is UOps.ALU
  assert _fold(pack & 0xFFFFFFFF).op is UOps.ALU
  small_lo = _var("slo", U64, 2**32 - 1)
  wraps = (_var("big", U64, 2**63) * (1 << 32)).alu(BinaryOps.OR, small_lo)
  assert _fold(wraps // (1 << 32)).op is UOps.ALU
  # the low half folds even then: hi*2**32 has no low bits, wrapped or not
  assert _fold(wraps & 0xFFFFFFFF) is small_lo
