"""The OpenCL device: ops against numpy on a real OpenCL platform (PoCL in CI), the GPU half of the codegen (local memory,
barriers, group-for-reduce) in rendered source, compile errors and the compile cache, device naming, and the probe's
reasons when there is no OpenCL (simulated). Tests needing a platform skip with the probe's reason when there is none."""
from __future__ import annotations

import importlib.metadata
import re
from typing import Any

import numpy as np
import pytest

from tiny import Tensor, dtypes
from tiny.backend import CompileError, Device, Kernel, Opt, OptOps, RenderError, create_schedule
from tiny_opencl import plugin, runtime
from tiny_opencl.renderer import OpenCLRenderer

WHY = plugin.probe()
needs_cl = pytest.mark.skipif(WHY is not None, reason=f"no OpenCL here: {WHY}")


def _np(t: Tensor) -> np.ndarray:
  return t.numpy()


def _kernels(out: Tensor) -> list:
  """The ScheduleItems of out that are kernels (not copies)."""
  return [si for si in create_schedule([out.lazydata]) if si.ast.op.name == "KERNEL"]


def _kernel_sources(out: Tensor, device: str = "GPU") -> list:
  """The OpenCL source of every kernel computing out (heuristic opts, as realize would)."""
  return [Kernel(si.ast, opts=Device[device].renderer).hand_coded_optimizations().to_program().src for si in _kernels(out)]


# *** packaging and plugin ***

def test_entry_point_is_installed() -> None:
  eps = [ep for ep in importlib.metadata.entry_points(group="tiny") if ep.value == "tiny_opencl.plugin"]
  assert [(ep.name, ep.dist.metadata["Name"] if ep.dist else None) for ep in eps] == [("opencl", "tiny-opencl")]


def test_ordinal_parsing() -> None:
  assert plugin.ordinal("GPU") == 0 and plugin.ordinal("GPU:1") == 1
  with pytest.raises(ValueError, match="GPU or GPU:N"):
    plugin.ordinal("GPU:x")


def _reset_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(runtime, "_CL", None)
  runtime.devices.cache_clear()


def test_probe_without_icd_loader(monkeypatch: pytest.MonkeyPatch) -> None:
  _reset_runtime(monkeypatch)

  def no_lib(*args: Any, **kwargs: Any) -> Any:
    raise OSError("not found")
  monkeypatch.setattr(runtime.ctypes, "CDLL", no_lib)
  try:
    why = plugin.probe()
  finally:
    monkeypatch.undo()
    runtime.devices.cache_clear()
  assert why is not None and "no OpenCL ICD loader" in why and "pocl-opencl-icd ocl-icd-libopencl1" in why


class _FakeCL:
  """gpuctypes.opencl as an ICD loader that has no platform (or a platform without devices) answers."""

  CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
  cl_platform_id = cl_device_id = __import__("ctypes").c_void_p

  def __init__(self, n_platforms: int):
    self.n_platforms = n_platforms

  def clGetPlatformIDs(self, n: int, ids: Any, count: Any) -> int:
    if count is not None:
      count._obj.value = self.n_platforms
    return runtime.CL_PLATFORM_NOT_FOUND_KHR if self.n_platforms == 0 else 0

  def clGetDeviceIDs(self, plat: Any, kind: int, n: int, ids: Any, count: Any) -> int:
    return -1   # CL_DEVICE_NOT_FOUND


@pytest.mark.parametrize("n_platforms, msg", [(0, "found no platform"), (1, "have no device")])
def test_probe_without_platform_or_device(monkeypatch: pytest.MonkeyPatch, n_platforms: int, msg: str) -> None:
  _reset_runtime(monkeypatch)
  monkeypatch.setattr(runtime, "cl", lambda: _FakeCL(n_platforms))
  try:
    why = plugin.probe()
  finally:
    monkeypatch.undo()
    runtime.devices.cache_clear()
  assert why is not None and msg in why and "install pocl-opencl-icd ocl-icd-libopencl1" in why


