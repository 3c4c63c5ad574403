"""Compilers of the CPU devices: C source to a shared object (clang, else cc/gcc) and LLVM IR to a native object (llvmlite)."""
from __future__ import annotations

import atexit
import functools
import hashlib
import os
import platform
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import IO, Any, Dict, List, Optional, Sequence, Set, Tuple, cast

from tiny.backend import CompileError, Compiler

from tiny_clang.settings import LLVM_WORKERS

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


def _link_fd(ld: str, fd: int, extra: Sequence[str] = (), pass_fds: Tuple[int, ...] = ()) -> Optional[bytes]:
  """The object in memfd `fd` linked into a shared object by ld; None when ld fails. `extra` goes before the object.

  An object that references nothing outside itself (most kernels) is linked alone: reading the symbol tables of libc and
  libm is most of ld's time, and they would add nothing but two DT_NEEDED entries. An object that calls into them (memset,
  expf, ...) is linked against libm and libc, like the driver does."""
  cmd = [ld, "-shared", *extra, f"/proc/self/fd/{fd}"]
  try:
    proc = _run_to_bytes(cmd + ["-z", "defs", "-o"], "", pass_fds=(fd,) + tuple(pass_fds))
    if proc.returncode != 0 or not proc.stdout:
      proc = _run_to_bytes(cmd + ["-lm", "-lc", "-o"], "", pass_fds=(fd,) + tuple(pass_fds))
  except OSError:
    return None
  return proc.stdout if proc.returncode == 0 and proc.stdout else None


def _memfd_with(name: str, data: bytes) -> int:
  fd = os.memfd_create(name)
  os.write(fd, data)
  return fd


def _link_shared(ld: str, obj: bytes) -> Optional[bytes]:
  """obj linked into a shared object by ld (see _link_fd); None when ld fails."""
  fd = _memfd_with("tiny_clang_obj", obj)
  try:
    return _link_fd(ld, fd)
  finally:
    os.close(fd)


# *** many kernels in one compiler process ***

_DIRECTIVE = re.compile(r"#\s*(\w+)\s*(\w*)")
_TYPEDEF = re.compile(r"typedef\s+[^;()]*?\b([A-Za-z_]\w*)\s*(?:__attribute__\s*\(\(.*\)\))?\s*;\s*$")
# a definition may start with GNU attributes (the renderer puts `__attribute__((min_vector_width(512)))` on 512-bit kernels):
# arguments nest one level of parentheses deep at most, and `static` may come before or after them
_ATTRS = r"(?:__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)\s*)*"
_FUNCTION = re.compile(_ATTRS + r"(static\s+)?" + _ATTRS + r"[A-Za-z_][\w\s*]*?\b([A-Za-z_]\w*)\s*\(.*\)\s*\{")
_VARIABLE = re.compile(_ATTRS + r"(static\s+)?" + _ATTRS + r"[A-Za-z_][\w\s*]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*(?:=.*)?;\s*$")
# preprocessor lines a kernel may hold at file scope; anything else (#include, #line, ...) keeps the source out of a batch
_PASSIVE_DIRECTIVES = {"if", "ifdef", "ifndef", "elif", "else", "endif", "pragma", "error", "warning", "undef"}


@dataclass(frozen=True)
class FileScope:
  """The names a C source defines at file scope: `names` (every one, to rename), `exported` (the non-static functions
  and variables a runtime looks up) and `macros` (#defines, undone after the source)."""

  names: Tuple[str, ...]
  exported: Tuple[str, ...]
  macros: Tuple[str, ...]


def file_scope(src: str) -> Optional[FileScope]:
  """The file-scope definitions of src, or None when src holds a form this reader does not know for sure.

  It reads the layout renderers emit: one definition per line at column 0, bodies indented or closed by a line starting
  with `}`. None only means "compile it alone": a batch never has to understand every source."""
  names: Dict[str, None] = {}
  exported: Dict[str, None] = {}
  macros: Dict[str, None] = {}
  for line in src.splitlines():
    if not line or line[0] in " \t}":
      continue
    if line[0] == "#":
      if (d := _DIRECTIVE.match(line)) is None:
        return None
      if d.group(1) == "define" and d.group(2):
        macros[d.group(2)] = None
      elif d.group(1) not in _PASSIVE_DIRECTIVES:
        return None
    elif line.startswith("typedef"):
      if (m := _TYPEDEF.match(line)) is None:
        return None
      names[m.group(1)] = None
    elif (m := _FUNCTION.match(line) or _VARIABLE.match(line)) is not None:
      names[m.group(2)] = None
      if m.group(1) is None:
        exported[m.group(2)] = None
    else:
      return None
  if not exported or set(macros) & set(names):
    return None
  return FileScope(tuple(names), tuple(exported), tuple(macros))


