"""The scheduler: turns a graph of LazyBuffers into an ordered list of kernels (ScheduleItems).

It decides which LazyBuffers get their own memory ("realizes") and fuses everything else into the kernels
that use it:
- outputs, meta ops (copies, contiguous, assign, ...) and `forced_realize` buffers are realized;
- a view that expands its base (broadcasting a reduce result, say) realizes the base, so the work is not
  repeated for every broadcast element, unless the base is a few elementwise ops on buffers that exist already
  (BatchNorm's rsqrt(var + eps)): then each reading kernel recomputes it instead of a kernel of its own;
- a padded view fuses only when every op between it and the realized inputs maps 0 to 0 (UNSAFE_PAD_OPS);
- elementwise work after a reduce joins the reduce's kernel when it reads the reduce contiguously, and
  several outputs of one reduce become one multi-output kernel, which also stores the realized buffers computed
  elementwise and contiguously from those outputs (an optimizer's new weight from its new momentum).
Kernels are then ordered by a deterministic toposort in which every read of an assign target comes before
the assign, and a memory planner lets intermediates whose lifetimes do not overlap share buffers.
"""
from __future__ import annotations

import sys
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, ClassVar, DefaultDict, Dict, List, Optional, Sequence, Set, Tuple, Union, cast

from tiny import eager_key
from tiny.device import Buffer
from tiny.dtype import ImageDType
from tiny.engine import graph_viz, pending
from tiny.engine.row_fusion import RowKernels, row_kernels
from tiny.helpers import DEBUG, MULTIOUTPUT, ROW_FUSION, Metadata, all_int, dedup, getenv, merge_dicts, prod
from tiny.lazy import LazyBuffer
from tiny.ops import UNSAFE_PAD_OPS, ArangeBuffer, BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps
from tiny.registry import Device
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import Variable

# graphs are walked recursively; deep elementwise chains need more than the default limit
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))


@dataclass(frozen=True)
class ScheduleItem:
  """One kernel (or meta op) to run: its AST and its buffers, outputs first."""

  ast: LazyOp
  bufs: Tuple[Buffer, ...]
  metadata: Optional[List[Metadata]] = None
  # not a field: (PendingSchedule, index) while a handed-out item has not run (see engine/pending.py)
  _pending: ClassVar[Optional[Tuple[Any, int]]] = None

  @property
  def outputs(self) -> Tuple[Buffer, ...]:
    """The buffers this item writes."""
    return self.bufs[:len(self.ast.src)] if self.ast.op is MetaOps.KERNEL else self.bufs[0:1]

  @property
  def inputs(self) -> Tuple[Buffer, ...]:
    """The buffers this item only reads."""
    return self.bufs[len(self.ast.src):] if self.ast.op is MetaOps.KERNEL else self.bufs[1:]


@dataclass(frozen=True)
class _PreItem:
  """A ScheduleItem still expressed on LazyBuffers (before buffers are known to be final)."""

  ast: LazyOp
  outputs: Tuple[LazyBuffer, ...]
  inputs: Tuple[LazyBuffer, ...]
  var_vals: Dict[Variable, int] = field(default_factory=dict)
  metadata: List[Metadata] = field(default_factory=list)


class AssignNotContiguousError(RuntimeError):
  """An assign reads its own target through a non-contiguous view (`a += a.T`), which would race."""


# **************** lowering one group of LazyBuffers to a kernel AST ****************

# Kernel ASTs are hash-consed: a structurally equal node built again (the same op realized again in an eager loop) is the
# very same object, so its hash is already cached and the method cache's key compare is an identity check instead of a
# walk of both trees. Equality here is LazyOp's own (op, arg ==, sources), so sharing can only merge what the method cache
# would have treated as equal anyway. A plain dict (a weak one costs more than it saves), emptied when it grows large.
_ast_nodes: Dict[Tuple[Any, ...], LazyOp] = {}
_AST_NODES_MAX = 1 << 14


def _lop(op: Any, src: Tuple[LazyOp, ...] = (), arg: Any = None) -> LazyOp:
  key = (op, src, arg)
  try:
    if (hit := _ast_nodes.get(key)) is not None:
      return hit
    if len(_ast_nodes) >= _AST_NODES_MAX:
      _ast_nodes.clear()
    ret = _ast_nodes[key] = LazyOp(op, src, arg)
  except TypeError:   # an unhashable arg: no sharing
    ret = LazyOp(op, src, arg)
  return ret

def _unbind(st: ShapeTracker, var_vals: Dict[Variable, int]) -> ShapeTracker:
  unbound, vv = st.simplify().unbind()
  var_vals.update(vv)
  return unbound


def _recursive_lazyop(buf: LazyBuffer, st: ShapeTracker, outputs: Tuple[LazyBuffer, ...], inputs: List[LazyBuffer], var_vals: Dict[Variable, int],
                      realizes: Dict[LazyBuffer, None], assign_targets: Dict[LazyBuffer, LazyBuffer],
                      cache: Dict[Tuple[LazyBuffer, ShapeTracker], LazyOp]) -> LazyOp:
  """The AST that computes `buf` viewed through `st`, fusing everything that is not realized."""
  if buf is not buf.base:
    st, buf = buf.st + st, buf.base
  if (buf, st) in cache:
    return cache[(buf, st)]
  ret: LazyOp
  if buf.op is MetaOps.CONST:
    # constants are always generated inline (a bound Variable becomes a kernel argument)
    val = buf.arg
    if isinstance(val, Variable):
      val, bound = val.unbind()
      var_vals[val] = bound
    ret = _lop(BufferOps.CONST, (), ConstBuffer(val, buf.dtype, _unbind(st, var_vals)))
  elif buf.realized is not None or (buf in realizes and buf not in outputs):
    unbound = _unbind(st, var_vals)
    if buf in assign_targets:
      # the kernel writes this buffer: it may read each element only where it writes it
      if not unbound.contiguous and not _masked_contiguous(unbound):
        raise AssignNotContiguousError("an assign target is read through a non-contiguous view in its own kernel; "
                                       "make the value contiguous first (a += a.T  ->  a += a.T.contiguous())")
      ret = _lop(BufferOps.LOAD, (), MemBuffer(outputs.index(assign_targets[buf]), buf.dtype, unbound))
    else:
      if buf not in inputs:
        inputs.append(buf)
      ret = _lop(BufferOps.LOAD, (), MemBuffer(len(outputs) + inputs.index(buf), buf.dtype, unbound))
  elif buf.op is MetaOps.ARANGE:
    # computed in place from each position, like a constant (stored only when it is itself the output)
    ret = _lop(BufferOps.ARANGE, (), ArangeBuffer(buf.dtype, _unbind(st, var_vals)))
  elif buf.op in (MetaOps.CONTIGUOUS, MetaOps.ASSIGN):
    # elementwise no-ops whose only job is to be the realized output
    assert buf in outputs, f"{buf.op} must be a kernel output"
    ret = _recursive_lazyop(buf.srcs[0], st, outputs, inputs, var_vals, realizes, assign_targets, cache)
  elif buf.op in ReduceOps:
    # the reduce reads its source in the source's full shape; everything above it is in the reduced shape
    src = _recursive_lazyop(buf.srcs[0], ShapeTracker.from_shape(buf.srcs[0].shape), outputs, inputs, var_vals, realizes, assign_targets, cache)
    ret = _lop(buf.op, (src,), buf.arg)
  else:
    ret = _lop(buf.op, tuple(_recursive_lazyop(x, st, outputs, inputs, var_vals, realizes, assign_targets, cache) for x in buf.srcs), buf.arg)
  cache[(buf, st)] = ret
  return ret


