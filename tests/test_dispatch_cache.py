"""Caches on the dispatch path must never hand one program the work of another.

Kernels are cached by AST + device + the settings that change code (NOOPT, BEAM), views and trackers cache their hash
and size, and new kernels of a schedule are compiled ahead of time on a thread pool. Every test here runs programs
that share a structure but differ in one thing that changes the kernel (a constant, a dtype, a shape, a mask, a stride,
the device, an opt flag) back to back, and checks each result against numpy: a wrong cache hit would give the other
program's answer. A bound Variable is the one difference that must *not* make a new kernel.
"""
from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

from tiny import helpers
from tiny.engine import realize
from tiny.engine.realize import precompile
from tiny.helpers import Context
from tiny.registry import Device
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import Variable
from tiny.shape.view import View
from tiny.tensor import Tensor

COMPUTE = [d for d in ("CLANG", "LLVM", "PYTHON") if d in Device.get_available_devices()]


@pytest.fixture(params=COMPUTE)
def device(request: pytest.FixtureRequest) -> str:
  return str(request.param)


def _data(shape, seed: int, dtype=np.float32) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return (rng.standard_normal(shape) * 4).astype(dtype)


def test_constants_are_part_of_the_kernel(device: str) -> None:
  a = _data((5, 7), 0)
  x = Tensor(a, device=device).realize()
  for c in (1.0, 2.0, -0.5, 1.0, 3.25):
    np.testing.assert_allclose((x + c).numpy(), a + np.float32(c), rtol=1e-6)
    np.testing.assert_allclose((x * c).numpy(), a * np.float32(c), rtol=1e-6)


def test_signed_zero_constant_is_not_zero(device: str) -> None:
  a = np.array([0.0, 1.0, -2.0], np.float32)
  x = Tensor(a, device=device).realize()
  # 1/(x*0.0) and 1/(x*-0.0) share a structure; only the constant's sign tells them apart
  np.testing.assert_array_equal(np.signbit((x * 0.0).numpy()), np.signbit(a * np.float32(0.0)))
  np.testing.assert_array_equal(np.signbit((x * -0.0).numpy()), np.signbit(a * np.float32(-0.0)))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16, np.int8])
def test_dtypes_are_part_of_the_kernel(device: str, dtype) -> None:
  if dtype is np.float16 and device == "PYTHON":
    pytest.skip("the PYTHON device computes half in float32 internally; checked on the compiled devices")
  a = (_data((6, 3), 1) if np.dtype(dtype).kind == "f" else np.arange(18).reshape(6, 3) - 9).astype(dtype)
  b = (_data((6, 3), 2) if np.dtype(dtype).kind == "f" else np.arange(18).reshape(6, 3)[::-1] % 7 + 1).astype(dtype)
  got = (Tensor(a, device=device) * Tensor(b, device=device) + Tensor(b, device=device)).numpy()
  assert got.dtype == dtype
  np.testing.assert_allclose(got.astype(np.float64), (a * b + b).astype(np.float64), rtol=2e-3 if dtype is np.float16 else 1e-6)


def test_shapes_are_part_of_the_kernel(device: str) -> None:
  for shape in ((4, 4), (4, 5), (5, 4), (20,), (1, 16)):
    a = _data(shape, 3)
    np.testing.assert_allclose((Tensor(a, device=device) + 1).numpy(), a + 1, rtol=1e-6)
    np.testing.assert_allclose(Tensor(a, device=device).sum().numpy(), a.sum(dtype=np.float64), rtol=1e-5, atol=1e-5)


def test_strides_are_part_of_the_kernel(device: str) -> None:
  a = _data((6, 6), 4)
  x = Tensor(a, device=device).realize()
  np.testing.assert_allclose((x + 1).numpy(), a + 1, rtol=1e-6)
  np.testing.assert_allclose((x.T + 1).numpy(), a.T + 1, rtol=1e-6)
  np.testing.assert_allclose((x[:, ::2] + 1).numpy(), a[:, ::2] + 1, rtol=1e-6)
  np.testing.assert_allclose((x[1:, 1:] + 1).numpy(), a[1:, 1:] + 1, rtol=1e-6)


def test_masks_are_part_of_the_kernel(device: str) -> None:
  a = _data((4, 4), 5)
  x = Tensor(a, device=device).realize()
  for pads in (((1, 0), (0, 0)), ((0, 1), (0, 0)), ((0, 0), (1, 0)), ((0, 0), (0, 1)), ((2, 0), (0, 0))):
    np.testing.assert_allclose((x.pad(pads) + 1).numpy(), np.pad(a, pads) + 1, rtol=1e-6)


