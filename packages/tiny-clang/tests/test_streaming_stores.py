"""Non-temporal (streaming) stores of large outputs (tiny_clang.streaming_stores) on CLANG and LLVM.

The end-to-end tests lower the renderer's threshold to a few KB, so small kernels stream, and check results against
numpy: odd sizes, masked/padded outputs, outputs at unaligned offsets (which must fall back to plain stores), outputs
re-read by later kernels of the same schedule, in-place updates, several dtypes, and 2 threads (each slice ends with
an sfence before the pool reports it done). They need an x86 host with AVX-512, the only one that streams."""
from __future__ import annotations

import platform
from typing import Any, Iterator, List

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel
from tiny.device import Buffer, Device
from tiny.dtype import dtypes
from tiny.engine.realize import get_runner, run_schedule
from tiny.engine.schedule import create_schedule
from tiny.codegen.uops import UOps
from tiny.ops import MetaOps
from tiny.tensor import Tensor
from tiny_clang.renderer import ClangRenderer
from tiny_clang.settings import THREADS
from tiny_clang.streaming_stores import LINE_BYTES, PREFETCH_BYTES, STREAM_MIN_BYTES, prefetched_loads, stream_min_bytes, \
  stream_prefetch_bytes, streaming_stores

SMALL = 4096   # the test threshold: a buffer of 4 KB or more streams

rng = np.random.default_rng(0)


def _marker(dev: str) -> str:
  return "vmovntps" if dev == "CLANG" else "!nontemporal"


def _prefetches(src: str, dev: str) -> int:
  """How many loads of a kernel's source prefetch ahead."""
  return src.count("__builtin_prefetch(" if dev == "CLANG" else "call void @llvm.prefetch.p0(")


@pytest.fixture(params=["CLANG", "LLVM"])
def dev(request: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
  name = request.param
  if name == "LLVM":
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
  renderer = Device[name].renderer
  if renderer.stream_min_bytes == 0:
    pytest.skip("streaming stores are only rendered on x86 hosts with AVX-512")
  # a plain attribute of the renderer: part of its cache key, so no program compiled at another threshold is reused
  monkeypatch.setattr(renderer, "stream_min_bytes", SMALL)
  yield name


def _realize(out: Tensor, dev: str) -> List[str]:
  """Run out's schedule; the sources of its kernels."""
  sched = create_schedule([out.lazydata])
  srcs = [get_runner(dev, si.ast).p.src for si in sched if si.ast.op is MetaOps.KERNEL]
  run_schedule(sched)
  return srcs


def _t(a: np.ndarray, dev: str) -> Tensor:
  return Tensor(a, device=dev).realize()


@pytest.mark.parametrize("n", [100_003, 65_536 + 16, 4_099])
@pytest.mark.parametrize("threads", [1, 2])
def test_elementwise_odd_sizes(dev: str, n: int, threads: int) -> None:
  an, bn, cn = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
  with THREADS.override(threads):
    out = (_t(an, dev) * _t(bn, dev) + _t(cn, dev)).relu()
    srcs = _realize(out, dev)
    got = out.numpy()
  np.testing.assert_allclose(got, np.maximum(an * bn + cn, 0), rtol=1e-6, atol=1e-6)
  if n % 16 == 0:
    assert any(_marker(dev) in s for s in srcs), srcs


def test_padded_and_broadcast_output(dev: str) -> None:
  """A 2-D output whose rows (257 floats) are not whole vectors: rows start at unaligned addresses."""
  an, bn = rng.standard_normal((333, 257)).astype(np.float32), rng.standard_normal(257).astype(np.float32)
  with THREADS.override(2):
    out = (_t(an, dev) + _t(bn, dev).reshape(1, 257)).relu() * 3
    _realize(out, dev)
    got = out.numpy()
  np.testing.assert_allclose(got, np.maximum(an + bn, 0) * 3, rtol=1e-6)


def test_output_reread_in_the_same_schedule(dev: str) -> None:
  """The streamed output is read by later kernels (a sum and another elementwise kernel) of one schedule."""
  n = 1 << 16
  an, bn = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  with THREADS.override(2):
    x = (_t(an, dev) * _t(bn, dev)).exp2()
    y = (x * 2 + 1) * x.sum()
    srcs = _realize(y, dev)
    got = y.numpy()
  xn = np.exp2(an * bn)
  np.testing.assert_allclose(got, (xn * 2 + 1) * xn.astype(np.float64).sum(), rtol=1e-4)
  assert any(_marker(dev) in s for s in srcs), srcs


def test_in_place_update(dev: str) -> None:
  n = 1 << 15
  an = rng.standard_normal(n).astype(np.float32)
  a = _t(an, dev)
  with THREADS.override(2):
    for _ in range(3):
      a.assign(a * 0.5 + 1).realize()
  ref = an
  for _ in range(3):
    ref = ref * np.float32(0.5) + np.float32(1)
  np.testing.assert_allclose(a.numpy(), ref, rtol=1e-6)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.float64, dtypes.int8, dtypes.float16])
