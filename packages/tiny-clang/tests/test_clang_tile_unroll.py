"""On AVX-512 the CLANG renderer asks clang to unroll each register tile's reduce loop UNROLL_TILE times
(tiny_clang.tile_loops): which loops get the pragma, that clang honours it, and that the products stay exact."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel
from tiny.engine.schedule import create_schedule
from tiny.ops import MetaOps
from tiny.tensor import Tensor
from tiny_clang.renderer import ClangRenderer
from tiny_clang.tile_loops import UNROLL_TILE

PRAGMA = f"#pragma clang loop unroll_count({UNROLL_TILE})"


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _renderer(simd_bytes: int) -> ClangRenderer:
  r = ClangRenderer()
  r.simd_bytes, r.simd_registers, r._x86 = simd_bytes, 32 if simd_bytes >= 64 else 16, True
  return r


def _packed_ast(m: int, kk: int, n: int, width: int) -> Any:
  """The AST of the product of a (m, kk) @ (kk, n) matmul whose b was packed into width-column panels (built on PYTHON)."""
  a, b = Tensor(_rand(m, kk, seed=1), device="PYTHON").realize(), Tensor(_rand(kk, n, seed=2), device="PYTHON").realize()
  panels = b.reshape(kk, n // width, width).permute(1, 0, 2).contiguous().realize()
  return create_schedule([(a.reshape(m, 1, 1, kk) * panels.permute(0, 2, 1)).sum(-1).reshape(m, n).lazydata])[-1].ast


def _src(ast: Any, renderer: ClangRenderer) -> str:
  return Kernel(ast, opts=renderer).hand_coded_optimizations().to_program().src


def test_packed_tile_loop_gets_the_pragma_on_avx512_only() -> None:
  """The 8 x 2 zmm tile's k loop is marked, right above it; the AVX2 tile (clang's own choice there) is not."""
  src = _src(_packed_ast(64, 256, 64, 32), _renderer(64))
  assert src.count(PRAGMA) == 1, src
  lines = src.split("\n")
  nxt = lines[lines.index(next(x for x in lines if PRAGMA in x)) + 1]
  assert re.match(r"\s*for \(int ridx\d+ = 0; ridx\d+ < 256; ridx\d+\+\+\) \{", nxt), nxt
  assert PRAGMA not in _src(_packed_ast(64, 256, 64, 16), _renderer(32))


def test_no_pragma_without_a_tile_loop() -> None:
  """Not for a trip count UNROLL_TILE does not divide, a 3x3 conv (its innermost reduce runs 3 times), or a plain sum."""
  assert PRAGMA not in _src(_packed_ast(64, 100, 64, 32), _renderer(64))
  x, w, v = (Tensor(_rand(*s, seed=i), device="PYTHON").realize() for i, s in enumerate([(2, 16, 10, 58), (16, 16, 3, 3), (1 << 12,)]))
  for out in (x.conv2d(w), v.sum()):
    kernels = [si for si in create_schedule([out.lazydata]) if si.ast.op is MetaOps.KERNEL]
    assert kernels
    assert all(PRAGMA not in _src(si.ast, _renderer(64)) for si in kernels)


def test_clang_unrolls_the_marked_loop() -> None:
  """In the compiled kernel the reduce loop holds UNROLL_TILE x 16 FMAs (x86 with AVX-512: what the pragma is for)."""
  from tiny_clang.compiler import find_cc
  from tiny_clang.renderer import host_simd_bytes
  if find_cc() is None or host_simd_bytes() < 64:
    pytest.skip("needs a C compiler and an AVX-512 host")
  import subprocess
  src = _src(_packed_ast(64, 256, 64, 32), _renderer(64))
  asm = subprocess.run([find_cc(), "-O2", "-march=native", "-ffp-contract=fast", "-S", "-x", "c", "-", "-o", "-"], input=src,
                       capture_output=True, text=True, check=True).stdout
  blocks = re.split(r"\n(?=\.LBB\d+_\d+:)", asm)
  loops = [b for b in blocks if (m := re.match(r"(\.LBB\d+_\d+):", b)) and re.search(rf"\bj\w+\s+{re.escape(m.group(1))}\b", b)]
  fmas = [len(re.findall(r"\bvfmadd\w*", b)) for b in loops]
  assert UNROLL_TILE * 16 in fmas, fmas


@pytest.mark.parametrize("m, kk, n", [(512, 64, 64), (256, 96, 128), (128, 1024, 32), (64, 8 * 37, 128)])
def test_unrolled_products_match_numpy(m: int, kk: int, n: int) -> None:
  """Packed products on the host's CLANG (unrolled on AVX-512) equal numpy's."""
  from tiny_clang.compiler import find_cc
  if find_cc() is None:
    pytest.skip("no C compiler (clang/cc/gcc) on this machine")
  an, bn = _rand(m, kk, seed=m), _rand(kk, n, seed=kk)
  np.testing.assert_allclose((Tensor(an, device="CLANG") @ Tensor(bn, device="CLANG")).numpy(), an @ bn, rtol=1e-4, atol=1e-3)
