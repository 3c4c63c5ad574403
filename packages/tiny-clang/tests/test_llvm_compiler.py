"""LLVM toolchain: IR that LLVM rejects raises CompileError with the numbered IR; fast-math stays within safe flags;
several programs (each with its own MCJIT engine and TargetMachine) live side by side and die cleanly."""
from __future__ import annotations

import gc
import platform
import re

import numpy as np
import pytest

from tiny.codegen.uops import UOp, UOps
from tiny.device import CompileError
from tiny.dtype import PtrDType, dtypes
from tiny.ops import BinaryOps

llvmlite = pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")

from tiny_clang.compiler import LLVMCompiler, init_llvm  # noqa: E402
from tiny_clang.llvmir import LLVMRenderer, lconst  # noqa: E402
from tiny_clang.runtime import ClangAllocator, LLVMProgram  # noqa: E402


def sum_rows_uops() -> list:
  """out[i] = sum_j in[i*8 + j]: one scalar accumulator."""
  f, i32 = dtypes.float32, dtypes.int32
  g0, g1 = UOp(UOps.DEFINE_GLOBAL, PtrDType(f), (), (0, True)), UOp(UOps.DEFINE_GLOBAL, PtrDType(f), (), (1, False))
  c0, c4, c8, z = UOp(UOps.CONST, i32, (), 0), UOp(UOps.CONST, i32, (), 4), UOp(UOps.CONST, i32, (), 8), UOp(UOps.CONST, f, (), 0.0)
  r0 = UOp(UOps.RANGE, i32, (c0, c4), (0, False))
  r1 = UOp(UOps.RANGE, i32, (c0, c8), (1, True))
  acc = UOp(UOps.DEFINE_ACC, f, (z, r1), (0,))
  row = UOp(UOps.ALU, i32, (r0, c8), BinaryOps.MUL)
  idx = UOp(UOps.ALU, i32, (row, r1), BinaryOps.ADD)
  ld = UOp(UOps.LOAD, f, (g1, idx))
  add = UOp(UOps.ALU, f, (acc, ld), BinaryOps.ADD)
  phi = UOp(UOps.PHI, f, (acc, add))
  return [g0, g1, c0, c4, c8, z, r0, row, acc, r1, idx, ld, add, phi, UOp(UOps.ENDRANGE, None, (r1,)), UOp(UOps.STORE, None, (g0, r0, phi)),
          UOp(UOps.ENDRANGE, None, (r0,))]


def test_bad_ir_raises_compile_error_with_numbered_source() -> None:
  src = "define void @f() {\n  %x = add i32 1, %undefined\n  ret void\n}\n"
  with pytest.raises(CompileError) as ei:
    LLVMCompiler().compile(src)
  assert "undefined" in ei.value.compiler_msg
  assert "   2 |   %x = add i32 1, %undefined" in str(ei.value)


def test_fast_math_flags_are_limited() -> None:
  src = LLVMRenderer().render("sum_rows", sum_rows_uops())
  flags = set(re.findall(r"\b(nnan|ninf|nsz|arcp|afn|fast|reassoc|contract)\b", src))
  assert flags <= {"reassoc", "contract"}, flags
  # reassoc only on the accumulating add
  assert len(re.findall(r"fadd reassoc", src)) == 1, src


def test_sum_rows_runs_and_programs_coexist() -> None:
  comp = LLVMCompiler()
  src = LLVMRenderer().render("sum_rows", sum_rows_uops())
  progs = [LLVMProgram("sum_rows", comp.compile(src)) for _ in range(4)]
  al = ClangAllocator()
  a = np.random.default_rng(0).standard_normal(32).astype(np.float32)
  inp = al.alloc(128)
  al.copyin(inp, memoryview(a).cast("B"))
  for p in progs:
    out = al.alloc(16)
    p(out, inp)
    np.testing.assert_allclose(np.frombuffer(al.as_buffer(out), np.float32), a.reshape(4, 8).sum(1), rtol=1e-5)
  del progs
  gc.collect()
  # a fresh engine after the others were torn down still works
  out = al.alloc(16)
  LLVMProgram("sum_rows", comp.compile(src))(out, inp)
  np.testing.assert_allclose(np.frombuffer(al.as_buffer(out), np.float32), a.reshape(4, 8).sum(1), rtol=1e-5)


