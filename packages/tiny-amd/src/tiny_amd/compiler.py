"""HIPCompiler: HIP C++ -> an AMD GPU code object (an ELF shared object) with clang, without a GPU or ROCm.

clang compiles the device side only (`--cuda-device-only --no-gpu-bundle-output`), with no HIP headers and no device
library (`-nogpuinc -nogpulib`): HIPRenderer's kernels declare everything they use. clang links the object with lld
into the code object that hipModuleLoadData takes. Debian's clang-15/16/19 (and lld of the same version) do it; clang 14
does not know the HIP device-only flags.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from typing import List, Optional

from tiny.backend import CompileError, Compiler

from tiny_amd.renderer import default_arch, normalize_arch

# newest first: gfx942 needs clang 19; every one of these targets gfx90a and gfx1100
CLANG_NAMES = ("clang-19", "clang-18", "clang-17", "clang-16", "clang-15")


class AMDToolchainError(RuntimeError):
  """No clang that can compile HIP device code for AMD GPUs was found."""


def has_lld(clang: str) -> bool:
  """Whether the linker clang runs for amdgcn (`lld` beside the real clang binary, as Debian's lld-N installs it) exists."""
  bindir = os.path.dirname(os.path.realpath(clang))
  return any(os.path.exists(os.path.join(bindir, n)) for n in ("lld", "ld.lld"))


def find_clang() -> str:
  """The clang used for AMD: AMD_CLANG from the environment, else the newest of clang-19 ... clang-15 on PATH that has its lld."""
  if want := os.environ.get("AMD_CLANG", ""):
    if (path := shutil.which(want)) is None:
      raise AMDToolchainError(f"AMD_CLANG={want} is not an executable on PATH")
    return path
  found = [p for name in CLANG_NAMES if (p := shutil.which(name)) is not None]
  for path in found:
    if has_lld(path):
      return path
  without = f" ({', '.join(os.path.basename(p) for p in found)} found, but not the lld of the same version)" if found else ""
  raise AMDToolchainError(f"no clang for AMD GPUs found (tried {', '.join(CLANG_NAMES)} on PATH{without}): install clang-16 and lld-16 "
                          "(apt-get install clang-16 lld-16), or point AMD_CLANG at one")


@functools.lru_cache(None)
def clang_version(path: str) -> str:
  """The first line of `clang --version` (part of the cache key: another clang writes other code)."""
  out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
  return out.splitlines()[0].strip() if out else os.path.basename(path)


def clang_args(clang: str, arch: str, out: str) -> List[str]:
  """The command line that compiles HIP from stdin to the code object `out` for `arch`."""
  return [clang, "-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpulib", "-nogpuinc", f"--offload-arch={arch}", "-O3",
          "-std=c++17", "-w", "-", "-o", out]


class HIPCompiler(Compiler):
  """HIP C++ -> code object for one AMD architecture with clang. Works without a GPU."""

  def __init__(self, arch: Optional[str] = None, clang: Optional[str] = None):
    self.arch = normalize_arch(arch) if arch is not None else default_arch()
    self.clang = clang or find_clang()
    version = "".join(c if c.isalnum() else "_" for c in clang_version(self.clang))[:60]
    super().__init__(f"compile_hip_{self.arch}_{version}")

  def compile(self, src: str) -> bytes:
    """The code object of src. Raises CompileError with the numbered source and clang's messages when clang rejects it."""
    with tempfile.TemporaryDirectory(prefix="tiny_amd_") as tmp:
      out = os.path.join(tmp, "kernel.co")
      try:
        # clang's HIP driver makes a scratch folder per stdin compile in TMPDIR and never removes it: keep it inside ours
        env = {**os.environ, "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp}
        r = subprocess.run(clang_args(self.clang, self.arch, out), input=src.encode(), capture_output=True, timeout=300, check=False,
                           env=env)
      except subprocess.TimeoutExpired as e:
        raise CompileError(f"clang ({self.arch}) took longer than {e.timeout}s", src) from e
      if r.returncode != 0 or not os.path.exists(out):
        raise CompileError(f"clang ({os.path.basename(self.clang)}, {self.arch}) rejected the kernel:\n"
                           f"{r.stderr.decode(errors='replace').strip()}", src)
      with open(out, "rb") as f:
        return f.read()

