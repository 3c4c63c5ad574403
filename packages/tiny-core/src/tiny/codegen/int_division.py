"""Total integer division: IDIV/MOD guarded so every renderer runs them natively with tiny's defined results."""
from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

from tiny.dtype import DType, dtypes
from tiny.ops import BinaryOps
from tiny.codegen.uops import UOp, UOps, graph_substitute
from tiny.codegen.symbolic_rules import INT_DTYPES
from tiny.codegen.linearize import toposort


def _safe_divisor(x: UOp, y: UOp, scalar: DType) -> Tuple[UOp, Optional[UOp]]:
  """(divisor that cannot trap, `y != 0` or None when y cannot be 0); the divisor is y itself when y is already safe."""
  maybe_zero = y.vmin <= 0 <= y.vmax
  # only MIN / -1 overflows: unsigned dtypes and dividends that cannot be MIN need no test
  maybe_overflow = not dtypes.is_unsigned(scalar) and y.vmin <= -1 <= y.vmax and x.vmin <= dtypes.min(scalar)
  nonzero = y.ne(0) if maybe_zero else None
  no_overflow: Optional[UOp] = None
  if maybe_overflow:
    # the graph is already folded: leave out the half of the test a constant operand decides
    lo = dtypes.min(scalar)
    no_overflow = x.ne(lo) if y.vmin == y.vmax == -1 else y.ne(-1) if x.vmin == x.vmax == lo else y.ne(-1) | x.ne(lo)
  conds = [c for c in (nonzero, no_overflow) if c is not None]
  if not conds:
    return y, None
  return functools.reduce(lambda a, b: a & b, conds).where(y, 1), nonzero


def guard_int_division(sink: UOp) -> UOp:
  """Make every integer IDIV/MOD safe to run natively while giving tiny's defined results (`tiny.ops._idiv`):
  x // 0 == x % 0 == 0, MIN // -1 == MIN and MIN % -1 == 0, on every renderer.

  C and LLVM make x/0 and MIN/-1 undefined (x86 traps with SIGFPE) and GPUs return arbitrary values, so the divisor is
  swapped for 1 where it is 0, or -1 with a MIN dividend (MIN/1 is the wrapped answer; x%1 is 0), and a zero divisor
  selects 0 for the quotient. It runs once on the final graph, here rather than in each renderer, so C, LLVM IR, PTX and
  the PYTHON interpreter all execute the same guarded graph. Divisors whose value range excludes the bad values (every
  constant other than 0 and -1, loop-index math) are left alone, so index division stays a plain division.
  """
  replace: Dict[UOp, UOp] = {}
  divisors: Dict[Tuple[UOp, UOp], Tuple[UOp, Optional[UOp]]] = {}
  for u in toposort(sink):
    if u.op is not UOps.ALU or u.arg not in (BinaryOps.IDIV, BinaryOps.MOD) or u.dtype is None:
      continue
    x, y = u.src
    if u.dtype.scalar() == dtypes.bool:
      # x // True == x and x // False == 0, x % y == 0: no division needed at all
      replace[u] = x & y if u.arg is BinaryOps.IDIV else u.const_like(False)
      continue
    if u.dtype.scalar() not in INT_DTYPES:
      continue
    if (x, y) not in divisors:
      # x // y and x % y of the same operands share one guarded divisor, so C compilers still emit a single division
      divisors[(x, y)] = _safe_divisor(x, y, u.dtype.scalar())
    d, nonzero = divisors[(x, y)]
    if d is y:
      continue
    res = x.alu(u.arg, d)
    replace[u] = nonzero.where(res, 0) if u.arg is BinaryOps.IDIV and nonzero is not None else res
  return graph_substitute(sink, replace) if replace else sink
