"""Ordering the rewritten graph: a toposort, the block-structured linearizer (RANGE/ENDRANGE around exactly the uops
that need each loop), the checker of its ordering rules, and the flops/memory estimate of the list."""
from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from tiny.helpers import flatten, prod
from tiny.ops import BinaryOps, TernaryOps, UnaryOps
from tiny.codegen.uops import UOp, UOps
from tiny.codegen.symbolic_rules import is_int


def toposort(sink: UOp) -> List[UOp]:
  """Every uop reachable from sink, sources before users (iterative: graphs can be deep)."""
  order: List[UOp] = []
  seen: Set[UOp] = set()
  stack: List[Tuple[UOp, bool]] = [(sink, False)]
  while stack:
    u, expanded = stack.pop()
    if expanded:
      order.append(u)
      continue
    if u in seen:
      continue
    seen.add(u)
    stack.append((u, True))
    for s in reversed(u.src):
      if s not in seen:
        stack.append((s, False))
  return order



def all_nodes(sink: UOp) -> List[UOp]:
  """Every uop reachable from sink, sources before users."""
  return toposort(sink)


_TOP_OPS = {UOps.DEFINE_GLOBAL: 0, UOps.DEFINE_VAR: 1, UOps.DEFINE_LOCAL: 2, UOps.SPECIAL: 3, UOps.CONST: 4}


class LinearizeError(RuntimeError):
  """The graph's loops cannot be nested consistently (an internal codegen bug)."""


