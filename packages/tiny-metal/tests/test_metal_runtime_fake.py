"""tiny_metal.runtime against a fake Objective-C runtime: everything the runtime does that does not need a Mac.

`FakeObjC` stands in for libobjc + Metal.framework: every message the runtime sends is marshalled through the argument types
it declares (each value goes through `argtype.from_param`, as ctypes would do for objc_msgSend) and recorded, and the fake
answers like Metal (objects are ints, NSError through the `NSError **` argument, buffer contents are real host memory).
The tests hold the recorded messages against Apple's selectors and argument order.
"""
from __future__ import annotations

import ctypes
import platform
import struct
from typing import Any, Dict, List, Tuple

import pytest

from tiny.backend import CompileError

from tiny_metal import runtime as rtm
from tiny_metal.renderer import MetalRenderer
from tiny_metal.runtime import (MTLSize, MetalAllocator, MetalBuffer, MetalDevice, MetalDeviceHandle, MetalError, MetalProgram, ObjC,
                                ObjCError, check_launch, mtl_language_version)


class FakeObjC(ObjC):
  """An ObjC whose objc_msgSend is a Python model of the Metal objects tiny uses."""

  def __init__(self, max_threads: int = 256, status: int = 4) -> None:
    self._sels: Dict[str, int] = {}
    self._fns: Dict[Tuple[Any, ...], Any] = {}
    self.objects: Dict[int, Dict[str, Any]] = {}
    self.calls: List[Tuple[str, Any, Tuple[Any, ...], Tuple[Any, ...]]] = []
    self.released: List[int] = []
    self.pools = 0
    self.max_threads, self.status = max_threads, status
    self.memory: Dict[int, Any] = {}
    self.metal = self
    self.libsystem = self
    self.device = self.new("MTLDevice", name="Fake Apple GPU")

  # *** objects ***
  def new(self, kind: str, **attrs: Any) -> int:
    handle = 0x1000 + 0x10 * len(self.objects)
    self.objects[handle] = {"kind": kind, **attrs}
    return handle

  def kind(self, h: int) -> str:
    return self.objects[h]["kind"]

  # *** the C functions ***
  def MTLCreateSystemDefaultDevice(self) -> int:  # noqa: N802 - Apple's name
    return self.device

  def dispatch_data_create(self, buf: Any, size: int, queue: Any, destructor: Any) -> int:
    return self.new("dispatch_data", data=ctypes.string_at(buf, size))

  def cls(self, name: str) -> int:
    for h, o in self.objects.items():
      if o["kind"] == "class" and o["name"] == name:
        return h
    return self.new("class", name=name)

  def sel(self, name: str) -> int:
    return self._sels.setdefault(name, len(self._sels) + 1)

  def pool_push(self) -> int:
    self.pools += 1
    return self.pools

  def pool_pop(self, pool: int) -> None:
    assert pool == self.pools, "pools pop in order"
    self.pools -= 1

  def _msgsend(self, restype: Any, argtypes: Tuple[Any, ...]) -> Any:
    def send(obj: int, sel: int, *args: Any) -> Any:
      name = next(k for k, v in self._sels.items() if v == sel)
      for t, v in zip(argtypes, args):
        if isinstance(t, type) and issubclass(t, ctypes.Structure):
          assert isinstance(v, t), f"{name}: {v!r} is not a {t.__name__}"
        else:
          t.from_param(v)   # raises like ctypes would for a value that does not fit the declared type
      self.calls.append((name, restype, argtypes, args))
      return self.answer(obj, name, args)
    return send

  def answer(self, obj: int, name: str, args: Tuple[Any, ...]) -> Any:  # noqa: C901 - one branch per selector
    o = self.objects[obj]
    if name == "stringWithUTF8String:":
      return self.new("NSString", text=args[0].decode())
    if name == "UTF8String":
      return o["text"].encode()
    if name in ("release",):
      self.released.append(obj)
      return None
    if name == "retain":
      return obj
    if name == "name":
      return self.new("NSString", text=o["name"])
    if name == "newCommandQueue":
      return self.new("MTLCommandQueue")
    if name == "maxThreadgroupMemoryLength":
      return 32768
    if name == "new":
      return self.new(o["name"], settings={})
    if name.startswith("set") and o["kind"] in ("MTLCompileOptions", "MTLComputePipelineDescriptor", "MTLIndirectCommandBufferDescriptor"):
      o["settings"][name] = args[0]
      return None
    if name in ("newLibraryWithSource:options:error:", "newLibraryWithData:error:"):
      src = self.objects[args[0]].get("text") or self.objects[args[0]]["data"].decode(errors="replace")
      if "syntax_error_here" in src:
        args[-1]._obj.value = self.new("NSError", text="program_source:3:5: error: use of undeclared identifier 'syntax_error_here'")
        return None
      return self.new("MTLLibrary", src=src)
    if name == "localizedDescription":
      return self.new("NSString", text=o["text"])
    if name == "newFunctionWithName:":
      fname = self.objects[args[0]]["text"]
      return self.new("MTLFunction", name=fname) if f"kernel void {fname}(" in o["src"] else None
    if name == "newComputePipelineStateWithDescriptor:options:reflection:error:":
      settings = self.objects[args[0]]["settings"]
      return self.new("MTLComputePipelineState", function=settings["setComputeFunction:"],
                      icb=settings["setSupportIndirectCommandBuffers:"])
    if name == "maxTotalThreadsPerThreadgroup":
      return self.max_threads
    if name == "threadExecutionWidth":
      return 32
    if name == "commandBuffer":
      return self.new("MTLCommandBuffer")
    if name == "computeCommandEncoder":
      return self.new("MTLComputeCommandEncoder")
    if name == "setBytes:length:atIndex:":
      o.setdefault("bytes", []).append(ctypes.string_at(args[0], args[1]))
      return None
    if name in ("setComputePipelineState:", "setBuffer:offset:atIndex:", "dispatchThreadgroups:threadsPerThreadgroup:", "endEncoding",
                "commit", "waitUntilCompleted"):
      return None
    if name == "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:":
      return self.new("MTLIndirectCommandBuffer", settings=dict(self.objects[args[0]]["settings"]), count=args[1], commands={})
    if name == "indirectComputeCommandAtIndex:":
      assert args[0] < o["count"], "a command index beyond maxCommandCount"
      return o["commands"].setdefault(args[0], self.new("MTLIndirectComputeCommand"))
    if name == "useResources:count:usage:":
      o["resources"] = list((ctypes.c_void_p * args[1]).from_address(args[0]))
      return None
    if name in ("setKernelBuffer:offset:atIndex:", "setBarrier", "concurrentDispatchThreadgroups:threadsPerThreadgroup:",
                "executeCommandsInBuffer:withRange:"):
      return None
    if name == "status":
      return self.status
    if name == "error":
      return self.new("NSError", text="Execution of the command buffer was aborted due to an error during execution.")
    if name == "GPUStartTime":
      return 10.0
    if name == "GPUEndTime":
      return 10.25
    if name == "newBufferWithLength:options:":
      mem = (ctypes.c_char * args[0])()
      h = self.new("MTLBuffer", length=args[0], options=args[1])
      self.memory[h] = mem
      return h
    if name == "contents":
      return ctypes.addressof(self.memory[obj])
    raise AssertionError(f"the fake does not know {name}")

  def sent(self, name: str) -> List[Tuple[Any, ...]]:
    """The argument tuples of every message `name` sent so far."""
    return [args for n, _, _, args in self.calls if n == name]

  def signature(self, name: str) -> Tuple[Any, Tuple[Any, ...]]:
    return next((r, a) for n, r, a, _ in self.calls if n == name)