def _masked_contiguous(st: ShapeTracker) -> bool:
  """A single masked view that equals a contiguous tracker on its valid region (a padded contiguous read)."""
  if len(st.views) != 1 or (mask := st.views[0].mask) is None:
    return False
  return ShapeTracker.from_shape(st.shape).shrink(mask) == st.shrink(mask)


def _lower_group(outs: List[LazyBuffer], realizes: Dict[LazyBuffer, None], reduce_for_op: Dict[LazyBuffer, LazyBuffer]) -> _PreItem:
  """Describe the computation of a group of outputs as one kernel AST (or one meta op)."""
  out = outs[0]
  if out.op in (MetaOps.CUSTOM, MetaOps.COPY, MetaOps.EMPTY, MetaOps.VIEW):
    return _PreItem(LazyOp(out.op, (), out.arg), (out,), tuple(x.base for x in out.srcs))
  var_vals: Dict[Variable, int] = merge_dicts([dict(o.st.var_vals) for o in outs])
  local_assigns = {x.srcs[1]: x for x in outs if x.op is MetaOps.ASSIGN}
  cache: Dict[Tuple[LazyBuffer, ShapeTracker], LazyOp] = {}
  inputs: List[LazyBuffer] = []
  stores: List[LazyOp] = []
  for i, o in enumerate(outs):
    # a kernel with a reduce runs in the (unsqueezed) reduced shape, one without in the output's shape
    r = reduce_for_op.get(o)
    output_st = ShapeTracker.from_shape(r.shape if r is not None else o.shape)
    lop = _recursive_lazyop(o, output_st, tuple(outs), inputs, var_vals, realizes, local_assigns, cache)
    store_st = o.arg[0] if o.op is MetaOps.ASSIGN and o.arg else output_st
    if store_st.shape != output_st.shape:
      store_st = store_st.reshape(output_st.shape)
    stores.append(_lop(BufferOps.STORE, (lop,), MemBuffer(i, o.dtype, _unbind(store_st, var_vals))))
  metadata = dedup([b.metadata for b, _ in cache if b.metadata is not None and b not in inputs])
  return _PreItem(_lop(MetaOps.KERNEL, tuple(stores)), tuple(outs), tuple(inputs), var_vals, metadata)


# **************** the graph walk and realize decisions ****************

def _recurse_lb(buf: LazyBuffer, realizes: Dict[LazyBuffer, None], allbufs: Dict[LazyBuffer, None], simple_pads: Dict[LazyBuffer, None],
                children: DefaultDict[LazyBuffer, Dict[LazyBuffer, None]], assign_targets: Dict[LazyBuffer, LazyBuffer],
                expanded: Optional[Dict[LazyBuffer, None]] = None) -> None:
  """Visit every unrealized LazyBuffer reachable from buf, recording children and the forced realizes.

  Bases read through a plain (unmasked) expand go to `expanded` when it is given: the caller decides once the whole
  graph is known whether they are cheap enough to recompute per element (see _recompute_from)."""
  stack: List[LazyBuffer] = [buf]
  while stack:
    buf = stack.pop()
    if buf in allbufs or buf.base.realized is not None:
      continue
    if buf is not buf.base:
      views = buf.st.views
      if len(views) == 1 and views[-1].mask is not None and all_int(buf.base.st.shape) and \
          prod(buf.base.st.shape) >= prod([y - x for x, y in views[-1].mask]):
        # a pad (or shrink+pad) reading no more than the base holds: fusable if the ops below are pad-safe
        simple_pads[buf.base] = None
      elif prod(buf.base.st.shape) < prod(buf.st.shape) and buf.base.op is not MetaOps.ARANGE:
        # an expand: compute the base once instead of once per broadcast element
        if not (buf.base.op is UnaryOps.CAST and isinstance(buf.base.srcs[0].dtype, ImageDType) and isinstance(buf.base.arg, ImageDType)):
          if expanded is not None and all(v.mask is None for v in views) and all_int(buf.st.shape):
            expanded[buf.base] = None
          else:
            realizes[buf.base] = None
      elif any(v.mask is not None for v in views):
        simple_pads[buf.base] = None
      stack.append(buf.base)
      continue
    allbufs[buf] = None
    if buf.forced_realize or (buf.op in MetaOps and buf.op is not MetaOps.ARANGE):
      realizes[buf] = None
    if buf.op is MetaOps.ASSIGN:
      target = buf.srcs[1]
      assert target.base is target and target.realized is not None, "assign must target a realized base"
      assign_targets[target] = buf
    if buf.op is MetaOps.COPY:
      if not (buf.srcs[0].st.contiguous and buf.srcs[0].size == buf.srcs[0].base.size):
        raise RuntimeError("a COPY must read a whole contiguous buffer")
      realizes[buf.srcs[0].base] = None
    if buf.op is MetaOps.VIEW:
      realizes[buf.srcs[0].base] = None
    for x in buf.srcs:
      if x.base.realized is None:
        children[x.base][buf] = None
    # reversed so the first source is visited first (keeps buffer order stable and natural)
    stack.extend(reversed(buf.srcs))


# the most elementwise ops a broadcast value may have to be recomputed per element instead of getting its own kernel
_RECOMPUTE_MAX_OPS = 8
# above this many elements a broadcast value that reads a buffer of its own size is not recomputed: a product reading it
# through a broadcast (GPT-2's first layernorm output, 128 x 768, into the QKV matmul) would recompute it and re-read
# that buffer once per column panel (~10x slower kernel), where its own kernel is one pass. A large value made from
# small inputs (the one-hot mask of an embedding lookup, tokens == arange) is still recomputed
_RECOMPUTE_MAX_ELEMENTS = 1 << 14


