"""Compiled UPat matching (tiny.codegen.upat_compile) gives exactly what the generic matcher `_match` gives: the same
stores, in the same order, for hand-made corner cases and for every rule tried while real kernels are rewritten."""
from __future__ import annotations

import math
from typing import Any, List

import pytest

from tiny.codegen.kernel import Kernel
from tiny.codegen.uops import PatternMatcher, UOp, UOps, UPat, _match
from tiny.codegen.upat_compile import compile_upat
from tiny.dtype import dtypes
from tiny.ops import BinaryOps, MetaOps, TernaryOps, UnaryOps
from tiny.runtime.ops_python import PythonRenderer
from tiny.tensor import Tensor

I32, F32 = dtypes.int32, dtypes.float32


def v(name: str, dt=I32) -> UOp:
  return UOp(UOps.VAR, dt, (), name)


def same(pat: UPat, u: UOp) -> List[Any]:
  want = _match(u, pat, {})
  got = compile_upat(pat)(u)
  # UOps compare by identity, so == on the lists of dicts is "the same uops bound to the same names, in the same order"
  assert got == want and [list(d) for d in got] == [list(d) for d in want], (pat, u)
  return got


def test_corner_cases_match_the_generic_matcher() -> None:
  x, y = v("x"), v("y")
  c2, c3 = UOp.const(I32, 2), UOp.const(I32, 3)
  f = v("f", F32)
  pats = [
    UPat.var("x"), UPat(), UPat.cvar("c"), UPat(UOps.CONST, 0), UPat(UOps.CONST, True), UPat(UOps.CONST, 1.0),
    UPat(UOps.CONST, math.nan), UPat(UOps.ALU, BinaryOps.ADD), UPat(UOps.ALU, BinaryOps.MUL, name="m"),
    UPat(UOps.ALU, dtype=F32), UPat(UOps.ALU, dtype={F32, I32}, name="r"), UPat({UOps.ALU, UOps.CONST}, name="r"),
    UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.var("x")),                                  # a name used twice
    UPat.alu(BinaryOps.ADD, UPat.var("a"), UPat.cvar("c")),                                 # both operand orders
    UPat.alu(BinaryOps.ADD, UPat.var("a"), UPat.var("b")),                                  # both orders match
    UPat.alu(BinaryOps.ADD, UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c1")), UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c2"))),
    UPat.alu(BinaryOps.CMPLT, UPat.var("a"), UPat.cvar("c")),                               # one order only
    UPat(UOps.ALU, name="r", src=UPat(UOps.CONST)),                                         # every source, no names
    UPat(UOps.ALU, name="r", src=UPat(UOps.CONST, name="c")),                               # every source, named: generic
    UPat(UOps.ALU, src=[UPat.cvar("c"), UPat.var("a"), UPat.var("b")]),                     # permutations
    UPat(UOps.ALU, src=(UPat.var("a"),), allow_any_len=True),
    UPat(UOps.ALU, name="r", any_src_op=UOps.CONST), UPat(UOps.ALU, name="r", any_src_op={UOps.VAR, UOps.SPECIAL}),
    UPat.alu(TernaryOps.WHERE, UPat.var("c"), UPat.var("x"), UPat.var("x")),
  ]
  uops = [x, c2, UOp.const(I32, 0), UOp.const(dtypes.bool, True), UOp.const(I32, 1), UOp.const(F32, 1.0), UOp.const(F32, math.nan),
          x + y, x + x, x + c2, c2 + x, c2 + c3, x * c2 + x * c3, (x * c2) + (y * c3), x.lt(c2), c2.lt(x), f + 1.0, -f, -x,
          x.lt(3).where(y, y), x.lt(3).where(x, y), UOp(UOps.ALU, I32, (c2, x, y), TernaryOps.WHERE),
          UOp(UOps.ALU, I32, (x, y, c2), "FAKE"), UOp(UOps.ALU, I32, (), BinaryOps.ADD)]
  for pat in pats:
    for u in uops:
      same(pat, u)
  # spot checks that the comparison above is not vacuous
  assert len(same(UPat.alu(BinaryOps.ADD, UPat.var("a"), UPat.var("b")), x + y)) == 2
  assert same(UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.var("x")), x + x) == [{"x": x}, {"x": x}]   # one per order
  assert same(UPat.alu(BinaryOps.ADD, UPat.var("x"), UPat.var("x")), x + y) == []
  assert same(UPat(UOps.CONST, 1), UOp.const(dtypes.bool, True)) == []   # True is not the int 1
  assert same(UPat(UOps.CONST, math.nan), UOp.const(F32, math.nan)) != []


def test_any_src_op_filters_candidates() -> None:
  calls: List[UOp] = []
  pm = PatternMatcher([(UPat(UOps.ALU, name="r", any_src_op=UOps.CONST), lambda r: calls.append(r))])
  x = v("x")
  pm.rewrite(x + x)
  pm.rewrite(x + 1)
  assert calls == [] or calls[0].src[1].op is UOps.CONST
  assert len(calls) == 1


def _kernels() -> List[Kernel]:
  a = Tensor.rand(6, 10)
  b = Tensor.rand(10, 5)
  outs = [(a @ b).relu().sum(axis=1), (a.exp() * 2 + 1).max(axis=0), a.reshape(3, 20).permute(1, 0).contiguous() + 3,
          Tensor.arange(12).reshape(3, 4).sum(0), (a > 0.5).where(a, 0).cumsum(1), a.pad(((1, 1), (0, 2))).sqrt()]
  ks = []
  for out in outs:
    for si in out.schedule():
      if si.ast.op is MetaOps.KERNEL:
        k = Kernel(si.ast, opts=PythonRenderer())
        k.hand_coded_optimizations()
        ks.append(k)
  return ks


def test_every_rule_tried_on_real_kernels_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
  checked = [0]
  orig = PatternMatcher.rewrite

  def checking_rewrite(self: PatternMatcher, u: UOp, known: Any = None) -> Any:
    for p, _ in (self._candidates(u) if known is None else self._candidates_beyond(u, known)):
      same(p, u)
      checked[0] += 1
    return orig(self, u, known)
  monkeypatch.setattr(PatternMatcher, "rewrite", checking_rewrite)
  for k in _kernels():
    k.linearize()
  assert checked[0] > 1000


def test_generated_code_is_kept_for_reading() -> None:
  fn = compile_upat(UPat.alu(BinaryOps.ADD, UPat.var("a"), UPat.cvar("c")))
  assert "commutative()" in fn.source   # type: ignore[attr-defined]
  neg = compile_upat(UPat(UOps.ALU, UnaryOps.NEG, name="n"))
  assert neg(-v("x"))[0]["n"].arg is UnaryOps.NEG