KERNEL = "#include <metal_stdlib>\nusing namespace metal;\nkernel void add(device float* data0 [[buffer(0)]]) {}\n"


@pytest.fixture
def fake() -> FakeObjC:
  return FakeObjC()


@pytest.fixture
def device(fake: FakeObjC) -> MetalDevice:
  return MetalDevice("METAL", MetalRenderer(), None, mtl=MetalDeviceHandle(fake, fake.device))


def test_send_checks_the_selector_arity_and_nil(fake: FakeObjC) -> None:
  with pytest.raises(ObjCError, match="takes 3 argument"):
    fake.send(fake.device, "setBuffer:offset:atIndex:", (ctypes.c_void_p, 1))
  with pytest.raises(ObjCError, match="sent to nil"):
    fake.send(None, "release")
  with pytest.raises(TypeError):   # a value that does not fit its declared ctypes type is refused before the call
    fake.send(fake.device, "newBufferWithLength:options:", (ctypes.c_ulong, "big"), (ctypes.c_ulong, 0))


def test_language_version_enum() -> None:
  assert mtl_language_version(3, 1) == 196609 and mtl_language_version(3, 0) == 0x30000 and mtl_language_version(2, 4) == 131076


def test_library_from_source(fake: FakeObjC) -> None:
  dev = MetalDeviceHandle(fake, fake.device)
  assert dev.name == "Fake Apple GPU" and dev.max_threadgroup_memory == 32768
  lib = dev.library(KERNEL.encode())
  assert fake.kind(lib.handle) == "MTLLibrary" and fake.objects[lib.handle]["src"] == KERNEL
  restype, argtypes = fake.signature("newLibraryWithSource:options:error:")
  assert restype is ctypes.c_void_p and argtypes == (ctypes.c_void_p,) * 3
  opts = next(h for h, o in fake.objects.items() if o["kind"] == "MTLCompileOptions")
  assert fake.objects[opts]["settings"] == {"setLanguageVersion:": 196609, "setFastMathEnabled:": False}
  assert opts in fake.released, "the compile options are released after use"
  handle = lib.handle
  lib.release()
  lib.release()   # a second release is a no-op: Objective-C would over-release
  assert fake.released.count(handle) == 1


