"""Syntax-checking MSL without macOS: clang >= 15 in C++17 mode with `msl_shim.h` standing in for `<metal_stdlib>`.

No Metal compiler runs off macOS, so this is the strongest check available elsewhere: it catches undeclared or misspelled
names, vector constructors with the wrong number of components, bad swizzles, unknown attributes, as_type between sizes
and C++ type errors (see msl_shim.h for what it cannot catch). `check_msl` checks one kernel; `check_msl_batch` checks many
in one clang run (each in its own namespace) and, when that fails, each alone so the error names the culprits.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from typing import List, Optional, Sequence, Tuple

from tiny.backend import CompileError

MIN_CLANG = 15
CLANG_CANDIDATES = ("clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang")
SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "msl_shim.h")
CLANG_FLAGS = ["-x", "c++", "-std=c++17", "-fsyntax-only", "-Werror=unknown-attributes", "-Wno-unused-value", "-ferror-limit=50"]
_STDLIB_INCLUDE = re.compile(r"^\s*#\s*include\s*<metal_stdlib>\s*$", re.M)


class MSLSyntaxError(CompileError):
  """clang rejected an MSL kernel under the shim (`.compiler_msg` holds clang's diagnostics)."""


class NoMSLChecker(RuntimeError):
  """No clang >= 15 is installed, so MSL cannot be syntax-checked here."""


def clang_major(path: str) -> Optional[int]:
  """The major version of the clang at `path`, or None when it does not run."""
  try:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  m = re.search(r"clang version (\d+)", out)
  return int(m.group(1)) if m else None


@functools.lru_cache(None)
def find_clang() -> Optional[Tuple[str, int]]:
  """(path, major version) of the newest clang >= 15 on PATH (TINY_MSL_CLANG overrides), or None."""
  names = [os.environ["TINY_MSL_CLANG"]] if os.environ.get("TINY_MSL_CLANG") else list(CLANG_CANDIDATES)
  for name in names:
    if (path := shutil.which(name)) is not None and (major := clang_major(path)) is not None and major >= MIN_CLANG:
      return path, major
  return None


def checker_missing() -> Optional[str]:
  """Why MSL cannot be syntax-checked here, or None."""
  if find_clang() is None:
    return f"no clang >= {MIN_CLANG} on PATH (apt-get install clang-16) to syntax-check MSL"
  return None


def prepare(src: str) -> str:
  """The kernel as clang sees it: `#include <metal_stdlib>` blanked (the shim is force-included instead), so line numbers
  in clang's messages are the kernel's own."""
  return _STDLIB_INCLUDE.sub("", src)


def _run_clang(src: str) -> Tuple[int, str]:
  found = find_clang()
  if found is None:
    raise NoMSLChecker(checker_missing())
  with tempfile.TemporaryDirectory(prefix="tiny-msl-") as d:
    path = os.path.join(d, "kernel.metal")
    with open(path, "w") as f:
      f.write(src)
    r = subprocess.run([found[0], *CLANG_FLAGS, "-include", SHIM_PATH, path], capture_output=True, text=True, timeout=300)
  return r.returncode, (r.stdout + r.stderr).replace(path, "kernel.metal")


def check_msl(src: str) -> None:
  """Raise MSLSyntaxError (with clang's messages and the numbered source) when clang rejects the kernel; NoMSLChecker
  when there is no clang >= 15."""
  rc, log = _run_clang(prepare(src))
  if rc != 0:
    raise MSLSyntaxError(log.strip() or f"clang exited with {rc}", src)


def batch_source(srcs: Sequence[str]) -> str:
  """One C++ translation unit holding many kernels: kernel i in `namespace k<i>` so their helpers never collide."""
  return "\n".join(f"namespace k{i} {{\n{prepare(src)}\n}}" for i, src in enumerate(srcs)) + "\n"


def check_msl_batch(srcs: Sequence[str], names: Optional[Sequence[str]] = None) -> None:
  """check_msl for many kernels with one clang run; on failure every kernel is checked alone and the error lists each
  rejected kernel (by `names`, default its index) with clang's messages."""
  if not srcs:
    return
  rc, log = _run_clang(batch_source(srcs))
  if rc == 0:
    return
  labels = list(names) if names is not None else [str(i) for i in range(len(srcs))]
  failures: List[str] = []
  for label, src in zip(labels, srcs):
    try:
      check_msl(src)
    except MSLSyntaxError as e:
      failures.append(f"{label}:\n{e.compiler_msg}")
  raise MSLSyntaxError("\n".join(failures) if failures else f"rejected only together:\n{log}")