def test_compiler_without_opencl_explains(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(plugin, "probe", lambda: "no OpenCL ICD loader (libOpenCL.so.1) found")
  with pytest.raises(runtime.OpenCLUnavailable, match="needs an OpenCL platform with a device: no OpenCL ICD loader"):
    plugin._compiler("GPU")


# *** renderer (no device needed) ***

def _render(out: Tensor, renderer: OpenCLRenderer, opts: Any = None) -> str:
  si = _kernels(out)[-1]
  k = Kernel(si.ast, opts=renderer)
  if opts is None:
    k.hand_coded_optimizations()
  else:
    for o in opts:
      k.apply_opt(o)
  return k.to_program().src


def test_reduce_uses_local_memory_and_barrier() -> None:
  src = _render(Tensor.ones(64, 256, device="PYTHON").contiguous().sum(1), OpenCLRenderer())
  assert "__local float temp" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src, src
  assert "get_local_id(0)" in src and "get_group_id(0)" in src and src.startswith("__kernel __attribute__((reqd_work_group_size("), src


def test_vectors_casts_and_bitcasts_spell_opencl() -> None:
  a = Tensor.ones(64, 64, device="PYTHON").contiguous()
  src = _render((a + 1).cast(dtypes.int32).bitcast(dtypes.float32), OpenCLRenderer())
  assert "as_float" in src and "(float4)(" in src and "float4" in src, src
  assert "__global" in src and "&" not in src, src   # no pointer-punning bitcasts


def test_half_and_double_need_their_extensions() -> None:
  def h() -> Tensor:
    return Tensor.ones(16, device="PYTHON", dtype=dtypes.float16).contiguous() * 2
  assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in _render(h(), OpenCLRenderer(fp16=True))
  with pytest.raises(RenderError, match="cl_khr_fp16"):
    _render(h(), OpenCLRenderer(fp16=False))
  d = Tensor.ones(16, device="PYTHON", dtype=dtypes.float64).contiguous() * 2
  assert "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" in _render(d, OpenCLRenderer())
  assert dtypes.bfloat16 not in OpenCLRenderer().supported_dtypes()


def test_bool_buffers_are_uchar_and_int64_consts_are_long() -> None:
  a = Tensor.arange(16, device="PYTHON").cast(dtypes.int64)
  src = _render((a * 3_000_000_000) < 5, OpenCLRenderer())
  assert "__global uchar* data0" in src and "ll" not in src.replace("all", ""), src


# *** on the device ***

@needs_cl
@pytest.mark.parametrize("op", ["add", "mul", "div", "exp", "log", "sqrt", "sin", "relu", "max", "where", "neg", "sigmoid"])
def test_elementwise(op: str) -> None:
  rng = np.random.default_rng(0)
  a, b = rng.uniform(0.5, 2, (33, 17)).astype(np.float32), rng.uniform(-2, 2, (33, 17)).astype(np.float32)
  ta, tb = Tensor(a, device="GPU"), Tensor(b, device="GPU")
  fns = {"add": (lambda x, y: x + y, lambda x, y: x + y), "mul": (lambda x, y: x * y, lambda x, y: x * y),
         "div": (lambda x, y: x / y, lambda x, y: x / y), "exp": (lambda x, y: x.exp(), lambda x, y: np.exp(x)),
         "log": (lambda x, y: x.log(), lambda x, y: np.log(x)), "sqrt": (lambda x, y: x.sqrt(), lambda x, y: np.sqrt(x)),
         "sin": (lambda x, y: y.sin(), lambda x, y: np.sin(y)), "relu": (lambda x, y: y.relu(), lambda x, y: np.maximum(y, 0)),
         "max": (lambda x, y: x.maximum(y), lambda x, y: np.maximum(x, y)), "where": (lambda x, y: (y > 0).where(x, y), lambda x, y: np.where(y > 0, x, y)),
         "neg": (lambda x, y: -y, lambda x, y: -y), "sigmoid": (lambda x, y: y.sigmoid(), lambda x, y: 1 / (1 + np.exp(-y)))}
  t, n = fns[op]
  np.testing.assert_allclose(_np(t(ta, tb)), n(a, b), rtol=1e-5, atol=1e-6)


@needs_cl
@pytest.mark.parametrize("shape, axis", [((64, 256), 1), ((256, 64), 0), ((4096,), None), ((3, 5, 7), 1), ((1000, 3), 0)])
def test_reduce(shape: Any, axis: Any) -> None:
  a = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
  t = Tensor(a, device="GPU")
  np.testing.assert_allclose(_np(t.sum(axis)), a.sum(axis), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(_np(t.max(axis)), a.max(axis))


@needs_cl
def test_reduce_with_group_for_reduce_is_right() -> None:
  # a big reduce into few outputs: the heuristic splits it over a workgroup (GROUPTOP) with __local memory and a barrier
  a = np.random.default_rng(2).standard_normal((8, 4096)).astype(np.float32)
  t = Tensor(a, device="GPU").realize()
  (src,) = _kernel_sources(t.sum(1))   # scheduling consumes the graph: the numbers come from a second, identical one
  assert "__local" in src and "barrier(CLK_LOCAL_MEM_FENCE)" in src, src
  np.testing.assert_allclose(_np(t.sum(1)), a.sum(1), rtol=1e-4, atol=1e-3)


@needs_cl
@pytest.mark.parametrize("opts", [[Opt(OptOps.GROUP, 0, 16)], [Opt(OptOps.GROUPTOP, 0, 32), Opt(OptOps.LOCAL, 0, 4)],
                                  [Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4)]])
def test_explicit_gpu_opts(opts: Any) -> None:
  from tiny.backend import CompiledRunner
  a = np.random.default_rng(3).standard_normal((32, 512)).astype(np.float32)
  t = Tensor(a, device="GPU").realize()
  out = t.sum(1)
  (si,) = _kernels(out)
  k = Kernel(si.ast, opts=Device["GPU"].renderer)
  for o in opts:
    k.apply_opt(o)
  prg = CompiledRunner(k.to_program())
  for b in si.bufs:
    b.ensure_allocated()
  prg([b for b in si.bufs], {}, wait=True)
  np.testing.assert_allclose(si.bufs[0].numpy(), a.sum(1), rtol=1e-4, atol=1e-3)


@needs_cl
@pytest.mark.parametrize("n, m, k", [(64, 64, 64), (33, 17, 65), (1, 256, 128), (128, 1, 32)])
def test_matmul(n: int, m: int, k: int) -> None:
  rng = np.random.default_rng(4)
  a, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
  np.testing.assert_allclose(_np(Tensor(a, device="GPU") @ Tensor(b, device="GPU")), a @ b, rtol=1e-4, atol=1e-4)


@needs_cl
def test_conv2d() -> None:
  rng = np.random.default_rng(5)
  x, w = rng.standard_normal((2, 3, 12, 12)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
  out = _np(Tensor(x, device="GPU").conv2d(Tensor(w, device="GPU"), padding=1))
  want = Tensor(x, device="CLANG").conv2d(Tensor(w, device="CLANG"), padding=1).numpy() if "CLANG" in Device.get_available_devices() else None
  if want is None:
    pytest.skip("no CLANG reference device")
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@needs_cl
def test_half_where_supported() -> None:
  r = Device["GPU"].renderer
  if not getattr(r, "fp16", False):
    pytest.skip(f"this OpenCL device has no cl_khr_fp16 ({runtime.device_info(0).name})")
  a = np.random.default_rng(6).standard_normal(100).astype(np.float16)
  np.testing.assert_allclose(_np(Tensor(a, device="GPU") * 2 + 1), a * 2 + 1, rtol=1e-3)


@needs_cl
def test_int_division_is_total() -> None:
  x = np.array([7, -7, 7, -7, 0, 5, -2 ** 31, -2 ** 31], dtype=np.int32)
  y = np.array([2, 2, -2, -2, 3, 0, -1, 0], dtype=np.int32)
  tx, ty = Tensor(x, device="GPU"), Tensor(y, device="GPU")
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal(_np(tx // ty), np.where(y == 0, 0, np.floor_divide(x, np.where(y == 0, 1, y))))
    np.testing.assert_array_equal(_np(tx % ty), np.where(y == 0, 0, np.mod(x, np.where(y == 0, 1, y))))


@needs_cl
@pytest.mark.parametrize("name, data, fn", [
  ("add INT_MIN", np.array([-128, 5, 2**31 - 1, -2**31], dtype=np.int32), lambda x: x + (-2**31)),   # PoCL gave -128 for -128
  ("mul add", np.array([-128, 5, 2**31 - 1, 1 << 20], dtype=np.int32), lambda x: x * 65537 + 2**30),
  ("neg", np.array([-2**31, 7, 0], dtype=np.int32), lambda x: -x),
  ("int64 square", np.array([2**62, -2**63, 3, 2**40], dtype=np.int64), lambda x: x * x + x),
])
def test_signed_overflow_wraps_like_numpy(name: str, data: np.ndarray, fn: Any) -> None:
  # signed overflow is undefined in OpenCL C; the renderer computes data arithmetic in the unsigned type so it wraps
  with np.errstate(over="ignore"):
    want = fn(data).astype(data.dtype)
  np.testing.assert_array_equal(_np(fn(Tensor(data, device="GPU"))), want, err_msg=name)


@needs_cl
@pytest.mark.parametrize("src_dt, dst_dt", [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float32, dtypes.uint8),
                                            (dtypes.int32, dtypes.bool), (dtypes.bool, dtypes.float32), (dtypes.int64, dtypes.int16),
                                            (dtypes.float32, dtypes.float64), (dtypes.uint32, dtypes.int64)])
def test_casts(src_dt: Any, dst_dt: Any) -> None:
  from tiny.dtype import to_np_dtype
  vals = np.array([0, 1, 2, 3, 7, 100, 200, 250, 12, 0, 1, 5], dtype=np.float64)
  a = vals.astype(to_np_dtype(src_dt))
  np.testing.assert_array_equal(_np(Tensor(a, device="GPU").cast(dst_dt)), a.astype(to_np_dtype(dst_dt)))


@needs_cl
def test_bitcast_and_int64() -> None:
  a = np.array([1.5, -2.0, 0.0, 3.25], dtype=np.float32)
  np.testing.assert_array_equal(_np(Tensor(a, device="GPU").bitcast(dtypes.int32) + 1), a.view(np.int32) + 1)
  b = np.array([2 ** 40, -(2 ** 41), 3, 2 ** 62], dtype=np.int64)
  np.testing.assert_array_equal(_np(Tensor(b, device="GPU") * 2 + 1), b * 2 + 1)


@needs_cl
def test_gather() -> None:
  rng = np.random.default_rng(7)
  table = rng.standard_normal((10, 6)).astype(np.float32)
  idx = np.array([3, 0, 9, 3, 1], dtype=np.int32)
  got = _np(Tensor(table, device="GPU")[Tensor(idx, device="GPU")])
  np.testing.assert_allclose(got, table[idx])
  np.testing.assert_allclose(_np(Tensor(table, device="GPU").gather(1, Tensor(np.array([[1, 0]] * 10, dtype=np.int32), device="GPU"))),
                             np.take_along_axis(table, np.array([[1, 0]] * 10), 1))


@needs_cl
def test_softmax_and_argmax() -> None:
  a = np.random.default_rng(8).standard_normal((16, 300)).astype(np.float32)
  t = Tensor(a, device="GPU")
  e = np.exp(a - a.max(1, keepdims=True))
  np.testing.assert_allclose(_np(t.softmax(1)), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(_np(t.argmax(1)), a.argmax(1))


@needs_cl
def test_symbolic_shapes() -> None:
  from tiny.backend import Variable
  a = np.arange(40, dtype=np.float32)
  t = Tensor(a, device="GPU").realize()
  for n in (3, 7):
    v = Variable("n", 1, 20).bind(n)
    np.testing.assert_allclose(_np(t.shrink(((0, v),)).sum()), a[:n].sum())


@needs_cl
def test_compile_error_has_build_log_and_numbered_source() -> None:
  comp = Device["GPU"].compiler
  with pytest.raises(CompileError) as e:
    comp.compile("__kernel void broken(__global float* a) { a[0] = undefined_thing; }")
  msg = str(e.value)
  assert "could not build the kernel" in msg and "undefined_thing" in e.value.compiler_msg, msg
  assert re.search(r"^\s+1 \| __kernel void broken", msg, re.M), msg


@needs_cl
def test_compile_cache_hit(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
  from tiny_opencl.compiler import CLCompiler
  comp = Device["GPU"].compiler
  assert isinstance(comp, CLCompiler) and comp.cachekey is not None
  info = runtime.device_info(0)
  assert comp.cachekey.startswith("compile_opencl_")
  src = f"__kernel void cache_probe_{np.random.default_rng().integers(1 << 30)}(__global float* a) {{ a[get_global_id(0)] = 1.0f; }}"
  calls = []
  real = CLCompiler.compile

  def counting(self: CLCompiler, s: str) -> bytes:
    calls.append(s)
    return real(self, s)
  monkeypatch.setattr(CLCompiler, "compile", counting)
  lib1 = comp.compile_cached(src)
  lib2 = comp.compile_cached(src)
  assert lib1 == lib2 and len(lib1) > 0 and len(calls) == 1, f"second compile of the same source was not a cache hit ({info.name})"
  # the cached binary loads and runs
  prg = runtime.CLProgram(0, re.search(r"void (\w+)", src).group(1), lib2)   # type: ignore[union-attr]
  alloc = Device["GPU"].allocator
  buf = alloc.alloc(16)
  prg(buf, global_size=(4, 1, 1), local_size=(1, 1, 1), wait=True)
  out = memoryview(bytearray(16))
  alloc.copyout(out, buf)
  np.testing.assert_array_equal(np.frombuffer(out, np.float32), np.ones(4, np.float32))


@needs_cl
def test_device_naming_and_limits() -> None:
  n = len(runtime.devices())
  assert n >= 1
  info = runtime.device_info(0)
  assert info.platform and info.name and info.max_work_group_size >= 1
  r = Device["GPU"].renderer
  assert r.local_threads_max == info.max_work_group_size and r.shared_max == info.local_mem_size
  assert Device["GPU"].dname == "GPU" and Device.canonicalize("gpu:0") in ("GPU", "GPU:0")
  with pytest.raises(Exception, match=rf"there are {n} device\(s\)"):
    runtime.device_info(n)
  if n > 1:
    assert Device["GPU:1"].dname == "GPU:1"


@needs_cl
def test_kernel_timing_and_views() -> None:
  dev = Device["GPU"]
  alloc = dev.allocator
  base = alloc.alloc(4096)
  alloc.copyin(base, memoryview(np.arange(1024, dtype=np.int32).tobytes()))
  align = runtime.device_info(0).base_addr_align
  view = alloc.offset(base, 64, align)
  out = memoryview(bytearray(64))
  alloc.copyout(out, view)
  np.testing.assert_array_equal(np.frombuffer(out, np.int32), np.arange(align // 4, align // 4 + 16))
  odd = alloc.offset(base, 8, 12)   # copies work at any offset
  alloc.copyout(out[:8], odd)
  np.testing.assert_array_equal(np.frombuffer(out[:8], np.int32), [3, 4])
  assert alloc.kernel_mem(view) is not None   # an aligned view becomes a sub-buffer
  if align > 4:
    with pytest.raises(runtime.OpenCLError, match="sub-buffers need offsets"):
      alloc.kernel_mem(alloc.offset(base, 8, 4))
  dev.synchronize()


# *** the whole-program fuzzer (tiny.testing.program_fuzz) on GPU ***

@needs_cl
def test_random_programs_on_gpu() -> None:
  """Random Tensor programs under NOOPT, the heuristic and random opts (locals, groups, upcasts) against the reference.
  HYPOTHESIS_PROFILE=fuzz runs many more."""
  import os

  from hypothesis import HealthCheck, given, settings
  from hypothesis import strategies as st

  from tiny.testing import program_fuzz as pf
  from tiny.testing.strategies import register_profiles
  register_profiles()
  names = {d.name for d in plugin.supported_dtypes("GPU")} | {"float32"}
  fuzz_dtypes = tuple(d for d in pf.DTYPES if getattr(dtypes, d).name in names)
  n = 4 if os.getenv("HYPOTHESIS_PROFILE", "default") == "default" else max(4, settings().max_examples)

  @settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
  @given(prog=pf.programs(max_ops=10, max_size=128, dtypes=fuzz_dtypes), seed=st.integers(0, 2 ** 31 - 1))
  def run(prog: pf.Program, seed: int) -> None:
    pf.check_program(prog, "GPU", pf.default_settings(seed, n_random=1 if n == 4 else 2))
  run()