def test_compile_errors_carry_metals_message(fake: FakeObjC) -> None:
  from tiny_metal.compiler import MetalCompiler
  dev = MetalDeviceHandle(fake, fake.device)
  with pytest.raises(MetalError, match="newLibraryWithSource.*undeclared identifier 'syntax_error_here'"):
    dev.library_from_source(KERNEL.replace("{}", "{ syntax_error_here; }"))
  comp = MetalCompiler(dev)
  assert comp.compile(KERNEL) == KERNEL.encode()
  with pytest.raises(CompileError, match="Metal rejected the kernel") as e:
    comp.compile(KERNEL.replace("{}", "{ syntax_error_here; }"))
  assert "undeclared identifier" in e.value.compiler_msg and e.value.src is not None
  assert fake.pools == 0, "every autorelease pool is popped, also on errors"


def test_metallib_goes_through_new_library_with_data(fake: FakeObjC) -> None:
  dev = MetalDeviceHandle(fake, fake.device)
  blob = b"MTLB" + b"\x01\x02" * 10 + b"kernel void add("
  lib = dev.library(blob)
  assert fake.sent("newLibraryWithData:error:") and not fake.sent("newLibraryWithSource:options:error:")
  ddata = fake.sent("newLibraryWithData:error:")[0][0]
  assert fake.objects[ddata]["data"] == blob and ddata in fake.released
  assert fake.kind(lib.handle) == "MTLLibrary"


def test_missing_kernel_name(fake: FakeObjC, device: MetalDevice) -> None:
  with pytest.raises(MetalError, match="no kernel named 'mul'"):
    MetalProgram(device, "mul", KERNEL.encode())
  assert fake.pools == 0


def test_launch_marshalling(fake: FakeObjC, device: MetalDevice) -> None:
  alloc = device.allocator
  assert isinstance(alloc, MetalAllocator)
  a, b = alloc.alloc(64), alloc.alloc(256)
  view = alloc.offset(b, 128, 16)
  prg = MetalProgram(device, "add", KERNEL.encode())
  assert (prg.max_threads, prg.simd_width) == (256, 32)
  fake.calls.clear()
  t = prg(a, view, global_size=(4, 2, 1), local_size=(32, 2, 1), vals=(7, -3), wait=True)
  assert t == pytest.approx(0.25)
  assert [n for n, _, _, _ in fake.calls] == [
    "commandBuffer", "retain", "computeCommandEncoder", "setComputePipelineState:", "setBuffer:offset:atIndex:", "setBuffer:offset:atIndex:",
    "setBytes:length:atIndex:", "setBytes:length:atIndex:", "dispatchThreadgroups:threadsPerThreadgroup:", "endEncoding", "commit",
    "waitUntilCompleted", "status", "GPUEndTime", "GPUStartTime", "release"]
  assert fake.sent("setBuffer:offset:atIndex:") == [(a.handle, 0, 0), (b.handle, 16, 1)]
  assert fake.signature("setBuffer:offset:atIndex:")[1] == (ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong)
  # the variables follow the buffers, as 4-byte ints, at the indices the renderer gave them
  assert [(a[1], a[2]) for a in fake.sent("setBytes:length:atIndex:")] == [(4, 2), (4, 3)]
  enc = next(h for h, o in fake.objects.items() if o["kind"] == "MTLComputeCommandEncoder")
  assert [struct.unpack("<i", x)[0] for x in fake.objects[enc]["bytes"]] == [7, -3]
  (grid, group), = fake.sent("dispatchThreadgroups:threadsPerThreadgroup:")
  assert (grid.width, grid.height, grid.depth, group.width, group.height, group.depth) == (4, 2, 1, 32, 2, 1)
  assert fake.signature("dispatchThreadgroups:threadsPerThreadgroup:") == (None, (MTLSize, MTLSize))
  cbuf = fake.sent("commit") and next(h for h, o in fake.objects.items() if o["kind"] == "MTLCommandBuffer")
  assert cbuf in fake.released and fake.pools == 0


