"""Hardware command queues (HCQ): the interfaces a device implements when it drives its hardware directly.

A device that speaks HCQ does not call a driver per kernel. It records commands into queues (launch this kernel, copy these
bytes, write this value into that signal, wait until that signal reaches a value) and submits whole queues to the hardware,
which runs them asynchronously. Ordering is expressed with signals: memory words holding a monotonically increasing value.

- `HCQSignal`: one such word. `value` reads or writes it, `wait(value)` blocks until it reaches a value, and it remembers when
  it reached each recent value (and the time of its last `timestamp` command), for profiling.
- `HWCommandQueue`: records `signal`/`wait`/`timestamp` commands; `submit(device)` hands them to the device. A recorded
  command can be patched in place (`update_signal`, `update_wait`), so a queue built once is replayed with new values.
  `HWComputeQueue` adds kernel launches (`exec`/`update_exec`), `HWCopyQueue` copies (`copy`/`update_copy`).
- `HCQProgram`/`HCQArgsState`: a loaded kernel and the argument memory of one launch of it (buffer addresses, variable values).
- `HCQCompiled`: the device. Every submission waits for the previous one on the device's timeline signal and bumps it, so
  eager work runs in order across the compute and copy queues; `synchronize()` waits for the timeline.
- `HCQAllocator`: memory, with copyin/copyout staged through host buffers on the copy queue and `transfer` between devices.

The graph executor built on these (`HCQGraph`) lives in `tiny.engine.hcq_graph`, above the engine it plugs into.
With `PROFILE=1` kernels and copies are timed on the device and `write_trace(path)` writes a Chrome trace (also at exit).
tiny-clang's `HCQCPU` device implements all of this on the CPU; it is the example to copy.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import json
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

from tiny.device import Allocator, BufferOptions, Compiled, Compiler, LRUAllocator
from tiny.helpers import PROFILE, flat_mv, getenv, temp
from tiny.renderer import Renderer

# how long a wait may block before it is an error: a signal that never comes is a bug, not a reason to hang forever
HCQ_TIMEOUT_MS = getenv("HCQ_TIMEOUT_MS", 30000)

_signal_ids = itertools.count()
_Q = TypeVar("_Q", bound="HWCommandQueue")


def now_us() -> float:
  """The clock every HCQ timestamp uses, in microseconds (the unit of the trace-event format)."""
  return time.perf_counter_ns() / 1e3


class HCQTimeoutError(TimeoutError):
  """A wait on a signal ran out of time: the signal, the value waited for and the value it had are in the message."""


# **************** signals ****************

class HCQSignal:
  """A timeline value in a memory word. Subclasses say where the word lives (`_read`/`_write`) and may wait better than polling.

  Writing `value` records when the signal reached it (`reached_at`); a queue's `timestamp` command sets `timestamp`.
  """

  REMEMBER = 256   # how many recent values keep their time; a timeline signal goes through millions

  def __init__(self, value: int = 0, name: str = ""):
    self.name = name or f"signal{next(_signal_ids)}"
    self._reached: collections.OrderedDict[int, float] = collections.OrderedDict()
    self.timestamp: Optional[float] = None
    self.value = value

  def _read(self) -> int:
    raise NotImplementedError("an HCQSignal subclass must say where its word lives (_read)")

  def _write(self, value: int) -> None:
    raise NotImplementedError("an HCQSignal subclass must say where its word lives (_write)")

  @property
  def value(self) -> int:
    """The signal's current value."""
    return self._read()

  @value.setter
  def value(self, value: int) -> None:
    # the time goes in before the word changes, so a waiter that wakes on the new value always finds it
    self._reached[value] = now_us()
    while len(self._reached) > self.REMEMBER:
      self._reached.popitem(last=False)
    self._write(value)

  def reached_at(self, value: int) -> Optional[float]:
    """When (now_us clock) the signal was set to `value`, if it was among the last REMEMBER values written."""
    return self._reached.get(value)

  def wait(self, value: int, timeout: Optional[float] = None) -> None:
    """Block until the signal is at least `value`; HCQTimeoutError after `timeout` seconds (default HCQ_TIMEOUT_MS)."""
    deadline = time.monotonic() + (HCQ_TIMEOUT_MS / 1e3 if timeout is None else timeout)
    while self.value < value:
      if time.monotonic() > deadline:
        raise self.timeout_error(value)
      time.sleep(0)

  def timeout_error(self, value: int) -> HCQTimeoutError:
    """The error for a wait on `value` that timed out."""
    return HCQTimeoutError(f"wait on {self.name} timed out: waiting for value {value}, the signal is at {self.value}")

  def __repr__(self) -> str:
    return f"<{type(self).__name__} {self.name}={self.value}>"


