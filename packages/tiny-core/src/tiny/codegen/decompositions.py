"""Decompositions for renderers: threefry in 32-bit integer ops, and polynomial exp2/log2/sin where a renderer lacks them."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from tiny.dtype import dtypes
from tiny.helpers import TRANSCENDENTAL
from tiny.ops import BinaryOps, UnaryOps
from tiny.codegen.uops import UOp, UPat, PatternMatcher
from tiny.codegen.transcendental import xexp2, xlog2, xsin

if TYPE_CHECKING:
  from tiny.renderer import Renderer


def threefry2x32(x: UOp, key: UOp) -> UOp:
  """Threefry-2x32 (20 rounds) on uint64 inputs, in uint32 arithmetic."""
  u32, u64 = dtypes.uint32, dtypes.uint64
  lo = lambda v: (v & 0xFFFFFFFF).cast(u32)  # noqa: E731
  hi = lambda v: ((v // (1 << 32)) & 0xFFFFFFFF).cast(u32)  # noqa: E731
  x0, x1, k0, k1 = lo(x), hi(x), lo(key), hi(key)
  ks = [k1, k0 ^ k1 ^ 0x1BD11BDA, k0]
  xr = [x0 + ks[-1], x1 + ks[0]]
  rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
  for i in range(5):
    for r in rotations[i % 2]:
      xr[0] = xr[0] + xr[1]
      rot = (xr[1] * (1 << r)) | (xr[1] // (1 << (32 - r)))  # MUL/IDIV by powers of two: shifts every renderer has
      xr[1] = rot ^ xr[0]
    xr = [xr[0] + ks[i % 3], xr[1] + ks[(i + 1) % 3] + (i + 1)]
  return (xr[1].cast(u64) * (1 << 32)) | xr[0].cast(u64)


decomp_rules: List[Tuple[UPat, Callable[..., Optional[UOp]]]] = [
  (UPat.alu(BinaryOps.THREEFRY, UPat.var("x"), UPat.var("key")), threefry2x32),
]

def transcendental_matcher(opts: Optional[Renderer]) -> Optional[PatternMatcher]:
  """Polynomial exp2/log2/sin for renderers whose code_for_op lacks them (TRANSCENDENTAL>=2 forces them)."""
  code = getattr(opts, "code_for_op", None) or {}
  force = TRANSCENDENTAL >= 2
  rules: List[Tuple[UPat, Callable[..., Optional[UOp]]]] = []
  floats = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
  for op, fxn in ((UnaryOps.EXP2, xexp2), (UnaryOps.LOG2, xlog2), (UnaryOps.SIN, xsin)):
    # an empty table means an interpreter that runs every op itself (PYTHON)
    if force or (opts is not None and code and op not in code):
      rules.append((UPat.alu(op, UPat.var("d", dtype=floats)), fxn))
  return PatternMatcher(rules) if rules else None
