"""Running a schedule: lower each ScheduleItem to a Runner and execute it on its buffers.

`CompiledRunner` wraps a compiled kernel (found in a method cache keyed by device and AST, so a kernel is
optimized and compiled once per process); `BufferCopy`/`BufferXfer` move data between devices; `ViewOp`,
`EmptyOp` and `CustomOp` cover the meta ops. `run_schedule` is what `Tensor.realize` ends in.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Generator, List, Optional, Tuple, Union

from tiny import eager_key, plugins
from tiny.codegen.kernel import Kernel
from tiny.device import Buffer, Compiled, Compiler
from tiny.engine import eager_params, graph_viz, pending
from tiny.eager_key import state as _key_state
from tiny.engine.schedule import ScheduleItem, cached_schedule, eager_kernel
from tiny.engine.schedule import schedule_to_run as schedule_to_run  # (Tensor.realize calls it through this module)
from tiny.helpers import BEAM, CAPTURING, DEBUG, NOOPT, GlobalCounters, Metadata, ansilen, colored, getenv, progress_bar, to_function_name
from tiny.lazy import LazyBuffer
from tiny.ops import LazyOp, MetaOps
from tiny.registry import Device
from tiny.renderer import Program, Renderer
from tiny.shape.symbolic import Variable, sym_infer


def _device(name: str) -> Compiled:
  return Device[name]


# **************** runners ****************

class Runner:
  """Something that runs on a list of Buffers: a kernel, a copy, a view. Costs feed GlobalCounters."""

  def __init__(self, display_name: str, dname: str, op_estimate: Any = 0, mem_estimate: Any = 0):
    self.first_run, self.display_name, self.dname, self.op_estimate, self.mem_estimate = True, display_name, dname, op_estimate, mem_estimate

  # the positions in its buffer list that a run writes (see note_writes); None: any of them, as far as anyone knows
  writes: Optional[Tuple[int, ...]] = None

  @property
  def device(self) -> Compiled:
    return _device(self.dname)

  def note_writes(self, rawbufs: List[Buffer]) -> None:
    """Tell the buffers this run wrote that their contents changed (Buffer.write_version)."""
    # Buffer.note_write inlined: this runs for every eager kernel
    for i in (range(len(rawbufs)) if self.writes is None else self.writes):
      b = rawbufs[i]
      (b if b._base is None else b._base)._writes += 1

  def exec(self, rawbufs: List[Buffer], var_vals: Optional[Dict[Variable, int]] = None) -> Optional[float]:
    """Run once on rawbufs (already allocated); returns the time in seconds when measured."""
    et = self(rawbufs, {} if var_vals is None else var_vals)
    if Buffer.tracking_writes:
      self.note_writes(rawbufs)
    return et

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    raise NotImplementedError("a Runner must implement __call__")


class CompiledRunner(Runner):
  """A kernel compiled for one device. `precompiled` skips compilation (a binary from a cache or a pickle)."""

  def __init__(self, p: Program, precompiled: Optional[bytes] = None):
    if DEBUG >= 4:
      print(p.src)
    self.p = p
    dev = _device(p.dname)
    self.lib = precompiled if precompiled is not None else dev.compiler.compile_cached(p.src)
    self.clprg = dev.runtime(to_function_name(p.name), self.lib)
    super().__init__(p.name, p.dname, p.op_estimate, p.mem_estimate)
    # the kernel's arguments are p.globals in order; a kernel that names no output is left at "any of them"
    if p.outs and all(o in p.globals for o in p.outs):
      self.writes = tuple(p.globals.index(o) for o in p.outs)
    if not p.vars and all(isinstance(d, int) for d in [*(p.global_size or ()), *(p.local_size or ())]):
      # no Variables, in the arguments or the launch sizes: the launch is the same every call, so it is worked out once
      global_size, local_size = p.launch_dims({})
      self._launch = {"global_size": tuple(global_size)} if global_size else {}
      if local_size:
        self._launch["local_size"] = tuple(local_size)
      self._launch["vals"] = ()

  def __reduce__(self) -> Tuple[Any, ...]:
    return self.__class__, (self.p, self.lib)

  # the launch keywords of a kernel without Variables (see __init__); None: worked out per call
  _launch: Optional[Dict[str, Any]] = None

  def direct_call(self) -> Optional[Callable[..., bool]]:
    """The program's own synchronous call on the raw buffers' handles (`direct(*handles) -> ran`), for a kernel without
    Variables whose runtime offers one (an optional `direct` method of the program, which returns False, having done
    nothing, when it cannot run that way now); None otherwise. Nothing is timed or counted: the caller counts."""
    return getattr(self.clprg, "direct", None) if self._launch is not None else None

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    if (launch := self._launch) is not None:
      return self.clprg(*[x._buf for x in rawbufs], **launch, wait=wait)
    global_size, local_size = self.p.launch_dims(var_vals)
    kwargs: Dict[str, Any] = {}
    if global_size:
      kwargs["global_size"] = tuple(global_size)
    if local_size:
      kwargs["local_size"] = tuple(local_size)
    return self.clprg(*[x._buf for x in rawbufs], **kwargs, vals=tuple(var_vals[k] for k in self.p.vars), wait=wait)


class CustomOp(Runner):
  """Runs a Python function on the buffers (MetaOps.CUSTOM)."""

  def __init__(self, fxn: Callable[..., Any]):
    self.fxn = fxn
    super().__init__(getattr(fxn, "__name__", "custom"), "CUSTOM", 0, 0)

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    self.fxn(*rawbufs)
    return None


class EmptyOp(Runner):
  """MetaOps.EMPTY: the buffer only needs to exist."""

  writes = (0,)

  def __init__(self, buf: Buffer):
    super().__init__(colored(f"empty {buf.size:10d} {buf.dtype}", "yellow"), buf.device)

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    return None


class ViewOp(Runner):
  """MetaOps.VIEW: the output aliases the input's memory, so there is nothing to run."""

  writes: Optional[Tuple[int, ...]] = ()

  def __init__(self, buf: Buffer):
    super().__init__(colored(f"view {buf.nbytes:8d} @ {buf.offset:<10d}", "yellow"), buf.device)

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    if rawbufs[0]._base is None or rawbufs[0]._base is not rawbufs[1].base:
      raise RuntimeError(f"a view must alias its source: {rawbufs[0]} is not a view of {rawbufs[1]}")
    return None


