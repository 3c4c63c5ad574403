"""Test support: renderers with a host CPU's vector shape that run on the PYTHON interpreter.

The CPU heuristics choose opts from the renderer's `simd_bytes` and `simd_registers`. These renderers let a test pick
an AVX2- or AVX-512-like machine on any host, see the opts the heuristic chooses there, and run the kernel on PYTHON
against numpy.
"""
from __future__ import annotations

from typing import List

from tiny.backend import Kernel, PythonRenderer

from tiny_clang.heuristics import cpu_hand_coded_optimizations


class Avx2LikeRenderer(PythonRenderer):
  """16 vector registers of 32 bytes (AVX2-like), choosing opts with the CPU heuristic; runs on PYTHON."""

  has_local = False
  has_shared = False
  supports_float4 = True
  simd_bytes = 32
  simd_registers = 16

  def hand_coded_optimizations(self, k: Kernel) -> bool:
    """The CLANG/LLVM heuristic, for this renderer's vector shape."""
    return cpu_hand_coded_optimizations(k)


class Avx512LikeRenderer(Avx2LikeRenderer):
  """32 vector registers of 64 bytes (AVX-512-like)."""

  simd_bytes = 64
  simd_registers = 32


def vector_accumulators(k: Kernel) -> List[int]:
  """The lane count of each vector accumulator (DEFINE_ACC wider than one lane) of the linearized kernel k."""
  assert k.uops is not None, "linearize the kernel first"
  return [u.dtype.count for u in k.uops.uops if u.op.name == "DEFINE_ACC" and u.dtype is not None and u.dtype.count > 1]