def test_threadgroup_size_is_checked(fake: FakeObjC, device: MetalDevice) -> None:
  prg = MetalProgram(device, "add", KERNEL.encode())
  buf = device.allocator.alloc(16)
  fake.calls.clear()
  with pytest.raises(ValueError, match=r"512 threads exceeds this pipeline's maxTotalThreadsPerThreadgroup of 256"):
    prg(buf, global_size=(1, 1, 1), local_size=(64, 8, 1))
  assert prg(buf, global_size=(0, 1, 1), local_size=(4, 1, 1), wait=True) == 0.0   # an empty grid launches nothing
  assert not fake.sent("commandBuffer")
  with pytest.raises(ValueError, match="three positive ints"):
    check_launch("k", (1, 1, 1), (0, 1, 1), 1024)
  check_launch("k", (65535, 1, 1), (1024, 1, 1), 1024)


def test_failed_command_buffer_raises_metals_error(fake: FakeObjC, device: MetalDevice) -> None:
  prg = MetalProgram(device, "add", KERNEL.encode())
  buf = device.allocator.alloc(16)
  fake.status = rtm.MTLCommandBufferStatusError
  with pytest.raises(MetalError, match="aborted due to an error during execution"):
    prg(buf, wait=True)
  prg(buf)   # not waited for: in flight until synchronize
  assert len(device.in_flight) == 1
  with pytest.raises(MetalError, match="a kernel failed on Fake Apple GPU"):
    device.synchronize()
  assert device.in_flight == []


def test_shared_memory_copies_and_views(fake: FakeObjC, device: MetalDevice) -> None:
  alloc = device.allocator
  assert isinstance(alloc, MetalAllocator)
  buf = alloc.alloc(32)
  assert fake.sent("newBufferWithLength:options:")[-1] == (32, rtm.MTLResourceStorageModeShared)
  alloc.copyin(buf, memoryview(bytes(range(32))))
  view = alloc.offset(buf, 8, 12)
  out = memoryview(bytearray(8))
  alloc.copyout(out, view)
  assert bytes(out) == bytes(range(12, 20))
  alloc.as_buffer(view)[:2] = b"\xff\xfe"   # zero-copy: a write through the host view is the buffer's memory
  whole = memoryview(bytearray(32))
  alloc.copyout(whole, buf)
  assert bytes(whole[12:14]) == b"\xff\xfe" and bytes(whole[:12]) == bytes(range(12))
  nested = alloc.offset(view, 4, 4)
  assert (nested.handle, nested.offset, nested.size) == (buf.handle, 16, 4)
  with pytest.raises(ValueError, match="does not fit"):
    alloc.offset(view, 8, 4)
  prg = MetalProgram(device, "add", KERNEL.encode())
  prg(buf)
  alloc.copyout(out, view)   # a copy waits for the kernels in flight first
  assert device.in_flight == []
  alloc._free(view, None)   # type: ignore[arg-type]
  assert buf.handle not in fake.released, "a view never releases the buffer it looks into"
  alloc._free(buf, None)   # type: ignore[arg-type]
  assert buf.handle in fake.released


def test_buffer_allocation_failure_is_memory_error(fake: FakeObjC, device: MetalDevice) -> None:
  fake.answer = lambda obj, name, args: None if name == "newBufferWithLength:options:" else FakeObjC.answer(fake, obj, name, args)  # type: ignore
  with pytest.raises(MemoryError, match="could not allocate 4096 bytes"):
    device.allocator._alloc(4096, None)  # type: ignore[attr-defined]


@pytest.mark.skipif(platform.system() == "Darwin", reason="checks how the runtime declines off macOS")
def test_off_macos_the_runtime_declines_cleanly() -> None:
  with pytest.raises(ObjCError, match="Metal needs macOS"):
    ObjC.load()
  assert rtm.metal_problem() == "Metal needs macOS"