def _not_smaller(p: LazyBuffer, b: LazyBuffer) -> bool:
  return not all_int(p.shape) or prod(cast(Tuple[int, ...], p.shape)) >= prod(cast(Tuple[int, ...], b.shape))


def _recompute_from(b: LazyBuffer, realizes: Dict[LazyBuffer, None], assign_targets: Dict[LazyBuffer, LazyBuffer]) -> Optional[List[LazyBuffer]]:
  """When b is a few elementwise ops on buffers that exist before the kernels reading it run (realized ones, or ones
  realized in this schedule), like Adam's `1 - b1**t` or BatchNorm's `rsqrt(var + eps)`, its expanded reads recompute it
  in the reading kernel instead of launching a kernel for a handful of values: the buffers it must then be recomputed
  from that are not realized yet (see _stored_by_its_reduce). None when b is not cheap to recompute, or reads a buffer
  that is assigned in this schedule: that read of the old contents stays in a kernel of its own, before the assign."""
  if b.forced_realize or not all_int(b.shape):
    return None
  # a large b that reads a buffer as large as itself would re-read it once per broadcast element: it gets a kernel
  large = prod(b.shape) > _RECOMPUTE_MAX_ELEMENTS
  todo, seen, ops, boundaries = [b], set(), 0, []
  while todo:
    p = todo.pop()
    if p in seen:
      continue
    seen.add(p)
    if p.realized is not None:
      if p in assign_targets or (large and _not_smaller(p, b)):
        return None
      continue
    if p.op in (MetaOps.CONST, MetaOps.ARANGE):
      continue
    if p is not b and p in realizes:
      if large and _not_smaller(p, b):
        return None
      continue
    if p is not b and _stored_by_its_reduce(p):
      if large and _not_smaller(p, b):
        return None
      # p = f(a reduce, realized inputs): the reduce needs a kernel anyway, which then stores p, and the reads recompute
      # from there (a loss gradient computed from the forward's output and broadcast into several weight gradients)
      boundaries.append(p)
      continue
    ops += 1
    if not isinstance(p.op, (UnaryOps, BinaryOps, TernaryOps)) or isinstance(p.dtype, ImageDType) or ops > _RECOMPUTE_MAX_OPS:
      return None
    todo.extend(x.base for x in p.srcs)
  return boundaries


def _stored_by_its_reduce(p: LazyBuffer) -> bool:
  """p is elementwise on exactly one unrealized reduce of its own size (read contiguously), realized buffers and
  constants, so the reduce's kernel can store p itself."""
  if not isinstance(p.op, (UnaryOps, BinaryOps, TernaryOps)) or isinstance(p.dtype, ImageDType):
    return False
  reduces = 0
  for x in p.srcs:
    xb = x.base
    if xb.realized is not None:
      continue   # an assigned buffer's old contents too: p's kernel is ordered before the assign, as any reader's
    if xb.op in ReduceOps and x.st.contiguous and xb.size == p.size:
      reduces += 1
    elif xb.op not in (MetaOps.CONST, MetaOps.ARANGE):
      return False
  return reduces == 1


def _is_padding_okay(buf: LazyBuffer, realizes: Dict[LazyBuffer, None]) -> bool:
  """True when padding buf with zeros can be pushed through its unrealized ops (they all map 0 to 0)."""
  seen: Set[LazyBuffer] = set()
  todo = [buf]
  while todo:
    b = todo.pop()
    if b in seen or b in realizes or b.realized is not None:
      continue
    seen.add(b)
    if b.op in UNSAFE_PAD_OPS:
      return False
    todo.extend(x.base for x in b.srcs)
  return True


def _recursive_group(tr: LazyBuffer, st: ShapeTracker, r: LazyBuffer, children: DefaultDict[LazyBuffer, Dict[LazyBuffer, None]],
                     realizes: Dict[LazyBuffer, None], reduce_for_op: Dict[LazyBuffer, LazyBuffer], group: Set[LazyBuffer]) -> None:
  """Collect the realized descendants of reduce r reachable through contiguous elementwise ops.

  Adding r itself to the group means "cannot fuse forward": r must be realized on its own."""
  if tr in realizes and tr is not r:
    if not st.contiguous or st.size != r.st.size or tr in reduce_for_op:
      group.add(r)
    group.add(tr)
    return
  for tr_next in children[tr]:
    if tr_next.op in ReduceOps:
      group.add(r)
      return
    st_childs = dedup(s for s in tr_next.srcs if s.base is tr)
    if len(st_childs) > 1:
      group.add(r)
      return
    _recursive_group(tr_next, st + st_childs[0].st, r, children, realizes, reduce_for_op, group)


def _reads_itself(group: Set[LazyBuffer], r: LazyBuffer, realizes: Dict[LazyBuffer, None]) -> bool:
  """Some member of the multi-output group reads a buffer of another kernel that reads a member: one kernel cannot
  store them all, the schedule would have a cycle (v = exp(x.sum()); g = v * f(sqrt(v)) with sqrt(v) an output)."""
  todo = [(x.base, False) for p in group for x in p.srcs]
  seen: Set[Tuple[LazyBuffer, bool]] = set()
  while todo:
    b, crossed = todo.pop()
    if b.realized is not None or b is r or (b, crossed) in seen:
      continue
    seen.add((b, crossed))
    if crossed and b in group:
      return True
    # another reduce counts as another kernel too: it may be realized later in this loop
    crossed = crossed or (b in realizes and b not in group) or b.op in ReduceOps
    todo.extend((x.base, crossed) for x in b.srcs)
  return False


def _needs_other_reduce(members: Set[LazyBuffer], r: LazyBuffer) -> bool:
  """Some member computes (through unscheduled ops) a reduce other than r: one kernel holds one reduce."""
  todo, seen = deque(members), set()
  while todo:
    p = todo.pop()
    if p in seen:
      continue
    seen.add(p)
    if p.op in ReduceOps:
      return True
    todo.extend(x.base for x in p.srcs if x.base.realized is None and x.base is not r)
  return False