class BufferCopy(Runner):
  """Copy between devices through host memory (zero-copy where an allocator offers as_buffer)."""

  writes = (0,)

  def __init__(self, total_sz: int, dest_device: str, src_device: str):
    size = f"{total_sz / 1e6:7.2f}M" if total_sz >= 1e6 else f"{total_sz:8d}"
    name = f"{type(self).__name__[6:].lower()} {size}, {dest_device[:7]:>7s} <- {src_device[:7]:7s}"
    super().__init__(colored(name, "yellow"), dest_device, 0, total_sz)

  def copy(self, dest: Buffer, src: Buffer) -> None:
    if src.device.startswith("DISK") and hasattr(dest.allocator, "as_buffer"):
      # read the file straight into the destination's host memory
      src.allocator.copyout(dest.allocator.as_buffer(dest._buf), src._buf)
    else:
      dest.copyin(src.as_buffer(allow_zero_copy=True))

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    dest, src = rawbufs[0:2]
    if dest.nbytes != src.nbytes:
      raise RuntimeError(f"buffer copy size mismatch: {dest.nbytes} bytes <- {src.nbytes} bytes")
    st = time.perf_counter()
    self.copy(dest, src)
    if wait:
      _device(dest.device).synchronize()
      return time.perf_counter() - st
    return None


class BufferXfer(BufferCopy):
  """Device-to-device copy with the allocator's transfer (same kind of device, no host round trip)."""

  def copy(self, dest: Buffer, src: Buffer) -> None:
    getattr(dest.allocator, "transfer")(dest._buf, src._buf, dest.nbytes, src_dev=_device(src.device), dest_dev=_device(dest.device))


# **************** kernels: optimize, compile, cache ****************

