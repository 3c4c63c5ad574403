"""Structural ids of eager elementwise graphs, built while the graph is built.

An eager loop realizes a small elementwise graph (`(y * a + b).realize()`) after every op. The scheduler knows the
kernel of a graph by its structure (see schedule._eager_graph), but walking the graph to build that structure key on
every realize cost more than the kernel. Here each elementwise base gets, when e() makes it, a small integer id of its
structure, made from its op, arg, dtype, tracker and the ids of what it reads; realize then finds the kernel by that id.

The id of a base is only valid while the graph below it stays as it was when the id was made. Realized buffers and
constants never change; what can change is an intermediate becoming realized (scheduled) or being marked
forced_realize. Both bump `state.epoch` (see `graph_changed`), and an id made in an older epoch is not used.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Tuple

from tiny.dtype import ImageDType
from tiny.ops import BinaryOps, MetaOps, TernaryOps, UnaryOps

_ELEMENTWISE = (UnaryOps, BinaryOps, TernaryOps)
_CONST = MetaOps.CONST

# a graph reading more realized buffers than this gets no id (the leaf lists are merged at every node: they must stay short)
MAX_LEAVES = 16
# structure -> id. Ids come from a counter and are never reused, so clearing the table when it is full can never make
# an old id stand for a new structure (a node still holding an old id only misses)
_MAX_IDS = 1 << 16
_ids: Dict[Tuple[Any, ...], int] = {}
_next_id = itertools.count(1)


class _State:
  """The epoch (see the module docstring); a class attribute, read by every realize."""

  epoch = 0


state = _State()


def graph_changed() -> None:
  """An intermediate of some lazy graph was realized or forced to realize: every id made before is stale."""
  state.epoch += 1


def arg_key(arg: Any) -> Any:
  """A float arg tagged so it never equals an int or bool; a zero or NaN by repr (-0.0 == 0.0, and NaN equals nothing)."""
  if arg.__class__ is not float:
    return arg
  return ("f", repr(arg)) if arg == 0 or arg != arg else ("f", arg)


def _leaf_index(leaves: List[Any], b: Any) -> int:
  for i, x in enumerate(leaves):
    if x is b:
      return i
  leaves.append(b)
  return len(leaves) - 1


def assign_id(b: Any) -> None:
  """Give the new elementwise base b its structural id (b._ekey = (epoch, id, realized bases read, in first-read order)),
  when its graph is one eager kernel: every source is a realized buffer, a constant, or an unrealized elementwise base
  with a current id of its own (not forced to realize, of b's device, not an image) read whole and unmasked. These are
  the conditions of schedule._eager_graph, and two graphs with one id have equal _eager_graph structures up to the
  sharing of equal subgraphs, which gives the same kernel AST."""
  if not isinstance(b.op, _ELEMENTWISE):
    return
  epoch = state.epoch
  leaves: List[Any] = []
  reads: List[Tuple[Any, ...]] = []
  for x in b.srcs:
    xb = x._base if x._base is not None else x
    if not hasattr(xb, "srcs"):   # realized
      reads.append((-1, _leaf_index(leaves, xb), xb.dtype, x.st))
      continue
    if xb.op is _CONST:
      reads.append((-2, arg_key(xb.arg), xb.dtype, x.st))
      continue
    ek = xb._ekey
    if ek is None or ek[0] != epoch or xb.forced_realize or xb.device != b.device or isinstance(xb.dtype, ImageDType):
      return
    if x is not xb and (x.size != xb.size or any(v.mask is not None for v in x.st.views)):
      return
    reads.append((ek[1], x.st if x is not xb else None, tuple(_leaf_index(leaves, y) for y in ek[2])))
  if len(leaves) > MAX_LEAVES:
    return
  key = (b.op, arg_key(b.arg), b.dtype, b.st, tuple(reads))
  try:
    if (eid := _ids.get(key)) is None:
      if len(_ids) >= _MAX_IDS:
        _ids.clear()
      eid = _ids[key] = next(_next_id)
  except TypeError:   # an unhashable arg
    return
  b._ekey = (epoch, eid, tuple(leaves))


def scalar_op_id(ret: Any, x: Any, xb: Any, tag: str, val: Any) -> None:
  """The id of ret = `x <op> constant val` as lazy.scalar_binop builds it (op and side named by tag), without the generic
  walk of assign_id: the key is x's part (a realized base read through x's tracker, or x's own current id and view) and
  the constant's value; the rest (dtypes, trackers of the constant and of ret) follows from x. Tagged "s", so it never
  equals an assign_id key, which starts with an op."""
  if not hasattr(xb, "srcs"):
    key: Tuple[Any, ...] = ("s", tag, arg_key(val), -1, xb.dtype, x.st)
    leaves: Tuple[Any, ...] = (xb,)
  else:
    ek = xb._ekey
    if ek is None or ek[0] != state.epoch or xb.forced_realize or isinstance(xb.dtype, ImageDType):
      return
    if x is xb:
      key = ("s", tag, arg_key(val), ek[1], None)
    elif x.size != xb.size or any(v.mask is not None for v in x.st.views):
      return
    else:
      key = ("s", tag, arg_key(val), ek[1], x.st)
    leaves = ek[2]
  if (eid := _ids.get(key)) is None:
    if len(_ids) >= _MAX_IDS:
      _ids.clear()
    eid = _ids[key] = next(_next_id)
  ret._ekey = (state.epoch, eid, leaves)


def current(b: Any) -> Optional[Tuple[int, Tuple[Any, ...]]]:
  """(id, realized bases read) of the unrealized base b when its id is current, else None."""
  ek = b._ekey
  if ek is None or ek[0] != state.epoch or not hasattr(b, "srcs"):
    return None
  return ek[1], ek[2]
