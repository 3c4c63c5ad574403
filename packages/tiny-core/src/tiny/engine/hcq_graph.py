"""HCQGraph: a TinyJit step as prebuilt hardware command queues, replayed by patching the recorded commands.

At construction every kernel becomes an `exec` on one compute queue (with its argument memory filled once) and every copy
between buffers of the device a `copy` on one copy queue. Inside a queue commands run in order; across the two queues a
graph-private signal per queue orders dependent items: after each item its queue signals how many items it has finished,
and an item that reads or writes a buffer the other queue last touched waits for that count first. Both queues start by
waiting for the device timeline; the compute queue ends by waiting for the copy queue and signalling the timeline.

A replay waits for the previous replay (it owns the argument memory), then patches in place: the buffer arguments and copy
ends that change per call (`input_replace`), the symbolic variables and launch dims, and the timeline wait/signal values.
No queue is rebuilt. Lives in the engine layer because it is a GraphRunner; the queue interfaces are in tiny.runtime.hcq.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple, Union, cast

from tiny.device import Buffer
from tiny.engine.jit import GraphRunner
from tiny.engine.realize import BufferCopy, CompiledRunner, ExecItem
from tiny.helpers import PROFILE
from tiny.registry import Device
from tiny.runtime.hcq import HCQArgsState, HCQCompiled, HCQProgram, HCQSignal, HWCommandQueue
from tiny.shape.symbolic import Variable

_Key = Union[int, Tuple[str, int]]


class HCQGraph(GraphRunner):
  """Graph executor of HCQ devices (`DeviceSpec.graph`)."""

  def __init__(self, jit_cache: List[ExecItem], input_rawbuffers: List[Buffer], var_vals: Dict[Variable, int]):
    devs = {ji.prg.dname for ji in jit_cache}
    if len(devs) != 1:
      raise NotImplementedError(f"HCQGraph runs the items of one device, got {sorted(devs)}")
    dev = Device[devs.pop()]
    if not isinstance(dev, HCQCompiled):
      raise NotImplementedError(f"HCQGraph needs an HCQ device, {dev.dname} is not one")
    for ji in jit_cache:
      if isinstance(ji.prg, CompiledRunner):
        if not isinstance(ji.prg.clprg, HCQProgram):
          raise NotImplementedError(f"HCQGraph runs HCQ programs, not {type(ji.prg.clprg).__name__}")
      elif isinstance(ji.prg, BufferCopy):
        if any(b is None or b.device != dev.dname for b in ji.bufs[:2]):
          raise NotImplementedError("HCQGraph copies only between buffers of its own device")
      else:
        raise NotImplementedError(f"HCQGraph cannot run {type(ji.prg).__name__}")
    super().__init__(jit_cache, input_rawbuffers, var_vals)
    self.dev = dev
    self.comp_q = dev.hw_compute_queue_t()
    has_copies = any(isinstance(ji.prg, BufferCopy) for ji in jit_cache)
    self.copy_q = dev.hw_copy_queue_t() if has_copies else None
    self.signals: Dict[str, HCQSignal] = {"COMPUTE": dev.signal_t(0, name=f"{dev.dname} graph compute"),
                                          "COPY": dev.signal_t(0, name=f"{dev.dname} graph copy")}
    self.queues: Dict[str, HWCommandQueue] = {"COMPUTE": self.comp_q}
    if self.copy_q is not None:
      self.queues["COPY"] = self.copy_q
    # each queue starts after everything submitted to the device before this replay (the value is patched per replay)
    self.timeline_waits = {name: q.next_index for name, q in self.queues.items()}
    for q in self.queues.values():
      q.wait(dev.timeline_signal, 0)
    self.args: Dict[int, HCQArgsState] = {}
    self.cmd_index: Dict[int, int] = {}
    self.profiled: List[Tuple[str, str, HCQSignal, HCQSignal]] = []
    done = {"COMPUTE": 0, "COPY": 0}
    last_write: Dict[_Key, Tuple[str, int]] = {}
    last_reads: Dict[_Key, List[Tuple[str, int]]] = {}
    for j, ji in enumerate(jit_cache):
      qname = "COPY" if isinstance(ji.prg, BufferCopy) else "COMPUTE"
      q = self.queues[qname]
      outs = {0} if qname == "COPY" else set(cast(CompiledRunner, ji.prg).p.outs)
      # what this item must wait for on the other queue: the last writer of what it touches, and the readers of what it writes
      need: Dict[str, int] = {}
      for i, b in enumerate(ji.bufs):
        if b is None and (j, i) not in self.input_replace:
          continue
        key = self._key(j, i, b)
        deps = [last_write[key]] if key in last_write else []
        if i in outs:
          deps += last_reads.get(key, [])
        for dq, cnt in deps:
          if dq != qname:
            need[dq] = max(need.get(dq, 0), cnt)
      for dq, cnt in need.items():
        q.wait(self.signals[dq], cnt)
      st, en = (dev.signal_t(), dev.signal_t()) if PROFILE else (None, None)
      if st is not None:
        q.timestamp(st)
      self.cmd_index[j] = q.next_index
      if isinstance(ji.prg, CompiledRunner):
        prg = cast(HCQProgram, ji.prg.clprg)
        handles = [b.ensure_allocated().handle if b is not None and (j, i) not in self.input_replace else 0 for i, b in enumerate(ji.bufs)]
        self.args[j] = prg.fill_kernargs(handles, [var_vals.get(v, 0) for v in ji.prg.p.vars])
        gs, ls = ji.prg.p.launch_dims(var_vals)
        self.comp_q.exec(prg, self.args[j], gs, ls or (1, 1, 1))
      else:
        dst, src = [b.ensure_allocated().handle if b is not None and (j, i) not in self.input_replace else None for i, b in enumerate(ji.bufs[:2])]
        assert self.copy_q is not None
        self.copy_q.copy(dst, src, cast(Buffer, ji.bufs[0]).nbytes)
      if st is not None and en is not None:
        q.timestamp(en)
        self.profiled.append((ji.prg.display_name if qname == "COPY" else cast(HCQProgram, cast(CompiledRunner, ji.prg).clprg).name,
                              qname, st, en))
      done[qname] += 1
      if self.copy_q is not None:
        q.signal(self.signals[qname], done[qname])
      for i, b in enumerate(ji.bufs):
        if b is None and (j, i) not in self.input_replace:
          continue
        key = self._key(j, i, b)
        if i in outs:
          last_write[key], last_reads[key] = (qname, done[qname]), []
        else:
          last_reads.setdefault(key, []).append((qname, done[qname]))
    if self.copy_q is not None:
      self.comp_q.wait(self.signals["COPY"], done["COPY"])
    self.timeline_signal_index = self.comp_q.next_index
    self.comp_q.signal(dev.timeline_signal, 0)
    self.last_value = 0

  def _key(self, j: int, i: int, b: Optional[Buffer]) -> _Key:
    # a slot filled per call is known by its input index (its buffer changes); anything else by its memory
    if (idx := self.input_replace.get((j, i))) is not None:
      return ("input", idx)
    return id(cast(Buffer, b).base)

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    dev = self.dev
    st = time.perf_counter()
    with dev.submit_lock:
      # the previous replay reads the argument memory and the graph's signals until it is done
      dev.timeline_signal.wait(self.last_value)
      dev.collect_profile()
      for (j, i), idx in self.input_replace.items():
        handle = rawbufs[idx].ensure_allocated().handle
        if j in self.args:
          self.args[j].update_buffer(i, handle)
        else:
          assert self.copy_q is not None
          self.copy_q.update_copy(self.cmd_index[j], **({"dest": handle} if i == 0 else {"src": handle}))
      for j, args in self.args.items():
        p = cast(CompiledRunner, self.jit_cache[j].prg).p
        if p.vars:
          for k, v in enumerate(p.vars):
            args.update_var(k, var_vals[v])
          gs, ls = p.launch_dims(var_vals)
          self.comp_q.update_exec(self.cmd_index[j], gs, ls)
      for s in self.signals.values():
        s.value = 0
      for _, _, s0, s1 in self.profiled:
        s0.timestamp = s1.timestamp = None
      for name, q in self.queues.items():
        q.update_wait(self.timeline_waits[name], value=dev.timeline_value - 1)
      self.comp_q.update_signal(self.timeline_signal_index, value=dev.timeline_value)
      if self.copy_q is not None:
        self.copy_q.submit(dev)
      self.comp_q.submit(dev)
      self.last_value = dev.timeline_value
      dev.timeline_value += 1
      for name, qname, s0, s1 in self.profiled:
        dev.add_profile(name, qname, s0, s1)
    if wait:
      dev.synchronize()
      return time.perf_counter() - st
    return None

  @property
  def device_queues(self) -> Dict[str, Any]:
    """The prebuilt queues by name ("COMPUTE", "COPY"), for inspection."""
    return dict(self.queues)