# **************** queues ****************

class HWCommandQueue:
  """A list of recorded commands. Each command is a list `[kind, *operands]`; its index (the position it was recorded at,
  which `next_index` gives before recording) is how `update_*` finds it again.

  A device subclass implements `_submit`: a hardware queue encodes the list into its packet format there, the CPU reference
  hands it to a worker thread. Commands are recorded and patched only by the host, never while a submission of them runs.
  """

  def __init__(self) -> None:
    self.cmds: List[List[Any]] = []

  @property
  def next_index(self) -> int:
    """The index the next recorded command gets."""
    return len(self.cmds)

  def __len__(self) -> int:
    return len(self.cmds)

  def _add(self: _Q, kind: str, *operands: Any) -> _Q:
    self.cmds.append([kind, *operands])
    return self

  def _cmd(self, idx: int, kind: str) -> List[Any]:
    if not 0 <= idx < len(self.cmds) or self.cmds[idx][0] != kind:
      got = self.cmds[idx][0] if 0 <= idx < len(self.cmds) else "nothing"
      raise ValueError(f"command {idx} of this queue is {got}, not {kind}")
    return self.cmds[idx]

  def signal(self: _Q, sig: HCQSignal, value: int) -> _Q:
    """Record: write `value` into `sig` once everything before it in this queue is done."""
    return self._add("signal", sig, value)

  def wait(self: _Q, sig: HCQSignal, value: int) -> _Q:
    """Record: stall this queue until `sig` is at least `value`."""
    return self._add("wait", sig, value)

  def timestamp(self: _Q, sig: HCQSignal) -> _Q:
    """Record: write the device time into `sig.timestamp` when the queue gets here."""
    return self._add("timestamp", sig)

  def update_signal(self: _Q, idx: int, signal: Optional[HCQSignal] = None, value: Optional[int] = None) -> _Q:
    """Patch the signal command at `idx` (its signal and/or value)."""
    cmd = self._cmd(idx, "signal")
    if signal is not None:
      cmd[1] = signal
    if value is not None:
      cmd[2] = value
    return self

  def update_wait(self: _Q, idx: int, signal: Optional[HCQSignal] = None, value: Optional[int] = None) -> _Q:
    """Patch the wait command at `idx` (its signal and/or value)."""
    cmd = self._cmd(idx, "wait")
    if signal is not None:
      cmd[1] = signal
    if value is not None:
      cmd[2] = value
    return self

  def submit(self: _Q, device: HCQCompiled) -> _Q:
    """Hand the recorded commands to `device`; they run asynchronously. The queue stays usable for patching and resubmitting."""
    if self.cmds:
      self._submit(device)
    return self

  def _submit(self, device: HCQCompiled) -> None:
    raise NotImplementedError(f"{type(self).__name__} must implement _submit")


class HCQArgsState:
  """The argument memory of one kernel launch: buffer handles, then variable values. Patched in place by graphs."""

  def __init__(self, prg: HCQProgram, bufs: Sequence[Any], vals: Sequence[int] = ()):
    self.prg = prg

  def update_buffer(self, index: int, buf: Any) -> None:
    """Point buffer argument `index` at `buf` (an allocator handle)."""
    raise NotImplementedError

  def update_var(self, index: int, value: int) -> None:
    """Set variable argument `index` (counted after the buffers) to `value`."""
    raise NotImplementedError


class HWComputeQueue(HWCommandQueue):
  """A queue that also launches kernels."""

  def exec(self, prg: HCQProgram, args_state: HCQArgsState, global_size: Sequence[int], local_size: Sequence[int]) -> HWComputeQueue:
    """Record: launch `prg` with the arguments in `args_state` on a grid of `global_size` workgroups of `local_size`."""
    self._add("exec", prg, args_state, tuple(global_size), tuple(local_size))
    return self

  def update_exec(self, idx: int, global_size: Optional[Sequence[int]] = None, local_size: Optional[Sequence[int]] = None,
                  bufs: Optional[Dict[int, Any]] = None, vals: Optional[Dict[int, int]] = None) -> HWComputeQueue:
    """Patch the launch at `idx`: new launch dims, buffer arguments ({index: handle}) or variable values ({index: value})."""
    cmd = self._cmd(idx, "exec")
    if global_size is not None:
      cmd[3] = tuple(global_size)
    if local_size is not None:
      cmd[4] = tuple(local_size)
    for i, b in (bufs or {}).items():
      cmd[2].update_buffer(i, b)
    for i, v in (vals or {}).items():
      cmd[2].update_var(i, v)
    return self