def get_kernel(renderer: Renderer, ast: LazyOp, dname: Optional[str] = None) -> Kernel:
  """The optimized Kernel for ast: hand-coded heuristics (which try tensor cores first), or BEAM search when BEAM>=1.

  NOOPT keeps only the opts a kernel needs to be correct. dname is the device the kernel runs on: BEAM compiles its
  candidates with that device's compiler, which for a renderer variant (CUDA:PTX) is not the plain device's."""
  if NOOPT:
    return Kernel(ast, opts=renderer).required_optimizations()
  if BEAM >= 1:
    from tiny.engine.search import beam_search, bufs_from_lin   # search times kernels with this module's runners: it imports us
    kb = Kernel(ast, opts=renderer).required_optimizations()
    hc = Kernel(ast, opts=renderer).hand_coded_optimizations()
    return beam_search(kb, bufs_from_lin(kb, allocate=False), BEAM.value, bool(getenv("BEAM_ESTIMATE", 1)), dname=dname, starts=[hc])
  return Kernel(ast, opts=renderer).hand_coded_optimizations()


# (device, renderer key, ast, beam level, NOOPT, device-kind-only) -> runner. The kind-only entry lets CUDA:1 reuse CUDA:0's
# binary; the renderer key keeps CUDA:PTX (another renderer of the same kind) or another arch from reusing it. NOOPT is
# part of the key because it picks other opts: without it a kernel first built under NOOPT=1 was reused, unoptimized,
# after NOOPT=0 (and the reverse), so tests comparing the two settings in one process ran one of them twice.
method_cache: Dict[Tuple[str, Tuple[Any, ...], LazyOp, int, int, bool], CompiledRunner] = {}
_method_cache_plugins: Tuple[int, int] = (-1, -1)


_CacheKey = Tuple[str, Tuple[Any, ...], LazyOp, int, int, bool]


def _cache_keys(dname: str, ast: LazyOp) -> Tuple[_CacheKey, _CacheKey, Renderer]:
  """(exact-device key, device-kind key, renderer) of ast in the method cache."""
  global _method_cache_plugins
  if (gen := plugins.generation()) != _method_cache_plugins:
    # plugins were reset or registered: a device name may now stand for another renderer or toolchain
    method_cache.clear()
    _method_cache_plugins = gen
  renderer = _device(dname).renderer
  rkey = renderer.cache_key()
  return (dname, rkey, ast, BEAM.value, NOOPT.value, False), (dname.split(":")[0], rkey, ast, BEAM.value, NOOPT.value, True), renderer


def get_runner(dname: str, ast: LazyOp) -> CompiledRunner:
  """The compiled runner for ast on device dname, from the method cache when possible."""
  ckey, bkey, renderer = _cache_keys(dname, ast)
  if (cret := method_cache.get(ckey)) is not None:
    return cret
  if (bret := method_cache.get(bkey)) is not None:
    ret = CompiledRunner(replace(bret.p, dname=dname), bret.lib)
  else:
    prg: Program = get_kernel(renderer, ast, dname).to_program()
    ret = CompiledRunner(replace(prg, dname=dname))
    method_cache[bkey] = ret
  method_cache[ckey] = ret
  return ret


def _show_progress(n: int) -> bool:
  # a bar only helps when there is a wait to watch, and must not litter logs or captured output: many kernels, and
  # stderr a terminal (or DEBUG>=1, where the user asked for progress output). PROGRESS=0 turns it off, PROGRESS=1 forces it.
  if (force := getenv("PROGRESS", -1)) >= 0:
    return bool(force) and n >= 2
  return n >= 8 and (DEBUG >= 1 or sys.stderr.isatty())


