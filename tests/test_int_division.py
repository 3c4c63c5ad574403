"""Integer // and % never crash and give numpy's answers on every device, for every integer dtype.

numpy defines what C leaves undefined (and x86 traps on with SIGFPE): x // 0 == 0, x % 0 == 0, MIN // -1 == MIN
(wrapping) and MIN % -1 == 0. For nonzero divisors tiny's `//` and `%` are numpy's (floor division, remainder with the
divisor's sign) and `Tensor.idiv` truncates toward zero like C. Each case runs on realized buffers (the kernel
divides) and on the constant-folding paths (LazyBuffer folding, UOp-graph folding of a divisor that becomes 0).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any, List, Tuple

import numpy as np
import pytest

from tiny import Device, Tensor
from tiny.codegen.uopgraph import UOpGraph
from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType, PtrDType, dtypes, to_np_dtype
from tiny.ops import BinaryOps, exec_alu

DEVICES = [d for d in Device.get_available_devices() if d in ("CLANG", "LLVM", "PYTHON")]
INT_DTYPES = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]
SIGNED = [dt for dt in INT_DTYPES if not dtypes.is_unsigned(dt)]


def _np(dt: DType) -> Any:
  return to_np_dtype(dt)


def _operands(dt: DType) -> Tuple[np.ndarray, np.ndarray]:
  """Every pair of (dividend, divisor) from values that hit the edges: MIN, MAX, 0, -1, small and odd values."""
  info = np.iinfo(_np(dt))
  xs = [info.min, info.min + 1, -7, -6, -1, 0, 1, 6, 7, info.max - 1, info.max]
  ys = [info.min, -7, -2, -1, 0, 1, 2, 3, 7, info.max]
  xs, ys = [v for v in xs if info.min <= v <= info.max], [v for v in ys if info.min <= v <= info.max]
  xg, yg = np.meshgrid(np.array(sorted(set(xs)), dtype=_np(dt)), np.array(sorted(set(ys)), dtype=_np(dt)), indexing="ij")
  return xg.reshape(-1), yg.reshape(-1)


def _np_floordiv(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  with np.errstate(all="ignore"):
    return np.floor_divide(x, y)


def _np_mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  with np.errstate(all="ignore"):
    return np.remainder(x, y)


def _np_truncdiv(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """C division built from numpy's floor division: one up where the floor rounded a negative inexact quotient."""
  with np.errstate(all="ignore"):
    q, r = np.floor_divide(x, y), np.remainder(x, y)
    step = (r != 0) & ((x < 0) != (y < 0))
    return np.where(step, q + np.array(1, dtype=x.dtype), q).astype(x.dtype)


def _check(got: Tensor, expected: np.ndarray, what: str) -> None:
  out = got.numpy()
  assert out.dtype == expected.dtype, f"{what}: dtype {out.dtype}, numpy {expected.dtype}"
  bad = np.nonzero(out != expected)[0]
  assert bad.size == 0, f"{what}: at {bad[:6].tolist()} got {out[bad[:6]].tolist()}, numpy {expected[bad[:6]].tolist()}"


# *** computed operands: the kernel divides by values it loads ***