def _fusable_descendants(group: Set[LazyBuffer], r: LazyBuffer, realizes: Dict[LazyBuffer, None],
                         children: DefaultDict[LazyBuffer, Dict[LazyBuffer, None]], reduce_for_op: Dict[LazyBuffer, LazyBuffer]) -> Set[LazyBuffer]:
  """The realized buffers computed elementwise from the outputs of r's kernel (an optimizer's new weight from its new
  momentum) that the same kernel can store too. Every path from an output to them must read each buffer whole and
  contiguously: the kernel recomputes an output at the index it stores, so a permuted or broadcast read would get the
  value of the wrong element (and the reduce's value is only there for the element being stored). Empty when any path
  breaks that, or leads into another reduce or meta op."""
  found: Set[LazyBuffer] = set()
  seen: Set[LazyBuffer] = set()
  todo = deque(group)
  while todo:
    c = todo.pop()
    if c in seen:
      continue
    seen.add(c)
    for x in children[c]:
      if x.realized is not None or x.device != r.device:
        continue
      views = dedup(s for s in x.srcs if s.base is c)
      if len(views) != 1 or not views[0].st.contiguous or views[0].size != c.size or x.size != r.size or x in reduce_for_op or \
          x.op in ReduceOps or (x.op in MetaOps and x.op not in (MetaOps.CONTIGUOUS, MetaOps.ASSIGN)):
        return set()
      if x in realizes and x not in group:
        found.add(x)
      todo.append(x)
  return found


def _assign_hazard(group: Set[LazyBuffer], extra: Set[LazyBuffer], realizes: Dict[LazyBuffer, None],
                   assign_targets: Dict[LazyBuffer, LazyBuffer]) -> bool:
  """Adding `extra` to the kernel of `group` would read an assigned buffer's old contents in the kernel that overwrites it
  (other than an assign reading its own target), or tie the kernel to an assign in another kernel."""
  fused = group | extra
  for m in fused:
    todo, seen = [x.base for x in m.srcs], set()
    while todo:
      p = todo.pop()
      if p in seen or p in fused:
        continue
      seen.add(p)
      if p.realized is not None:
        a = assign_targets.get(p)
        if a is not None and a is not m and (m in extra or a in extra):
          return True
        continue
      if p not in realizes:
        todo.extend(x.base for x in p.srcs)
  return False


def _pair_reduces(allbufs: Dict[LazyBuffer, None], realizes: Dict[LazyBuffer, None], children: DefaultDict[LazyBuffer, Dict[LazyBuffer, None]],
                  assign_targets: Dict[LazyBuffer, LazyBuffer], rows: RowKernels) -> Dict[LazyBuffer, LazyBuffer]:
  """Give every reduce a kernel: fuse it into its realized descendants when that is clean, else realize it (a reduce a
  row kernel inlines has no kernel of its own; one a row kernel reads gets one of its own)."""
  reduce_for_op: Dict[LazyBuffer, LazyBuffer] = {}
  for r in allbufs:
    if r.op not in ReduceOps or r in realizes or r in rows.inlined:
      continue
    group: Set[LazyBuffer] = set()
    _recursive_group(r, r.st, r, children, realizes, reduce_for_op, group)
    can_chase = all(tr not in reduce_for_op for tr in group)
    forced = r in group or r in rows.fed
    if not forced and len(group) > 1:
      # a multi-output kernel is only possible when no output depends on another reduce
      forced = _needs_other_reduce(group, r)
    if not forced and group:
      # realized buffers computed elementwise from the outputs join the kernel too (a weight update after its momentum's)
      extra = _fusable_descendants(group, r, realizes, children, reduce_for_op)
      if extra and not _needs_other_reduce(extra, r) and not _assign_hazard(group, extra, realizes, assign_targets) and \
          not _reads_itself(group | extra, r, realizes):
        group.update(extra)
      elif len(group) > 1:
        forced = _reads_itself(group, r, realizes)
    if not forced and any(x.op is MetaOps.ASSIGN for x in group):
      # an assign may join only if its kernel reads no other buffer that is assigned in this schedule
      todo = deque((r, *group))
      while todo and not forced:
        p = todo.pop().base
        if p.realized is not None or p in realizes:
          if p in assign_targets and assign_targets[p] not in group:
            forced, can_chase = True, False
          continue
        todo.extend(p.srcs)
    if forced or not group:
      tr = r
      if can_chase:
        # walk down single contiguous children so the reduce stores the final elementwise result
        st = tr.st
        while len(children[tr]) == 1:
          tr_next = next(iter(children[tr]))
          st_childs = dedup(s for s in tr_next.srcs if s.base is tr)
          if len(st_childs) > 1 or st.size != st_childs[0].st.size:
            break
          st = st + st_childs[0].st
          if not st.contiguous or tr_next.op in ReduceOps or tr_next.op in MetaOps or tr_next in rows.outputs:
            break
          tr = tr_next
        # storing an up-cast result wastes bandwidth: store before the cast instead
        if tr is not r and tr.op is UnaryOps.CAST and tr.arg.itemsize > tr.srcs[0].dtype.itemsize:
          tr = tr.srcs[0].base
        reduce_for_op[tr] = r
      realizes[tr] = None
    else:
      reduce_for_op.update((tr, r) for tr in group)
  return reduce_for_op


_Graph = Tuple[DefaultDict[LazyBuffer, List[LazyBuffer]], DefaultDict[LazyBuffer, int], Dict[LazyBuffer, _PreItem]]


def _graph_schedule(outs: Sequence[LazyBuffer], seen: Set[LazyBuffer]) -> _Graph:
  """The dependency graph between pre-scheduled items, keyed by each item's first output."""
  realizes: Dict[LazyBuffer, None] = {x.base: None for x in outs if x.base.realized is None}
  allbufs: Dict[LazyBuffer, None] = {}
  simple_pads: Dict[LazyBuffer, None] = {}
  children: DefaultDict[LazyBuffer, Dict[LazyBuffer, None]] = defaultdict(dict)
  assign_targets: Dict[LazyBuffer, LazyBuffer] = {}
  expanded: Dict[LazyBuffer, None] = {}
  for out in outs:
    _recurse_lb(out.base, realizes, allbufs, simple_pads, children, assign_targets, expanded)
  # lazy results made from a buffer's old contents before it was assigned (b = t * 2; t.assign(...)): torch computed them
  # before the write, so they are realized here too, ordered before the assign, instead of later from the new contents
  checked: Set[LazyBuffer] = set()
  while todo := [a for a in assign_targets.values() if a not in checked]:
    checked.update(todo)
    for r in dedup(r for a in todo for r in a.pending_stale_readers() if r not in allbufs and r not in seen):
      realizes[r] = None
      _recurse_lb(r, realizes, allbufs, simple_pads, children, assign_targets, expanded)
  for b in expanded:
    if b not in realizes:
      boundaries = _recompute_from(b, realizes, assign_targets)
      realizes.update((x, None) for x in (boundaries if boundaries is not None else [b]))

  for p in simple_pads:
    if not _is_padding_okay(p, realizes):
      realizes[p] = None

  # softmax/layernorm-like outputs become row kernels that inline their row statistics (see row_fusion.py)
  rows = row_kernels(realizes, children, {x.base for x in outs}, assign_targets) if ROW_FUSION else RowKernels(set(), set(), set())
  reduce_for_op = _pair_reduces(allbufs, realizes, children, assign_targets, rows)

  output_groups: DefaultDict[LazyBuffer, List[LazyBuffer]] = defaultdict(list)
  for buf in realizes:
    if buf.realized is not None or buf.op is MetaOps.CONST or buf in seen:
      continue
    output_groups[reduce_for_op[buf] if buf in reduce_for_op and MULTIOUTPUT else buf].append(buf)

  prescheduled = {group[0]: _lower_group(group, realizes, reduce_for_op) for group in output_groups.values()}
  schedule_targets = {o: ps for ps in prescheduled.values() for o in ps.outputs}

  graph: DefaultDict[LazyBuffer, List[LazyBuffer]] = defaultdict(list)
  in_degree: DefaultDict[LazyBuffer, int] = defaultdict(int)
  for key, lsi in prescheduled.items():
    in_degree.setdefault(key, 0)
    # run after the items that produce our inputs
    for x in dedup(schedule_targets[x].outputs[0] for x in lsi.inputs if x in schedule_targets):
      graph[x].append(key)
      in_degree[key] += 1
    # run before any item that overwrites one of our inputs (read before write)
    for a in dedup(schedule_targets[assign_targets[x]].outputs[0] for x in lsi.inputs if x in assign_targets):
      if a is not key:
        graph[key].append(a)
        in_degree[a] += 1
  return graph, in_degree, prescheduled


