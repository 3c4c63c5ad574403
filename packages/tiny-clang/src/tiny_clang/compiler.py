"""Compilers of the CPU devices: C source to a shared object (clang, else cc/gcc) and LLVM IR to a native object (llvmlite)."""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Any, List, Optional, Tuple

from tiny.backend import CompileError, Compiler

# -ffp-contract=fast lets a*b+c become one FMA (more accurate, twice the matmul throughput); -fopenmp-simd turns on
# the `#pragma omp simd reduction` the renderer puts on reduction loops (reassociation there and nowhere else)
DEFAULT_CFLAGS = ["-O2", "-march=native", "-fPIC", "-ffp-contract=fast", "-fno-math-errno", "-fopenmp-simd", "-w"]


def find_cc() -> Optional[str]:
  """The C compiler to use: $CC, else clang, else the system cc/gcc. None when there is none."""
  if cc := os.environ.get("CC"):
    return shutil.which(shlex.split(cc)[0]) and cc
  for name in ("clang", "cc", "gcc"):
    if shutil.which(name):
      return name
  return None


@functools.lru_cache(None)
def _cc_version(cc: str) -> str:
  try:
    return subprocess.run(shlex.split(cc) + ["--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
  except (OSError, subprocess.SubprocessError, IndexError, ValueError):   # not runnable, hung, or printed nothing: the key says so
    return "unknown"


@functools.lru_cache(None)
def host_cpu_id() -> str:
  """A short hash of the host CPU model and feature flags: what `-march=native` compiles for.

  Part of the compile cache key, so a cache directory shared between machines never serves one CPU's code to another."""
  wanted = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags", "features", "cpu implementer", "cpu architecture",
            "cpu variant", "cpu part")
  try:
    with open("/proc/cpuinfo") as f:
      first = f.read().split("\n\n")[0]
    ident = "\n".join(line for line in first.splitlines() if line.split(":")[0].strip().lower() in wanted)
  except OSError:
    ident = ""
  return hashlib.sha256(f"{platform.machine()}|{platform.processor()}|{ident}".encode()).hexdigest()[:16]


def _run_to_bytes(cmd: List[str], src: str, pass_fds: Tuple[int, ...] = ()) -> subprocess.CompletedProcess:
  """Run cmd with the output path as its last argument, feeding src on stdin; returns (proc, output bytes).

  The output goes to an anonymous in-memory file when the OS has memfd, so nothing is left on disk even if we crash."""
  if hasattr(os, "memfd_create"):
    fd = os.memfd_create("tiny_clang_out")
    try:
      proc = subprocess.run(cmd + [f"/proc/self/fd/{fd}"], input=src.encode(), capture_output=True, pass_fds=(fd,) + pass_fds)
      if proc.returncode == 0:
        os.lseek(fd, 0, os.SEEK_SET)
        size = os.fstat(fd).st_size
        proc.stdout = os.read(fd, size) if size else b""
        while len(proc.stdout) < size:
          proc.stdout += os.read(fd, size - len(proc.stdout))
      return proc
    finally:
      os.close(fd)
  with tempfile.TemporaryDirectory(prefix="tiny_clang_") as d:
    out = os.path.join(d, "kernel.so")
    proc = subprocess.run(cmd + [out], input=src.encode(), capture_output=True)
    if proc.returncode == 0:
      with open(out, "rb") as f:
        proc.stdout = f.read()
    return proc


@functools.lru_cache(None)
def direct_linker(cc: str) -> Optional[str]:
  """The linker that `cc -shared` runs, when tiny may run it itself (Linux, memfd, TINY_CLANG_DIRECT_LINK not 0); else None.

  Linking through the compiler driver costs a second driver process and the C runtime start files, about as much CPU as
  compiling a small kernel; `ld -shared` on the object does the same work in a few milliseconds. The object is the one
  the driver would have built (same compiler, same flags), so the kernel's machine code does not change."""
  if not sys.platform.startswith("linux") or not hasattr(os, "memfd_create") or os.environ.get("TINY_CLANG_DIRECT_LINK", "1") == "0":
    return None
  try:
    name = subprocess.run(shlex.split(cc) + ["-print-prog-name=ld"], capture_output=True, text=True, timeout=30).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return shutil.which(name) if name else None


def _link_shared(ld: str, obj: bytes) -> Optional[bytes]:
  """obj linked into a shared object by ld (against libm and libc, like the driver does); None when ld fails."""
  fd = os.memfd_create("tiny_clang_obj")
  try:
    os.write(fd, obj)
    proc = _run_to_bytes([ld, "-shared", f"/proc/self/fd/{fd}", "-lm", "-lc", "-o"], "", pass_fds=(fd,))
  except OSError:
    return None
  finally:
    os.close(fd)
  return proc.stdout if proc.returncode == 0 and proc.stdout else None


class ClangCompiler(Compiler):
  """C source -> shared object bytes, with clang (or $CC, or the system cc). Flags: $CFLAGS replaces the defaults.

  On Linux the source is compiled to an object by the compiler and linked by calling its linker directly (see direct_linker)."""

  def __init__(self, cachekey: str = "compile_clang", opt_args: Optional[List[str]] = None):
    cc = find_cc()
    if cc is None:
      raise RuntimeError("CLANG needs a C compiler: install clang (apt-get install clang) or gcc, or set CC")
    self.cc = shlex.split(cc)
    self.flags = shlex.split(os.environ["CFLAGS"]) if os.environ.get("CFLAGS") else list(DEFAULT_CFLAGS)
    self.flags += opt_args or []
    native = any(f.endswith("=native") for f in self.flags)
    # -pthread also picks the thread library at link time: leave such builds (the worker pool) to the driver
    self.ld = direct_linker(cc) if "-pthread" not in self.flags else None
    # the linker is part of the key too: a binary linked one way is never served to a setup that links the other way
    link = f"|ld={self.ld}" if self.ld is not None else ""
    key = hashlib.sha256(f"{_cc_version(cc)}|{self.flags}|{host_cpu_id() if native else ''}{link}".encode()).hexdigest()[:16]
    super().__init__(f"{cachekey}_{key}")

  # compile() only runs a subprocess: the engine may run several at once
  parallel_compile = True

  def compile(self, src: str) -> bytes:
    """Compile src to a shared object; a failure raises CompileError with the numbered source and the compiler's message."""
    if self.ld is not None:
      try:
        proc = _run_to_bytes(self.cc + ["-c"] + self.flags + ["-x", "c", "-", "-o"], src)
      except OSError as e:
        raise CompileError(f"could not run the C compiler {self.cc[0]!r}: {e}", src) from e
      if proc.returncode != 0:
        raise CompileError(f"{' '.join(self.cc)} failed (exit {proc.returncode}):\n{proc.stderr.decode(errors='replace').strip()}", src)
      if (lib := _link_shared(self.ld, proc.stdout)) is not None:
        return lib
      # the linker could not be run on its own here (an unusual toolchain layout): let the driver link from now on
      self.ld = None
    cmd = self.cc + ["-shared"] + self.flags + ["-x", "c", "-", "-lm", "-o"]
    try:
      proc = _run_to_bytes(cmd, src)
    except OSError as e:
      raise CompileError(f"could not run the C compiler {self.cc[0]!r}: {e}", src) from e
    if proc.returncode != 0:
      raise CompileError(f"{' '.join(self.cc)} failed (exit {proc.returncode}):\n{proc.stderr.decode(errors='replace').strip()}", src)
    return proc.stdout


# ***** LLVM *****

@functools.lru_cache(None)
def init_llvm() -> Any:
  """Initialize llvmlite's native target once; returns the llvmlite.binding module."""
  import llvmlite.binding as llvm
  for fn in ("initialize_all_targets", "initialize_all_asmprinters", "initialize_native_target", "initialize_native_asmprinter",
             "initialize_native_asmparser"):
    if hasattr(llvm, fn):
      getattr(llvm, fn)()
  # conversions LLVM lowers to runtime calls on some CPUs (double -> half, half <-> float without F16C) live in libgcc;
  # MCJIT resolves symbols from libraries loaded permanently, so make it one of them
  import ctypes.util
  for lib in (ctypes.util.find_library("gcc_s"), "libgcc_s.so.1"):
    if lib:
      try:
        llvm.load_library_permanently(lib)
        break
      except RuntimeError:
        pass
  return llvm


def host_target_machine(opt: int = 2) -> Any:
  """A fresh TargetMachine for the host CPU (MCJIT engines take ownership of theirs: never share one)."""
  llvm = init_llvm()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=opt, reloc="pic", codemodel="default", jit=False)


