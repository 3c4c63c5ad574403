"""MetalGraph: TinyJit replays a captured step as one indirect command buffer (ICB) on METAL.

NOTE: written against Apple's documentation without a Mac; its message sequence is unit-tested against a fake Objective-C
runtime (tests/test_metal_runtime_fake.py), not on hardware.

Every captured kernel becomes one concurrent-dispatch command of the ICB, with a barrier after it so the eager order holds.
An ICB cannot take `setBytes`, so the symbolic variables live in a small shared buffer, one 256-byte slot each (the
strictest offset alignment Metal asks of `constant` arguments), bound at the variable's argument index. On each call only
what changed is re-encoded: the buffers that are inputs or fresh outputs of this call, the variable values (written into
their slots), and the launch sizes that depend on a variable. Resources bound in an ICB are not tracked by Metal, so the
encoder declares every buffer with `useResources:count:usage:` before `executeCommandsInBuffer:withRange:`.
"""
from __future__ import annotations

import ctypes
from typing import Dict, List, Optional, Set, Tuple, cast

from tiny.backend import Buffer, CompiledRunner, ExecItem, GraphRunner, Variable

from tiny_metal.runtime import MTLResourceStorageModeShared, MTLSize, MetalBuffer, MetalDevice, MetalError, MetalProgram, NSRange, check_launch

MTLIndirectCommandTypeConcurrentDispatch = 1 << 5
MTLResourceUsageReadWrite = 1 | 2
MAX_KERNEL_BUFFERS = 31   # Metal's buffer argument table
VAR_SLOT = 256


