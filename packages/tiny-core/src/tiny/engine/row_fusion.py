"""Row kernels: softmax, log_softmax and layernorm in one kernel that walks each row several times while it is in cache.

Such a graph computes statistics of each row (a max, a sum of exp(x - max), a mean, a variance of x - mean), broadcasts
them back along the row and combines them elementwise with the row. Scheduled the usual way, every statistic is a kernel
of its own that streams the whole input from memory again. A row kernel instead inlines the statistics: the lowerer gives
each reduce its own loop over the row axes and the store one more, so the input is read from memory once.

The scheduler fuses only this narrow pattern (anything else keeps its kernels), on devices whose renderer sets
`row_kernels` (the CPUs: one thread walks a row, which a GPU would do slowly):
- the output is an elementwise op of an int shape F whose row axis is the last axis of F (rows contiguous in the loop
  order; one axis, so the store has one loop over it: softmax(-1), layernorm(-1));
- it is computed from realized buffers (any view), constants, unrealized elementwise ops read through views that do not
  pad (an elementwise op broadcast along the row axes only when it is a row statistic), row
  statistics read through a plain broadcast along the row axes, and unrealized reduces of other axes read through a
  reshape (attention's q @ k^T): those keep a kernel of their own (the scheduler realizes them, maybe with the
  elementwise ops after them), whose output the row kernel reads;
- a row statistic is a chain of elementwise ops (on constants only) over one SUM or MAX of the row axes of an input of
  shape F, whose source follows the same rules (so a statistic may use an earlier one: the sum of exp(x - max));
- every reduce reduces that axis; a row holds at most _ROW_MAX_ELEMENTS elements (it should stay in cache);
- nothing else in the schedule reads the statistics or the ops that depend on them, none is an output or forced to realize,
  and no buffer read is assigned in this schedule.
"""
from __future__ import annotations

from typing import DefaultDict, Dict, NamedTuple, Optional, Set, Tuple

from tiny.dtype import ImageDType
from tiny.helpers import all_int, prod
from tiny.lazy import LazyBuffer
from tiny.ops import BinaryOps, MetaOps, ReduceOps, TernaryOps, UnaryOps
from tiny.registry import Device
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import sint

# the largest row (elements) a row kernel takes: three passes over a row are cheap only while it stays in L1/L2
_ROW_MAX_ELEMENTS = 1 << 16
_ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps)


def _plain_broadcast(x: LazyBuffer, shape: Tuple[sint, ...]) -> bool:
  """x reads its base (of size 1 on some axes) broadcast along those axes to shape, and nothing else."""
  base = x.base.shape
  if len(base) != len(shape) or any(b not in (1, s) for b, s in zip(base, shape)):
    return False
  return x.st == ShapeTracker.from_shape(base).expand(shape)


def _unmasked_view(x: LazyBuffer) -> bool:
  """x reads its base through views without padding (reshapes, permutes, shrinks, broadcasts: attention's (T, T) mask
  broadcast over the heads); the row kernel computes the base at each index it reads."""
  return all(v.mask is None for v in x.st.views)


class _NotARow(Exception):
  """The graph of this output does not fit the row kernel pattern."""