class _CompileQueue:
  """Sources waiting for their compiler, handed to worker threads in batches (`Compiler.compile_many`).

  While sources still come, batches start once `min_batch` wait, and at most workers-1 run at once: the thread that
  renders (Python) keeps a core, and every compiler process started costs about as much as compiling a small kernel.
  Batches grow by themselves when compiling is slower than rendering, which is when starting fewer processes pays. Once
  rendering is over (`close`) what is left is split over every worker. A batch holds sources of one compiler only."""

  min_batch = 4

  def __init__(self, workers: int):
    self._cv = threading.Condition()
    self._pending: List[Tuple[Compiler, str, "Future[Optional[bytes]]"]] = []
    self._closed = False
    self._running = 0
    self._threads = [threading.Thread(target=self._work, name=f"tiny-compile-{i}", daemon=True) for i in range(workers)]
    for t in self._threads:
      t.start()

  def submit(self, compiler: Compiler, src: str) -> "Future[Optional[bytes]]":
    """Queue src; the future gets its binary, or None when it did not compile."""
    fut: Future[Optional[bytes]] = Future()
    with self._cv:
      self._pending.append((compiler, src, fut))
      self._cv.notify()
    return fut

  def close(self) -> None:
    """No more sources: the workers finish what waits, then stop."""
    with self._cv:
      self._closed = True
      self._cv.notify_all()

  def join(self) -> None:
    for t in self._threads:
      t.join()

  def _may_start(self) -> bool:
    if self._closed:
      return True
    return len(self._pending) >= self.min_batch and self._running < max(1, len(self._threads) - 1)

  def _take(self) -> List[Tuple[Compiler, str, "Future[Optional[bytes]]"]]:
    with self._cv:
      while not self._may_start():
        self._cv.wait()
      # at the end what waits is shared by every worker; before, one batch takes it all (at most workers-1 batches run)
      share = len(self._threads) if self._closed else 1
      if not self._pending:
        return []
      compiler = self._pending[0][0]
      mine = [job for job in self._pending if job[0] is compiler]
      # a compiler whose every batch starts a process says how small a share may get (`min_share`): halving what is left
      # at every take ended a CLANG first call with batches of 2, 1 and 1 kernels, each paying a start for one kernel
      size = max(-(-len(mine) // share), getattr(compiler, "min_share", 1))
      mine = mine[:min(getattr(compiler, "max_batch", 1 << 30), size)]
      taken = {id(job) for job in mine}
      self._pending = [job for job in self._pending if id(job) not in taken]
      self._running += 1
      return mine

  def _done(self) -> None:
    with self._cv:
      self._running -= 1
      self._cv.notify_all()

  def _work(self) -> None:
    while batch := self._take():
      try:
        libs = batch[0][0].compile_many([src for _, src, _ in batch])
      except Exception:  # noqa: BLE001 - each kernel is compiled again when it is lowered, which raises the error in order
        libs = []
      if len(libs) != len(batch):   # every future gets an answer, or precompile would wait forever
        libs = [None] * len(batch)
      self._done()
      for (_, _, fut), lib in zip(batch, libs):
        fut.set_result(lib)


def precompile(schedule: List[ScheduleItem]) -> int:
  """Compile the not yet cached kernels of schedule ahead of running it, several at a time; returns how many were built.

  Kernels are optimized and rendered here, one after another (that is Python), while worker threads turn the sources
  into binaries (clang runs as a subprocess, so it uses the other cores meanwhile), in batches: a compiler with
  `compile_many` builds a whole batch with one process. Only compilers that declare `parallel_compile` take part, and
  never under BEAM (the search compiles and times candidates itself). A kernel that fails to optimize, render or
  compile here is left out: lowering it later raises the error in order."""
  if len(schedule) < 2 or BEAM >= 1 or _runners_ready(schedule) or getenv("PARALLEL_COMPILE", 1) == 0:
    return 0
  todo: Dict[_CacheKey, Tuple[str, LazyOp, _CacheKey]] = {}
  for si in schedule:
    if si.ast.op is not MetaOps.KERNEL or not si.bufs:
      continue
    dname = si.outputs[0].device
    try:
      ckey, bkey, _ = _cache_keys(dname, si.ast)
      if not _device(dname).compiler.parallel_compile:
        continue
    except Exception:
      continue
    if ckey not in method_cache and bkey not in method_cache and bkey not in todo:
      todo[bkey] = (dname, si.ast, ckey)
  if len(todo) < 2:
    return 0   # nothing to overlap: the usual path compiles it
  queue = _CompileQueue(max(1, min(len(todo), os.cpu_count() or 1)))
  built = 0
  # the bar counts kernels that are ready (rendered, and compiled or found in the disk cache), as they get ready
  bar = progress_bar(len(todo), "compiling", "kernel") if _show_progress(len(todo)) else None
  tick: Callable[..., None] = (lambda *_: bar.update(1)) if bar is not None else (lambda *_: None)
  try:
    # every kernel in schedule order, with its binary (a disk cache hit) or the future that will bring it
    in_order: List[Tuple[_CacheKey, _CacheKey, Program, Union[bytes, "Future[Optional[bytes]]"]]] = []
    try:
      for bkey, (dname, ast, ckey) in todo.items():
        compiler = _device(dname).compiler
        try:
          prg = replace(get_kernel(_device(dname).renderer, ast, dname).to_program(), dname=dname)
        except Exception:
          tick()
          continue
        if (lib := compiler.cache_lookup(prg.src)) is None:
          (fut := queue.submit(compiler, prg.src)).add_done_callback(tick)
          in_order.append((bkey, ckey, prg, fut))
        else:
          tick()
          in_order.append((bkey, ckey, prg, lib))
    finally:
      queue.close()
    # runners are made in schedule order, not in the order the compiles finish: what they print (DEBUG>=4) and the
    # method cache's order are then the same in every process. Loading a binary takes far less than compiling one, so
    # waiting for the earliest kernel first costs next to nothing.
    for bkey, ckey, prg, got in in_order:
      if isinstance(got, Future):
        if (lib := got.result()) is None:
          continue
        _device(prg.dname).compiler.cache_store(prg.src, lib)
      else:
        lib = got
      method_cache[bkey] = method_cache[ckey] = CompiledRunner(prg, lib)
      built += 1
  finally:
    queue.join()
    if bar is not None:
      bar.close()
  return built


# **************** executing ****************

@dataclass(frozen=True)
class ExecItem:
  """A runner bound to its buffers (None where a JIT fills the input in at replay)."""

  prg: Runner
  bufs: List[Optional[Buffer]]
  metadata: Optional[List[Metadata]] = None

  def run(self, var_vals: Optional[Dict[Variable, int]] = None, wait: bool = False, jit: bool = False,
          do_update_stats: bool = True) -> Optional[float]:
    """Run once; allocates missing buffers (except under the JIT, which owns them) and updates GlobalCounters."""
    var_vals = {} if var_vals is None else var_vals
    bufs = [b for b in self.bufs if b is not None]
    if len(bufs) != len(self.bufs):
      raise RuntimeError("cannot run an ExecItem with unbound (None) buffers")
    if not jit:
      bufs = [b.ensure_allocated() for b in bufs]
    et = self.prg(bufs, var_vals, wait=wait or DEBUG >= 2)
    if not jit and Buffer.tracking_writes:
      # a JIT replay counts its writes once for all its kernels (TinyJit's JitWriteCounter)
      self.prg.note_writes(bufs)
    if do_update_stats:
      op_est, mem_est = _count_run(self.prg, var_vals)
      if et is not None:
        GlobalCounters.time_sum_s += et
      if DEBUG >= 2:
        print(_debug_line(self, et, op_est, mem_est, jit))
    return et


def _count_run(prg: Runner, var_vals: Dict[Variable, int]) -> Tuple[Any, Any]:
  """Add one run of prg to GlobalCounters; returns its (ops, memory) estimates with var_vals put in."""
  op_est, mem_est = sym_infer(prg.op_estimate, var_vals), sym_infer(prg.mem_estimate, var_vals)
  GlobalCounters.kernel_count += 1
  GlobalCounters.global_ops += op_est
  GlobalCounters.global_mem += mem_est
  prg.first_run = False
  return op_est, mem_est


def _debug_line(ei: ExecItem, et: Optional[float], op_est: float, mem_est: float, jit: bool) -> str:
  prg = ei.prg
  head = colored(f"*** {prg.dname[:7]:7s} {GlobalCounters.kernel_count:4d}", "magenta" if jit else ("green" if prg.first_run else None))
  name = prg.display_name + " " * max(0, 38 - ansilen(prg.display_name))
  dims = ""
  if isinstance(prg, CompiledRunner):
    gs, ls = prg.p.launch_dims({}) if not prg.p.vars else (prg.p.global_size, prg.p.local_size)
    dims = f" global {str(list(gs or [])):<16s} local {str(list(ls or [])):<12s}"
  line = f"{head} {name} arg {len(ei.bufs):3d} mem {GlobalCounters.mem_used / 1e9:5.2f} GB{dims}"
  if et is not None:
    tm = colored(f"{et * 1e3:9.2f}ms", "yellow") if et > 0.01 else f"{et * 1e6:9.2f}us"
    secs = et or 1e-20
    line += f" tm {tm}/{GlobalCounters.time_sum_s * 1e3:9.2f}ms ({op_est / (secs * 1e9):9.2f} GFLOPS, {mem_est / (secs * 1e9):7.2f} GB/s)"
  if ei.metadata:
    line += f" {[repr(m) if DEBUG >= 3 else str(m) for m in ei.metadata]}"
  return line


# (device, ast, BEAM, NOOPT) -> (the device's renderer, plugin generation, runner, which of the item's buffers each kernel
# argument is, the runner's method_cache key). In front of method_cache for kernels run again and again (eager loops): it
# skips the renderer's cache key, which is rebuilt from the renderer's attributes on every get_runner. A renderer is never
# changed in place, so the same renderer object (and no plugin change) means the same key there.
_runners: Dict[Tuple[str, LazyOp, int, int], Tuple[Renderer, Tuple[int, int], CompiledRunner, Tuple[int, ...], _CacheKey]] = {}
_runners_gen: Tuple[int, int] = (-1, -1)


def _runner_for(dname: str, ast: LazyOp) -> Tuple[CompiledRunner, Tuple[int, ...]]:
  """get_runner(dname, ast), and the index into the item's buffers of each of the kernel's arguments."""
  global _runners_gen
  key, renderer, gen = (dname, ast, BEAM.value, NOOPT.value), _device(dname).renderer, plugins.generation()
  if (ent := _runners.get(key)) is not None and ent[0] is renderer and ent[1] == gen:
    return ent[2], ent[3]
  if gen != _runners_gen:
    _runners.clear()
    _runners_gen = gen
  runner = get_runner(dname, ast)
  if len(_runners) >= 1 << 14:
    _runners.clear()
  idx = tuple(g[0] if isinstance(g, tuple) else g for g in runner.p.globals)
  _runners[key] = (renderer, gen, runner, idx, _cache_keys(dname, ast)[0])
  return runner, idx


def _runners_ready(schedule: List[ScheduleItem]) -> bool:
  """Every kernel of schedule was run before and is still in method_cache: nothing to compile, and precompile need not
  build each kernel's method_cache key (_runners has it, so the renderer's cache key is not rebuilt)."""
  if plugins.generation() != _runners_gen:
    return False
  beam, noopt = BEAM.value, NOOPT.value
  for si in schedule:
    if si.ast.op is MetaOps.KERNEL and si.bufs:
      dname = si.bufs[0].device
      if (ent := _runners.get((dname, si.ast, beam, noopt))) is None or ent[0] is not _device(dname).renderer or ent[4] not in method_cache:
        return False
  return True


def lower_schedule_item(si: ScheduleItem, claim: bool = True) -> ExecItem:
  """The ExecItem that performs one ScheduleItem. The caller runs it: a handed-out item stops being pending, and the
  pending items that write its inputs run first (see engine/pending.py); claim=False is for pending.py itself."""
  if claim:
    pending.claim(si)
  if si.ast.op is MetaOps.KERNEL:
    if len({x.device for x in si.bufs}) > 1:
      raise RuntimeError(f"a kernel's buffers must all be on one device, got {sorted({x.device for x in si.bufs})}")
    runner, idx = _runner_for(si.bufs[0].device, si.ast)
    return ExecItem(runner, [si.bufs[i] for i in idx], si.metadata)
  out = si.outputs[0]
  if si.ast.op is MetaOps.COPY:
    src = si.inputs[0]
    kernel_type = BufferCopy
    if out.device.split(":")[0] == src.device.split(":")[0] and hasattr(_device(out.device).allocator, "transfer"):
      kernel_type = BufferXfer
    return ExecItem(kernel_type(si.ast.arg, out.device, src.device), list(si.bufs), si.metadata)
  if si.ast.op is MetaOps.CUSTOM:
    return ExecItem(CustomOp(si.ast.arg), list(si.bufs), si.metadata)
  if si.ast.op is MetaOps.EMPTY:
    return ExecItem(EmptyOp(out), list(si.bufs), si.metadata)
  if si.ast.op is MetaOps.VIEW:
    return ExecItem(ViewOp(out), list(si.bufs), si.metadata)
  raise RuntimeError(f"don't know how to lower {si.ast.op}")


def lower_schedule(schedule: List[ScheduleItem]) -> Generator[ExecItem, None, None]:
  """Lower items one at a time (popping them from schedule, so buffers are released as we go).

  New kernels are compiled up front, in parallel where the compiler allows it (see precompile)."""
  precompile(schedule)
  while len(schedule):
    si = schedule.pop(0)
    # an item that already ran because something read its output before this run (see engine/pending.py)
    if not pending.claim(si):
      continue
    try:
      yield lower_schedule_item(si, claim=False)
    except Exception:
      if DEBUG >= 2:
        print(f"error lowering {si.ast.op}")
        print("tensor operations:")
        for m in si.metadata or []:
          print(f"  {m!r}")
      raise


class _PerThreadList(threading.local):
  """A list of its own in every thread: a TinyJit capturing in one thread must not take in another thread's kernels."""

  def __init__(self) -> None:
    self.items: List[Any] = []

  def append(self, x: Any) -> None:
    self.items.append(x)

  def clear(self) -> None:
    self.items.clear()

  def __len__(self) -> int:
    return len(self.items)

  def __getitem__(self, i: int) -> Any:
    return self.items[i]


# TinyJit puts an object with an `add(ExecItem)` method here while it captures (per thread)
capturing = _PerThreadList()

# Scheduling marks LazyBuffers of the shared graph as realized before their kernels ran: two threads realizing one
# graph would otherwise read buffers the other has not filled (or allocated) yet. Held for schedule + run (+ copy-out).
realize_lock = threading.RLock()


def realize_eager(lb: LazyBuffer) -> bool:
  """Compute lb right away when its graph structure was scheduled before: an eager op's one kernel (see
  schedule.eager_kernel) runs on the buffers, with no ScheduleItem, memory plan or ExecItem built in between; a graph
  of several kernels runs its cached schedule (see schedule.cached_schedule). Returns False, having done nothing, where
  the full path must run: a new structure, a JIT capturing, DEBUG>=2 or GRAPH output, inputs on another device. Call it
  holding realize_lock, as Tensor.realize does."""
  # the flags' values read directly: their comparison methods are Python calls, and this runs for every eager op
  if capturing.items or DEBUG.value >= 2 or graph_viz.GRAPH.value:
    return False
  out = lb._base if lb._base is not None else lb
  # an id seen before (and still current: see eager_key.known) whose plan still fits the device and the settings
  if (ek := out._ekey) is not None and ek[0] == _key_state.epoch and (plan := _plans.get(ek[1])) is not None and \
      plan.dname == out.device and plan.rev == plugins._revision and plan.dev.renderer is plan.renderer and \
      plan.beam == BEAM.value and plan.noopt == NOOPT.value and hasattr(out, "srcs"):
    return plan.run(out, ek[2])
  if (hit := eager_kernel(out)) is None:
    # a scalar op whose constant changed: the kernel that reads it from a buffer, if its structure has one
    return eager_params.try_run(out) or _run_cached_schedule(lb)
  ast, inputs = hit
  dname = out.device
  bufs = [out.buffer]
  for x in inputs:
    if x.device != dname or x.size == 0:
      return False
    bufs.append(x.buffer)
  runner, idx = _runner_for(dname, ast)
  if ek is not None and (known := eager_key.known(out)) is not None:
    _remember_plan(known, dname, runner, idx, inputs)
  # from here on it is scheduled, as _scheduled does it: the output stops holding its graph
  out.mark_scheduled()
  _run_kernel(runner, [bufs[i] for i in idx])
  return True


class _EagerPlan:
  """How to run the kernel of one eager structural id (see tiny.eager_key) on one device, found by the id alone: the
  runner, where each kernel argument comes from (the output, or one of the realized bases the id lists), the settings
  the runner was chosen under (it is stale once one of them changes), and its cost estimates for GlobalCounters."""

  __slots__ = ("dname", "dev", "renderer", "rev", "beam", "noopt", "runner", "spec", "ops", "mem", "direct")

  def __init__(self, dname: str, runner: CompiledRunner, spec: Tuple[int, ...]) -> None:
    # the device object is what the registry gives for dname as long as the plugins stay the same (see
    # registry.__getitem__), so realize_eager checks the plugins' revision (which every change of them, a reset
    # included, bumps: plugins.generation) and then reads the renderer from it, without a registry lookup
    self.dev = _device(dname)
    self.dname, self.renderer, self.rev, self.beam, self.noopt = dname, self.dev.renderer, plugins.generation()[1], BEAM.value, NOOPT.value
    self.runner, self.spec = runner, spec
    self.ops, self.mem = sym_infer(runner.op_estimate, _NO_VARS), sym_infer(runner.mem_estimate, _NO_VARS)
    # the program's own call on the raw buffers, where its runtime has one (see CompiledRunner.direct_call)
    self.direct = runner.direct_call()

  def run(self, out: LazyBuffer, leaves: Tuple[LazyBuffer, ...]) -> bool:
    """Run the kernel computing out (unrealized, its id current) on its leaves; False, having done nothing, where an
    input is on another device or empty (the full path says what to do)."""
    dname = self.dname
    bufs: List[Buffer] = []
    handles = []   # the device handles, built in the same plain loop: a comprehension is a function call of its own
    for i in self.spec:
      if i < 0:
        b = out.result_buffer(self.dev.allocator)
      else:
        x = leaves[i]
        if x.device != dname or x.size == 0:
          return False
        # (a realized base has it: `buffer` without its call)
        b = xb if (xb := getattr(x, "_buffer", None)) is not None else x.buffer
      if (h := getattr(b, "_buf", None)) is None:
        h = b.allocate()._buf
      bufs.append(b)
      handles.append(h)
    # from here on it is scheduled, as _scheduled does it: the output stops holding its graph
    out.mark_scheduled()
    if (direct := self.direct) is None or not direct(*handles):
      self.runner(bufs, _NO_VARS)
    if Buffer.tracking_writes:
      # (the output is a fresh buffer no cache has read yet, but which slots a kernel writes is the runner's to say)
      self.runner.note_writes(bufs)
    GlobalCounters.kernel_count += 1
    GlobalCounters.global_ops += self.ops
    GlobalCounters.global_mem += self.mem
    return True


# eager structural id -> its plan (see _EagerPlan); ids are never reused, so an entry can only go stale, which run checks
_plans: Dict[int, _EagerPlan] = {}
_PLANS_MAX = 1 << 14


def _remember_plan(known: Tuple[int, Tuple[LazyBuffer, ...]], dname: str, runner: CompiledRunner, idx: Tuple[int, ...],
                   inputs: Tuple[LazyBuffer, ...]) -> None:
  """Keep the plan of the id known[0] when each kernel input is one of the realized bases the id lists (known[1])."""
  if runner._launch is None:   # Variables: launched per call
    return
  eid, leaves = known
  spec = []
  for i in idx:
    if i == 0:
      spec.append(-1)
      continue
    if (j := next((j for j, x in enumerate(leaves) if x is inputs[i - 1]), None)) is None:
      return
    spec.append(j)
  if len(_plans) >= _PLANS_MAX:
    _plans.clear()
  _plans[eid] = _EagerPlan(dname, runner, tuple(spec))


_NO_VARS: Dict[Variable, int] = {}


def _run_kernel(runner: CompiledRunner, bufs: List[Buffer]) -> None:
  """What ExecItem(runner, bufs).run() does for a kernel with no Variables, no DEBUG output and no JIT capture (the
  eager fast path): allocate, run, count. Without the ExecItem, list copies and symbolic estimates in between."""
  runner([b.ensure_allocated() for b in bufs], _NO_VARS)
  if Buffer.tracking_writes:
    runner.note_writes(bufs)
  _count_run(runner, _NO_VARS)


def _run_cached_schedule(lb: LazyBuffer) -> bool:
  """Run lb's cached schedule, if there is one, as run_schedule would (its kernels ran before: nothing to precompile)."""
  if (hit := cached_schedule([lb])) is None:
    return False
  schedule, var_vals = hit
  for si in schedule:
    lower_schedule_item(si).run(var_vals)
  return True


def run_schedule(schedule: List[ScheduleItem], var_vals: Optional[Dict[Variable, int]] = None, do_update_stats: bool = True) -> None:
  """Run every item of schedule in order (consumes the list)."""
  for ei in lower_schedule(schedule):
    if len(capturing) and CAPTURING:
      capturing[0].add(ei)
    ei.run(var_vals, do_update_stats=do_update_stats)