def _flat_item(outs: Sequence[LazyBuffer], seen: Set[LazyBuffer]) -> Optional[_PreItem]:
  """The one kernel of an eager-style graph, or None when the graph needs the full analysis.

  Eager code realizes one op at a time: a single output computed elementwise (or by one reduce at the top) from realized
  buffers and constants, through any views, maybe by a chain of elementwise ops read whole (x.exp(), (x * 2 + 1).relu()).
  Then every decision of _graph_schedule is already known: the output is the only thing realized (no intermediate is
  forced, no pad needs a safety check, no expand weighs recomputing against a kernel), a reduce is its own kernel and
  nothing is assigned. So the walk, the realize analysis and the toposort are skipped; the kernel AST is built by the same
  _lower_group, once per graph structure (see _eager_graph)."""
  if len(outs) != 1:
    return None
  out = outs[0].base
  if out in seen or out.realized is not None or not isinstance(out.op, (*_ELEMENTWISE, ReduceOps)):
    return None
  for x in out.srcs:
    if x.base.realized is None and x.base.op is not MetaOps.CONST:
      return _fused_chain(out)
  return _lowered_once(out)


def _fused_chain(out: LazyBuffer) -> Optional[_PreItem]:
  """The one kernel of out when it is a chain of elementwise ops on realized buffers and constants, or None (its own
  function so that tests can turn the chain shortcut off and compare with the full analysis)."""
  return _lowered_once(out)


def _lowered_once(out: LazyBuffer) -> Optional[_PreItem]:
  """out's kernel by its graph's structure (see _eager_graph): built by _lower_alone the first time, then from the cache."""
  if (graph := _eager_graph(out)) is None:
    return None
  key, leaves, nodes = graph
  if (hit := _eager_ast(key)) is not None:
    metadata = dedup([b.metadata for b in nodes if b.metadata is not None])
    ret = _PreItem(hit[0], (out,), tuple(leaves[i] for i in hit[1]), {}, metadata)
  else:
    ret = _lower_alone(out)
    if not ret.var_vals:
      if len(_eager_asts) >= _AST_NODES_MAX:
        _eager_asts.clear()
      try:
        _eager_asts[key] = (ret.ast, tuple(leaves.index(b) for b in ret.inputs))
      except TypeError:   # an unhashable arg somewhere in the graph
        pass
  if not ret.var_vals and (ek := eager_key.known(out)) is not None:
    _remember_by_id(ek, ret.ast, ret.inputs)
  return ret


def _remember_by_id(ek: Tuple[int, Tuple[LazyBuffer, ...]], ast: LazyOp, inputs: Sequence[LazyBuffer]) -> None:
  """Keep the kernel ast of out, reading inputs, under out's structural id (see tiny.eager_key), with the position of each input among the
  realized bases the id lists."""
  eid, leaves = ek
  pos = []
  for b in inputs:
    i = next((i for i, x in enumerate(leaves) if x is b), None)
    if i is None:   # not a graph the id describes: leave it to the walk
      return
    pos.append(i)
  if len(_eager_by_id) >= _AST_NODES_MAX:
    _eager_by_id.clear()
  _eager_by_id[eid] = (ast, tuple(pos))


def eager_kernel(out: LazyBuffer) -> Optional[Tuple[LazyOp, Tuple[LazyBuffer, ...]]]:
  """(kernel AST, input bases) of out when out is an eager-style graph (see _flat_item) whose structure was scheduled
  before; None otherwise (then the full scheduler must run, which also remembers the structure for next time)."""
  if (ek := eager_key.known(out)) is not None and (hit := _eager_by_id.get(ek[0])) is not None:
    leaves: Sequence[LazyBuffer] = ek[1]
  elif (graph := _eager_graph(out)) is None or (hit := _eager_ast(graph[0])) is None:
    return None
  else:
    leaves = graph[1]
    if ek is not None:
      _remember_by_id(ek, hit[0], [leaves[i] for i in hit[1]])
  return hit[0], tuple(leaves[i] for i in hit[1])


def _eager_ast(key: Tuple[Any, ...]) -> Optional[Tuple[LazyOp, Tuple[int, ...]]]:
  try:
    return _eager_asts.get(key)
  except TypeError:   # an unhashable arg
    return None


def _arg_key(arg: Any) -> Any:
  """A float arg tagged, so that it never matches an equal int or bool. A zero by repr: -0.0 == 0.0 (and hashes alike), but
  the kernels they give differ; a NaN too, since it equals nothing (its key would never be found again). Any other float
  by value (repr, which the zeros need, costs more than the rest of the key): equal floats are the same constant."""
  if arg.__class__ is not float:
    return arg
  return ("f", repr(arg)) if arg == 0 or arg != arg else ("f", arg)


_ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps)