@pytest.mark.parametrize("dt", INT_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_buffers(device: str, dt: DType) -> None:
  x, y = _operands(dt)
  a, b = Tensor(x, device=device).realize(), Tensor(y, device=device).realize()
  _check(a // b, _np_floordiv(x, y), f"{dt} //")
  _check(a % b, _np_mod(x, y), f"{dt} %")
  _check(a.idiv(b), _np_truncdiv(x, y), f"{dt} idiv")


@pytest.mark.parametrize("device", DEVICES)
def test_buffers_fused_with_upcast(device: str) -> None:
  # a 2-D kernel that the optimizer upcasts (several lanes per loop iteration, vectors on CPUs) with a 0/-1-rich divisor
  rng = np.random.default_rng(1)
  x = rng.integers(-2**31, 2**31, size=(16, 64), dtype=np.int64).astype(np.int32)
  y = rng.integers(-2, 3, size=(16, 64)).astype(np.int32)
  x[0, :8], y[0, :8] = -2**31, -1
  a, b = Tensor(x, device=device).realize(), Tensor(y, device=device).realize()
  _check(((a // b) + (a % b)).reshape(-1), (_np_floordiv(x, y) + _np_mod(x, y)).reshape(-1), "int32 // + %")
  # divisions nested in each other's operands, and one feeding a reduce
  _check(((a // b) // b).reshape(-1), _np_floordiv(_np_floordiv(x, y), y).reshape(-1), "(a // b) // b")
  _check((a % (b // 2)).reshape(-1), _np_mod(x, _np_floordiv(y, np.int32(2))).reshape(-1), "a % (b // 2)")
  _check((a // b).cast(dtypes.int64).sum(axis=1), _np_floordiv(x, y).astype(np.int64).sum(axis=1), "sum(a // b)")


# *** constant divisors and constant folding ***

@pytest.mark.parametrize("dt", INT_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_scalar_divisors(device: str, dt: DType) -> None:
  x, _ = _operands(dt)
  a = Tensor(x, device=device).realize()
  divisors = [0, 1, 3] + ([-1, -3] if dt in SIGNED else [])
  for c in divisors:
    yc = np.full_like(x, c)
    _check(a // c, _np_floordiv(x, yc), f"{dt} // {c}")
    _check(a % c, _np_mod(x, yc), f"{dt} % {c}")
    _check(a.idiv(c), _np_truncdiv(x, yc), f"{dt} idiv {c}")


@pytest.mark.parametrize("dt", INT_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_full_and_const_only(device: str, dt: DType) -> None:
  info = np.iinfo(_np(dt))
  x, y = _operands(dt)
  a, b = Tensor(x, device=device).realize(), Tensor(y, device=device).realize()
  n = x.shape[0]
  for c in ([0, -1] if dt in SIGNED else [0]):
    # a Tensor.full divisor is an unrealized constant: LazyBuffer folding or the kernel's CONST divisor
    full = Tensor.full((n,), c, dtype=dt, device=device)
    _check(a // full, _np_floordiv(x, np.full_like(x, c)), f"{dt} // full({c})")
    _check(a % full, _np_mod(x, np.full_like(x, c)), f"{dt} % full({c})")
    # both operands constant: folded before any kernel exists
    for v in (int(info.min), int(info.max), 5):
      lhs = Tensor.full((3,), v, dtype=dt, device=device)
      xv, yv = np.full(3, v, dtype=_np(dt)), np.full(3, c, dtype=_np(dt))
      _check(lhs // full[:3], _np_floordiv(xv, yv), f"{dt} full({v}) // full({c})")
      _check(lhs % full[:3], _np_mod(xv, yv), f"{dt} full({v}) % full({c})")
  # b - b is no lazy constant, but the UOp graph folds it to 0: the kernel divides by a CONST 0
  zero = np.zeros_like(x)
  _check(a // (b - b), _np_floordiv(x, zero), f"{dt} // (b-b)")
  _check(a % (b - b), _np_mod(x, zero), f"{dt} % (b-b)")
  _check(a.idiv(b - b), _np_truncdiv(x, zero), f"{dt} idiv (b-b)")
  # a scalar dividend with a tensor divisor
  for v in (int(info.min), 7):
    xv = np.full_like(y, v)
    _check(Tensor.full((n,), v, dtype=dt, device=device) // b, _np_floordiv(xv, y), f"{dt} {v} // b")
    _check(Tensor.full((n,), v, dtype=dt, device=device) % b, _np_mod(xv, y), f"{dt} {v} % b")


@pytest.mark.parametrize("dt", INT_DTYPES, ids=str)
def test_exec_alu_is_total(dt: DType) -> None:
  # the scalar semantics every constant fold and the PYTHON device use: C's truncating division made total
  x, y = _operands(dt)
  q = np.array([exec_alu(BinaryOps.IDIV, dt, [int(a), int(b)]) for a, b in zip(x, y)], dtype=_np(dt))
  r = np.array([exec_alu(BinaryOps.MOD, dt, [int(a), int(b)]) for a, b in zip(x, y)], dtype=_np(dt))
  np.testing.assert_array_equal(q, _np_truncdiv(x, y))
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal(r, np.where(y == 0, 0, np.fmod(x, y)).astype(_np(dt)))


@pytest.mark.parametrize("device", DEVICES)
def test_bool_floordiv(device: str) -> None:
  x = np.array([False, False, True, True])
  y = np.array([False, True, False, True])
  got = (Tensor(x, device=device).realize() // Tensor(y, device=device).realize()).numpy()
  with np.errstate(all="ignore"):
    expected = np.floor_divide(x.astype(np.int8), y.astype(np.int8)).astype(bool)
  np.testing.assert_array_equal(got, expected)


# *** the fast path: constant divisors other than 0 and -1 stay one plain division ***

def _linearized_divs(divisor: UOp) -> List[UOp]:
  g0, g1 = UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.int32), (), (0, True)), UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.int32), (), (1, False))
  idx = UOp.const(dtypes.int32, 0)
  x = UOp(UOps.LOAD, dtypes.int32, (g1, idx))
  store = UOp(UOps.STORE, None, (g0, idx, x // divisor))
  return [u for u in UOpGraph([store]).linearize().uops if u.op is UOps.ALU and u.arg is BinaryOps.IDIV]


@pytest.mark.parametrize("c", [3, 7, 1 << 20, -3])
def test_constant_divisor_is_not_guarded(c: int) -> None:
  divs = _linearized_divs(UOp.const(dtypes.int32, c))
  assert len(divs) == 1 and divs[0].src[1].op is UOps.CONST and divs[0].src[1].arg == c


def test_loaded_divisor_is_guarded() -> None:
  g2 = UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.int32), (), (2, False))
  divs = _linearized_divs(UOp(UOps.LOAD, dtypes.int32, (g2, UOp.const(dtypes.int32, 0))))
  assert len(divs) == 1 and divs[0].src[1].op is UOps.ALU and divs[0].src[1].arg is not BinaryOps.IDIV


def test_idiv_range_is_exact_for_int64() -> None:
  # the value range of x // 3 over all int64 x: a float division would round the bounds past 2**53
  x = UOp(UOps.LOAD, dtypes.int64, (UOp(UOps.DEFINE_GLOBAL, PtrDType(dtypes.int64), (), (0, False)), UOp.const(dtypes.int32, 0)))
  q = x // UOp.const(dtypes.int64, 3)
  assert (q.vmin, q.vmax) == (-(2**63 // 3), (2**63 - 1) // 3)


# *** the process survives (a SIGFPE would kill it) ***

@pytest.mark.parametrize("device", [d for d in DEVICES if d in ("CLANG", "LLVM")])
def test_process_survives(device: str) -> None:
  code = textwrap.dedent(f"""
    from tiny import Tensor, dtypes
    a = Tensor([5, 7], dtype=dtypes.int32, device="{device}").realize()
    b = Tensor([0, 2], dtype=dtypes.int32, device="{device}").realize()
    m = Tensor([-2**31], dtype=dtypes.int32, device="{device}").realize()
    n1 = Tensor([-1], dtype=dtypes.int32, device="{device}").realize()
    print((a // b).tolist(), (a % b).tolist(), (m // n1).tolist(), (m % n1).tolist(), (m // -1).tolist())
  """)
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
  assert proc.stdout.split("\n")[0] == "[0, 3] [0, 1] [-2147483648] [0] [-2147483648]"


# *** CUDA: the guarded kernels render and compile (NVRTC / nvJitLink, no GPU needed) ***

def _cuda_sources(renderer: object) -> List[str]:
  """Sources of the kernels of a // b + a % b, a.idiv(b) and a // 3 for every integer dtype, each with its own name."""
  from tiny.codegen.kernel import Kernel
  from tiny.engine.schedule import create_schedule_with_vars
  from tiny.ops import MetaOps
  out: List[str] = []
  for dt in INT_DTYPES:
    a, b = Tensor.empty(64, dtype=dt, device="PYTHON"), Tensor.empty(64, dtype=dt, device="PYTHON")
    for t in ((a // b) + (a % b), a.idiv(b), a // 3):
      sched, _ = create_schedule_with_vars([t.lazydata])
      for si in sched:
        if si.ast.op is MetaOps.KERNEL:
          k = Kernel(si.ast, opts=renderer)
          k.hand_coded_optimizations()
          out.append(k.to_program(name_override=f"intdiv_{len(out)}").src)
  return out


@pytest.mark.parametrize("kind", ["cuda", "ptx"])
def test_cuda_renders_and_compiles(kind: str) -> None:
  pytest.importorskip("tiny_cuda")
  from tiny_cuda.compiler import CUDAToolchainError, NVRTCCompiler, PTXCompiler
  from tiny_cuda.opsuite import cuda_batch_source, ptx_batch_source
  from tiny_cuda.ptx import PTXRenderer
  from tiny_cuda.renderer import CUDARenderer
  srcs = _cuda_sources(CUDARenderer("sm_80") if kind == "cuda" else PTXRenderer("sm_80"))
  if kind == "cuda":
    assert any("?" in s and "/" in s for s in srcs), "no guarded (selected) divisor in the CUDA C"
  else:
    assert any("selp." in s and "div.s32" in s for s in srcs) and any("rem.u64" in s for s in srcs)
  try:
    compiler = NVRTCCompiler("sm_80") if kind == "cuda" else PTXCompiler("sm_80")
  except CUDAToolchainError as e:
    pytest.skip(f"no CUDA toolchain: {e}")
  lib = compiler.compile(cuda_batch_source(srcs) if kind == "cuda" else ptx_batch_source(srcs))
  for i in range(len(srcs)):
    assert f"intdiv_{i}".encode() in lib