class HWCopyQueue(HWCommandQueue):
  """A queue that also copies device memory (a DMA engine on a GPU)."""

  def copy(self, dest: Any, src: Any, nbytes: int) -> HWCopyQueue:
    """Record: copy `nbytes` from handle `src` to handle `dest`."""
    self._add("copy", dest, src, nbytes)
    return self

  def update_copy(self, idx: int, dest: Any = None, src: Any = None) -> HWCopyQueue:
    """Patch the copy at `idx` with a new destination and/or source."""
    cmd = self._cmd(idx, "copy")
    if dest is not None:
      cmd[1] = dest
    if src is not None:
      cmd[2] = src
    return self


# **************** programs and devices ****************

class HCQProgram:
  """A kernel loaded on an HCQ device. Calling it (as the engine does) launches it on the compute queue, in timeline order.

  Subclasses set `args_state_t` and run the launch when their queue executes an `exec` command."""

  args_state_t: Type[HCQArgsState] = HCQArgsState

  def __init__(self, device: HCQCompiled, name: str):
    self.device, self.name = device, name

  def fill_kernargs(self, bufs: Sequence[Any], vals: Sequence[int] = ()) -> HCQArgsState:
    """The argument memory for a launch on `bufs` (allocator handles) and variable values `vals`."""
    return self.args_state_t(self, bufs, vals)

  def __call__(self, *bufs: Any, global_size: Tuple[int, ...] = (1, 1, 1), local_size: Tuple[int, ...] = (1, 1, 1),
               vals: Tuple[int, ...] = (), wait: bool = False) -> Optional[float]:
    dev = self.device
    with dev.submit_lock:
      q = dev.hw_compute_queue_t().wait(dev.timeline_signal, dev.timeline_value - 1)
      st, en = (dev.signal_t(), dev.signal_t()) if PROFILE or wait else (None, None)
      if st is not None:
        q.timestamp(st)
      q.exec(self, self.fill_kernargs(bufs, vals), global_size, local_size)
      if en is not None:
        q.timestamp(en)
      q.signal(dev.timeline_signal, dev.timeline_value).submit(dev)
      dev.timeline_value += 1
      if PROFILE and st is not None and en is not None:
        dev.add_profile(self.name, "COMPUTE", st, en)
    if wait and st is not None and en is not None:
      dev.synchronize()
      return ((en.timestamp or 0.0) - (st.timestamp or 0.0)) / 1e6
    return None


_hcq_devices: "weakref.WeakSet[HCQCompiled]" = weakref.WeakSet()


class HCQCompiled(Compiled):
  """A device driven through hardware command queues.

  `timeline_signal` holds how far the device got; `timeline_value` is the value the next submission will signal. Every
  submission waits for `timeline_value - 1` first (so the compute and copy queues never race on eager work), signals
  `timeline_value` last and bumps it, under `submit_lock`. A queue that fails records the error in `error`; the next
  `synchronize()` raises it."""

  def __init__(self, device: str, allocator: Allocator, renderer: Optional[Renderer], compiler: Optional[Compiler], runtime: Any,
               signal_t: Type[HCQSignal], compute_queue_t: Type[HWComputeQueue], copy_queue_t: Type[HWCopyQueue], graph: Any = None,
               caps: Any = None):
    self.signal_t, self.hw_compute_queue_t, self.hw_copy_queue_t = signal_t, compute_queue_t, copy_queue_t
    self.timeline_signal = signal_t(0, name=f"{device} timeline")
    self.timeline_value = 1
    self.submit_lock = threading.RLock()
    self.error: Optional[BaseException] = None
    self._pending_profile: List[Tuple[str, str, HCQSignal, HCQSignal]] = []
    super().__init__(device, allocator, renderer, compiler, runtime, graph, caps)
    _hcq_devices.add(self)
    if PROFILE:
      _register_atexit()

  def synchronize(self) -> None:
    """Wait until everything submitted so far has run; raise the error a queue hit, if one did."""
    self.timeline_signal.wait(self.timeline_value - 1)
    self.collect_profile()
    if (err := self.error) is not None:
      self.error = None
      raise RuntimeError(f"a command queue of {self.dname} failed: {err}") from err

  def add_profile(self, name: str, queue: str, start: HCQSignal, end: HCQSignal) -> None:
    """Record a profiled command: its `start`/`end` signals get their timestamps when it runs; collected at synchronize."""
    with self.submit_lock:
      self._pending_profile.append((name, queue, start, end))

  def collect_profile(self) -> None:
    """Move the profiled commands that have run into the trace."""
    with self.submit_lock:
      done = [p for p in self._pending_profile if p[2].timestamp is not None and p[3].timestamp is not None]
      self._pending_profile = [p for p in self._pending_profile if p[2].timestamp is None or p[3].timestamp is None]
    for name, queue, st, en in done:
      record_event(name, self.dname, queue, st.timestamp or 0.0, en.timestamp or 0.0)


