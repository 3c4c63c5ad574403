"""Compilers for CUDA that need no GPU and no driver: NVRTC (CUDA C -> CUBIN or PTX) and nvJitLink (PTX -> CUBIN).

Both libraries come from NVIDIA's pip wheels (`nvidia-cuda-nvrtc-cu12`, `nvidia-nvjitlink-cu12`); the CUDA headers
NVRTC needs (`cuda_fp16.h`, `cuda_bf16.h`) come from `nvidia-cuda-runtime-cu12`. A system CUDA toolkit is used when
the wheels are missing. The libraries are bound here with ctypes: loading them never touches libcuda.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import importlib.util
import os
import re
from typing import Any, List, Optional, Tuple

from tiny.backend import CompileError, Compiler, getenv

DEFAULT_ARCH = "sm_80"


class CUDAToolchainError(RuntimeError):
  """A CUDA compiler library (NVRTC, nvJitLink) or the CUDA headers cannot be found."""


# *** finding the libraries ***

def _nvidia_dirs(sub: str) -> List[str]:
  """site-packages/nvidia/<sub> of every installed nvidia wheel namespace (there may be several site dirs)."""
  spec = importlib.util.find_spec("nvidia")
  if spec is None or spec.submodule_search_locations is None:
    return []
  return [os.path.join(p, sub) for p in spec.submodule_search_locations if os.path.isdir(os.path.join(p, sub))]


def _toolkit_dirs(sub: str) -> List[str]:
  roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
  return [os.path.join(r, sub) for r in roots if r and os.path.isdir(os.path.join(r, sub))]


def _load(what: str, wheel: str, patterns: List[str]) -> ctypes.CDLL:
  """Load a library from its pip wheel, else from a CUDA toolkit, else from the loader path; RTLD_GLOBAL so that other
  bindings of the same library (gpuctypes) find its symbols."""
  # CUDA 12 wheels keep each library in nvidia/<wheel>/lib, CUDA 13 wheels share nvidia/cu13/lib
  wheel_dirs = _nvidia_dirs(f"{wheel}/lib") + _nvidia_dirs("cu13/lib") + _nvidia_dirs("cu12/lib")
  candidates = [os.path.join(d, p) for d in wheel_dirs for p in patterns]
  candidates += [os.path.join(d, p) for d in _toolkit_dirs("lib64") for p in patterns]
  found = [f for c in candidates for f in sorted(glob.glob(c), reverse=True)]
  errors = []
  for path in found + [p.replace("*", "") for p in patterns]:
    try:
      # NVRTC 13 dlopens its builtins library by name: load the one beside it first, or a wheel-only install fails
      for companion in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*"))) if "nvrtc" in path else []:
        ctypes.CDLL(companion, mode=ctypes.RTLD_GLOBAL)
      return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
      errors.append(f"{path}: {e}")
  raise CUDAToolchainError(f"{what} not found: pip install nvidia-{wheel.replace('_', '-')}-cu12 (tried {', '.join(errors) or 'nothing'})")


@functools.lru_cache(None)
def cuda_include_dir() -> str:
  """The directory holding cuda_fp16.h / cuda_bf16.h (the nvidia-cuda-runtime-cu12 wheel's include/, else a toolkit's)."""
  for d in _nvidia_dirs("cuda_runtime/include") + _nvidia_dirs("cu13/include") + _nvidia_dirs("cu12/include") + _toolkit_dirs("include"):
    if os.path.isfile(os.path.join(d, "cuda_fp16.h")):
      return d
  raise CUDAToolchainError("the CUDA headers (cuda_fp16.h) were not found: pip install nvidia-cuda-runtime-cu12")


# *** NVRTC ***

_c_p = ctypes.c_void_p
_c_charp = ctypes.c_char_p


@functools.lru_cache(None)
def nvrtc() -> ctypes.CDLL:
  """libnvrtc with the argument types of the functions used here."""
  lib = _load("NVRTC (libnvrtc)", "cuda_nvrtc", ["libnvrtc.so.1*", "libnvrtc.so"])
  sig = {
    "nvrtcCreateProgram": [ctypes.POINTER(_c_p), _c_charp, _c_charp, ctypes.c_int, ctypes.POINTER(_c_charp), ctypes.POINTER(_c_charp)],
    "nvrtcCompileProgram": [_c_p, ctypes.c_int, ctypes.POINTER(_c_charp)],
    "nvrtcDestroyProgram": [ctypes.POINTER(_c_p)],
    "nvrtcGetProgramLogSize": [_c_p, ctypes.POINTER(ctypes.c_size_t)], "nvrtcGetProgramLog": [_c_p, _c_charp],
    "nvrtcGetCUBINSize": [_c_p, ctypes.POINTER(ctypes.c_size_t)], "nvrtcGetCUBIN": [_c_p, _c_charp],
    "nvrtcGetPTXSize": [_c_p, ctypes.POINTER(ctypes.c_size_t)], "nvrtcGetPTX": [_c_p, _c_charp],
    "nvrtcVersion": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
    "nvrtcGetErrorString": [ctypes.c_int],
  }
  for name, args in sig.items():
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = args, ctypes.c_int
  lib.nvrtcGetErrorString.restype = _c_charp
  return lib


def nvrtc_version() -> Tuple[int, int]:
  """(major, minor) of the loaded NVRTC."""
  major, minor = ctypes.c_int(), ctypes.c_int()
  nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return major.value, minor.value


def _read(getsize: Any, get: Any, prog: ctypes.c_void_p) -> bytes:
  size = ctypes.c_size_t()
  getsize(prog, ctypes.byref(size))
  buf = ctypes.create_string_buffer(size.value)
  get(prog, buf)
  return buf.raw[:size.value]


def normalize_arch(arch: str) -> str:
  """'sm_80', '80', 'sm80' or 'compute_80' -> 'sm_80'; anything else raises ValueError."""
  m = re.fullmatch(r"(?:sm_?|compute_)?(\d{2,3}[a-z]?)", arch.strip())
  if m is None:
    raise ValueError(f"not a CUDA architecture: {arch!r} (expected something like sm_80 or sm_90)")
  return f"sm_{m.group(1)}"


def default_arch() -> str:
  """CUDA_ARCH from the environment (sm_XX), else sm_80: the target when no GPU tells us its compute capability."""
  return normalize_arch(getenv("CUDA_ARCH", DEFAULT_ARCH))


def arch_and_tensor_cores(arch: Optional[str]) -> Tuple[str, List[Any]]:
  """The normalized target (default_arch() when None) and its tensor cores: mma.sync needs sm_80 or newer."""
  from tiny_cuda.renderer import cuda_tensor_cores
  target = normalize_arch(arch) if arch is not None else default_arch()
  return target, (cuda_tensor_cores() if int(target[3:5]) >= 80 else [])


class NVRTCCompiler(Compiler):
  """CUDA C -> CUBIN (or PTX with ptx=True) with NVRTC, for one GPU architecture. Works without a GPU or a driver."""

  def __init__(self, arch: Optional[str] = None, ptx: bool = False, extra_options: Optional[List[str]] = None):
    self.arch, self.ptx = normalize_arch(arch) if arch is not None else default_arch(), ptx
    self.options = [f"--gpu-architecture={self.arch if not ptx else self.arch.replace('sm_', 'compute_')}", f"-I{cuda_include_dir()}",
                    "-default-device"] + list(extra_options or [])
    major, minor = nvrtc_version()
    # NVRTC 13 dropped the C++14 dialect; the kernels are plain C++ that either dialect accepts
    self.options.insert(2, "--std=c++17" if major >= 13 else "--std=c++14")
    # extra options (and the header directory) change the output: they are part of the cache key
    opts_id = hashlib.sha256("\0".join(self.options).encode()).hexdigest()[:12]
    super().__init__(f"compile_nvrtc{major}{minor}_{self.arch}{'_ptx' if ptx else ''}_{opts_id}")

  def compile(self, src: str) -> bytes:
    """The CUBIN (or PTX text) of src. Raises CompileError with the source and NVRTC's log when NVRTC rejects it."""
    lib = nvrtc()
    prog = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"<tiny>", 0, None, None)
    if status != 0:
      raise CompileError(f"nvrtcCreateProgram failed: {lib.nvrtcGetErrorString(status).decode()}", src)
    try:
      opts = (ctypes.c_char_p * len(self.options))(*[o.encode() for o in self.options])
      status = lib.nvrtcCompileProgram(prog, len(self.options), opts)
      if status != 0:
        log = _read(lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog, prog).decode(errors="replace").rstrip("\x00")
        raise CompileError(f"NVRTC ({self.arch}) rejected the kernel: {lib.nvrtcGetErrorString(status).decode()}\n{log}", src)
      if self.ptx:
        return _read(lib.nvrtcGetPTXSize, lib.nvrtcGetPTX, prog).rstrip(b"\x00")
      return _read(lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN, prog)
    finally:
      lib.nvrtcDestroyProgram(ctypes.byref(prog))