def batch_prefix(i: int) -> str:
  """What source i of a batch has in front of each of its file-scope names inside the batch's translation unit."""
  return f"tiny_b{i}_"


def batch_source(srcs: Sequence[str], scopes: Sequence[FileScope]) -> str:
  """One translation unit holding every source, each one's file-scope names renamed (a macro per name around it), so
  equal kernel or helper names in two sources never meet. Macros a source defines are undone after it."""
  out: List[str] = []
  for i, (src, scope) in enumerate(zip(srcs, scopes)):
    out += [f"#define {n} {batch_prefix(i)}{n}" for n in scope.names]
    out.append(src)
    out += [f"#undef {n}" for n in scope.names + scope.macros]
  return "\n".join(out) + "\n"


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

  # the engine hands over at most this many sources at once: 8 already spread the compiler's start over enough kernels,
  # while every link reads the whole batch object and the last batches of a first call are waited for
  max_batch = 8
  # and when it shares out the last sources, no fewer than this many per batch: each one starts a compiler process,
  # which costs about as much as compiling a small kernel
  min_share = 4

  def compile_many(self, srcs: Sequence[str]) -> List[Optional[bytes]]:
    """Shared objects of many sources from ONE compiler process, the same code compile() gives each of them.

    Starting clang costs about as much as compiling a small kernel, so the sources become one translation unit (each
    one's file-scope names renamed, see batch_source), compiled with a section per function, and the linker cuts shared
    objects out of it: one per group of sources whose exported names differ (see link_groups), with only the group's
    sections and its exported names aliased back to the originals.
    A source the batch cannot take (see file_scope), a batch that fails, or a link that fails goes through compile()
    alone; None marks a source that does not compile at all (compile() raises its error). A subclass or a patch that
    replaces compile() is honoured: then every source goes through it."""
    if self.ld is None or len(srcs) < 2 or type(self).compile is not _CLANG_COMPILE:
      return super().compile_many(srcs)
    scopes = [file_scope(s) for s in srcs]
    todo = [i for i, sc in enumerate(scopes) if sc is not None]
    libs: List[Optional[bytes]] = [None] * len(srcs)
    for start in range(0, len(todo), self.max_batch):
      part = todo[start:start + self.max_batch]
      if len(part) < 2:
        continue
      got = self._compile_batch([srcs[i] for i in part], [cast(FileScope, scopes[i]) for i in part])
      for i, lib in zip(part, got):
        libs[i] = lib
    for i, src in enumerate(srcs):
      if libs[i] is None:
        libs[i] = super().compile_many([src])[0]
    return libs

  def _compile_batch(self, srcs: Sequence[str], scopes: Sequence[FileScope]) -> List[Optional[bytes]]:
    """Per source, its shared object cut out of one compiled batch; None where that failed (all of them when the batch
    did not compile)."""
    assert self.ld is not None
    try:
      proc = _run_to_bytes(self.cc + ["-c"] + self.flags + ["-ffunction-sections", "-fdata-sections", "-x", "c", "-", "-o"],
                           batch_source(srcs, scopes))
    except OSError:
      return [None] * len(srcs)
    if proc.returncode != 0 or not proc.stdout:
      return [None] * len(srcs)
    libs: List[Optional[bytes]] = [None] * len(srcs)
    obj_fd = _memfd_with("tiny_clang_batch", proc.stdout)
    try:
      for group in link_groups(scopes):
        lib = self._link_group(obj_fd, [(i, scopes[i]) for i in group]) if len(group) > 1 else None
        for i in group:
          # a group whose link failed is linked one source at a time, as a batch without groups would be
          libs[i] = lib if lib is not None else self._link_group(obj_fd, [(i, scopes[i])])
    finally:
      os.close(obj_fd)
    return libs

  def _link_group(self, obj_fd: int, members: Sequence[Tuple[int, FileScope]]) -> Optional[bytes]:
    """One shared object holding the batch sources `members` (index in the batch, scope): only their sections are kept
    (--gc-sections keeps what the exported names reach), and only their exported names leave it (the version script),
    each under its own name. None when ld fails."""
    assert self.ld is not None
    exported = [n for _, scope in members for n in scope.exported]
    vfd = _memfd_with("tiny_clang_exports", f"{{ global: {'; '.join(exported)}; local: *; }};".encode())
    try:
      aliases = [f"--defsym={n}={batch_prefix(i)}{n}" for i, scope in members for n in scope.exported]
      return _link_fd(self.ld, obj_fd, ["--gc-sections", f"--version-script=/proc/self/fd/{vfd}", *aliases], (vfd,))
    finally:
      os.close(vfd)


