"""The expander: EXPAND/CONTRACT disappear and every lane of an upcast axis becomes its own scalar uops."""
from __future__ import annotations

import functools
import itertools
from typing import Dict, List, Optional, Tuple

from tiny.helpers import dedup, flatten
from tiny.codegen.uops import UOp, UOps, UPat, PatternMatcher


def _expand_idx(args: Tuple[Tuple[int, int], ...], rpk: Dict[int, int]) -> int:
  idx, mul = 0, 1
  for axis, m in args[::-1]:
    idx += rpk[axis] * mul
    mul *= m
  return idx


@functools.lru_cache(maxsize=4096)
def _choices(args: Tuple[Tuple[int, int], ...]) -> List[Dict[int, int]]:
  # cached: the same few axis sets come back for every uop of a kernel. Callers only read the dicts.
  return [dict(x) for x in itertools.product(*[[(axis, i) for i in range(m)] for axis, m in args])]


@functools.lru_cache(maxsize=4096)
def _lane_map(args: Tuple[Tuple[int, int], ...], sarg: Tuple[Tuple[int, int], ...]) -> Tuple[int, ...]:
  """For each lane of an EXPAND over `args`, the lane of an EXPAND over `sarg` (some of those axes) it takes."""
  return tuple(_expand_idx(sarg, rpk) for rpk in _choices(args))


def do_expand(root: UOp) -> Optional[UOp]:
  """An op with EXPAND sources becomes an EXPAND of one op per lane."""
  expands = [x for x in root.src if x.op is UOps.EXPAND]
  if not expands:
    return None
  if root.op is UOps.DEFINE_ACC:
    return None
  args = tuple(sorted(dedup(flatten([x.arg for x in expands]))))
  # per source, its lane for every output lane (None: not an EXPAND, the same uop in every lane)
  maps = [_lane_map(args, s.arg) if s.op is UOps.EXPAND else None for s in root.src]
  lanes = []
  for lane in range(len(_choices(args))):
    lanes.append(UOp(root.op, root.dtype, tuple([s if m is None else s.src[m[lane]] for s, m in zip(root.src, maps)]), root.arg))
  return UOp(UOps.EXPAND, root.dtype, tuple(lanes), args)


def do_contract(con: UOp) -> Optional[UOp]:
  """CONTRACT gathers the lanes of some expand axes into a vector."""
  ex = con.src[0]
  assert con.dtype is not None
  if ex.op is not UOps.EXPAND:
    return UOp(UOps.VECTORIZE, con.dtype, (ex,) * con.dtype.count)
  missing = [a for a in con.arg if a not in ex.arg]
  if missing:
    # the source does not vary along these axes: expand it to them first
    full = tuple(sorted(ex.arg + tuple(missing)))
    lanes = tuple(ex.src[_expand_idx(ex.arg, rpk)] for rpk in _choices(full))
    ex = UOp(UOps.EXPAND, ex.dtype, lanes, full)
  rest = tuple(x for x in ex.arg if x not in con.arg)
  out = []
  for rpk in _choices(rest):
    out.append(UOp(UOps.VECTORIZE, con.dtype, tuple(ex.src[_expand_idx(ex.arg, {**rpk, **lrpk})] for lrpk in _choices(con.arg))))
  return UOp(UOps.EXPAND, con.dtype, tuple(out), rest)


def _merge_nested_expand(root: UOp) -> Optional[UOp]:
  """An EXPAND whose lanes are themselves EXPANDs becomes one EXPAND over both sets of axes."""
  if not any(x.op is UOps.EXPAND for x in root.src):
    return None
  inner = tuple(sorted(dedup(flatten([x.arg for x in root.src if x.op is UOps.EXPAND]))))
  args = tuple(sorted(dedup(root.arg + inner)))
  lanes = []
  for rpk in _choices(args):
    x = root.src[_expand_idx(root.arg, rpk)]
    lanes.append(x.src[_expand_idx(x.arg, rpk)] if x.op is UOps.EXPAND else x)
  return UOp(UOps.EXPAND, root.dtype, tuple(lanes), args)


def _flatten_expand_src(root: UOp) -> Optional[UOp]:
  if not any(x.op is UOps.EXPAND for x in root.src):
    return None
  return UOp(root.op, root.dtype, tuple(flatten([x.src if x.op is UOps.EXPAND else (x,) for x in root.src])), root.arg)


def _gep_vectorize(g: UOp, vec: UOp) -> UOp:
  return vec.src[g.arg]


def _vectorize_of_geps(root: UOp) -> Optional[UOp]:
  x = root.src[0].src[0]
  if x.dtype != root.dtype or not all(s.op is UOps.GEP and s.src[0] is x and s.arg == i for i, s in enumerate(root.src)):
    return None
  return x


expander = PatternMatcher([
  # both functions only act on a uop with an EXPAND source: the matcher does not offer them the others
  (UPat({UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.WMMA, UOps.LOAD, UOps.STORE, UOps.VECTORIZE, UOps.REDUCE, UOps.BARRIER,
         UOps.AFTER}, name="root", src=None, any_src_op=UOps.EXPAND),
   lambda root: do_expand(root) if root.op not in (UOps.BARRIER, UOps.AFTER) else _flatten_expand_src(root)),
  (UPat(UOps.CONTRACT, name="con"), do_contract),
  (UPat(UOps.EXPAND, name="ex"), lambda ex: ex.src[0] if ex.arg == () else _merge_nested_expand(ex)),
  (UPat(UOps.SINK, name="root"), _flatten_expand_src),
  (UPat(UOps.GEP, name="g", src=(UPat(UOps.VECTORIZE, name="vec"),)), _gep_vectorize),
  (UPat(UOps.VECTORIZE, name="root", src=UPat(UOps.GEP)), _vectorize_of_geps),
])
