"""Compilers for METAL. What a METAL "binary" is: the kernel's MSL source, checked.

Apple's public API cannot serialize a compiled MTLLibrary, so the bytes a METAL compiler returns (and tiny caches) are the
MSL source, UTF-8 encoded, after it passed a check; the runtime builds the library from them (`newLibraryWithSource:`,
which Metal's own shader cache makes cheap the second time). A precompiled `.metallib` (magic `MTLB`, e.g. from `xcrun
metal`) is loaded as is through `newLibraryWithData:`.

- `MetalCompiler` (macOS): the check is Metal's compiler itself (`newLibraryWithSource:options:error:` with the MSL version
  the renderer targets); its error text comes back as a CompileError.
- `MSLSyntaxCompiler` (elsewhere): the check is clang with msl_shim.h (tiny_metal.syntax). The source it returns is what
  a Mac would run, but nothing runs it here: execution needs macOS.
"""
from __future__ import annotations

from typing import Any, Optional

from tiny.backend import CompileError, Compiler

from tiny_metal.renderer import MSL_VERSION
from tiny_metal.syntax import NoMSLChecker, check_msl

METALLIB_MAGIC = b"MTLB"


class MSLSyntaxCompiler(Compiler):
  """Off macOS: syntax-check the MSL with clang + msl_shim.h and return the source bytes; CompileError when clang
  rejects it or when no clang >= 15 is installed."""

  def __init__(self) -> None:
    super().__init__(f"metal_msl_{MSL_VERSION[0]}.{MSL_VERSION[1]}_syntax")

  def compile(self, src: str) -> bytes:
    try:
      check_msl(src)
    except NoMSLChecker as e:
      raise CompileError(f"cannot check Metal kernels here: {e}; they compile and run only on macOS", src) from e
    return src.encode()


class MetalCompiler(Compiler):
  """On macOS: compile the MSL with Metal's compiler to prove it builds, and return the source bytes (see the module doc).
  `device` is the MTLDevice handle to compile for (tiny_metal.runtime)."""

  def __init__(self, device: Optional[Any] = None) -> None:
    from tiny_metal.runtime import default_device
    self.device = device if device is not None else default_device()
    super().__init__(f"metal_{MSL_VERSION[0]}.{MSL_VERSION[1]}_{self.device.name}")

  def compile(self, src: str) -> bytes:
    from tiny_metal.runtime import MetalError
    try:
      self.device.library_from_source(src).release()
    except MetalError as e:
      raise CompileError(f"Metal rejected the kernel: {e}", src) from e
    return src.encode()
