"""Reduce lowering: each REDUCE becomes an accumulator (DEFINE_ACC) updated by a PHI inside its loops."""
from __future__ import annotations

import itertools
from typing import Any

from tiny.dtype import DType, dtypes
from tiny.ops import BinaryOps
from tiny.codegen.uops import UOp, UOps, UPat, PatternMatcher, uop_const_value


def _identity(op: BinaryOps, dtype: DType) -> Any:
  if op is BinaryOps.ADD:
    return 0
  if op is BinaryOps.MAX:
    return dtypes.min(dtype.scalar())
  raise ValueError(f"no identity for {op}")


def _is_zero(u: UOp) -> bool:
  return uop_const_value(u) == 0 or (u.op is UOps.VECTORIZE and all(uop_const_value(s) == 0 for s in u.src))


def make_reduce_lowerer() -> PatternMatcher:
  """A matcher that lowers each REDUCE to an accumulator; numbering is per linearization."""
  counter = itertools.count()

  def lower(red: UOp) -> UOp:
    assert red.dtype is not None
    acc = UOp(UOps.DEFINE_ACC, red.dtype, (UOp.const(red.dtype.scalar(), _identity(red.arg, red.dtype)),) + red.src[1:], (next(counter),))
    v = red.src[0]
    if v.op is UOps.WMMA and red.arg is BinaryOps.ADD and _is_zero(v.src[2]):
      # a tensor core adds into its C operand: accumulate in place
      return UOp(UOps.PHI, red.dtype, (acc, UOp(UOps.WMMA, v.dtype, (v.src[0], v.src[1], acc), v.arg)))
    return UOp(UOps.PHI, red.dtype, (acc, acc.alu(red.arg, v)))
  return PatternMatcher([(UPat(UOps.REDUCE, name="red"), lower)])
