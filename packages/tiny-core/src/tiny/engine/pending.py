"""Schedules handed to the caller but not run yet.

Scheduling marks each computed LazyBuffer realized at once (it drops its graph), before any kernel has run: the public
schedule functions (Tensor.schedule, schedule_with_vars, create_schedule[_with_vars]) return items that the caller
runs later (run_schedule), or never. Until they run, the buffers they write hold nothing (or, for an assign, the old
contents), yet every other path already reads them as computed. So each such schedule is remembered here: whatever
reads one of its buffers first (Tensor.realize and numpy(), or run_schedule of another schedule) runs the items up to
the one that writes it, and the caller's own later run_schedule skips the items that already ran that way (an in-place
assign run twice would add twice).

The tags live on the ScheduleItems and on the Buffers they write (as `_pending`), not on LazyBuffers: a Buffer is
what every later reader holds, and a tag dies with the last holder of the items or buffers. Two schedules handed out
one after the other can touch the same buffer (an assign's target: `x.assign(x + 1); x.schedule()` twice), so the order
between them is recorded when the later one is registered, not looked up when it runs (by then a buffer's tag may
name a newer writer): an item first runs the older pending items that write what it reads or writes, and the older
pending items that read what it writes (`_pending_readers` on a buffer, by weak reference).
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from tiny.ops import MetaOps

# an item's state in its PendingSchedule
_PENDING, _RAN, _TAKEN = 0, 1, 2

Tag = Tuple["PendingSchedule", int]


class PendingSchedule:
  """The items of one schedule in run order, the values of its Variables, what became of each item (still to run, run
  here before its caller got to it (_RAN), or taken by the caller's own run (_TAKEN)), and per item the items of older
  schedules that must run before it."""

  __slots__ = ("items", "var_vals", "state", "left", "deps", "ref", "__weakref__")

  def __init__(self, items: List[Any], var_vals: Dict[Any, int]) -> None:
    self.items, self.var_vals = items, var_vals
    self.state = [_PENDING] * len(items)
    self.left = len(items)
    self.deps: Dict[int, List[Tag]] = {}
    # in `live` until every item ran or was taken, or the schedule is dropped unrun (the callback)
    self.ref = weakref.ref(self, live.discard)
    live.add(self.ref)

  def _done(self, i: int, state: int) -> None:
    self.state[i] = state
    self.left -= 1
    self.deps.pop(i, None)
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


def _is_pending(tag: Optional[Tag]) -> bool:
  return tag is not None and tag[0].state[tag[1]] == _PENDING


def _tag_of(buf: Any) -> Optional[Tag]:
  tag = buf._pending if buf._pending is not None or buf._base is None else buf._base._pending
  return tag if _is_pending(tag) else None


def _readers_of(buf: Any) -> List[Tag]:
  """The pending items (of live schedules) that read buf; drops the others from its list."""
  refs = buf._pending_readers
  if not refs:
    return []
  out, keep = [], []
  for r, i in refs:
    if (p := r()) is not None and p.state[i] == _PENDING:
      out.append((p, i))
      keep.append((r, i))
  buf._pending_readers = keep
  return out


def register(schedule: Sequence[Any], var_vals: Dict[Any, int]) -> None:
  """Remember schedule (ScheduleItems in run order) as handed out: its buffers count as computed only once it ran."""
  if not schedule:
    return
  p = PendingSchedule(list(schedule), dict(var_vals))
  for i, si in enumerate(schedule):
    # what must run first: older writers of every buffer it touches, older readers of every buffer it writes
    deps = [t for b in si.bufs if (t := _tag_of(b)) is not None and t[0] is not p]
    deps += [t for b in si.outputs for t in _readers_of(b) if t[0] is not p]
    if deps:
      p.deps[i] = deps
  for i, si in enumerate(schedule):
    tag = (p, i)
    object.__setattr__(si, "_pending", tag)   # a frozen dataclass: the tag is no field, so it changes no comparison
    for b in si.outputs:
      b._pending = tag
    for b in si.inputs:
      b._pending_readers = _live_refs(b) + [(p.ref, i)]


def _live_refs(b: Any) -> List[Tuple[Any, int]]:
  return [(r, i) for r, i in b._pending_readers if (q := r()) is not None and q.state[i] == _PENDING] if b._pending_readers else []


def _run_tag(tag: Tag) -> None:
  """Run tag's schedule in order up to and including its item."""
  p, last = tag
  for i in range(last + 1):
    if p.state[i] == _PENDING:
      _run(p, i)


def _before(p: PendingSchedule, i: int) -> None:
  # the older schedules' items this one must follow (recorded when p was registered)
  for t in p.deps.get(i, ()):
    if _is_pending(t):
      _run_tag(t)


def _before_untracked(si: Any) -> None:
  # an item no schedule of here holds (Tensor.realize's, TinyJit's, a cached one): its graph was built on the newest
  # state, so it reads after the newest pending writers, and writes (an assign) after the pending readers
  for b in si.inputs:
    if (t := _tag_of(b)) is not None:
      _run_tag(t)
  for b in si.outputs:
    if (t := _tag_of(b)) is not None:
      _run_tag(t)
    for t in _readers_of(b):
      _run_tag(t)


def _run(p: PendingSchedule, i: int) -> None:
  from tiny.engine.realize import capturing, lower_schedule_item
  from tiny.helpers import CAPTURING
  si = p.items[i]
  _before(p, i)
  if p.state[i] != _PENDING:   # an item it waited for ran this one already
    return
  ei = lower_schedule_item(si, claim=False)
  if len(capturing) and CAPTURING:
    capturing[0].add(ei)
  ei.run(p.var_vals)
  p._done(i, _RAN)


def ensure_ready(buf: Any) -> None:
  """Run the pending items (in their schedule's order) up to the one that writes buf, if one has not run yet."""
  if (tag := _tag_of(buf)) is not None:
    _run_tag(tag)


def claim(si: Any) -> bool:
  """The caller is about to run si itself: run what must come first and stop tracking it. False when si already ran
  here (the caller must skip it), True when it has to run (also for an item that was never handed out)."""
  if (tag := si._pending) is None:
    if live:
      _before_untracked(si)
    return True
  p, i = tag
  if p.state[i] == _RAN:
    object.__setattr__(si, "_pending", None)   # ran once for the caller: a later run of the same item is the caller's
    return False
  if p.state[i] == _PENDING:
    _before(p, i)
    # the caller may run a schedule out of order or in part: the items of its own schedule before this one come first
    for j in range(i):
      if p.state[j] == _PENDING:
        _run(p, j)
    p._done(i, _TAKEN)
  object.__setattr__(si, "_pending", None)
  return True


def ensure_graph_ready(lbs: Iterable[Any]) -> None:
  """Before a realize of lbs: run the pending items that write a realized buffer their lazy graphs read (or that lbs
  are), and the pending readers of a buffer an assign among them writes."""
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
      if b.op is MetaOps.ASSIGN and (target := getattr(srcs[1].base, "_buffer", None)) is not None:
        for t in _readers_of(target):
          _run_tag(t)
      todo.extend(s._base if s._base is not None else s for s in srcs)
    elif (buf := getattr(b, "_buffer", None)) is not None:
      ensure_ready(buf)
