"""Schedules handed to the caller but not run yet.

Scheduling marks each computed LazyBuffer realized at once (it drops its graph), before any kernel has run: the public
schedule functions (Tensor.schedule, schedule_with_vars, create_schedule[_with_vars]) return items that the caller
runs later (run_schedule), or never. Until they run, the buffers they write hold nothing (or, for an assign, the old
contents), yet every other path already reads them as computed. So each such schedule is remembered here: whatever
reads one of its buffers first (Tensor.realize and numpy(), or run_schedule of another schedule) runs the items up to
the one that writes it, and the caller's own later run_schedule skips the items that already ran that way (an in-place
assign run twice would add twice).

The tags live on the ScheduleItems and on the Buffers they write (as `_pending`), not on LazyBuffers: a Buffer is
what every later reader holds, and a tag dies with the last holder of the items or buffers.
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

# an item's state in its PendingSchedule
_PENDING, _RAN, _TAKEN = 0, 1, 2


class PendingSchedule:
  """The items of one schedule in run order, the values of its Variables, and what became of each item: still to run,
  run here before its caller got to it (_RAN), or taken by the caller's own run (_TAKEN)."""

  __slots__ = ("items", "var_vals", "state", "left", "ref", "__weakref__")

  def __init__(self, items: List[Any], var_vals: Dict[Any, int]) -> None:
    self.items, self.var_vals = items, var_vals
    self.state = [_PENDING] * len(items)
    self.left = len(items)
    # in `live` until every item ran or was taken, or the schedule is dropped unrun (the callback)
    self.ref = weakref.ref(self, live.discard)
    live.add(self.ref)

  def _done(self, i: int, state: int) -> None:
    self.state[i] = state
    self.left -= 1
    tag = self.items[i]._pending
    # a buffer the memory planner gave to a later item too keeps that item's tag
    for b in self.items[i].outputs:
      if b._pending is tag:
        b._pending = None
    if self.left == 0:
      live.discard(self.ref)


# the schedules with items still to run, by weak reference: a plain set, so the test Tensor.realize makes for every
# eager op (it looks at its inputs only while there is one) is a set's truth value
live: Set["weakref.ref[PendingSchedule]"] = set()


def register(schedule: Sequence[Any], var_vals: Dict[Any, int]) -> None:
  """Remember schedule (ScheduleItems in run order) as handed out: its buffers count as computed only once it ran."""
  if not schedule:
    return
  p = PendingSchedule(list(schedule), dict(var_vals))
  for i, si in enumerate(schedule):
    tag = (p, i)
    object.__setattr__(si, "_pending", tag)   # a frozen dataclass: the tag is no field, so it changes no comparison
    for b in si.outputs:
      b._pending = tag


def _tag_of(buf: Any) -> Optional[Tuple[PendingSchedule, int]]:
  if (tag := buf._pending) is not None:
    return tag
  return buf._base._pending if buf._base is not None else None


def _ready_inputs(si: Any, p: Optional[PendingSchedule], i: int) -> None:
  # an input that an earlier item of si's own schedule writes is ready when that schedule runs in order; one that a
  # later item writes is read before that write (its old contents), so only other schedules' buffers are run here
  for b in si.inputs:
    if (tag := _tag_of(b)) is not None and (tag[0] is not p or tag[1] < i):
      ensure_ready(b)


def _run(p: PendingSchedule, i: int) -> None:
  from tiny.engine.realize import capturing, lower_schedule_item
  from tiny.helpers import CAPTURING
  si = p.items[i]
  _ready_inputs(si, p, i)
  ei = lower_schedule_item(si, claim=False)
  if len(capturing) and CAPTURING:
    capturing[0].add(ei)
  ei.run(p.var_vals)
  p._done(i, _RAN)


def ensure_ready(buf: Any) -> None:
  """Run the pending items (in their schedule's order) up to the one that writes buf, if one has not run yet."""
  if (tag := _tag_of(buf)) is None:
    return
  p, last = tag
  for i in range(last + 1):
    if p.state[i] == _PENDING:
      _run(p, i)


def claim(si: Any) -> bool:
  """The caller is about to run si itself: make its inputs ready and stop tracking it. False when si already ran here
  (the caller must skip it), True when it has to run (also for an item that was never handed out)."""
  if (tag := si._pending) is None:
    if live:
      _ready_inputs(si, None, 0)
    return True
  p, i = tag
  if p.state[i] == _RAN:
    object.__setattr__(si, "_pending", None)   # ran once for the caller: a later run of the same item is the caller's
    return False
  if p.state[i] == _PENDING:
    _ready_inputs(si, p, i)
    p._done(i, _TAKEN)
  object.__setattr__(si, "_pending", None)
  return True


def ensure_graph_ready(lbs: Iterable[Any]) -> None:
  """Run the pending items that write a realized buffer the lazy graphs of lbs read (or that lbs are)."""
  if not live:
    return
  seen: Set[int] = set()
  todo: List[Any] = [lb._base if lb._base is not None else lb for lb in lbs]
  while todo:
    b = todo.pop()
    if id(b) in seen:
      continue
    seen.add(id(b))
    if (srcs := getattr(b, "srcs", None)) is not None:
      todo.extend(s._base if s._base is not None else s for s in srcs)
    elif (buf := getattr(b, "_buffer", None)) is not None:
      ensure_ready(buf)