# **************** memory ****************

@dataclass
class _Staging:
  buf: Any
  free_at: int = 0   # the device timeline value after which the last copy through it is done


class HCQAllocator(LRUAllocator):
  """Memory of an HCQ device. Subclasses implement `_alloc`, `_free`, `_offset` (a view) and `_host_view` (the host-visible
  bytes of a buffer allocated with BufferOptions(host=True), used for staging).

  copyin fills host staging buffers and copies them on the copy queue without waiting (the staging buffers are reused only
  after the timeline passes their copy); copyout waits, since the caller reads the bytes right after."""

  STAGING_SIZE = 2 << 20
  STAGING_COUNT = 2

  def __init__(self, device: HCQCompiled):
    super().__init__()
    self.device = device
    self._staging: List[_Staging] = []
    self._next_staging = 0

  def _offset(self, buf: Any, size: int, offset: int) -> Any:
    raise NotImplementedError

  def _host_view(self, buf: Any) -> memoryview:
    raise NotImplementedError

  def offset(self, buf: Any, size: int, offset: int) -> Any:
    """A handle to `size` bytes of `buf` starting `offset` bytes in."""
    return self._offset(buf, size, offset)

  def _take_staging(self) -> _Staging:
    if len(self._staging) < self.STAGING_COUNT:
      self._staging.append(_Staging(self._alloc(self.STAGING_SIZE, BufferOptions(host=True, cpu_access=True))))
    s = self._staging[self._next_staging % len(self._staging)]
    self._next_staging += 1
    self.device.timeline_signal.wait(s.free_at)
    return s

  def _copy(self, dest: Any, src: Any, nbytes: int, name: str) -> int:
    """Submit one copy on the copy queue in timeline order; returns the timeline value it signals."""
    dev = self.device
    q = dev.hw_copy_queue_t().wait(dev.timeline_signal, dev.timeline_value - 1)
    st, en = (dev.signal_t(), dev.signal_t()) if PROFILE else (None, None)
    if st is not None:
      q.timestamp(st)
    q.copy(dest, src, nbytes)
    if en is not None:
      q.timestamp(en)
    q.signal(dev.timeline_signal, dev.timeline_value).submit(dev)
    if st is not None and en is not None:
      dev.add_profile(name, "COPY", st, en)
    dev.timeline_value += 1
    return dev.timeline_value - 1

  def copyin(self, dest: Any, src: memoryview) -> None:
    src = flat_mv(src)
    with self.device.submit_lock:
      for off in range(0, src.nbytes, self.STAGING_SIZE):
        n = min(self.STAGING_SIZE, src.nbytes - off)
        s = self._take_staging()
        self._host_view(s.buf)[:n] = src[off:off + n]
        s.free_at = self._copy(self._offset(dest, n, off), s.buf, n, f"copyin {n} bytes")

  def copyout(self, dest: memoryview, src: Any) -> None:
    dest = flat_mv(dest)
    self.device.synchronize()
    with self.device.submit_lock:
      for off in range(0, dest.nbytes, self.STAGING_SIZE):
        n = min(self.STAGING_SIZE, dest.nbytes - off)
        s = self._take_staging()
        s.free_at = self._copy(s.buf, self._offset(src, n, off), n, f"copyout {n} bytes")
        self.device.timeline_signal.wait(s.free_at)
        dest[off:off + n] = self._host_view(s.buf)[:n]
    self.device.synchronize()   # raises what the copy queue hit, if anything

  def transfer(self, dest: Any, src: Any, sz: int, src_dev: HCQCompiled, dest_dev: HCQCompiled) -> None:
    """Copy `sz` bytes between two devices of this kind on the destination's copy queue, after the work of both."""
    with src_dev.submit_lock, dest_dev.submit_lock:
      dest_dev.hw_copy_queue_t().wait(src_dev.timeline_signal, src_dev.timeline_value - 1) \
        .wait(dest_dev.timeline_signal, dest_dev.timeline_value - 1).copy(dest, src, sz) \
        .signal(dest_dev.timeline_signal, dest_dev.timeline_value).submit(dest_dev)
      dest_dev.timeline_value += 1
      if src_dev is not dest_dev:
        # the source may not be overwritten by later work on its device before the copy has read it
        src_dev.hw_compute_queue_t().wait(dest_dev.timeline_signal, dest_dev.timeline_value - 1) \
          .signal(src_dev.timeline_signal, src_dev.timeline_value).submit(src_dev)
        src_dev.timeline_value += 1

  def free(self, opaque: Any, size: int, options: Optional[BufferOptions] = None) -> None:
    # memory going back to the system may still be in use by queued work; memory kept in the LRU cache is reused only by
    # later submissions, which the timeline orders after the earlier ones
    if not getenv("LRU", 1) or (options is not None and options.nolru):
      self.device.synchronize()
    super().free(opaque, size, options)

  def free_cache(self) -> None:
    self.device.synchronize()
    super().free_cache()