def test_dtypes(dev: str, dtype: Any) -> None:
  n = (1 << 15) + 64
  np_dt = np.dtype(np.float16) if dtype == dtypes.float16 else np.dtype(dtype.fmt)
  an = rng.integers(-50, 50, n).astype(np_dt)
  bn = rng.integers(-50, 50, n).astype(np_dt)
  out = _t(an, dev) * 3 + _t(bn, dev)
  with THREADS.override(2):
    _realize(out, dev)
  np.testing.assert_array_equal(out.numpy(), an * np_dt.type(3) + bn)


@pytest.mark.parametrize("offset_elems", [0, 1, 5, 16])
def test_output_at_unaligned_offset(dev: str, offset_elems: int) -> None:
  """The same streaming kernel writes into views of one buffer at offsets of 0, 4, 20 and 64 bytes: the unaligned ones
  must take the plain-store path (vmovntps would fault), the aligned ones stream; every element lands where it should."""
  n = 1 << 14
  an, bn = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
  a, b = _t(an, dev), _t(bn, dev)
  out = a * b + 1
  sched = create_schedule([out.lazydata])
  (si,) = [si for si in sched if si.ast.op is MetaOps.KERNEL]
  runner = get_runner(dev, si.ast)
  assert _marker(dev) in runner.p.src
  base = Buffer(dev, n + 32, dtypes.float32).allocate()
  base.copyin(memoryview(np.full(n + 32, -7, np.float32).view(np.uint8)))
  view = base.view(n, dtypes.float32, 4 * offset_elems).ensure_allocated()
  with THREADS.override(2):
    runner([view, *si.bufs[1:]], {}, wait=True)
  got = np.empty(n + 32, np.float32)
  base.copyout(memoryview(got.view(np.uint8)))
  np.testing.assert_allclose(got[offset_elems:offset_elems + n], an * bn + 1, rtol=1e-6, atol=1e-6)
  assert (got[:offset_elems] == -7).all() and (got[offset_elems + n:] == -7).all()


@pytest.mark.parametrize("distance", [0, 2048, 1 << 20])
def test_loads_prefetch_ahead(dev: str, distance: int, monkeypatch: pytest.MonkeyPatch) -> None:
  """A streaming kernel prefetches each input's whole-vector loads `distance` bytes ahead (0: none). The inputs are
  views ending at the end of their buffers, so the last prefetches point past them (even a MiB past): harmless, the
  results match numpy at 1 and 2 threads."""
  monkeypatch.setattr(Device[dev].renderer, "stream_prefetch_bytes", distance)   # part of the cache key
  n = (1 << 14) + 48
  an, bn, cn = (rng.standard_normal(n + 16).astype(np.float32) for _ in range(3))
  for threads in (1, 2):
    with THREADS.override(threads):
      a, b, c = (_t(x, dev)[16:] for x in (an, bn, cn))
      out = (a * b + c).relu()
      srcs = _realize(out, dev)
      got = out.numpy()
    np.testing.assert_allclose(got, np.maximum(an[16:] * bn[16:] + cn[16:], 0), rtol=1e-6, atol=1e-6)
    (src,) = [s for s in srcs if _marker(dev) in s]
    assert _prefetches(src, dev) == (3 if distance else 0), src
    if distance:
      assert f"{distance}" in src


def test_no_prefetch_without_streaming_stores(dev: str) -> None:
  """A kernel whose output is under the streaming threshold, or a reduce, reads its inputs without prefetching."""
  an = rng.standard_normal(512).astype(np.float32)
  small = _t(an, dev) * 2
  assert all(_prefetches(s, dev) == 0 for s in _realize(small, dev))
  np.testing.assert_allclose(small.numpy(), an * 2)
  bn = rng.standard_normal((64, 1024)).astype(np.float32)
  red = _t(bn, dev).sum(axis=1)
  assert all(_prefetches(s, dev) == 0 for s in _realize(red, dev))
  # a row sum near zero is cancellation: its float32 rounding is absolute (~1e-6 for 1024 standard normals), not relative
  np.testing.assert_allclose(red.numpy(), bn.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)


