"""Structural ids of eager elementwise graphs, so that realize finds an eager op's kernel without walking its graph.

An eager loop realizes a small elementwise graph (`(y * a + b).realize()`) after every op. The scheduler knows the
kernel of a graph by its structure (see schedule._eager_graph), but walking the graph to build that structure key on
every realize cost more than the kernel. Here the node of a `Tensor <op> python scalar` gets, when it is built, a
small integer id of its structure, made from the constant, the op and what it reads (a realized buffer through some
tracker, or another such node by its id); realize then finds the kernel by that id (see scalar_op_id).

Only these nodes get one: giving every elementwise base an id (from its op, arg, dtype, tracker and sources) cost a few
microseconds a node, more than the walk it saves on most graphs, and most lazy graphs are never realized eagerly.

The id of a base is only valid while the graph below it stays as it was when the id was made. Realized buffers and
constants never change; what can change is an intermediate becoming realized (scheduled) or being marked
forced_realize. Both bump `state.epoch` (see `graph_changed`), and an id made in an older epoch is not used.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, Optional, Tuple

from tiny.dtype import ImageDType, dtypes

# structure -> id. Ids come from a counter and are never reused, so clearing the table when it is full can never make
# an old id stand for a new structure (a node still holding an old id only misses)
_MAX_IDS = 1 << 16
_F32 = dtypes.float32
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


def scalar_op_id(ret: Any, x: Any, xb: Any, tag: str, val: Any) -> None:
  """Give ret = `x <op> constant val`, as lazy.scalar_binop builds it (op and side named by tag), its id when x is
  realized or has a current id of its own (else none: realize walks its graph instead). The key is the tag, the
  constant's value, and x's part: a realized base with its dtype and x's tracker, or x's base by its id with x's view
  (read whole and unmasked, as the eager graph needs). The rest follows from x: the dtype, the constant's tracker (x's
  shape, broadcast) and ret's (x's shape, contiguous). ret._ekey = (epoch, id, the realized bases the graph reads)."""
  # one read of the epoch: a bump by another thread in between must leave ret with the epoch x's id was checked in
  epoch = state.epoch
  # arg_key(val), inline: it runs for every scalar op
  av = val if val.__class__ is not float else (("f", repr(val)) if val == 0 or val != val else ("f", val))
  if not hasattr(xb, "srcs"):
    # x read through a contiguous tracker (one view, no offset or mask: read as laid out, the same kernel whatever else
    # the tracker holds) keys by its shape, and float32 (by identity) by a 0: no ShapeTracker or DType hash, both Python
    # calls. The usual x is a result read whole, whose tracker is the very object ret gets (one per shape), so even the
    # contiguous check is skipped. Any other x keys by its tracker and dtype, never equal to a shape or a 0 (an x whose
    # dtype equals float32 but is another object only gets an id of its own)
    dt, st = xb.dtype, x.st
    key: Tuple[Any, ...] = ("s", tag, av, -1, 0 if dt is _F32 else dt, x.shape if st is ret.st or st.contiguous else st)
    leaves: Tuple[Any, ...] = (xb,)
  else:
    ek = xb._ekey
    if ek is None or ek[0] != epoch or not ek[1] or xb.forced_realize or isinstance(xb.dtype, ImageDType):
      return
    if x is xb:
      key = ("s", tag, av, ek[1], None)
    elif x.size != xb.size or any(v.mask is not None for v in x.st.views):
      return
    else:
      key = ("s", tag, av, ek[1], x.st)
    leaves = ek[2]
  if (eid := _ids.get(key)) is None:
    if len(_ids) >= _MAX_IDS:
      _ids.clear()
    eid = _ids[key] = next(_next_id)
  ret._ekey = (epoch, eid, leaves)


def known(b: Any) -> Optional[Tuple[int, Tuple[Any, ...]]]:
  """(id, realized bases read) of the unrealized base b, when it has an id made in this epoch."""
  ek = b._ekey
  if ek is None or ek[0] != state.epoch or not ek[1] or not hasattr(b, "srcs"):
    return None
  return ek[1], ek[2]