def _eager_graph(out: LazyBuffer) -> Optional[Tuple[Tuple[Any, ...], List[LazyBuffer], List[LazyBuffer]]]:
  """(structural key, realized bases read in first-read order, computed bases and constants) of out's graph, or None
  when it is not one kernel with out as its only realized buffer.

  out must be an unrealized elementwise op or reduce whose sources are realized buffers, constants, aranges, or elementwise ops
  (not forced to realize, of out's device, not images) read whole and unmasked, recursively. The key lists every node
  (op, arg, dtype, tracker) and every read (which node, buffer or constant, through which tracker), numbered in visit
  order, so two graphs with one key have the same kernel AST with the same buffers in the same places: it replaces
  building the AST again when an eager loop repeats an op on new buffers of the same layout."""
  if not isinstance(out.op, (*_ELEMENTWISE, ReduceOps)) or out.realized is not None:
    return None
  ids: Dict[LazyBuffer, int] = {out: 0}
  leaves: Dict[LazyBuffer, int] = {}
  nodes: List[LazyBuffer] = [out]
  key: List[Any] = []
  add = key.append
  for b in nodes:   # grows while it is walked: breadth first
    if b.op is _CONST:
      continue
    arg = b.arg
    add((b.op, arg if arg.__class__ is not float else _arg_key(arg), b.dtype, b.st))
    for x in b.srcs:
      xb = x._base if x._base is not None else x
      if not hasattr(xb, "srcs"):   # realized (what xb.realized says of a base, without making its Buffer object)
        add((-1, leaves.setdefault(xb, len(leaves)), xb.dtype, x.st))
        continue
      if xb.op is _CONST:
        arg = xb.arg
        add((-2, arg if arg.__class__ is not float else _arg_key(arg), xb.dtype, x.st))
        nodes.append(xb)   # for the metadata only
        continue
      if xb.op is MetaOps.ARANGE and xb.device == out.device:
        key.append((-3, xb.shape, xb.dtype, x.st))   # positions, computed in the kernel like a constant
        continue
      # an intermediate is read whole and unmasked (a pad would need its safety check, an expand the recompute weighing)
      if x is not xb and (x.size != xb.size or any(v.mask is not None for v in x.st.views)):
        return None
      if (n := ids.get(xb)) is None:
        if not isinstance(xb.op, _ELEMENTWISE) or xb.forced_realize or xb.device != out.device or isinstance(xb.dtype, ImageDType):
          return None
        n = ids[xb] = len(ids)
        nodes.append(xb)
      add((n, x.st if x is not xb else None))
  return tuple(key), list(leaves), nodes


_CONST = MetaOps.CONST


# the kernel AST of an eager graph by its structural key (see _eager_graph), with the positions of its input buffers among
# the graph's realized bases; never symbolic (a graph with Variables is lowered every time)
_eager_asts: Dict[Tuple[Any, ...], Tuple[LazyOp, Tuple[int, ...]]] = {}
# the same by the structural id of the graph's top base (see tiny.eager_key): found without walking the graph
_eager_by_id: Dict[int, Tuple[LazyOp, Tuple[int, ...]]] = {}


def _lower_alone(out: LazyBuffer) -> _PreItem:
  """The kernel of out as the only realized buffer of its graph (a reduce at the top is its own kernel's reduce)."""
  return _lower_group([out], {out: None}, {out: out} if out.op in ReduceOps else {})


# **************** the schedule cache: multi-kernel graphs of a structure seen before ****************

@dataclass(frozen=True)
class _CachedItem:
  """One item of a cached schedule, its LazyBuffers given by their number in the graph's walk (see _graph_structure)."""

  ast: LazyOp
  outputs: Tuple[int, ...]    # the bases it computes (they are marked scheduled)
  bufs: Tuple[int, ...]       # the bases whose Buffers the ScheduleItem holds, outputs first, empty ones left out
  metadata: Tuple[int, ...]   # bases whose metadata the item shows


@dataclass(frozen=True)
class _CachedSchedule:
  """A schedule by structure: the items in run order, the symbolic values (the key holds the bound value of any
  Variable, so they are the same for every graph of the key), and whether the memory planner can share anything."""

  items: Tuple[_CachedItem, ...]
  var_vals: Dict[Variable, int]
  plan: bool


_schedules: Dict[Tuple[Any, ...], _CachedSchedule] = {}
# bounds on what the cache holds: entries, and bases over all keys (a key costs a few hundred bytes a base). Only small
# graphs are cached: eager code repeats them, while a big graph realized again and again belongs in a TinyJit, and a big
# one whose structure changes every call (a new symbolic value each step) would fill the cache with keys of no use.
_SCHEDULES_MAX = 1 << 12
_SCHEDULES_MAX_BASES = 1 << 16
_GRAPH_MAX_BASES = 256
_schedules_bases = 0


@dataclass
class ScheduleCacheStats:
  """How often the scheduler took a schedule from the cache (hits), and how many it stored (stores)."""

  hits: int = 0
  stores: int = 0


schedule_cache_stats = ScheduleCacheStats()

# a graph holding one of these is scheduled in full every time: a custom op's function, an EMPTY's fresh buffer and a
# VIEW's buffer made when the LazyBuffer is built are more than the structure says
_UNCACHED_OPS = (MetaOps.CUSTOM, MetaOps.EMPTY, MetaOps.VIEW)

_Structure = Tuple[Tuple[Any, ...], List[LazyBuffer]]


def _graph_structure(outs: Sequence[LazyBuffer]) -> Optional[_Structure]:
  """(structural key, bases in walk order) of the graph of outs, or None when its schedule must not be cached.

  The walk numbers every base it reaches from outs (stopping at realized ones, as _recurse_lb does) and every view
  object, in an order fixed by the structure. The key records, for each base, whether it is realized and its dtype,
  device and tracker, and for a computed one also its op, arg, forced_realize and sources (which base, through which
  view object: the scheduler tells views apart by identity). Everything _graph_schedule decides from is there, so a
  graph with an equal key gets the same kernels on the bases of the same numbers. Bound Variables compare by value,
  so they are part of the key too. An assign whose target was read by a lazy result outside the graph (which the
  scheduler pulls in, see pending_stale_readers) is not cached."""
  ids: Dict[LazyBuffer, int] = {}
  views: Dict[LazyBuffer, int] = {}
  nodes: List[LazyBuffer] = []

  def ref(x: LazyBuffer) -> Any:
    xb = x._base if x._base is not None else x
    if (n := ids.get(xb)) is None:
      n = ids[xb] = len(nodes)
      nodes.append(xb)
    if xb is x:
      return n
    if (v := views.get(x)) is None:
      v = views[x] = len(views)
      return (n, v, x.st, x.dtype)
    return (n, v)

  key: List[Any] = [MULTIOUTPUT.value, ROW_FUSION.value, tuple(ref(o) for o in outs)]
  assigns: List[LazyBuffer] = []
  i = 0
  while i < len(nodes):
    if i >= _GRAPH_MAX_BASES:
      return None
    b = nodes[i]
    i += 1
    if not hasattr(b, "srcs"):   # realized (a scheduled base drops its sources)
      key.append((b.dtype, b.device, b.st))
      continue
    if b.op in _UNCACHED_OPS:
      return None
    if b.op is MetaOps.ASSIGN:
      assigns.append(b)
    key.append((b.op, _arg_key(b.arg), b.dtype, b.device, b.st, b.forced_realize, tuple(ref(x) for x in b.srcs)))
  for a in assigns:
    if any(r not in ids for r in a.pending_stale_readers()):
      return None
  return tuple(key), nodes