def linearize_sink(sink: UOp) -> List[UOp]:
  """Order the graph into a list with RANGE/ENDRANGE around exactly the uops that must be in each loop."""
  nodes = [u for u in toposort(sink) if u.op is not UOps.SINK]
  topo_idx = {u: i for i, u in enumerate(nodes)}
  acc_ranges: Dict[UOp, FrozenSet[UOp]] = {u: frozenset(s for s in u.src[1:] if s.op is UOps.RANGE) for u in nodes if u.op is UOps.DEFINE_ACC}
  phis: Dict[UOp, List[UOp]] = defaultdict(list)
  for u in nodes:
    if u.op is UOps.PHI:
      phis[u.src[0]].append(u)
  range_accs: Dict[UOp, List[UOp]] = defaultdict(list)
  # the loops of one accumulator nest in the order of its src
  range_outer: Dict[UOp, FrozenSet[UOp]] = defaultdict(frozenset)
  for a in acc_ranges:
    rs = [s for s in a.src[1:] if s.op is UOps.RANGE]
    for i, r in enumerate(rs):
      range_accs[r].append(a)
      range_outer[r] = range_outer[r] | frozenset(rs[:i])
  glob = sorted([u for u in nodes if u.op is UOps.RANGE and not u.arg[1]], key=lambda r: (r.arg[0], topo_idx[r]))
  gset = frozenset(glob)
  empty: FrozenSet[UOp] = frozenset()
  # the bounds of the global loops (e.g. `v+1` for a symbolic size) are computed before the outermost loop opens
  bounds: Set[UOp] = set()
  stack = [s for r in glob for s in r.src]
  while stack:
    if (x := stack.pop()) not in bounds:
      bounds.add(x)
      stack.extend(x.src)
  acc_outer: Dict[UOp, FrozenSet[UOp]] = {a: gset for a in acc_ranges}
  place: Dict[UOp, FrozenSet[UOp]] = {}
  export: Dict[UOp, FrozenSet[UOp]] = {}
  for _ in range(len(acc_ranges) + 2):
    for u in nodes:
      srcs_export = empty.union(*[export[s] for s in u.src]) if u.src else empty
      if u.op in _TOP_OPS:
        p = e = empty
      elif u in bounds:
        p = e = srcs_export
      elif u.op is UOps.RANGE:
        if not u.arg[1]:
          p = frozenset(glob[:glob.index(u) + 1])
        else:
          p = srcs_export | gset | range_outer[u] | empty.union(*[acc_outer[a] for a in range_accs[u]]) | {u}
        e = p
      elif u.op is UOps.DEFINE_ACC:
        p = acc_outer[u] | gset
        e = p | acc_ranges[u]
      elif u.op is UOps.PHI:
        p = srcs_export | gset | acc_ranges[u.src[0]]
        e = p - acc_ranges[u.src[0]]
      elif u.op is UOps.AFTER:
        # inside the loops of its stores; its users are placed outside the loops it names, so (see emit) after them
        p = srcs_export | gset
        e = p - frozenset(s for s in u.src if s.op is UOps.RANGE and s.arg[1])
      else:
        p = e = srcs_export | gset
      place[u], export[u] = p, e
    new_outer = {a: empty.union(*[export[ph] for ph in phis[a]]) | gset for a in acc_ranges}
    if new_outer == acc_outer:
      break
    acc_outer = new_outer
  loops = [u for u in nodes if u.op is UOps.RANGE]
  depth = {r: len(place[r]) for r in loops}

  def innermost(s: FrozenSet[UOp]) -> Optional[UOp]:
    return max(s, key=lambda r: (depth[r], topo_idx[r])) if s else None

  parent: Dict[UOp, Optional[UOp]] = {}
  for r in loops:
    parent[r] = pr = innermost(place[r] - {r})
    if place[r] - {r} != (place[pr] if pr is not None else empty):
      raise LinearizeError(f"loop {r.arg} cannot be nested: {sorted(x.arg for x in place[r])}")
  block: Dict[UOp, Optional[UOp]] = {}
  for u in nodes:
    if u.op is UOps.RANGE:
      block[u] = parent[u]
      continue
    b = innermost(place[u])
    if place[u] != (place[b] if b is not None else empty):
      raise LinearizeError(f"{u.op} needs loops {sorted(x.arg for x in place[u])} that do not nest")
    block[u] = b
  children: Dict[Optional[UOp], List[UOp]] = defaultdict(list)
  for u in nodes:
    children[block[u]].append(u)

  def top_of(u: UOp, b: Optional[UOp]) -> Optional[UOp]:
    # the member of block b that contains u (u itself, or the child loop of b that u is inside of); None if u is outside b
    x: Optional[UOp] = u
    while x is not None and block[x] is not b:
      x = block[x]
      if x is None and b is not None:
        return None
    return x

  out: List[UOp] = []

  def emit(b: Optional[UOp]) -> None:
    members = children[b]
    mset = set(members)
    deps: Dict[UOp, Set[UOp]] = {m: set() for m in members}
    users: Dict[UOp, List[UOp]] = defaultdict(list)
    subtree_cache: Dict[UOp, List[UOp]] = {}

    def subtree(r: UOp) -> List[UOp]:
      if r not in subtree_cache:
        subtree_cache[r] = [r] + flatten([subtree(c) if c.op is UOps.RANGE else [c] for c in children[r]])
      return subtree_cache[r]
    for m in members:
      body = subtree(m) if m.op is UOps.RANGE else [m]
      for u in body:
        for s in u.src:
          if u.op is UOps.DEFINE_ACC and s.op is UOps.RANGE:
            continue
          t = top_of(s, b)
          if t is not None and t is not m and t in mset:
            deps[m].add(t)
    for m, ds in deps.items():
      for d in ds:
        users[d].append(m)
    indeg = {m: len(deps[m]) for m in members}

    def prio(m: UOp) -> Tuple[int, int, int]:
      cls = _TOP_OPS.get(m.op, 9)
      return (cls, m.arg[0] if m.op is UOps.DEFINE_GLOBAL else 0, topo_idx[m])
    heap = [(prio(m), topo_idx[m], m) for m in members if indeg[m] == 0]
    heapq.heapify(heap)
    done = 0
    while heap:
      _, _, m = heapq.heappop(heap)
      done += 1
      if m.op is UOps.RANGE:
        out.append(m)
        emit(m)
        out.append(UOp(UOps.ENDRANGE, None, (m,)))
      else:
        out.append(m)
      for x in users[m]:
        indeg[x] -= 1
        if indeg[x] == 0:
          heapq.heappush(heap, (prio(x), topo_idx[x], x))
    if done != len(members):
      raise LinearizeError("cycle while ordering a block")
  emit(None)
  return out


