"""CUDAGraph: TinyJit replays a captured step as one CUDA graph launch.

Run on an H100 by `hardware_check.sh` (see the README).

The captured kernels become a chain of kernel nodes (each depends on the one before, so the order of the eager run
is kept). On every call only what changed is patched into the instantiated graph: the buffers that are inputs or
fresh outputs of this call, the symbolic variables and the launch sizes that depend on them.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Set, Tuple, cast

from tiny.backend import Buffer, CompiledRunner, ExecItem, GraphRunner, Variable

from tiny_cuda.runtime import CUDAProgram, KernelArgs, _timed, check, context, cuda


class CUDAGraph(GraphRunner):
  """A CUDA graph of the captured kernels of one GPU. Raises NotImplementedError (the JIT then runs the items one by one)
  for anything that is not a CUDA kernel of that GPU."""

  def __init__(self, jit_cache: List[ExecItem], input_rawbuffers: List[Buffer], var_vals: Dict[Variable, int]):
    super().__init__(jit_cache, input_rawbuffers, var_vals)
    progs: List[CUDAProgram] = []
    for ji in jit_cache:
      if not isinstance(ji.prg, CompiledRunner) or not isinstance(ji.prg.clprg, CUDAProgram):
        raise NotImplementedError(f"CUDAGraph only holds CUDA kernels, got {type(ji.prg).__name__}")
      progs.append(ji.prg.clprg)
    if len({p.ordinal for p in progs}) != 1:
      raise NotImplementedError("CUDAGraph holds the kernels of one GPU")
    self.ordinal = progs[0].ordinal
    cu = cuda()
    context(self.ordinal)
    self.args: List[KernelArgs] = []
    self.params: List[Any] = []
    self.nodes: List[Any] = []
    # kernels whose launch sizes depend on a variable must be patched on every call
    self.symbolic_dims: Set[int] = set()
    self.graph = cu.CUgraph()
    check(cu.cuGraphCreate(ctypes.byref(self.graph), 0), "cuGraphCreate")
    for j, (ji, prg) in enumerate(zip(jit_cache, progs)):
      p = cast(CompiledRunner, ji.prg).p
      args = KernelArgs(tuple(cast(Buffer, b).handle for b in ji.bufs), tuple(var_vals[v] for v in p.vars))
      gsz, lsz = self._dims(j, var_vals)
      if not all(isinstance(x, int) for x in list(p.global_size or []) + list(p.local_size or [])):
        self.symbolic_dims.add(j)
      params = cu.CUDA_KERNEL_NODE_PARAMS(prg.fn, *gsz, *lsz, 0, ctypes.cast(args.params, ctypes.POINTER(ctypes.c_void_p)), None)
      node = cu.CUgraphNode()
      deps = (cu.CUgraphNode * 1)(self.nodes[-1]) if self.nodes else None
      check(cu.cuGraphAddKernelNode(ctypes.byref(node), self.graph, deps, 1 if self.nodes else 0, ctypes.byref(params)),
            f"cuGraphAddKernelNode({prg.name})")
      self.args.append(args)
      self.params.append(params)
      self.nodes.append(node)
    self.instance = cu.CUgraphExec()
    check(cu.cuGraphInstantiateWithFlags(ctypes.byref(self.instance), self.graph, 0), "cuGraphInstantiateWithFlags")
    # which kernel takes which variable, at which argument position
    self.var_slots: List[Tuple[int, int, Variable]] = []
    for j, ji in enumerate(jit_cache):
      p = cast(CompiledRunner, ji.prg).p
      nbufs = len(ji.bufs)
      self.var_slots += [(j, nbufs + k, v) for k, v in enumerate(p.vars)]

  def _dims(self, j: int, var_vals: Dict[Variable, int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    gsz, lsz = cast(CompiledRunner, self.jit_cache[j].prg).p.launch_dims(var_vals)
    return (tuple(gsz) + (1, 1, 1))[:3], (tuple(lsz or (1, 1, 1)) + (1, 1, 1))[:3]

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    cu = cuda()
    context(self.ordinal)
    dirty: Set[int] = set()
    for (j, i), input_idx in self.input_replace.items():
      self.args[j].set_buf(i, rawbufs[input_idx].handle)
      dirty.add(j)
    for j, slot, v in self.var_slots:
      self.args[j].values[slot].value = var_vals[v]
      dirty.add(j)
    for j in self.symbolic_dims:
      gsz, lsz = self._dims(j, var_vals)
      p = self.params[j]
      p.gridDimX, p.gridDimY, p.gridDimZ = gsz
      p.blockDimX, p.blockDimY, p.blockDimZ = lsz
      dirty.add(j)
    for j in sorted(dirty):
      check(cu.cuGraphExecKernelNodeSetParams(self.instance, self.nodes[j], ctypes.byref(self.params[j])), "cuGraphExecKernelNodeSetParams")

    def launch() -> None:
      check(cu.cuGraphLaunch(self.instance, None), "cuGraphLaunch")
    if wait:
      return _timed(self.ordinal, launch)
    launch()
    return None

  def __del__(self) -> None:
    try:
      cu = cuda()
      if getattr(self, "instance", None):
        cu.cuGraphExecDestroy(self.instance)
      if getattr(self, "graph", None):
        cu.cuGraphDestroy(self.graph)
    except Exception:  # noqa: BLE001 - interpreter shutdown
      pass