def link_groups(scopes: Sequence[FileScope]) -> List[List[int]]:
  """The sources of a batch (by index) in groups that share one shared object, in order; no two sources of a group
  export the same name.

  Each run of ld costs a process start and a read of the whole batch object, ~5 ms per kernel at a first call: a group is
  linked once and every source of it gets the same shared object, which holds the machine code of the group's kernels
  (each one the code compile() gives it) and exports their names. A runtime looks up the names of its own kernel, which
  no other kernel of the group has. Kernels of one model often share a name (`E_4_16` with another constant), so the
  sources are spread over as few groups as their names allow."""
  groups: List[Tuple[List[int], Set[str]]] = []
  for i, scope in enumerate(scopes):
    names = set(scope.exported)
    for members, taken in groups:
      if not names & taken:
        members.append(i)
        taken |= names
        break
    else:
      groups.append(([i], names))
  return [members for members, _ in groups]


# compile() as defined here: compile_many batches only while compile() is this one, not a subclass's or a patched one
_CLANG_COMPILE = ClangCompiler.compile


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

  # compile_many runs in the engine's compile threads while the main thread renders the next kernels (see below)
  parallel_compile = True
  # the engine hands over at most this many sources at once: a helper comes back to the pool between batches, so at the
  # end of rendering what is left spreads over every helper instead of waiting behind one long batch
  max_batch = 8

  def compile_many(self, srcs: Sequence[str]) -> List[Optional[bytes]]:
    """Objects of many sources, compiled by a helper process (see _LLVMWorker): exactly what compile() gives each one.

    llvmlite lets go of the GIL inside LLVM, but it runs every LLVM call of the process under one lock, and each of the
    ~20 calls of a compile has to win the GIL back from the thread that renders Python (up to 5 ms each): compiled in a
    thread of this process, a kernel takes about twice its CPU time. A helper process runs LLVM on another core with
    neither. A small batch with no helper running yet is compiled here (starting one costs ~0.3 CPU-s), as is everything
    when helpers cannot run (TINY_LLVM_WORKERS=0, no Python executable, a helper that dies at start) and for a subclass
    or a patched compile()/optimize() (a helper builds a plain LLVMCompiler, which would not honour them). None marks a
    source that did not compile (compile() alone raises its error), or one that made two helpers die."""
    if type(self) is not LLVMCompiler or LLVMCompiler.compile is not _LLVM_COMPILE or LLVMCompiler.optimize is not _LLVM_OPTIMIZE:
      return super().compile_many(srcs)
    libs: List[Optional[bytes]] = []
    worker = _WORKERS.take(self.opt, start=len(srcs) >= _WORKERS.start_batch)
    tries = 0
    while len(libs) < len(srcs):
      if worker is None:
        libs += super().compile_many(srcs[len(libs):])
        break
      try:
        libs.append(worker.compile(srcs[len(libs)]))
        tries = 0
      except _WorkerDied:
        # the helper could have died of something else (killed from outside): the source gets a second helper, and
        # None only when that one dies on it too (compiling it in this process would likely take this process down)
        _WORKERS.discard(worker)
        if (tries := tries + 1) == 2:
          libs.append(None)
          tries = 0
        worker = _WORKERS.take(self.opt, start=True)
    if worker is not None:
      _WORKERS.give_back(worker)
    return libs


# the methods as defined here: compile_many hands work to helper processes only while these are the ones in use
_LLVM_COMPILE = LLVMCompiler.compile
_LLVM_OPTIMIZE = LLVMCompiler.optimize


# ***** LLVM compiles in helper processes *****

class _WorkerDied(Exception):
  """The helper process exited (or stopped talking) before answering."""


def _write_msg(f: IO[bytes], data: bytes) -> None:
  f.write(struct.pack("<Q", len(data)) + data)
  f.flush()


def _read_msg(f: IO[bytes]) -> Optional[bytes]:
  """One length-prefixed message, or None at end of file (the other side is gone)."""
  head = f.read(8)
  if len(head) < 8:
    return None
  n = struct.unpack("<Q", head)[0]
  data = f.read(n)
  return data if len(data) == n else None


