"""CPUGraph: replays a JIT-captured list of CLANG/LLVM kernels with one native call.

Interface (tinygrad v0.9.1's GraphRunner): `CPUGraph(jit_cache, input_rawbuffers, var_vals)` then
`graph(rawbufs, var_vals, wait=False) -> Optional[float]`. At construction every kernel's argument array (buffer addresses,
variable values) is built once; a call only patches the slots of the buffers that change between calls (`input_replace`)
and of the symbolic variables, then hands the whole list to the thread pool, which runs kernel after kernel (split across
cores where the kernel allows it, with a barrier between dependent kernels) without returning to Python.
Items that are not CLANG/LLVM kernels make the constructor raise NotImplementedError, which tells the JIT to run that
batch item by item.
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Dict, List, Optional, Tuple

from tiny.backend import CompiledRunner, ExecItem, GraphRunner

from tiny_clang.pool import NativePool, get_pool, num_threads
from tiny_clang.runtime import CPUProgram, buf_address


class CPUGraph(GraphRunner):
  """Graph executor of the CLANG and LLVM devices."""

  def __init__(self, jit_cache: List[ExecItem], input_rawbuffers: List[Any], var_vals: Dict[Any, int]):
    for ji in jit_cache:
      if not isinstance(ji.prg, CompiledRunner) or not isinstance(ji.prg.clprg, CPUProgram):
        raise NotImplementedError(f"CPUGraph runs only CLANG/LLVM kernels, not {type(ji.prg).__name__}")
    super().__init__(jit_cache, input_rawbuffers, var_vals)
    self.progs: List[CPUProgram] = [ji.prg.clprg for ji in jit_cache]  # type: ignore[attr-defined]
    self.args: List[Any] = []
    self.var_slots: List[Tuple[int, int, Any]] = []
    for j, ji in enumerate(jit_cache):
      p = ji.prg.p  # type: ignore[attr-defined]
      arr = (ctypes.c_int64 * max(1, len(ji.bufs) + len(p.vars)))()
      for i, b in enumerate(ji.bufs):
        if b is not None and (j, i) not in self.input_replace:
          arr[i] = buf_address(b.ensure_allocated().handle)
      for k, v in enumerate(p.vars):
        self.var_slots.append((j, len(ji.bufs) + k, v))
        arr[len(ji.bufs) + k] = var_vals.get(v, 0)
      self.args.append(arr)
    n = len(self.progs)
    self.n = n
    self.fns = (ctypes.c_void_p * n)(*[p.entry for p in self.progs])
    self.argp = (ctypes.c_void_p * n)(*[ctypes.addressof(a) for a in self.args])
    # kernels that ran (or would have run) on several cores when captured, or may under THREADS>1, are split here too
    self.par = (ctypes.c_int32 * n)(*[int(p.graph_threads() > 1) for p in self.progs])
    self.pool = get_pool()

  def __call__(self, rawbufs: List[Any], var_vals: Dict[Any, int], wait: bool = False) -> Optional[float]:
    for (j, i), idx in self.input_replace.items():
      self.args[j][i] = buf_address(rawbufs[idx].handle)
    for j, slot, v in self.var_slots:
      self.args[j][slot] = var_vals[v]
    T = num_threads()
    st = time.perf_counter()
    if isinstance(self.pool, NativePool):
      self.pool.run(self.n, self.fns, self.argp, self.par, T)
    else:
      self.pool.run_list([p.entry for p in self.progs], self.args, list(self.par), T)
    et = time.perf_counter() - st
    return et if wait else None
