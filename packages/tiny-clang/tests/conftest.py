"""Shared fixtures of the tiny-clang tests: a CPU backend (CLANG or LLVM) that renders, compiles and runs hand-built UOp lists."""
from __future__ import annotations

import os
from typing import Any, Callable, List, Sequence

import numpy as np
import pytest
from hypothesis import settings

settings.register_profile("fuzz", max_examples=2000, deadline=None)
settings.register_profile("default", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


class Backend:
  """Renders a linearized UOp list for one device, compiles it and runs it on numpy arrays (copied to device buffers)."""

  count = 0

  def __init__(self, name: str):
    from tiny_clang.runtime import ClangAllocator
    self.name = name
    if name == "CLANG":
      from tiny_clang.compiler import ClangCompiler, find_cc
      if find_cc() is None:
        pytest.skip("no C compiler (clang/cc/gcc) on this machine")
      from tiny_clang.renderer import ClangRenderer
      from tiny_clang.runtime import ClangProgram
      self.renderer, self.compiler, self.program = ClangRenderer(), ClangCompiler(), ClangProgram
    else:
      pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
      from tiny_clang.compiler import LLVMCompiler
      from tiny_clang.llvmir import LLVMRenderer
      from tiny_clang.runtime import LLVMProgram
      self.renderer, self.compiler, self.program = LLVMRenderer(), LLVMCompiler(), LLVMProgram
    self.allocator = ClangAllocator()

  def build(self, uops: List[Any], name: str = "test_kernel") -> Any:
    Backend.count += 1
    name = f"{name}_{Backend.count}"
    src = self.renderer.render(name, uops)
    return self.program(name, self.compiler.compile(src)), src

  def run(self, uops: List[Any], out: np.ndarray, inputs: Sequence[np.ndarray], vals: Sequence[int] = (), name: str = "test_kernel",
          prg: Any = None) -> np.ndarray:
    """Run the kernel with `out` (its contents are the initial output) and inputs as buffers 0..n; returns the output."""
    if prg is None:
      prg, _ = self.build(uops, name)
    bufs = []
    for a in [out, *inputs]:
      a = np.ascontiguousarray(a)
      b = self.allocator.alloc(max(a.nbytes, 1))
      self.allocator.copyin(b, memoryview(a.reshape(-1).view(np.uint8)))
      bufs.append(b)
    prg(*bufs, vals=tuple(vals))
    res = np.empty_like(out)
    self.allocator.copyout(memoryview(res.reshape(-1).view(np.uint8)), bufs[0])
    return res


@pytest.fixture(params=["CLANG", "LLVM"])
def backend(request: Any) -> Backend:
  return Backend(request.param)


@pytest.fixture
def make_backend() -> Callable[[str], Backend]:
  return Backend