def test_devices_do_not_share_kernels() -> None:
  if len(COMPUTE) < 2:
    pytest.skip("needs two computing devices")
  a = _data((8, 3), 6)
  outs = {d: (Tensor(a, device=d).exp2() * 0.5).numpy() for d in COMPUTE}
  for d, got in outs.items():
    np.testing.assert_allclose(got, np.exp2(a) * np.float32(0.5), rtol=1e-5, err_msg=d)
  keys = [k for k in realize.method_cache if not k[-1]]
  assert {k[0] for k in keys} >= set(COMPUTE), "every device compiles its own kernel"


def test_noopt_is_part_of_the_kernel_key() -> None:
  dev = COMPUTE[0]
  a = _data((32, 32), 7)
  x = Tensor(a, device=dev).realize()
  runners = []
  for noopt in (0, 1):
    with Context(NOOPT=noopt):
      np.testing.assert_allclose((x * 1.5 + 0.75).sum(1).numpy(), (a.astype(np.float64) * 1.5 + 0.75).sum(1), rtol=1e-4)
      ast = (x * 1.5 + 0.75).sum(1).schedule()[-1].ast
      runners.append(realize.get_runner(dev, ast))
  assert runners[0] is not runners[1], "a kernel built under NOOPT=0 was reused under NOOPT=1"


def test_bound_variable_reuses_its_kernel(device: str) -> None:
  a = _data((10,), 8)
  x = Tensor(a, device=device).realize()
  vi = Variable("dispatch_n", 1, 10)
  before = None
  for k, n in enumerate((3, 7, 1, 10, 5)):
    s = (x.shrink(((0, vi.bind(n)),)) * 2 + 1).sum()
    np.testing.assert_allclose(s.numpy(), (a[:n].astype(np.float64) * 2 + 1).sum(), rtol=1e-5, atol=1e-5)
    if k == 0:
      before = len(realize.method_cache)
  assert len(realize.method_cache) == before, "another value of a bound Variable compiled a new kernel"


def test_views_and_trackers_cache_hash_but_never_pickle_it() -> None:
  v = View.create((3, Variable("pk", 1, 9)), None, 0, None)
  h, size = hash(v), v.size()
  assert size == 27 and "_hash" in v.__dict__
  state = v.__getstate__()
  assert "_hash" not in state and "_size" not in state, "a salted hash must not travel to another process"
  v2 = pickle.loads(pickle.dumps(v))
  assert v2 == v and hash(v2) == h and v2.size() == size
  st = ShapeTracker((v,))
  assert hash(pickle.loads(pickle.dumps(st))) == hash(st)
  # equal trackers built separately hash alike (the cache is per object, the value is structural)
  assert hash(ShapeTracker.from_shape((4, 5)).permute((1, 0))) == hash(ShapeTracker.from_shape((4, 5)).permute((1, 0)))


def _many_kernels(x: Tensor, salt: float) -> list:
  # distinct constants give distinct ASTs: each output is its own new kernel
  return [(x * (salt + i) + i).exp2() for i in range(6)]


def test_parallel_precompile_matches_sequential(monkeypatch: pytest.MonkeyPatch) -> None:
  devs = [d for d in COMPUTE if Device[d].compiler.parallel_compile]
  if not devs:
    pytest.skip("no device with a compiler that compiles in parallel")
  dev = devs[0]
  a = _data((16,), 9) / 8
  x = Tensor(a, device=dev).realize()
  outs = _many_kernels(x, 0.0625)
  schedule = outs[0].schedule(*outs[1:])
  n_kernels = len({si.ast for si in schedule})
  assert precompile(list(schedule)) == n_kernels, "every new kernel is built ahead of the run"
  realize.run_schedule(schedule)
  for i, o in enumerate(outs):
    np.testing.assert_allclose(o.numpy(), np.exp2(a * np.float32(0.0625 + i) + i), rtol=1e-5)
  monkeypatch.setenv("PARALLEL_COMPILE", "0")
  seq = _many_kernels(x, 0.125)
  sched = seq[0].schedule(*seq[1:])
  assert precompile(sched) == 0, "PARALLEL_COMPILE=0 compiles in order, while lowering"
  realize.run_schedule(sched)
  for i, o in enumerate(seq):
    np.testing.assert_allclose(o.numpy(), np.exp2(a * np.float32(0.125 + i) + i), rtol=1e-5)


def test_parallel_precompile_leaves_failures_to_the_ordered_path(monkeypatch: pytest.MonkeyPatch) -> None:
  devs = [d for d in COMPUTE if Device[d].compiler.parallel_compile]
  if not devs:
    pytest.skip("no device with a compiler that compiles in parallel")
  dev = devs[0]
  compiler = Device[dev].compiler
  real = type(compiler).compile
  counter = itertools.count(1)   # next() on it is atomic: workers call compile concurrently
  calls = []

  def flaky(self, src: str) -> bytes:
    calls.append(n := next(counter))
    if n == 1:
      raise RuntimeError("a worker failed")
    return real(self, src)
  monkeypatch.setattr(type(compiler), "compile", flaky)
  monkeypatch.setattr(helpers, "CACHELEVEL", 0)   # every kernel goes through compile(), none comes from the disk cache
  x = Tensor(_data((8,), 10), device=dev).realize()
  outs = _many_kernels(x, 0.3125)
  Tensor.realize(*outs)   # the kernel whose worker failed is compiled again, in order, when it is lowered
  for i, o in enumerate(outs):
    np.testing.assert_allclose(o.numpy(), np.exp2(x.numpy() * np.float32(0.3125 + i) + i), rtol=1e-5)
  assert len(calls) == len(outs) + 1


