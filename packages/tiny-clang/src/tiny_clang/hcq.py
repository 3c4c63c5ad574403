"""HCQCPU: the hardware-command-queue interfaces of tiny.backend implemented on the CPU, as the reference a device author copies.

What stands in for the hardware:
- a signal is a 64-bit word in host memory; writers notify a condition variable, so a wait sleeps instead of spinning;
- each device has two worker threads, its compute engine and its copy engine. `submit` hands a snapshot of a queue's
  commands to the engine's thread, which runs them in order: `wait` blocks the engine, `signal` writes the word,
  `timestamp` writes the time, `exec` calls a CLANG kernel (on tiny-clang's thread pool), `copy` is a memmove;
- memory is 64-byte aligned host memory, so staging buffers and device buffers are the same kind of thing.

Kernels are CLANG's: the same renderer, compiler and loaded shared objects, only launched from the compute engine.
A command that fails is recorded on the device (raised by the next synchronize); the engine skips the rest of that
submission's work but still writes its signals and timestamps, so nobody waits forever on a failed queue.
"""
from __future__ import annotations

import ctypes
import functools
import queue
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple, Type

from tiny.backend import (BufferOptions, HCQAllocator, HCQArgsState, HCQCompiled, HCQGraph, HCQProgram, HCQSignal, HWCommandQueue, HWComputeQueue,
                          HWCopyQueue, getenv, to_function_name)

from tiny_clang.runtime import ClangProgram, _libc, alloc_host, buf_address


def _now_us() -> float:
  # the clock of tiny.backend's HCQ timestamps (perf_counter, in microseconds)
  return time.perf_counter_ns() / 1e3


class CPUSignal(HCQSignal):
  """A signal in a host memory word, with a condition variable so waiters sleep until a writer notifies them."""

  def __init__(self, value: int = 0, name: str = ""):
    self._word = (ctypes.c_uint64 * 1)()
    self._cond = threading.Condition()
    super().__init__(value, name)

  def _read(self) -> int:
    return int(self._word[0])

  def _write(self, value: int) -> None:
    with self._cond:
      self._word[0] = value
      self._cond.notify_all()

  def wait(self, value: int, timeout: Optional[float] = None) -> None:
    """Sleep until the word is at least `value` (HCQTimeoutError after `timeout` seconds, default HCQ_TIMEOUT_MS)."""
    limit = getenv("HCQ_TIMEOUT_MS", 30000) / 1e3 if timeout is None else timeout
    with self._cond:
      if not self._cond.wait_for(lambda: self._word[0] >= value, timeout=limit):
        raise self.timeout_error(value)


class _Engine:
  """One worker thread: runs submitted command lists in order, like a hardware queue engine."""

  def __init__(self, device: HCQCPUDevice, name: str):
    self.device, self.name = device, name
    self.jobs: queue.Queue[List[List[Any]]] = queue.Queue()
    self.thread = threading.Thread(target=self._loop, name=f"{device.dname} {name}", daemon=True)
    self.thread.start()

  def _loop(self) -> None:
    while True:
      cmds = self.jobs.get()
      failed = False
      for cmd in cmds:
        # after a failure only the bookkeeping runs: the signals the host and other queues wait for still arrive
        if failed and cmd[0] not in ("signal", "timestamp"):
          continue
        try:
          run_command(cmd)
        except BaseException as e:  # noqa: BLE001 - the engine must survive anything a command raises
          if self.device.error is None:
            self.device.error = e
          failed = True


def run_command(cmd: List[Any]) -> None:
  """Execute one recorded command on the calling (engine) thread."""
  kind = cmd[0]
  if kind == "signal":
    cmd[1].value = cmd[2]
  elif kind == "wait":
    cmd[1].wait(cmd[2])
  elif kind == "timestamp":
    cmd[1].timestamp = _now_us()
  elif kind == "exec":
    cmd[1].run(cmd[2])   # launch dims (cmd[3], cmd[4]) are unused: a CPU kernel loops over its whole grid itself
  elif kind == "copy":
    if cmd[3]:
      ctypes.memmove(buf_address(cmd[1]), buf_address(cmd[2]), cmd[3])
  else:
    raise RuntimeError(f"unknown HCQ command {kind!r}")