# *** estimates ***

def _sym(u: UOp) -> Any:
  if u.op is UOps.CONST:
    return u.arg
  if u.op is UOps.DEFINE_VAR:
    return u.arg
  if u.op is UOps.ALU and u.arg in (BinaryOps.ADD, BinaryOps.MUL):
    a, b = _sym(u.src[0]), _sym(u.src[1])
    return a + b if u.arg is BinaryOps.ADD else a * b
  if u.op is UOps.ALU and u.arg is UnaryOps.NEG:
    return -_sym(u.src[0])
  return 1


def flops_mem(uops: List[UOp], ignore_indexing: bool = False) -> Tuple[Any, Any]:
  """(flops, bytes loaded+stored) of a linearized kernel, loops multiplied in."""
  flops: Any = 0
  mem: Any = 0
  mults: Any = 1
  stack: List[Any] = []
  for u in uops:
    if u.op is UOps.RANGE:
      stack.append(mults)
      mults = mults * (_sym(u.src[1]) - _sym(u.src[0]))
    elif u.op is UOps.ENDRANGE:
      mults = stack.pop()
    elif u.op in (UOps.LOAD, UOps.STORE):
      dt = u.dtype if u.op is UOps.LOAD else u.src[2].dtype
      if dt is not None:
        mem += dt.itemsize * mults
    elif u.op is UOps.ALU and u.dtype is not None:
      if ignore_indexing and is_int(u):
        continue
      flops += (2 if u.arg is TernaryOps.MULACC else 1) * u.dtype.count * mults
    elif u.op is UOps.WMMA:
      flops += 2 * prod(u.arg[1]) // u.arg[5] * mults
  return flops, mem


def verify_linearized(uops: Sequence[UOp]) -> None:
  """Check the ordering rules of the linearized list (raises AssertionError on the first violation)."""
  pos = {u: i for i, u in enumerate(uops)}
  open_loops: List[UOp] = []
  scope_of: Dict[UOp, Tuple[UOp, ...]] = {}
  for i, u in enumerate(uops):
    assert u.op not in (UOps.EXPAND, UOps.CONTRACT, UOps.REDUCE, UOps.SINK, UOps.VAR), f"{u.op} left after linearization"
    for s in u.src:
      if u.op is UOps.DEFINE_ACC and s.op is UOps.RANGE:
        assert s in pos and pos[s] > i, "DEFINE_ACC must come before its loops"
        continue
      assert s in pos and pos[s] < i, f"{u.op} at {i} uses {s.op} defined later or never"
      if s.op in (UOps.RANGE, UOps.IF) and u.op in (UOps.ENDRANGE, UOps.ENDIF):
        continue
      sc = scope_of[s]
      if s.op not in (UOps.PHI, UOps.AFTER):
        assert tuple(open_loops[:len(sc)]) == sc, f"{u.op} at {i} uses {s.op} from a closed scope"
    if u.op in (UOps.RANGE, UOps.IF):
      scope_of[u] = tuple(open_loops) + (u,)
      open_loops.append(u)
    elif u.op in (UOps.ENDRANGE, UOps.ENDIF):
      assert open_loops and open_loops[-1] is u.src[0], "END closes the wrong scope"
      open_loops.pop()
      scope_of[u] = tuple(open_loops)
    else:
      scope_of[u] = tuple(open_loops)
  assert not open_loops, "unclosed scopes"

