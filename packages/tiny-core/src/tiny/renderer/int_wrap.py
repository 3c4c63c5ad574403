"""Which signed integer ALUs of a kernel must wrap on overflow when written in a C-family language.

numpy's int32/int64 arithmetic wraps around; C, OpenCL C, CUDA, HIP and Metal leave signed overflow undefined, and
their compilers use that (clang folds `x + INT_MIN` into `x | INT_MIN`). So the arithmetic that computes on data is
written in the unsigned type of the same width, where overflow wraps, and converted back.
"""
from __future__ import annotations

from typing import Dict, Sequence, Set

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType, dtypes
from tiny.ops import BinaryOps, TernaryOps, UnaryOps

# narrower ints are computed as int and truncated by the renderer, and vector arithmetic already wraps in clang
UNSIGNED_OF: Dict[DType, DType] = {dtypes.int32: dtypes.uint32, dtypes.int64: dtypes.uint64}
WRAP_OPS = (BinaryOps.ADD, BinaryOps.MUL, UnaryOps.NEG, TernaryOps.MULACC)


def wrapping_int_ops(uops: Sequence[UOp]) -> Set[UOp]:
  """The signed int32/int64 scalar ALUs of a kernel that compute on data (a LOAD or an accumulator feeds them).

  Index arithmetic, built from loop counters, thread ids and constants, stays plain signed: it never overflows, and the
  compiler's no-overflow assumption is what lets it turn indices into pointer steps."""
  data: Set[UOp] = set()
  out: Set[UOp] = set()
  for u in uops:
    if u.op in (UOps.LOAD, UOps.DEFINE_ACC, UOps.PHI) or (u.op in (UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.VECTORIZE) and
                                                           any(s in data for s in u.src)):
      data.add(u)
      if u.op is UOps.ALU and u.arg in WRAP_OPS and u.dtype in UNSIGNED_OF:
        out.add(u)
  return out