@pytest.mark.parametrize("x,dt,expect", [(1.0, dtypes.float32, "0x3FF0000000000000"), (0.1, dtypes.float32, "0x3FB99999A0000000"),
                                         (1.0, dtypes.float16, "0xH3C00"), (1.0, dtypes.bfloat16, "0xR3F80"), (-1, dtypes.uint8, "-1"),
                                         (255, dtypes.uint8, "-1"), (True, dtypes.bool, "true"), (float("inf"), dtypes.float64, "0x7FF0000000000000")])
def test_constants_are_exact(x: float, dt, expect: str) -> None:
  assert lconst(x, dt) == expect


def test_object_is_cached_bytes() -> None:
  lib = LLVMCompiler().compile(LLVMRenderer().render("sum_rows", sum_rows_uops()))
  assert isinstance(lib, bytes) and lib[:4] == b"\x7fELF"


def test_addresses_are_summed_in_i64() -> None:
  """Every gep takes an i64 index, and the index add/mul have i64 twins with nsw (the i32 versions keep no nsw)."""
  src = LLVMRenderer().render("sum_rows", sum_rows_uops())
  geps = re.findall(r"getelementptr inbounds float, ptr %data\d, (i\d+) ", src)
  assert geps and set(geps) == {"i64"}, src
  assert re.search(r"= mul nsw i64 %t\d+, 8\n", src) and re.search(r"= add nsw i64 %t\d+, %t\d+\n", src), src
  assert not re.search(r"(add|mul) nsw i32 %t", src), src


def _packed_matmul_ir(n: int) -> str:
  """The LLVM IR of the packed-panel product kernel of an n x n matmul (the last kernel of its schedule)."""
  from tiny.codegen.kernel import Kernel
  from tiny.engine.schedule import create_schedule
  from tiny.tensor import Tensor
  renderer = LLVMRenderer()
  if not renderer.matmul_panel(n, n, n, dtypes.float32):
    pytest.skip("this host's LLVM renderer packs no panels")
  a, b = Tensor.empty(n, n, device="LLVM"), Tensor.empty(n, n, device="LLVM")
  k = Kernel(create_schedule([(a @ b).lazydata])[-1].ast, opts=renderer).hand_coded_optimizations().linearize()
  assert k.uops is not None
  return renderer.render("packed_matmul", k.uops.uops)


def _innermost_loop(asm: str) -> str:
  """The instructions of the shortest backward-branching block of a function's assembly: the hot reduce loop."""
  blocks = re.split(r"\n(?=\.LBB\d+_\d+:)", asm)
  loops = [b for b in blocks if (m := re.match(r"(\.LBB\d+_\d+):", b)) and re.search(rf"\bj\w+\s+{re.escape(m.group(1))}\b", b)]
  return min(loops, key=len) if loops else ""


def test_packed_matmul_reduce_loop_walks_pointers() -> None:
  """The reduce loop of the packed matmul has only its loads, FMAs and loop counting: no index sign extension
  (movslq) or recomputation (the i32 index sums made LLVM extend a's index every step, ~0.8x the C kernel), and it is
  unrolled UNROLL_TILE times (LLVM alone unrolls it twice)."""
  from tiny_clang.llvmir import UNROLL_TILE
  if platform.machine() not in ("x86_64", "AMD64") or "+fma" not in init_llvm().get_host_cpu_features().flatten():
    pytest.skip("the assembly checked here is x86 with FMA")
  comp = LLVMCompiler()
  src = _packed_matmul_ir(512)
  asm = comp.tm.emit_assembly(comp.optimize(src))
  loop = _innermost_loop(asm)
  fmas = re.findall(r"\bvfmadd\w*", loop)
  assert fmas, loop
  assert "movslq" not in loop and "cltq" not in loop, loop
  accs = len(re.findall(r"%acc\d+ = alloca <", src))
  assert len(fmas) == accs * UNROLL_TILE, (len(fmas), accs, loop)


def test_only_register_tile_loops_are_unrolled() -> None:
  """A reduce loop with a scalar accumulator keeps LLVM's own unrolling (no loop metadata)."""
  assert "llvm.loop" not in LLVMRenderer().render("sum_rows", sum_rows_uops())
