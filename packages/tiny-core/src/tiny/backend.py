"""tiny.backend: the versioned API a device package builds on.

The contract
------------
A device package (tiny-clang, tiny-cuda, a third-party plugin) imports from core only:

- ``tiny.backend`` (this module): renderers, the UOp IR, dtypes, compilers, allocators and buffers, the runtime
  classes a device implements, graph runners, and the few helpers renderers and runtimes share;
- ``tiny.plugins``: the pluggy hooks, ``DeviceSpec``/``RendererSpec`` and ``PLUGIN_API_VERSION``;
- the top-level user API (``from tiny import Tensor, dtypes``), and only in self-test / op-suite modules (files named
  ``opsuite.py``, ``selftest.py`` or ``__main__.py``) that build programs the way a user does.

Every other ``tiny.*`` module is core's private implementation and may change in any release. ``tests/test_architecture.py``
enforces the rule in CI. See docs/PLUGINS.md.

Versioning
----------
The names in ``__all__`` are versioned with ``tiny.plugins.PLUGIN_API_VERSION`` ("MAJOR.MINOR"). Adding a name or an
optional argument bumps MINOR; removing or renaming a name or changing a signature or behaviour incompatibly bumps
MAJOR. A plugin declares the version it was written against (``TINY_PLUGIN_API``); core refuses a plugin whose MAJOR
differs or whose MINOR is newer than its own (``tiny.plugins.api_compatible``).

Names are resolved on first access, like ``import tiny`` itself: importing this module costs nothing, a renderer-only
consumer never pulls in the scheduler, and no import cycle can form between core's layers and this facade.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
  from tiny.capabilities import DeviceCaps
  from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
  from tiny.codegen.transcendental import xexp2, xlog2
  from tiny.codegen.uops import PatternMatcher, UOp, UOps, UPat
  from tiny.device import Allocator, Buffer, BufferOptions, Compiled, CompileError, Compiler, LRUAllocator
  from tiny.dtype import DType, ImageDType, PtrDType, dtypes
  from tiny.engine.hcq_graph import HCQGraph
  from tiny.engine.jit import GraphRunner
  from tiny.engine.realize import CompiledRunner, ExecItem, Runner
  from tiny.engine.schedule import ScheduleItem, create_schedule, create_schedule_with_vars
  from tiny.helpers import DEBUG, flat_mv, getenv, prod, to_function_name
  from tiny.ops import BinaryOps, LazyOp, MetaOps, ReduceOps, TernaryOps, UnaryOps, exec_alu
  from tiny.plugins import PLUGIN_API_VERSION
  from tiny.registry import Device
  from tiny.renderer import Program, RegisterLayout, Renderer, TensorCore, lazy_gated_alternatives
  from tiny.renderer.cstyle import CStyleLanguage, RenderError
  from tiny.runtime.hcq import (HCQAllocator, HCQArgsState, HCQCompiled, HCQProgram, HCQSignal, HCQTimeoutError, HWCommandQueue, HWComputeQueue,
                                HWCopyQueue)
  from tiny.runtime.ops_python import PythonAllocator, PythonCompiler, PythonProgram, PythonRenderer
  from tiny.shape.symbolic import Variable

# name -> defining module; grouped as in docs/PLUGINS.md
_LAZY: Dict[str, str] = {
  # version of this API
  "PLUGIN_API_VERSION": "tiny.plugins",
  # rendering: UOps -> source
  "Renderer": "tiny.renderer", "Program": "tiny.renderer", "TensorCore": "tiny.renderer", "RegisterLayout": "tiny.renderer",
  "lazy_gated_alternatives": "tiny.renderer",
  "CStyleLanguage": "tiny.renderer.cstyle", "RenderError": "tiny.renderer.cstyle",
  # the IR
  "UOp": "tiny.codegen.uops", "UOps": "tiny.codegen.uops", "UPat": "tiny.codegen.uops", "PatternMatcher": "tiny.codegen.uops",
  "UnaryOps": "tiny.ops", "BinaryOps": "tiny.ops", "TernaryOps": "tiny.ops", "ReduceOps": "tiny.ops", "MetaOps": "tiny.ops", "LazyOp": "tiny.ops",
  "xexp2": "tiny.codegen.transcendental", "xlog2": "tiny.codegen.transcendental", "exec_alu": "tiny.ops",
  # dtypes and symbolic sizes
  "DType": "tiny.dtype", "PtrDType": "tiny.dtype", "ImageDType": "tiny.dtype", "dtypes": "tiny.dtype", "Variable": "tiny.shape.symbolic",
  # compiling, memory and devices
  "Compiler": "tiny.device", "CompileError": "tiny.device", "Allocator": "tiny.device", "LRUAllocator": "tiny.device",
  "BufferOptions": "tiny.device", "Buffer": "tiny.device", "Compiled": "tiny.device", "Device": "tiny.registry",
  "DeviceCaps": "tiny.capabilities",
  # executing and graphs
  "Runner": "tiny.engine.realize", "CompiledRunner": "tiny.engine.realize", "ExecItem": "tiny.engine.realize", "GraphRunner": "tiny.engine.jit",
  # hardware command queues (HCQ devices)
  "HCQSignal": "tiny.runtime.hcq", "HCQTimeoutError": "tiny.runtime.hcq", "HWCommandQueue": "tiny.runtime.hcq",
  "HWComputeQueue": "tiny.runtime.hcq", "HWCopyQueue": "tiny.runtime.hcq", "HCQArgsState": "tiny.runtime.hcq", "HCQProgram": "tiny.runtime.hcq",
  "HCQCompiled": "tiny.runtime.hcq", "HCQAllocator": "tiny.runtime.hcq", "HCQGraph": "tiny.engine.hcq_graph",
  # kernel optimization (device heuristics)
  "Kernel": "tiny.codegen.kernel", "KernelOptError": "tiny.codegen.kernel", "Opt": "tiny.codegen.kernel", "OptOps": "tiny.codegen.kernel",
  # scheduling, for op suites that turn user programs into kernels
  "ScheduleItem": "tiny.engine.schedule", "create_schedule": "tiny.engine.schedule", "create_schedule_with_vars": "tiny.engine.schedule",
  # the reference interpreter (the PYTHON device), for plugins that delegate to it
  "PythonRenderer": "tiny.runtime.ops_python", "PythonCompiler": "tiny.runtime.ops_python", "PythonAllocator": "tiny.runtime.ops_python",
  "PythonProgram": "tiny.runtime.ops_python",
  # helpers
  "prod": "tiny.helpers", "getenv": "tiny.helpers", "flat_mv": "tiny.helpers", "to_function_name": "tiny.helpers", "DEBUG": "tiny.helpers",
}

# spelled out (not list(_LAZY)) so that linters and type checkers see the re-exports; a test keeps the two equal
__all__ = [
  "PLUGIN_API_VERSION",
  "Renderer", "Program", "TensorCore", "RegisterLayout", "lazy_gated_alternatives", "CStyleLanguage", "RenderError",
  "UOp", "UOps", "UPat", "PatternMatcher", "UnaryOps", "BinaryOps", "TernaryOps", "ReduceOps", "MetaOps", "LazyOp", "xexp2", "xlog2", "exec_alu",
  "DType", "PtrDType", "ImageDType", "dtypes", "Variable",
  "Compiler", "CompileError", "Allocator", "LRUAllocator", "BufferOptions", "Buffer", "Compiled", "Device", "DeviceCaps",
  "Runner", "CompiledRunner", "ExecItem", "GraphRunner",
  "HCQSignal", "HCQTimeoutError", "HWCommandQueue", "HWComputeQueue", "HWCopyQueue", "HCQArgsState", "HCQProgram", "HCQCompiled", "HCQAllocator",
  "HCQGraph",
  "Kernel", "KernelOptError", "Opt", "OptOps",
  "ScheduleItem", "create_schedule", "create_schedule_with_vars",
  "PythonRenderer", "PythonCompiler", "PythonAllocator", "PythonProgram",
  "prod", "getenv", "flat_mv", "to_function_name", "DEBUG",
]


def __getattr__(name: str) -> Any:
  if name not in _LAZY:
    raise AttributeError(f"module 'tiny.backend' has no attribute {name!r}: it is not part of the backend API (see docs/PLUGINS.md)")
  value = getattr(importlib.import_module(_LAZY[name]), name)
  globals()[name] = value   # later lookups skip __getattr__
  return value


def __dir__() -> List[str]:
  return sorted(set(globals()) | set(__all__))
