"""tiny plugin: the CLANG and LLVM CPU devices. Importing this module is cheap: toolchains load when a device is first used."""
from __future__ import annotations

import importlib.util
from typing import Any, List, Optional

from tiny.backend import DeviceCaps
from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "1.2"


def _probe_clang() -> Optional[str]:
  from tiny_clang.compiler import find_cc
  if find_cc() is None:
    return "no C compiler found: install clang (apt-get install clang) or gcc, or point CC at one"
  return None


def _probe_llvm() -> Optional[str]:
  if importlib.util.find_spec("llvmlite") is None:
    return "llvmlite is not installed: pip install llvmlite"
  return None


def _allocator(dev: str) -> Any:
  from tiny_clang.runtime import ClangAllocator
  return ClangAllocator()


def _clang_renderer(dev: str) -> Any:
  from tiny_clang.renderer import ClangRenderer
  return ClangRenderer()


def _clang_compiler(dev: str) -> Any:
  from tiny_clang.compiler import ClangCompiler
  return ClangCompiler()


def _clang_runtime(dev: str) -> Any:
  from tiny_clang.pool import build_in_background
  from tiny_clang.runtime import ClangProgram
  build_in_background()   # the device is made before its first kernel is compiled: build the pool meanwhile
  return ClangProgram


def _llvm_renderer(dev: str) -> Any:
  from tiny_clang.llvmir import LLVMRenderer
  return LLVMRenderer()


def _llvm_compiler(dev: str) -> Any:
  from tiny_clang.compiler import LLVMCompiler
  return LLVMCompiler()


def _llvm_runtime(dev: str) -> Any:
  from tiny_clang.pool import build_in_background
  from tiny_clang.runtime import LLVMProgram
  build_in_background()
  return LLVMProgram


def _graph(dev: str) -> Any:
  from tiny_clang.graph import CPUGraph
  return CPUGraph


def _hcq_device(dev: str) -> Any:
  from tiny_clang.hcq import HCQCPUDevice
  return HCQCPUDevice(dev)


def _hcq_graph(dev: str) -> Any:
  from tiny.backend import HCQGraph
  return HCQGraph


def _hcq_unbuilt(dev: str) -> Any:
  # HCQCPU builds its whole device in device_factory (runtime and allocator need the device object)
  raise RuntimeError("HCQCPU is built by its device_factory")


# host memory: buffers are views into each other (ctypes from_buffer) and read back without a copy
CPU_CAPS = DeviceCaps(buffer_views=True, zero_copy=True, buffer_options=frozenset({"nolru"}), view_alignment=1)
# HCQCPU memory is host memory too, but queued work may still be writing it: reads go through copyout, which waits
HCQ_CPU_CAPS = DeviceCaps(buffer_views=True, zero_copy=False, buffer_options=frozenset({"nolru"}), view_alignment=1)


@hookimpl
def tiny_devices() -> List[DeviceSpec]:
  """CLANG (C through clang, else cc/gcc) and LLVM (LLVM IR through llvmlite), both on every core; HCQCPU, the HCQ reference."""
  return [DeviceSpec(name="CLANG", allocator=_allocator, renderer=_clang_renderer, compiler=_clang_compiler, runtime=_clang_runtime,
                     graph=_graph, priority=10, probe=_probe_clang, caps=CPU_CAPS),
          DeviceSpec(name="LLVM", allocator=_allocator, renderer=_llvm_renderer, compiler=_llvm_compiler, runtime=_llvm_runtime,
                     graph=_graph, priority=5, probe=_probe_llvm, caps=CPU_CAPS),
          # the CPU reference of the hardware-command-queue interfaces: CLANG kernels run from a compute engine thread, copies
          # from a copy engine thread, ordered by signals. Never the default (negative priority): it exists to test HCQ.
          DeviceSpec(name="HCQCPU", allocator=_hcq_unbuilt, renderer=_clang_renderer, compiler=_clang_compiler, runtime=_hcq_unbuilt,
                     graph=_hcq_graph, priority=-1, probe=_probe_clang, device_factory=_hcq_device, caps=HCQ_CPU_CAPS)]


def doctor_notes() -> List[str]:
  """What `python -m tiny doctor` prints under this plugin: which thread pool runs the kernels (and why, when it is the slow one)."""
  from tiny_clang.pool import pool_notes
  return pool_notes()
