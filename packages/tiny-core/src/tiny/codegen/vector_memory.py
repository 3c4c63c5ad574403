"""Vector memory folding: consecutive scalar LOADs/STOREs of a float buffer (or, on CPUs, a 32/64-bit int buffer) become one
vector LOAD/STORE (+ GEPs)."""
from __future__ import annotations

import functools
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Dict, Optional, Set, Tuple

from tiny.dtype import DType, dtypes
from tiny.helpers import dedup
from tiny.ops import BinaryOps
from tiny.codegen.uops import UOp, UOps, graph_substitute
from tiny.codegen.symbolic_rules import split_const
from tiny.codegen.linearize import all_nodes

if TYPE_CHECKING:
  from tiny.renderer import Renderer


def _base_offset(idx: UOp) -> Tuple[UOp, int]:
  if idx.op is UOps.CONST and isinstance(idx.arg, int):
    return idx.const_like(0), idx.arg
  return split_const(idx)


def _vector_sizes(dtype: DType, simd_bytes: int = 0) -> Tuple[int, ...]:
  if dtype.scalar() in (dtypes.float16, dtypes.bfloat16):
    return (8, 4, 2)
  # a renderer that re-vectorizes ALU ops (simd_bytes) takes loads and stores as wide as its registers
  widest = max(4, simd_bytes // dtype.scalar().itemsize)
  return tuple(s for s in (16, 8, 4, 2) if s <= widest)


def _foldable(elem: DType, simd_bytes: int) -> bool:
  """Floats fold everywhere; 32/64-bit ints only for renderers that re-vectorize the ALU ops too (simd_bytes > 0): there
  the vector store lets `vectorize_lanes` turn integer chains (threefry's rounds) into vector code, while elsewhere a vector
  of ints would only be gathered from scalar lanes."""
  return dtypes.is_float(elem) or (simd_bytes > 0 and dtypes.is_int(elem) and elem.itemsize in (4, 8))


def fold_vector_memory(sink: UOp, opts: Optional[Renderer]) -> UOp:
  """Consecutive aligned scalar LOADs/STOREs of float buffers (32/64-bit int ones too on CPUs) become one vector LOAD/STORE (+ GEPs)."""
  if opts is None or not getattr(opts, "supports_float4", False):
    return sink
  # loads first: rewriting them rebuilds the stores that use them
  simd = int(getattr(opts, "simd_bytes", 0) or 0)
  return _fold_vector_memory(_fold_vector_memory(sink, UOps.LOAD, simd), UOps.STORE, simd)


def _fold_vector_memory(sink: UOp, kind: UOps, simd_bytes: int = 0) -> UOp:
  loads: Dict[Any, Dict[int, UOp]] = defaultdict(dict)
  stores: Dict[Any, Dict[int, UOp]] = defaultdict(dict)
  for u in all_nodes(sink):
    if u.op is not kind or u.src[0].op not in (UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL):
      continue
    elem = u.dtype if u.op is UOps.LOAD else u.src[2].dtype
    if elem is None or elem.count != 1 or not _foldable(elem, simd_bytes):
      continue
    base, off = _base_offset(u.src[1])
    if u.op is UOps.LOAD and len(u.src) == 2:
      loads[(u.src[0], base, elem, False)].setdefault(off, u)
    elif u.op is UOps.LOAD and simd_bytes and len(u.src) == 4 and u.src[2].op is not UOps.BARRIER:
      # a CPU folds gated loads too: see the gated vector load below
      loads[(u.src[0], base, elem, True)].setdefault(off, u)
    elif u.op is UOps.STORE and len(u.src) == 3:
      stores[(u.src[0], base, elem, False)][off] = u
  replace: Dict[UOp, UOp] = {}
  for groups, is_load in ((loads, True), (stores, False)):
    for (buf, base, elem, gated), by_off in groups.items():
      used: Set[int] = set()
      for off in sorted(by_off):
        if off in used:
          continue
        for sz in _vector_sizes(elem, simd_bytes):
          offs = list(range(off, off + sz))
          # GPUs need vectors aligned to their size; a CPU (simd_bytes) loads and stores at any element offset
          aligned = simd_bytes > 0 or (off % sz == 0 and base.divides(sz) is not None)
          if not aligned or any(o not in by_off or o in used for o in offs):
            continue
          members = [by_off[o] for o in offs]
          vidx = members[0].src[1]
          if is_load and gated:
            # all lanes valid: one vector load; otherwise each lane's own gated load, evaluated only then (the
            # renderer inlines the alternative), so no lane is ever read out of its bounds
            gates = dedup([m.src[2] for m in members])
            gate = functools.reduce(lambda a, b: a.alu(BinaryOps.AND, b), gates)
            # (copies of the lanes: the originals are what gets replaced by this load's GEPs)
            lanes = tuple(UOp(m.op, m.dtype, m.src, m.arg) for m in members)
            vl = UOp(UOps.LOAD, elem.vec(sz), (buf, vidx, gate, UOp(UOps.VECTORIZE, elem.vec(sz), lanes)))
            for i, m in enumerate(members):
              replace[m] = vl.gep(i)
          elif is_load:
            vl = UOp(UOps.LOAD, elem.vec(sz), (buf, vidx))
            for i, m in enumerate(members):
              replace[m] = vl.gep(i)
          else:
            vs = UOp(UOps.STORE, None, (buf, vidx, UOp(UOps.VECTORIZE, elem.vec(sz), tuple(m.src[2] for m in members))))
            replace[members[0]] = vs
            for m in members[1:]:
              replace[m] = UOp(UOps.NOOP)
          used.update(offs)
          break
  if not replace:
    return sink
  # a plain substitution: graph_rewrite would merge a gated load's lane copies with the very lanes being replaced
  return graph_substitute(sink, replace)