# *** which stores stream ***

def _uops(out: Tensor, renderer: Any) -> List[Any]:
  (si,) = [si for si in create_schedule([out.lazydata]) if si.ast.op is MetaOps.KERNEL]
  k = Kernel(si.ast, opts=renderer).hand_coded_optimizations()
  k.linearize()
  assert k.uops is not None
  return list(k.uops.uops)


def _x86_avx512_renderer() -> ClangRenderer:
  r = ClangRenderer()
  if r.stream_min_bytes == 0:
    pytest.skip("the heuristic runs on the host's own vector width: x86 with AVX-512 only")
  return r


def test_threshold_counts_the_whole_output() -> None:
  """An elementwise kernel over 1M floats writes 4 MiB in 64-byte vectors: it streams from a 4 MiB threshold, not 4 MiB + 1."""
  r = _x86_avx512_renderer()
  a = Tensor.empty(1 << 20, device="CLANG")
  uops = _uops(a + 1, r)
  stores = [u for u in uops if u.op.name == "STORE"]
  assert streaming_stores(uops, 4 << 20) == set(stores)
  assert streaming_stores(uops, (4 << 20) + 1) == set()
  assert streaming_stores(uops, 0) == set()


def test_reductions_and_half_outputs_do_not_stream() -> None:
  r = _x86_avx512_renderer()
  a = Tensor.empty(4096, 4096, device="CLANG")
  assert streaming_stores(_uops(a.sum(axis=1), r), 1) == set()  # 16 KB out, scalar or narrow stores
  h = Tensor.empty(1 << 20, device="CLANG", dtype=dtypes.float16)
  assert streaming_stores(_uops(h + 1, r), 1) == set()


def test_prefetched_loads_follow_the_streaming_stores() -> None:
  """Only a kernel with streaming stores prefetches, only whole-line loads, and only ungated ones (a padded input's
  load may read nothing)."""
  r = _x86_avx512_renderer()
  a, b = Tensor.empty(1 << 20, device="CLANG"), Tensor.empty(1 << 20, device="CLANG")
  uops = _uops(a * b, r)
  loads = {u for u in uops if u.op.name == "LOAD"}
  streams = streaming_stores(uops, 4 << 20)
  assert len(loads) == 2 and prefetched_loads(uops, streams, 2048) == loads
  assert prefetched_loads(uops, set(), 2048) == set()        # no streaming store, no prefetch
  assert prefetched_loads(uops, streams, 0) == set()
  padded = _uops(a.pad(((16, 16),)) * 2, r)                  # the loads at the edges are gated
  gated = {u for u in padded if u.op.name == "LOAD" and len(u.src) >= 4 and u.src[2].op.name != "BARRIER"}
  assert gated and not (prefetched_loads(padded, streaming_stores(padded, 1), 2048) & gated)


def test_a_reduce_with_streaming_stores_prefetches_nothing() -> None:
  """A matmul's output streams when it is large, but its loads of a and of the panels come from cache: no prefetch."""
  r = _x86_avx512_renderer()
  uops = _uops(Tensor.empty(64, 64, device="CLANG") @ Tensor.empty(64, 64, device="CLANG"), r)   # (no panel copy)
  streams = streaming_stores(uops, 1)
  assert streams and any(u.op is UOps.DEFINE_ACC for u in uops)
  assert any(u.op is UOps.LOAD and u.dtype is not None and u.dtype.itemsize == LINE_BYTES for u in uops)
  assert prefetched_loads(uops, streams, 2048) == set()


def test_stream_prefetch_bytes_by_threshold() -> None:
  assert stream_prefetch_bytes(0) == 0                       # a host that never streams never prefetches either
  assert stream_prefetch_bytes(16 << 20) == PREFETCH_BYTES


def test_stream_min_bytes_by_host() -> None:
  x86 = platform.machine().lower() in ("x86_64", "amd64")
  assert stream_min_bytes(64, frozenset({"avx512f", "avx2"})) == (STREAM_MIN_BYTES if x86 else 0)
  assert stream_min_bytes(32, frozenset({"avx512f", "avx2"})) == 0   # a narrower vector width: no whole-line stores
  assert stream_min_bytes(64, frozenset({"avx2"})) == 0
  assert LINE_BYTES == 64