def _snapshot(q: HWCommandQueue) -> List[List[Any]]:
  # the host may patch the queue for its next submission while the engine still runs this one
  return [list(c) for c in q.cmds]


class CPUComputeQueue(HWComputeQueue):
  """Compute queue of HCQCPU: runs on the device's compute engine."""

  def _submit(self, device: Any) -> None:
    device.compute_engine.jobs.put(_snapshot(self))


class CPUCopyQueue(HWCopyQueue):
  """Copy queue of HCQCPU: runs on the device's copy engine."""

  def _submit(self, device: Any) -> None:
    device.copy_engine.jobs.put(_snapshot(self))


class CPUArgsState(HCQArgsState):
  """Kernel arguments as the CLANG entry point takes them: an int64 array of buffer addresses, then variable values."""

  def __init__(self, prg: HCQProgram, bufs: Sequence[Any], vals: Sequence[int] = ()):
    super().__init__(prg, bufs, vals)
    self.nbufs = len(bufs)
    self.arr = (ctypes.c_int64 * max(1, len(bufs) + len(vals)))(*[buf_address(b) if b else 0 for b in bufs], *vals)
    # keep the handles alive while a launch may still read them (views are ctypes objects that own nothing else)
    self.bufs = list(bufs)

  def update_buffer(self, index: int, buf: Any) -> None:
    self.arr[index] = buf_address(buf)
    self.bufs[index] = buf

  def update_var(self, index: int, value: int) -> None:
    self.arr[self.nbufs + index] = value


class HCQCPUProgram(HCQProgram):
  """A CLANG kernel launched through the compute queue."""

  args_state_t: Type[HCQArgsState] = CPUArgsState

  def __init__(self, device: HCQCPUDevice, name: str, lib: bytes):
    super().__init__(device, to_function_name(name))
    self.clang = ClangProgram(name, lib)

  def run(self, args_state: CPUArgsState) -> None:
    """Run the kernel (called by the compute engine)."""
    self.clang.run_args(args_state.arr)


class HCQCPUAllocator(HCQAllocator):
  """Host memory, 64-byte aligned (huge pages from 2 MiB, see alloc_host), moved by the copy engine."""

  ALIGN = 64

  def _alloc(self, size: int, options: BufferOptions) -> Any:
    return alloc_host(size, self.ALIGN)

  def _free(self, opaque: Any, options: BufferOptions) -> None:
    _libc.get().free(ctypes.addressof(opaque))

  def _offset(self, buf: Any, size: int, offset: int) -> Any:
    return (ctypes.c_uint8 * size).from_buffer(buf, offset)

  def _host_view(self, buf: Any) -> memoryview:
    return memoryview(buf).cast("B")


class HCQCPUDevice(HCQCompiled):
  """The HCQCPU device: CLANG kernels and host memory behind a compute engine and a copy engine."""

  def __init__(self, device: str):
    from tiny_clang.compiler import ClangCompiler
    from tiny_clang.renderer import ClangRenderer
    self.dname = device
    self.compute_engine, self.copy_engine = _Engine(self, "compute"), _Engine(self, "copy")
    super().__init__(device, HCQCPUAllocator(self), ClangRenderer(), ClangCompiler(), functools.partial(HCQCPUProgram, self),
                     CPUSignal, CPUComputeQueue, CPUCopyQueue, graph=HCQGraph)

  def engines(self) -> Tuple[threading.Thread, threading.Thread]:
    """The compute and copy engine threads."""
    return self.compute_engine.thread, self.copy_engine.thread