# *** nvJitLink ***

NVJITLINK_INPUT_PTX = 2


@functools.lru_cache(None)
def nvjitlink() -> Tuple[ctypes.CDLL, str]:
  """libnvJitLink and the newest versioned suffix of its entry points ('_12_9'): the header maps nvJitLinkCreate to
  __nvJitLinkCreate_12_X, so there are no unversioned symbols to bind."""
  lib = _load("nvJitLink (libnvJitLink)", "nvjitlink", ["libnvJitLink.so.1*", "libnvJitLink.so"])
  suffix = next((f"_{major}_{minor}" for major in range(14, 11, -1) for minor in range(20, -1, -1)
                 if hasattr(lib, f"__nvJitLinkCreate_{major}_{minor}")), None)
  if suffix is None:
    raise CUDAToolchainError("libnvJitLink has no __nvJitLinkCreate_* entry point this binding knows")
  return lib, suffix


def _jl(name: str) -> Any:
  lib, suffix = nvjitlink()
  fn = getattr(lib, f"__nvJitLink{name}{suffix}")
  fn.restype = ctypes.c_int
  return fn


def _jl_log(handle: ctypes.c_void_p, kind: str) -> str:
  size = ctypes.c_size_t()
  if _jl(f"Get{kind}LogSize")(handle, ctypes.byref(size)) != 0 or size.value == 0:
    return ""
  buf = ctypes.create_string_buffer(size.value)
  _jl(f"Get{kind}Log")(handle, buf)
  return buf.value.decode(errors="replace")


