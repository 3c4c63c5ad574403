"""graph_rewrite's memo of fixpoints (a uop left unchanged by a pass is not tried again with the same rules in the next):
the later passes still apply every rule they add, give the graph the memo-free rewrite gives, and UOps still pickle."""
from __future__ import annotations

import pickle
from typing import Dict

from tiny.dtype import PtrDType, dtypes
from tiny.ops import BinaryOps
from tiny.codegen.uops import PatternMatcher, UOp, UOps, UPat, graph_rewrite
from tiny.codegen.symbolic_rules import constant_folder


def _graph() -> UOp:
  g = UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.float32), (), (0, True))
  r = UOp(UOps.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 16)), (0, False))
  idx = (r + 0) * 1 + UOp.const(dtypes.int32, 3) * 2 - 6
  val = UOp(UOps.LOAD, dtypes.float32, (g, idx)) * 2.0 + 1.0
  return UOp(UOps.SINK, None, (UOp(UOps.STORE, None, (g, idx, val)),))


def _structure(u: UOp, memo: Dict[UOp, int]) -> str:
  """A canonical text of the graph (shared nodes numbered), to compare graphs built apart."""
  if u in memo:
    return f"#{memo[u]}"
  memo[u] = len(memo)
  return f"{u.op.name}[{u.dtype}|{u.arg!r}]({','.join(_structure(s, memo) for s in u.src)})"


def test_subset_pass_is_a_no_op_and_new_rules_still_apply() -> None:
  first = graph_rewrite(_graph(), constant_folder)
  # the same rules again (and a subset of them): nothing to do, the very same graph comes back
  assert graph_rewrite(first, constant_folder) is first
  assert graph_rewrite(first, PatternMatcher(constant_folder.patterns[:5])) is first
  # a rule the earlier pass did not have is tried on every uop, fixpoint or not
  double_mul = PatternMatcher([(UPat.alu(BinaryOps.MUL, UPat.var("x"), UPat.cvar("c")),
                                lambda x, c: x + x if c.arg == 2.0 else None)])
  second = graph_rewrite(first, constant_folder + double_mul)
  ops = [u.arg for u in second.parents if u.op is UOps.ALU]
  assert BinaryOps.MUL not in ops and BinaryOps.ADD in ops
  # the same as rewriting a fresh copy of the graph (no memo at all) with both matchers
  fresh = graph_rewrite(graph_rewrite(_graph(), constant_folder + double_mul), constant_folder + double_mul)
  assert _structure(second, {}) == _structure(fresh, {})


def test_the_index_folds_like_before() -> None:
  out = graph_rewrite(_graph(), constant_folder)
  store = out.src[0]
  # ((r + 0) * 1 + 3*2) - 6 == r: the identities and constant folding still fire
  assert store.src[1].op is UOps.RANGE


def test_rewritten_uops_pickle() -> None:
  out = graph_rewrite(_graph(), constant_folder)
  back = pickle.loads(pickle.dumps(out))
  assert _structure(back, {}) == _structure(out, {})
  assert "_fix" not in back.__dict__ and "_sfix" not in back.__dict__