def _cached_schedule(structure: _Structure, seen: Set[LazyBuffer]) -> Optional[Tuple[List[ScheduleItem], Dict[Variable, int], bool]]:
  """(schedule, var_vals, whether to run the memory planner) from the cache for structure's key, on its bases, which
  are marked scheduled as _scheduled does; None on a miss."""
  key, nodes = structure
  try:
    hit = _schedules.get(key)
  except TypeError:   # an unhashable arg somewhere in the graph
    return None
  if hit is None:
    return None
  schedule: List[ScheduleItem] = []
  for it in hit.items:
    for n in it.outputs:
      o = nodes[n]
      seen.add(o)
      o.mark_scheduled()
    metadata = dedup([m for n in it.metadata if (m := nodes[n].metadata) is not None])
    schedule.append(ScheduleItem(it.ast, tuple(nodes[n].buffer for n in it.bufs), metadata))
  schedule_cache_stats.hits += 1
  if DEBUG >= 1 and len(schedule) >= 10:
    print(f"scheduled {len(schedule)} kernels")
  return schedule, dict(hit.var_vals), hit.plan


def cached_schedule(outs: Sequence[LazyBuffer]) -> Optional[Tuple[List[ScheduleItem], Dict[Variable, int]]]:
  """create_schedule_with_vars(outs) when the schedule cache has outs' structure (see _graph_structure), with its bases
  marked scheduled; None, having changed nothing, on a miss (then create_schedule_with_vars must run, which stores it)."""
  if (structure := _graph_structure(outs)) is None or (hit := _cached_schedule(structure, set())) is None:
    return None
  del structure   # the planner tells private buffers by their LazyBuffers being gone
  schedule, var_vals, plan = hit
  return (memory_planner(schedule) if plan else schedule), var_vals


def _remember_schedule(structure: _Structure, items: List[_PreItem], var_vals: Dict[Variable, int]) -> None:
  """Store the schedule items (in run order) under structure's key, by the numbers of their bases in the walk."""
  global _schedules_bases
  key, nodes = structure
  index = {b: i for i, b in enumerate(nodes)}
  first_with: Dict[Metadata, int] = {}
  for i, b in enumerate(nodes):
    if b.metadata is not None:
      first_with.setdefault(b.metadata, i)
  try:
    cached = tuple(_CachedItem(ps.ast, tuple(index[o] for o in ps.outputs), tuple(index[x] for x in ps.outputs + ps.inputs if x.size != 0),
                               tuple(first_with[m] for m in ps.metadata if m in first_with)) for ps in items)
    if len(_schedules) >= _SCHEDULES_MAX or _schedules_bases + len(nodes) > _SCHEDULES_MAX_BASES:
      _schedules.clear()
      _schedules_bases = 0
    _schedules[key] = _CachedSchedule(cached, dict(var_vals), _may_share(cached))
    _schedules_bases += len(nodes)
  except (KeyError, TypeError):   # a buffer from outside the walk (should not happen), or an unhashable arg
    return
  schedule_cache_stats.stores += 1


def _may_share(items: Tuple[_CachedItem, ...]) -> bool:
  """Whether two of the buffers these items compute could share memory: only when the spans of items between their
  first and last use do not all overlap, which (spans on a line) is when one ends before another starts. Inputs are
  left out: the planner only takes buffers that nothing refers to and that are not allocated, which an input seldom
  is, and skipping the planner never changes a result, it only may cost memory."""
  first: Dict[int, int] = {}
  last: Dict[int, int] = {}
  computed = {n for it in items for n in it.outputs}
  for i, it in enumerate(items):
    for n in it.bufs:
      if n in computed:
        first.setdefault(n, i)
        last[n] = i
  return bool(first) and max(first.values()) > min(last.values())


def _scheduled(ps: _PreItem, seen: Set[LazyBuffer]) -> ScheduleItem:
  """ps as a ScheduleItem; its outputs now count as realized: they drop their sources, which also frees the graph above."""
  for o in ps.outputs:
    seen.add(o)
    o.mark_scheduled()
  return ScheduleItem(ps.ast, tuple(x.buffer for x in ps.outputs + ps.inputs if x.size != 0), ps.metadata)


def _run_order(graph: DefaultDict[LazyBuffer, List[LazyBuffer]], in_degree: DefaultDict[LazyBuffer, int], keys: List[LazyBuffer]) -> List[LazyBuffer]:
  """The items in an order that runs each after the items it depends on (graph: item -> items that must run later), and
  each as late as it can be while following the longest chain of work first.

  Every item is placed right before the first item that needs it, deepest dependency first: an item that needs nothing
  (a weight's repacking copy, a constant's fill) runs next to its reader instead of at the start, so its buffer is not
  held across the whole schedule (GPT-2's prefill held every layer's repacked weights at once in breadth-first order)."""
  # levels by a breadth-first pass (Kahn's algorithm), which also finds cycles
  level: Dict[LazyBuffer, int] = {}
  degree = dict(in_degree)
  queue = deque(k for k in keys if degree[k] == 0)
  preds: DefaultDict[LazyBuffer, List[LazyBuffer]] = defaultdict(list)
  while queue:
    k = queue.popleft()
    level.setdefault(k, 0)
    for x in graph[k]:
      preds[x].append(k)
      level[x] = max(level.get(x, 0), level[k] + 1)
      degree[x] -= 1
      if degree[x] == 0:
        queue.append(x)
  if len(level) != len(keys):
    raise RuntimeError(f"cycle detected in the schedule graph: {len(keys)} items but only {len(level)} could be ordered")
  # depth-first post-order from the items nothing depends on, deepest dependency first
  order: List[LazyBuffer] = []
  done: Set[LazyBuffer] = set()
  for root in (k for k in keys if not graph[k]):
    stack: List[Tuple[LazyBuffer, bool]] = [(root, False)]
    while stack:
      k, expanded = stack.pop()
      if k in done:
        continue
      if expanded:
        done.add(k)
        order.append(k)
        continue
      stack.append((k, True))
      # pushed shallowest first, so the deepest is popped (and placed) first
      stack.extend((p, False) for p in sorted(preds[k], key=lambda p: level[p]) if p not in done)
  assert len(order) == len(keys), "every item leads to an item that nothing depends on"
  return order