class PTXCompiler(Compiler):
  """PTX text -> CUBIN with nvJitLink, in process. `.target` in the PTX is rewritten to this compiler's architecture."""

  def __init__(self, arch: Optional[str] = None):
    self.arch = normalize_arch(arch) if arch is not None else default_arch()
    _, suffix = nvjitlink()
    super().__init__(f"compile_nvjitlink{suffix}_{self.arch}")

  def compile(self, src: str) -> bytes:
    """The CUBIN of the PTX src. Raises CompileError with nvJitLink's log when the PTX is rejected."""
    ptx = re.sub(r"^\.target\s+\S+", f".target {self.arch}", src, count=1, flags=re.MULTILINE)
    data = ptx.encode() + b"\x00"
    handle = ctypes.c_void_p()
    opts = (ctypes.c_char_p * 1)(f"-arch={self.arch}".encode())
    if (status := _jl("Create")(ctypes.byref(handle), ctypes.c_uint32(1), opts)) != 0:
      raise CompileError(f"nvJitLinkCreate failed with status {status} for {self.arch}", src)
    try:
      # AddData is where bad PTX is reported: Complete may still "succeed" afterwards, with an empty CUBIN
      status = _jl("AddData")(handle, ctypes.c_int(NVJITLINK_INPUT_PTX), data, ctypes.c_size_t(len(data)), b"tiny.ptx")
      if status != 0:
        raise CompileError(f"nvJitLink ({self.arch}) rejected the PTX (status {status}):\n{_jl_log(handle, 'Error')}", ptx)
      if (status := _jl("Complete")(handle)) != 0:
        raise CompileError(f"nvJitLink ({self.arch}) could not link the PTX (status {status}):\n{_jl_log(handle, 'Error')}", ptx)
      size = ctypes.c_size_t()
      if _jl("GetLinkedCubinSize")(handle, ctypes.byref(size)) != 0 or size.value == 0:
        raise CompileError(f"nvJitLink ({self.arch}) produced no CUBIN:\n{_jl_log(handle, 'Error')}", ptx)
      out = ctypes.create_string_buffer(size.value)
      if (status := _jl("GetLinkedCubin")(handle, out)) != 0:
        raise CompileError(f"nvJitLinkGetLinkedCubin failed with status {status}", ptx)
      return out.raw
    finally:
      _jl("Destroy")(ctypes.byref(handle))