def test_clang_direct_link_matches_driver_link(monkeypatch: pytest.MonkeyPatch) -> None:
  tiny_clang_compiler = pytest.importorskip("tiny_clang.compiler")
  if tiny_clang_compiler.find_cc() is None or "CLANG" not in COMPUTE:
    pytest.skip("needs a C compiler and the CLANG device")
  from tiny_clang.runtime import ClangProgram
  x = Tensor(_data((32,), 11), device="CLANG").realize()
  src = realize.get_runner("CLANG", (x.abs() * 3 + 0.5).sqrt().schedule()[-1].ast).p
  libs = {}
  for direct in ("1", "0"):
    monkeypatch.setenv("TINY_CLANG_DIRECT_LINK", direct)
    tiny_clang_compiler.direct_linker.cache_clear()
    comp = tiny_clang_compiler.ClangCompiler()
    assert (comp.ld is not None) == (direct == "1" and tiny_clang_compiler.direct_linker(comp.cc[0]) is not None)
    libs[direct] = (comp.cachekey, comp.compile(src.src))
  tiny_clang_compiler.direct_linker.cache_clear()
  if libs["1"][0] == libs["0"][0]:
    pytest.skip("no separate linker on this system: both ways are the driver link")
  a = x.numpy()
  for direct, (_, lib) in libs.items():
    out = Tensor.empty(32, device="CLANG").realize()
    prg = ClangProgram(src.name, lib)
    prg(out.lazydata.buffer._buf, x.lazydata.buffer._buf)
    np.testing.assert_allclose(out.numpy(), np.sqrt(np.abs(a) * 3 + 0.5), rtol=1e-6, err_msg=f"direct link {direct}")


def test_eager_ast_cache_keeps_sources_apart(device: str) -> None:
  # one cached AST per layout: x * x loads one buffer, x * y two, and a swapped or repeated source must not reuse either
  a, b = _data((5, 6), 20), _data((5, 6), 21)
  x, y = Tensor(a, device=device).realize(), Tensor(b, device=device).realize()
  for got, want in (((x * y), a * b), ((x * x), a * a), ((y * x), b * a), ((y * y), b * b), ((x - y), a - b), ((y - x), b - a),
                    ((x.T * y.T), (a * b).T), ((x * 2.5), a * np.float32(2.5)), ((x * -2.5), a * np.float32(-2.5))):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


# graphs of elementwise ops on realized inputs take the one-kernel shortcut; the rest must be scheduled as the full analysis
# does: an intermediate that is expanded, padded, reduced or forced contiguous changes what gets its own kernel
CHAINS = {
  "exp": (lambda x, y: x.exp(), lambda a, b: np.exp(a)),
  "shared intermediate": (lambda x, y: (t := x * 2 + 1) * t.relu() - t, lambda a, b: (t := a * 2 + 1) * np.maximum(t, 0) - t),
  "permuted intermediate": (lambda x, y: (x + y).T.sigmoid() * 3, lambda a, b: 3 / (1 + np.exp(-(a + b).T))),
  "expanded intermediate": (lambda x, y: (x[:, :1] * 2 + 1).expand(5, 6) * y, lambda a, b: (a[:, :1] * 2 + 1) * b),
  "padded intermediate": (lambda x, y: (x + 1).pad(((1, 1), (0, 0))).exp(), lambda a, b: np.exp(np.pad(a + 1, ((1, 1), (0, 0))))),
  "reduced intermediate": (lambda x, y: (x * y).sum(1, keepdim=True) + x, lambda a, b: (a * b).sum(1, keepdims=True) + a),
  "forced intermediate": (lambda x, y: (x * 2).contiguous() + y, lambda a, b: a * 2 + b),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_elementwise_shortcut_schedules_as_the_full_analysis(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
  from tiny.engine import schedule
  f, ref = CHAINS[name]
  a, b = _data((5, 6), 22) / 4, _data((5, 6), 23) / 4
  x, y = Tensor(a).realize(), Tensor(b).realize()
  fast = f(x, y).schedule()
  with monkeypatch.context() as m:
    m.setattr(schedule, "_fused_chain", lambda out: None)
    full = f(x, y).schedule()
  assert [si.ast for si in fast] == [si.ast for si in full]
  np.testing.assert_allclose(f(x, y).numpy(), ref(a, b), rtol=1e-5, atol=1e-6)