class MetalGraph(GraphRunner):
  """The captured kernels of one METAL device as an ICB. Raises NotImplementedError (the JIT then runs them one by one)
  for anything that is not a Metal kernel of one device, or a kernel with more arguments than Metal's table holds."""

  def __init__(self, jit_cache: List[ExecItem], input_rawbuffers: List[Buffer], var_vals: Dict[Variable, int]):
    super().__init__(jit_cache, input_rawbuffers, var_vals)
    progs: List[MetalProgram] = []
    for ji in jit_cache:
      if not isinstance(ji.prg, CompiledRunner) or not isinstance(ji.prg.clprg, MetalProgram):
        raise NotImplementedError(f"MetalGraph only holds Metal kernels, got {type(ji.prg).__name__}")
      if len(ji.bufs) + len(ji.prg.p.vars) > MAX_KERNEL_BUFFERS:
        raise NotImplementedError(f"{ji.prg.p.name} takes more than {MAX_KERNEL_BUFFERS} arguments")
      progs.append(ji.prg.clprg)
    if len({id(p.device) for p in progs}) != 1:
      raise NotImplementedError("MetalGraph holds the kernels of one device")
    self.mtl_device: MetalDevice = progs[0].device
    self.progs = progs
    rt, mtl = self.mtl_device.mtl.rt, self.mtl_device.mtl
    # the variables: slot k of the var buffer holds self.var_list[k]
    self.var_list = list(self.vars)
    self.var_buf: Optional[MetalBuffer] = None
    if self.var_list:
      handle = rt.send(mtl.handle, "newBufferWithLength:options:", (ctypes.c_ulong, VAR_SLOT * len(self.var_list)),
                       (ctypes.c_ulong, MTLResourceStorageModeShared))
      if not handle:
        raise MetalError("could not allocate the variable buffer of a MetalGraph")
      self.var_buf = MetalBuffer(handle, VAR_SLOT * len(self.var_list))
    desc = rt.send(rt.cls("MTLIndirectCommandBufferDescriptor"), "new")
    try:
      rt.send(desc, "setCommandTypes:", (ctypes.c_ulong, MTLIndirectCommandTypeConcurrentDispatch), restype=None)
      rt.send(desc, "setInheritBuffers:", (ctypes.c_bool, False), restype=None)
      rt.send(desc, "setInheritPipelineState:", (ctypes.c_bool, False), restype=None)
      rt.send(desc, "setMaxKernelBufferBindCount:", (ctypes.c_ulong, MAX_KERNEL_BUFFERS), restype=None)
      self.icb = rt.send(mtl.handle, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", (ctypes.c_void_p, desc),
                         (ctypes.c_ulong, len(jit_cache)), (ctypes.c_ulong, 0))
    finally:
      rt.release(desc)
    if not self.icb:
      raise MetalError(f"newIndirectCommandBufferWithDescriptor returned nil for {len(jit_cache)} commands")
    self.commands: List[int] = []
    self.symbolic_dims: Set[int] = set()
    for j, (ji, prg) in enumerate(zip(jit_cache, progs)):
      p = cast(CompiledRunner, ji.prg).p
      cmd = rt.send(self.icb, "indirectComputeCommandAtIndex:", (ctypes.c_ulong, j))
      rt.send(cmd, "setComputePipelineState:", (ctypes.c_void_p, prg.pipeline.handle), restype=None)
      for i, b in enumerate(ji.bufs):
        self._bind(cmd, i, cast(Buffer, b).handle)
      for k, v in enumerate(p.vars):
        assert self.var_buf is not None, "a kernel with variables means the graph has some"
        rt.send(cmd, "setKernelBuffer:offset:atIndex:", (ctypes.c_void_p, self.var_buf.handle),
                (ctypes.c_ulong, VAR_SLOT * self.var_list.index(v)), (ctypes.c_ulong, len(ji.bufs) + k), restype=None)
      rt.send(cmd, "setBarrier", restype=None)
      self.commands.append(cmd)
      if not all(isinstance(x, int) for x in list(p.global_size or []) + list(p.local_size or [])):
        self.symbolic_dims.add(j)
      self._dispatch(j, var_vals)

  def _bind(self, cmd: int, index: int, buf: MetalBuffer) -> None:
    self.mtl_device.mtl.rt.send(cmd, "setKernelBuffer:offset:atIndex:", (ctypes.c_void_p, buf.handle), (ctypes.c_ulong, buf.offset),
                            (ctypes.c_ulong, index), restype=None)

  def _dims(self, j: int, var_vals: Dict[Variable, int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    gsz, lsz = cast(CompiledRunner, self.jit_cache[j].prg).p.launch_dims(var_vals)
    return (tuple(gsz) + (1, 1, 1))[:3], (tuple(lsz or (1, 1, 1)) + (1, 1, 1))[:3]

  def _dispatch(self, j: int, var_vals: Dict[Variable, int]) -> None:
    gsz, lsz = self._dims(j, var_vals)
    check_launch(self.progs[j].name, gsz, lsz, self.progs[j].max_threads)
    self.mtl_device.mtl.rt.send(self.commands[j], "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (MTLSize, MTLSize(*gsz)),
                            (MTLSize, MTLSize(*lsz)), restype=None)

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    rt, dev = self.mtl_device.mtl.rt, self.mtl_device
    # the ICB's previous run may still read the buffers and the variable slots this call rewrites
    dev.synchronize()
    for (j, i), input_idx in self.input_replace.items():
      self._bind(self.commands[j], i, rawbufs[input_idx].handle)
    if self.var_buf is not None:
      slots = dev.allocator.as_buffer(self.var_buf).cast("i")   # type: ignore[attr-defined]
      for k, v in enumerate(self.var_list):
        slots[k * VAR_SLOT // 4] = var_vals[v]
    for j in self.symbolic_dims:
      self._dispatch(j, var_vals)
    used: Dict[int, None] = {}
    for ji in self.jit_cache:
      for b in ji.bufs:
        used[cast(Buffer, b).handle.handle] = None
    for (j, i), input_idx in self.input_replace.items():
      used[rawbufs[input_idx].handle.handle] = None
    if self.var_buf is not None:
      used[self.var_buf.handle] = None
    resources = (ctypes.c_void_p * len(used))(*used)
    pool = rt.pool_push()
    try:
      cbuf = rt.retain(rt.send(dev.mtl.queue, "commandBuffer"))
      enc = rt.send(cbuf, "computeCommandEncoder")
      rt.send(enc, "useResources:count:usage:", (ctypes.c_void_p, ctypes.addressof(resources)), (ctypes.c_ulong, len(used)),
              (ctypes.c_ulong, MTLResourceUsageReadWrite), restype=None)
      rt.send(enc, "executeCommandsInBuffer:withRange:", (ctypes.c_void_p, self.icb), (NSRange, NSRange(0, len(self.commands))), restype=None)
      rt.send(enc, "endEncoding", restype=None)
      rt.send(cbuf, "commit", restype=None)
    finally:
      rt.pool_pop(pool)
    if not wait:
      dev.in_flight.append(cbuf)
      return None
    return dev.wait(cbuf)

  def __del__(self) -> None:
    try:
      rt = self.mtl_device.mtl.rt
      rt.release(getattr(self, "icb", None))
      if getattr(self, "var_buf", None) is not None:
        rt.release(cast(MetalBuffer, self.var_buf).handle)
    except Exception:  # noqa: BLE001 - interpreter shutdown
      pass