def llvm_worker_main() -> None:
  """The loop of a helper process: LLVM IR in (stdin), b"\\x01" + its object or b"\\x00" when it does not compile out.

  The protocol runs on a private copy of stdout; fd 1 itself goes to stderr, so a stray print cannot corrupt it. Ctrl-C
  is the parent's to handle: the helper ends when its stdin closes, which also happens when the parent dies."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  out = os.fdopen(os.dup(1), "wb")
  os.dup2(2, 1)
  comp = LLVMCompiler(opt=int(sys.argv[1]))
  _write_msg(out, b"ready")
  while (msg := _read_msg(sys.stdin.buffer)) is not None:
    try:
      reply = b"\x01" + comp.compile(msg.decode())
    except Exception:  # noqa: BLE001 - the parent compiles it again in process, which raises the error where it belongs
      reply = b"\x00"
    _write_msg(out, reply)


class _LLVMWorker:
  """A Python process running llvm_worker_main for one opt level; it imports the parent's tiny_clang (same sys.path)."""

  def __init__(self, opt: int):
    self.opt, self.ready = opt, False
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    self.proc = subprocess.Popen([sys.executable, "-c", "from tiny_clang.compiler import llvm_worker_main; llvm_worker_main()",
                                  str(opt)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

  def compile(self, src: str) -> Optional[bytes]:
    """The object of src, None when it does not compile; raises _WorkerDied when the process is gone."""
    assert self.proc.stdin is not None and self.proc.stdout is not None
    try:
      if not self.ready:
        # the helper says "ready" once it imported everything: only then is a death the fault of a source
        if _read_msg(self.proc.stdout) != b"ready":
          raise _WorkerDied(f"it did not start (exit code {self.proc.poll()})")
        self.ready = True
      _write_msg(self.proc.stdin, src.encode())
      reply = _read_msg(self.proc.stdout)
    except (OSError, ValueError) as e:   # a broken pipe, or a pipe already closed
      raise _WorkerDied(str(e)) from e
    if not reply:
      raise _WorkerDied(f"exit code {self.proc.poll()}")
    return reply[1:] if reply[:1] == b"\x01" else None

  def close(self) -> None:
    """End the process: closing its stdin ends its loop; one that does not end soon is killed."""
    for f in (self.proc.stdin, self.proc.stdout):
      if f is not None:
        try:
          f.close()
        except OSError:   # what a dead helper never read cannot be flushed to it
          pass
    try:
      self.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()


class _WorkerPool:
  """The helper processes of this process: started on demand, idle ones kept for the next batch, all ended at exit.

  At most `limit` live at once (each holds ~100 MB); a batch that finds none free is compiled in process. When a helper
  dies before it is ready (it cannot import tiny_clang, say), helpers are off for good: every batch would pay a start
  for nothing."""

  # a batch at least this long starts a helper when none is idle: below, compiling in process costs less than the start
  start_batch = 4

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.idle: List[_LLVMWorker] = []
    self.live = 0
    self.broken = False
    # a forked child must not talk to its parent's helpers (two writers on one pipe): it starts its own. The parent's
    # stay referenced, so that the child neither closes nor waits for them.
    self.inherited: List[_LLVMWorker] = []
    if hasattr(os, "register_at_fork"):
      os.register_at_fork(after_in_child=self._forget_after_fork)

  def _forget_after_fork(self) -> None:
    self.lock = threading.Lock()
    self.inherited += self.idle
    self.idle, self.live = [], 0

  @property
  def limit(self) -> int:
    if LLVM_WORKERS.value >= 0:
      return LLVM_WORKERS.value
    # one per core, as many as the engine's compile threads, so that no batch waits for a helper or falls back to this
    # process, where it would share llvmlite's lock with the loading of finished kernels
    return max(1, min(4, os.cpu_count() or 1))

  def take(self, opt: int, start: bool) -> Optional[_LLVMWorker]:
    """An idle helper for opt, else a new one when `start` and the limit allow it, else None."""
    with self.lock:
      for i, w in enumerate(self.idle):
        if w.opt == opt:
          return self.idle.pop(i)
      if not start or self.broken or self.live >= self.limit or not sys.executable:
        return None
      self.live += 1
    try:
      return _LLVMWorker(opt)
    except OSError:
      with self.lock:
        self.live -= 1
        self.broken = True
      return None

  def give_back(self, w: _LLVMWorker) -> None:
    with self.lock:
      self.idle.append(w)

  def discard(self, w: _LLVMWorker) -> None:
    """Forget a helper that died."""
    with self.lock:
      self.live -= 1
      self.broken = self.broken or not w.ready
    w.close()

  def close(self) -> None:
    """End every idle helper. One still busy at exit ends by itself: its stdin closes when this process is gone."""
    with self.lock:
      idle, self.idle = self.idle, []
      self.live -= len(idle)
    for w in idle:
      w.close()


_WORKERS = _WorkerPool()
atexit.register(_WORKERS.close)