def _schedule(outs: Sequence[LazyBuffer], seen: Set[LazyBuffer]) -> Tuple[List[ScheduleItem], Dict[Variable, int], bool]:
  """(items in run order, var_vals, whether the memory planner may find buffers to share)."""
  if (flat := _flat_item(outs, seen)) is not None:
    return [_scheduled(flat, seen)], dict(flat.var_vals), False
  # a graph of a structure scheduled before takes that schedule, on its own buffers (see _graph_structure)
  structure = _graph_structure(outs) if not seen else None
  if structure is not None and (hit := _cached_schedule(structure, seen)) is not None:
    return hit
  graph, in_degree, prescheduled = _graph_schedule(outs, seen)
  items = [prescheduled[key] for key in _run_order(graph, in_degree, list(prescheduled))]
  var_vals: Dict[Variable, int] = merge_dicts([ps.var_vals for ps in items]) if items else {}
  if structure is not None:
    _remember_schedule(structure, items, var_vals)
  schedule = [_scheduled(ps, seen) for ps in items]
  if DEBUG >= 1 and len(schedule) >= 10:
    print(f"scheduled {len(schedule)} kernels")
  return schedule, var_vals, True


def schedule_to_run(outs: Sequence[LazyBuffer], seen: Optional[Set[LazyBuffer]] = None) -> Tuple[List[ScheduleItem], Dict[Variable, int]]:
  """create_schedule_with_vars for a caller that runs the items right away (Tensor.realize, TinyJit): not tracked as
  pending (see engine/pending.py)."""
  schedule, var_vals, plan = _schedule(outs, set() if seen is None else seen)
  if graph_viz.GRAPH:  # GRAPH=1: draw the schedule graph (tiny/engine/graph_viz.py)
    graph_viz.record_schedule(schedule)
  # _schedule has returned, so the scheduler holds no LazyBuffers: lb_refcount now tells which buffers are private
  return (memory_planner(schedule) if plan else schedule), var_vals


def create_schedule_with_vars(outs: Sequence[LazyBuffer], seen: Optional[Set[LazyBuffer]] = None) -> Tuple[List[ScheduleItem], Dict[Variable, int]]:
  """Schedule the computation of outs: the kernels in run order and the values of the symbolic variables.

  outs (and the buffers realized with them) read as realized from now on; until the items run, whatever reads one of
  their buffers (a realize, numpy(), another schedule's run) runs the items that write it first, and run_schedule of
  these items then skips the ones that ran that way (see engine/pending.py)."""
  schedule, var_vals = schedule_to_run(outs, seen)
  pending.register(schedule, var_vals)
  return schedule, var_vals


def create_schedule(outs: Sequence[LazyBuffer], seen: Optional[Set[LazyBuffer]] = None) -> List[ScheduleItem]:
  """create_schedule_with_vars for graphs without symbolic variables."""
  schedule, var_vals = create_schedule_with_vars(outs, seen)
  if var_vals:
    raise RuntimeError(f"the graph has symbolic variables {list(var_vals)}: use create_schedule_with_vars")
  return schedule


# **************** memory planner ****************

def _internal_memory_planner(buffers: List[Union[List[Buffer], Tuple[Buffer, ...]]], noopt_buffers: Optional[Set[Buffer]] = None,
                             debug_prefix: str = "") -> Dict[Buffer, Buffer]:
  """Map each private, unallocated buffer to a buffer it can share with (one whose lifetime does not overlap).

  A buffer is private when no LazyBuffer refers to it anymore (lb_refcount == 0) and it is not allocated yet;
  its lifetime is the span of items between its first and last use."""
  if getenv("NO_MEMORY_PLANNER"):
    return {}

  def plannable(b: Buffer) -> bool:
    return not b.is_allocated() and b.lb_refcount == 0 and (noopt_buffers is None or b.base not in noopt_buffers)

  first: Dict[Buffer, int] = {}
  last: Dict[Buffer, int] = {}
  for i, u in enumerate(buffers):
    for b in u:
      if plannable(b):
        first.setdefault(b.base, i)
        last[b.base] = i

  free_segs: DefaultDict[Tuple, List[Tuple[int, int, Buffer]]] = defaultdict(list)

  def find_replacement(b: Buffer, st: int, en: int) -> Buffer:
    can_offset = hasattr(Device[b.device].allocator, "offset")
    key = (b.device, b.dtype, b.options) + (() if can_offset else (b.nbytes,))
    default = (0, len(buffers) - 1, b)
    segs = free_segs[key]
    idx = next((i for i, (s, e, _) in enumerate(segs) if s <= st and en <= e), None)
    seg_st, seg_en, seg_buf = segs.pop(idx) if idx is not None else default
    if st - 1 >= seg_st:
      segs.append((seg_st, st - 1, seg_buf))
    if seg_en >= en + 1:
      segs.append((en + 1, seg_en, seg_buf))
    return seg_buf if seg_buf.nbytes == b.nbytes else Buffer(b.device, b.size, b.dtype, base=seg_buf)

  # biggest first, so smaller buffers fit in the gaps the big ones leave
  requests = sorted(((first[b], last[b], b) for b in first), key=lambda x: -x[2].nbytes)
  assigned = {b: find_replacement(b, st, en) for st, en, b in requests}
  for u in buffers:
    for b in u:
      if not plannable(b):
        continue
      if b._base is not None:
        assigned[b] = Buffer(b.device, b.size, b.dtype, base=assigned.get(b.base, b.base).base, offset=b.offset)
      else:
        assigned[b] = assigned.get(b, b)
  if DEBUG >= 1:
    before = dedup(x for x in assigned if x._base is None)
    after = dedup(x for x in assigned.values() if x._base is None)
    if len(before) != len(after):
      print(debug_prefix + f"memory reduced from {sum(x.nbytes for x in before) / 1e6:.2f} MB -> {sum(x.nbytes for x in after) / 1e6:.2f} MB, "
            f"{len(before)} -> {len(after)} bufs")
  return assigned


def memory_planner(schedule: List[ScheduleItem]) -> List[ScheduleItem]:
  """Let intermediates of the schedule share memory. Buffers of copies and views are left alone."""
  if len(schedule) <= 1:
    return schedule   # one item: no two lifetimes to fit together (the common eager case, so skip the bookkeeping)
  noopt = {b.base for si in schedule if si.ast.op is not MetaOps.KERNEL for b in si.bufs}
  assigned = _internal_memory_planner([si.bufs for si in schedule], noopt_buffers=noopt)
  return [ScheduleItem(si.ast, tuple(assigned.get(x, x) for x in si.bufs), si.metadata) for si in schedule]