# **************** profiling ****************

@dataclass(frozen=True)
class ProfileEvent:
  """One profiled command: start and end on the now_us clock."""
  name: str
  device: str
  queue: str
  start: float
  end: float


_events: List[ProfileEvent] = []
_events_lock = threading.Lock()
_atexit_registered = False


def record_event(name: str, device: str, queue: str, start: float, end: float) -> None:
  """Add one event to the trace (HCQ devices call this; a device that times things its own way may too)."""
  with _events_lock:
    _events.append(ProfileEvent(name, device, queue, start, end))


def profile_events() -> List[ProfileEvent]:
  """The events recorded so far (after synchronizing every HCQ device)."""
  for dev in list(_hcq_devices):
    try:
      dev.synchronize()
    except Exception:  # a failed device still has its earlier events to show
      dev.collect_profile()
  with _events_lock:
    return list(_events)


def clear_profile() -> None:
  """Forget the recorded events."""
  with _events_lock:
    _events.clear()


def trace_json(events: Optional[List[ProfileEvent]] = None) -> Dict[str, Any]:
  """The events as Chrome trace-event JSON: a complete ("X") event per command, a process per device, a thread per queue."""
  events = profile_events() if events is None else events
  pids: Dict[str, int] = {}
  tids: Dict[Tuple[str, str], int] = {}
  out: List[Dict[str, Any]] = []
  for e in events:
    if e.device not in pids:
      pids[e.device] = len(pids) + 1
      out.append({"name": "process_name", "ph": "M", "pid": pids[e.device], "tid": 0, "args": {"name": e.device}})
    if (e.device, e.queue) not in tids:
      tids[(e.device, e.queue)] = len([k for k in tids if k[0] == e.device]) + 1
      out.append({"name": "thread_name", "ph": "M", "pid": pids[e.device], "tid": tids[(e.device, e.queue)], "args": {"name": e.queue}})
    out.append({"name": e.name, "ph": "X", "ts": e.start, "dur": max(0.0, e.end - e.start), "pid": pids[e.device],
                "tid": tids[(e.device, e.queue)], "cat": e.queue.lower()})
  return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_trace(path: Optional[str] = None) -> str:
  """Write the recorded events as a Chrome trace (chrome://tracing, Perfetto) to `path` (default PROFILE_PATH or a temp
  file); returns the path."""
  path = path or getenv("PROFILE_PATH", temp("tiny_profile.json"))
  with open(path, "w") as f:
    json.dump(trace_json(), f)
  return path


def _write_at_exit() -> None:
  if _events or any(d._pending_profile for d in list(_hcq_devices)):
    print(f"tiny: HCQ profile written to {write_trace()}")


def _register_atexit() -> None:
  global _atexit_registered
  if not _atexit_registered:
    _atexit_registered = True
    atexit.register(_write_at_exit)