class _RowWalk:
  """The walk of one output's graph, collecting what its row kernel would inline."""

  def __init__(self, out: LazyBuffer, realizes: Dict[LazyBuffer, None], protected: Set[LazyBuffer],
               assign_targets: Dict[LazyBuffer, LazyBuffer]) -> None:
    self.out, self.shape = out, out.shape
    self.realizes, self.protected, self.assign_targets = realizes, protected, assign_targets
    self.axes: Optional[Tuple[int, ...]] = None
    self.members: Set[LazyBuffer] = set()   # unrealized ops the kernel computes (the output's graph, the reduces' sources)
    self.stats: Set[LazyBuffer] = set()     # the statistics' chains and their reduces
    self.fed: Set[LazyBuffer] = set()       # reduces that are no statistic, read as inputs (realized by the scheduler)
    self.done: Set[LazyBuffer] = set()

  def _inlinable(self, b: LazyBuffer) -> bool:
    return b.realized is None and not b.forced_realize and b not in self.protected and b.device == self.out.device and \
      not isinstance(b.dtype, ImageDType)

  def operand(self, x: LazyBuffer) -> None:
    """x (a view of shape F) as a source of an elementwise op of the row kernel."""
    xb = x.base
    if xb.realized is not None:
      if xb in self.assign_targets:
        raise _NotARow("reads an assigned buffer")
      return
    if xb.op in (MetaOps.CONST, MetaOps.ARANGE):
      return   # computed from the index wherever it is read (an arange builds attention's causal mask)
    if xb.shape != self.shape and _plain_broadcast(x, self.shape):
      if self._inlinable(xb) and self.statistic(xb):
        return
      if xb in self.realizes:
        return   # a broadcast buffer another kernel computes
      raise _NotARow("an expanded op that is not a row statistic")
    if xb in self.realizes:
      return   # another kernel's output, read as an input
    if xb.op in ReduceOps and self._inlinable(xb) and xb not in self.stats and x.st.contiguous and x.size == xb.size:
      # a reduce of other axes (scores = q @ k^T): a kernel of its own computes it, this one reads its output
      self.fed.add(xb)
      return
    if not self._inlinable(xb) or not isinstance(xb.op, _ELEMENTWISE) or (x is not xb and not _unmasked_view(x)):
      raise _NotARow(f"cannot inline {xb.op}")
    self.expression(xb)

  def expression(self, b: LazyBuffer) -> None:
    if b in self.done:
      return
    self.done.add(b)
    if b is not self.out:
      self.members.add(b)
    for x in b.srcs:
      self.operand(x)

  def statistic(self, s: LazyBuffer) -> bool:
    """Walk the chain of a row statistic s down to its reduce; False when s is not one (then nothing was recorded)."""
    if s in self.stats:
      return True
    chain: Set[LazyBuffer] = set()
    reduce: Optional[LazyBuffer] = None
    todo = [s]
    while todo:
      b = todo.pop()
      if b in chain:
        continue
      if not self._inlinable(b):
        return False
      chain.add(b)
      if b.op in ReduceOps:
        if reduce is not None or b.op not in (ReduceOps.SUM, ReduceOps.MAX):
          return False
        reduce = b
        continue
      if not isinstance(b.op, _ELEMENTWISE):
        return False
      for x in b.srcs:
        if x.base.op is MetaOps.CONST and x.base.realized is None:
          continue
        if x.base.realized is not None or not (x is x.base or (x.st.contiguous and x.shape == x.base.shape)):
          return False
        todo.append(x.base)
    if reduce is None or reduce.srcs[0].shape != self.shape:
      return False
    axes = tuple(sorted(reduce.arg))
    n = len(self.shape)
    # one row axis, the last: the store walks it in one loop (two would be two loops the linearizer has no order for)
    if axes != (n - 1,) or (self.axes is not None and axes != self.axes) or \
        s.shape != tuple(1 if i in axes else d for i, d in enumerate(self.shape)) or prod(self.shape[a] for a in axes) > _ROW_MAX_ELEMENTS:
      return False
    self.axes = axes
    self.stats |= chain
    self.operand(reduce.srcs[0])
    return True


def _device_takes_rows(device: str) -> bool:
  try:
    return bool(getattr(Device[device].renderer, "row_kernels", False))
  except Exception:   # a device that cannot be opened here gets the usual kernels
    return False


class RowKernels(NamedTuple):
  """What row_kernels decided, for the scheduler's pairing of reduces with kernels."""
  inlined: Set[LazyBuffer]   # the statistics' reduces: computed inside row kernels, no kernel of their own
  fed: Set[LazyBuffer]       # reduces whose outputs row kernels read: each must get a kernel of its own
  outputs: Set[LazyBuffer]   # the row kernels' outputs: no other reduce's kernel may store them


def row_kernels(realizes: Dict[LazyBuffer, None], children: DefaultDict[LazyBuffer, Dict[LazyBuffer, None]], protected: Set[LazyBuffer],
                assign_targets: Dict[LazyBuffer, LazyBuffer]) -> RowKernels:
  """Find the outputs that become row kernels and take their statistics out of realizes (they are inlined).

  protected: bases that must keep a buffer of their own (the schedule's outputs)."""
  inlined: Set[LazyBuffer] = set()
  claimed: Set[LazyBuffer] = set()
  fed: Set[LazyBuffer] = set()
  outputs: Set[LazyBuffer] = set()
  for out in list(realizes):
    if out.realized is not None or not isinstance(out.op, _ELEMENTWISE) or isinstance(out.dtype, ImageDType) or \
        not all_int(out.shape) or out in claimed or not _device_takes_rows(out.device):
      continue
    walk = _RowWalk(out, realizes, protected, assign_targets)
    try:
      walk.expression(out)
    except _NotARow:
      continue
    if not walk.stats:
      continue
    group = walk.members | walk.stats
    # what the kernel inlines must be read only inside it (another kernel would need it in memory), and by one row kernel
    if group & claimed or any(c is not out and c not in group for b in group for c in children[b]):
      continue
    # a reduce one row kernel reads as an input cannot be inlined by another, nor the other way round
    if walk.fed & claimed or walk.stats & fed:
      continue
    claimed |= group | {out}
    fed |= walk.fed
    outputs.add(out)
    for b in walk.stats:
      realizes.pop(b, None)
      if b.op in ReduceOps:
        inlined.add(b)
  return RowKernels(inlined, fed, outputs)