def test_metal_buffer_defaults() -> None:
  b = MetalBuffer(5, 10)
  assert (b.offset, b.view) == (0, False)


class StandInBuffer:
  """What the graph reads of a tiny Buffer: its allocator handle."""

  def __init__(self, handle: MetalBuffer):
    self.handle = handle


def test_graph_encodes_an_indirect_command_buffer(fake: FakeObjC, device: MetalDevice) -> None:
  from tiny.backend import CompiledRunner, ExecItem
  from tiny_metal.graph import VAR_SLOT, MetalGraph
  from tiny_metal.opsuite import suite_asts, suite_programs
  progs = suite_programs(MetalRenderer(), "gpu", suite_asts(["elementwise", "symbolic_reduce"]))
  assert [bool(p.vars) for p in progs] == [False, True]
  var = progs[1].vars[0]
  alloc = device.allocator
  items, bufs = [], []
  for p in progs:
    runner = CompiledRunner.__new__(CompiledRunner)
    runner.p, runner.lib, runner.clprg = p, p.src.encode(), MetalProgram(device, p.name, p.src.encode())
    runner.first_run, runner.display_name, runner.dname, runner.op_estimate, runner.mem_estimate = False, p.name, "METAL", 0, 0
    b = [StandInBuffer(alloc.alloc(4096)) for _ in p.globals]
    bufs.append(b)
    items.append(ExecItem(runner, b))  # type: ignore[arg-type]
  inp = bufs[0][1]
  fake.calls.clear()
  graph = MetalGraph(items, [inp], {var: 5})  # type: ignore[list-item]
  icb = next(h for h, o in fake.objects.items() if o["kind"] == "MTLIndirectCommandBuffer")
  assert fake.objects[icb]["count"] == 2 and fake.objects[icb]["settings"] == {
    "setCommandTypes:": 32, "setInheritBuffers:": False, "setInheritPipelineState:": False, "setMaxKernelBufferBindCount:": 31}
  assert len(fake.sent("setBarrier")) == 2, "every command waits for the one before"
  var_buf = graph.var_buf
  assert var_buf is not None and var_buf.size == VAR_SLOT
  binds = fake.sent("setKernelBuffer:offset:atIndex:")
  nb0, nb1 = len(bufs[0]), len(bufs[1])
  assert binds[:nb0] == [(b.handle.handle, 0, i) for i, b in enumerate(bufs[0])]
  assert binds[nb0:nb0 + nb1] == [(b.handle.handle, 0, i) for i, b in enumerate(bufs[1])]
  assert binds[nb0 + nb1] == (var_buf.handle, 0, nb1), "the variable follows the buffers, in its slot of the var buffer"
  dispatches = fake.sent("concurrentDispatchThreadgroups:threadsPerThreadgroup:")
  assert len(dispatches) == 2 and all(isinstance(g, MTLSize) for d in dispatches for g in d)
  # a call: the new input is bound where the old one was, the variable is written to its slot, the ICB runs once
  fake.calls.clear()
  new_inp = StandInBuffer(alloc.offset(alloc.alloc(8192), 4096, 256))
  assert graph([new_inp], {var: 7}, wait=True) == pytest.approx(0.25)  # type: ignore[list-item]
  assert fake.sent("setKernelBuffer:offset:atIndex:") == [(new_inp.handle.handle, 256, 1)]
  assert alloc.as_buffer(var_buf).cast("i")[0] == 7
  enc = next(h for h, o in fake.objects.items() if o["kind"] == "MTLComputeCommandEncoder" and "resources" in o)
  used = set(fake.objects[enc]["resources"])
  assert used == {b.handle.handle for bs in bufs for b in bs} | {new_inp.handle.handle, var_buf.handle}
  (ran, rng), = fake.sent("executeCommandsInBuffer:withRange:")
  assert ran == icb and (rng.location, rng.length) == (0, 2)
  assert fake.pools == 0


def test_graph_refuses_what_it_cannot_hold(device: MetalDevice) -> None:
  from tiny.backend import ExecItem, Runner
  from tiny_metal.graph import MetalGraph
  other = Runner("copy", "METAL")
  with pytest.raises(NotImplementedError, match="only holds Metal kernels"):
    MetalGraph([ExecItem(other, []), ExecItem(other, [])], [], {})  # type: ignore[arg-type]