class LLVMCompiler(Compiler):
  """LLVM IR text -> optimized native object bytes (ELF relocatable), for the host CPU."""

  def __init__(self, cachekey: str = "compile_llvm", opt: int = 2):
    llvm = init_llvm()
    self.opt = opt
    self.tm = host_target_machine(opt)
    # the object code depends on the LLVM version and the host CPU's features, not only its name
    ident = f"{llvm.llvm_version_info}|{llvm.get_host_cpu_features().flatten()}"
    super().__init__(f"{cachekey}_{llvm.get_host_cpu_name()}_O{opt}_{hashlib.sha256(ident.encode()).hexdigest()[:12]}")

  def optimize(self, src: str) -> Any:
    """Parse and run the O2/O3 pipeline of the new pass manager; returns the llvmlite module."""
    llvm = init_llvm()
    try:
      mod = llvm.parse_assembly(src)
      mod.verify()
    except RuntimeError as e:
      raise CompileError(f"LLVM rejected the IR:\n{e}", src) from e
    if hasattr(llvm, "create_pipeline_tuning_options"):
      pto = llvm.create_pipeline_tuning_options(speed_level=self.opt)
      pto.loop_vectorization = True
      pto.slp_vectorization = True
      pb = llvm.create_pass_builder(self.tm, pto)
      pb.getModulePassManager().run(mod, pb)
    return mod

  def compile(self, src: str) -> bytes:
    """Optimize and emit an object file; a failure raises CompileError with the numbered IR."""
    mod = self.optimize(src)
    try:
      return bytes(self.tm.emit_object(mod))
    except RuntimeError as e:
      raise CompileError(f"LLVM code generation failed:\n{e}", src) from e
