"""Packed-panel matmul on the CPU devices: when `Tensor.dot` repacks b, the tile the packed kernel gets, exact results.

The decisions are checked on renderers that declare their vector shape (independent of this host) and the kernels run
on the PYTHON device against numpy; the end-to-end products and gradients run on CLANG and LLVM against numpy/torch."""
from __future__ import annotations

from typing import List, Tuple, TypeVar

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, Opt, OptOps
from tiny.dtype import dtypes
from tiny.engine.schedule import create_schedule
from tiny.tensor import Tensor
from tiny.testing.ops_helper import run_kernel_on_python
from tiny_clang.matmul_panels import block_rows, panel_width
from tiny_clang.renderer import host_simd_bytes
from tiny_clang.testing import Avx2LikeRenderer, Avx512LikeRenderer


T = TypeVar("T", np.ndarray, Tensor)


def _rand(*shape: int, seed: int, dtype: type = np.float32) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_panel_width_decisions() -> None:
  """Two vectors of columns for big float products; nothing for small, skinny, odd-width or integer ones."""
  assert panel_width(32, 1024, 1024, 1024, dtypes.float32) == 16
  assert panel_width(64, 1024, 1024, 1024, dtypes.float32) == 32
  assert panel_width(32, 1024, 1024, 1024, dtypes.float64) == 8
  assert panel_width(32, 1, 768, 2304, dtypes.float32) == 0        # a matrix-vector product streams b once anyway
  assert panel_width(32, 64, 64, 64, dtypes.float32) == 0          # too little work to pay for the copy
  assert panel_width(32, 1024, 1024, 1000, dtypes.float32) == 0    # n not a multiple of the panel
  assert panel_width(32, 1024, 1024, 1024, dtypes.int32) == 0
  assert panel_width(0, 1024, 1024, 1024, dtypes.float32) == 0     # no vector unit declared


def _packed_kernel(m: int, kk: int, n: int, width: int, renderer: object) -> Tuple[Kernel, List[np.ndarray], np.ndarray]:
  """The optimized product kernel of a (m, kk) @ (kk, n) matmul whose b was packed into width-column panels."""
  an, bn = _rand(m, kk, seed=m), _rand(kk, n, seed=n)
  a, b = Tensor(an, device="PYTHON").realize(), Tensor(bn, device="PYTHON").realize()
  panels = b.reshape(kk, n // width, width).permute(1, 0, 2).contiguous().realize()
  out = (a.reshape(m, 1, 1, kk) * panels.permute(0, 2, 1)).sum(-1).reshape(m, n)
  si = create_schedule([out.lazydata])[-1]
  pn = bn.reshape(kk, n // width, width).transpose(1, 0, 2).copy()
  inputs = [an if si.bufs[i].nbytes == an.nbytes else pn for i in (1, 2)]
  return Kernel(si.ast, opts=renderer).hand_coded_optimizations(), inputs, an @ bn


def test_block_rows() -> None:
  """AVX2: 2 MB of a's rows per block, at least 256 rows, but 4 blocks per thread and never under 512 KB; 32 registers
  (AVX-512): the same with up to 4 MB."""
  assert block_rows(16, 4, 2048 * 4, 2048, 2) == 256      # 2048², 2 threads: 2 MB
  assert block_rows(16, 4, 1024 * 4, 1024, 2) == 128      # 1024², 2 threads: 8 blocks of 512 KB
  assert block_rows(16, 4, 1024 * 4, 4096, 2) == 512      # 4096 x 1024: 2 MB
  assert block_rows(16, 4, 4096 * 4, 8192, 2) == 256      # k = 4096: the 256-row floor (4 MB)
  assert block_rows(16, 4, 2048 * 4, 2048, 16) == 64      # 16 threads: 512 KB, as before
  assert block_rows(32, 8, 2048 * 4, 2048, 2) == 256      # AVX-512, 2048², 2 threads: 4 blocks per thread (2 MB each)
  assert block_rows(32, 8, 2048 * 4, 2048, 1) == 512      # one thread: 4 MB
  assert block_rows(32, 8, 1024 * 4, 1024, 2) == 128      # 1024², 2 threads: 8 blocks of 512 KB, as before
  assert block_rows(32, 8, 1024 * 4, 1024, 1) == 256      # the 256-row floor
  assert block_rows(32, 8, 2048 * 4, 2048, 16) == 64      # 16 threads: 512 KB
  assert block_rows(32, 8, 1 << 20, 64, 2) == 8           # at least one register tile


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
  """The tiling decisions as for one thread, whatever this host has: SLICES_PER_THREAD panels suffice to go outermost."""
  monkeypatch.setattr("tiny_clang.matmul_panels.num_threads", lambda: 1)


def test_avx2_panel_tile(monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
  """AVX2: 16 columns x 4 rows (8 vector accumulators); all rows in one block put the panel loop outermost."""
  k, inputs, ref = _packed_kernel(256, 512, 64, 16, Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.SWAP, 0, 1)], k.applied_opts
  # blocks of 8 rows = 2 row tiles
  monkeypatch.setattr("tiny_clang.matmul_panels.AVX2_MIN_BLOCK_ROWS", 8)
  monkeypatch.setattr("tiny_clang.matmul_panels.AVX2_BLOCK_BYTES", 8 * 16384 * 4)
  k, inputs, ref = _packed_kernel(32, 16384, 32, 16, Avx2LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.BLOCK, 0, 2)], k.applied_opts


def test_avx512_panel_tile(one_thread: None) -> None:
  """AVX-512: 32 columns (two steps of 16) x 8 rows; 2 panels are too few to share out, so row tiles stay outermost."""
  k, _, _ = _packed_kernel(64, 128, 64, 32, Avx512LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.UPCAST, 0, 8)], k.applied_opts
  k, _, _ = _packed_kernel(64, 128, 128, 32, Avx512LikeRenderer())
  assert k.applied_opts[-1] == Opt(OptOps.SWAP, 0, 1), k.applied_opts


def test_avx512_block_past_l2_takes_all_rows(monkeypatch: pytest.MonkeyPatch) -> None:
  """AVX-512: a block of a's rows that overflows L2 with its panel becomes one block of all rows (panels outermost,
  shared out by the threads); a block that fits keeps its rows, and AVX2 keeps its blocks either way."""
  monkeypatch.setattr("tiny_clang.matmul_panels.num_threads", lambda: 2)
  # blocks of 16 rows (2 row tiles) of 128 floats: 8 KB, and the panel of 32 columns 16 KB
  for name in ("BLOCK_BYTES", "AVX2_BLOCK_BYTES", "AVX512_BLOCK_BYTES"):
    monkeypatch.setattr(f"tiny_clang.matmul_panels.{name}", 16 * 128 * 4)
  for name in ("AVX2_MIN_BLOCK_ROWS", "AVX512_MIN_BLOCK_ROWS"):
    monkeypatch.setattr(f"tiny_clang.matmul_panels.{name}", 16)
  monkeypatch.setattr("tiny_clang.matmul_panels.AVX512_MIN_BLOCK_TILES", 2)     # (so that a block of 2 row tiles may stay)
  monkeypatch.setattr("tiny_clang.matmul_panels.AVX512_L2_BYTES", 24 * 1024)   # 8 + 16 KB fit
  k, inputs, ref = _packed_kernel(64, 128, 256, 32, Avx512LikeRenderer())
  assert k.applied_opts[-1] == Opt(OptOps.BLOCK, 0, 2), k.applied_opts
  monkeypatch.setattr("tiny_clang.matmul_panels.AVX512_L2_BYTES", 16 * 1024)   # they do not
  k, inputs, ref = _packed_kernel(64, 128, 256, 32, Avx512LikeRenderer())
  assert k.applied_opts[-1] == Opt(OptOps.SWAP, 0, 1), k.applied_opts
  got = run_kernel_on_python(k, inputs, (64, 256 // 32, 32)).reshape(64, 256)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)
  k, _, _ = _packed_kernel(64, 128, 128, 32, Avx512LikeRenderer())             # 4 panels: too few for 2 threads
  assert k.applied_opts[-1] == Opt(OptOps.BLOCK, 0, 2), k.applied_opts
  k, _, _ = _packed_kernel(64, 128, 128, 16, Avx2LikeRenderer())
  assert k.applied_opts[-1] == Opt(OptOps.BLOCK, 0, 4), k.applied_opts


def test_avx512_few_row_tiles_take_all_rows(monkeypatch: pytest.MonkeyPatch) -> None:
  """AVX-512, 2 threads: a long reduce leaves blocks of few row tiles (GPT-2's MLP down-projection, 128 x 3072 @ 3072
  x 768, made 4 blocks of 4 tiles), so all rows go in one block with the panels outermost; 1024² keeps its blocks of 16
  tiles, and AVX2 keeps its blocks either way."""
  monkeypatch.setattr("tiny_clang.matmul_panels.num_threads", lambda: 2)
  k, _, _ = _packed_kernel(128, 3072, 768, 32, Avx512LikeRenderer())
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.SWAP, 0, 1)], \
      k.applied_opts
  k, _, _ = _packed_kernel(64, 4096, 1024, 32, Avx512LikeRenderer())
  assert k.applied_opts[-1] == Opt(OptOps.SWAP, 0, 1), k.applied_opts
  k, _, _ = _packed_kernel(1024, 1024, 1024, 32, Avx512LikeRenderer())
  assert k.applied_opts[-1] == Opt(OptOps.BLOCK, 0, 16), k.applied_opts
  k, _, _ = _packed_kernel(128, 3072, 768, 16, Avx2LikeRenderer())
  assert k.applied_opts[-1].op is OptOps.BLOCK, k.applied_opts
  # too few panels to share out among the threads: the row blocks stay outermost
  k, _, _ = _packed_kernel(128, 3072, 224, 32, Avx512LikeRenderer())
  assert k.applied_opts[-1] == Opt(OptOps.BLOCK, 0, 4), k.applied_opts


def test_panels_outermost_only_with_enough_panels(monkeypatch: pytest.MonkeyPatch) -> None:
  """The panel loop goes outermost only with SLICES_PER_THREAD panels per thread: the threads share out the outer loop."""
  monkeypatch.setattr("tiny_clang.matmul_panels.num_threads", lambda: 2)
  k, _, _ = _packed_kernel(64, 128, 128, 16, Avx2LikeRenderer())    # 8 panels: 4 per thread
  assert k.applied_opts[-1] == Opt(OptOps.SWAP, 0, 1), k.applied_opts
  k, _, _ = _packed_kernel(64, 128, 64, 16, Avx2LikeRenderer())     # 4 panels
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 0, 4)], k.applied_opts


@pytest.mark.parametrize("m, kk, n, width", [(64, 40, 32, 16), (40, 36, 48, 16), (13, 20, 32, 16), (24, 16, 64, 32), (8, 24, 64, 16),
                                             (12, 20, 96, 16), (13, 20, 64, 16)])
def test_panel_kernel_exact_on_python(m: int, kk: int, n: int, width: int, monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
  """The tiled packed kernel (blocked, or panels outermost, odd row counts) computes numpy's product."""
  # a block of a's rows this small makes the small products (which PYTHON runs quickly) blocked too
  monkeypatch.setattr("tiny_clang.matmul_panels.BLOCK_BYTES", 8 * kk * 4)
  for name in ("AVX2", "AVX512"):
    monkeypatch.setattr(f"tiny_clang.matmul_panels.{name}_BLOCK_BYTES", 8 * kk * 4)
    monkeypatch.setattr(f"tiny_clang.matmul_panels.{name}_MIN_BLOCK_ROWS", 1)
  renderer = Avx2LikeRenderer() if width == 16 else Avx512LikeRenderer()
  k, inputs, ref = _packed_kernel(m, kk, n, width, renderer)
  blocked = m % 8 == 0 and m > 8 and width == 16
  assert (Opt(OptOps.BLOCK, 0, 2) in k.applied_opts) == blocked, k.applied_opts
  # unblocked (8 rows on AVX2 are 2 row tiles of one block), the panels go outermost when there are 4 or more
  assert (Opt(OptOps.SWAP, 0, 1) in k.applied_opts) == (not blocked and n // width >= 4), k.applied_opts
  got = run_kernel_on_python(k, inputs, (m, n // width, width)).reshape(m, n)
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)


def _copy_src(kk: int, n: int, view: str) -> np.ndarray:
  """The array that b is a view of: (kk, n) for a plain b, (n, kk) for a transposed one, (kk, n + 24) for a slice."""
  return _rand(*{"plain": (kk, n), "transposed": (n, kk), "sliced": (kk, n + 24)}[view], seed=kk)


def _copy_view(src: T, view: str, n: int) -> T:
  return {"plain": src, "transposed": src.T, "sliced": src[:, 8:n + 8]}[view]


def _copy_kernel(kk: int, n: int, width: int, view: str = "plain") -> Tuple[Kernel, np.ndarray, np.ndarray]:
  """The optimized copy of b, a (kk, n) view (see _copy_src), into width-column panels; its source array; numpy's panels."""
  src = _copy_src(kk, n, view)
  b = _copy_view(Tensor(src, device="PYTHON").realize(), view, n)
  panels = b.reshape(kk, n // width, width).permute(1, 0, 2).contiguous()
  si = create_schedule([panels.lazydata])[-1]
  ref = _copy_view(src, view, n).reshape(kk, n // width, width).transpose(1, 0, 2)
  renderer = Avx2LikeRenderer() if width == 16 else Avx512LikeRenderer()
  return Kernel(si.ast, opts=renderer).hand_coded_optimizations(), src, ref


def test_panel_copy_tile() -> None:
  """The copy of a row-major b reads blocks of 8 rows whole, block loop outermost; a transposed b is left alone."""
  k, _, _ = _copy_kernel(64, 64, 16)
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.BLOCK, 1, 8), Opt(OptOps.SWAP, 0, 1)], k.applied_opts
  k, _, _ = _copy_kernel(20, 128, 32)     # 20 rows: blocks of 4; AVX-512 panels of 32 = two upcasts of 16
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.BLOCK, 1, 4), Opt(OptOps.SWAP, 0, 1)], \
      k.applied_opts
  k, _, _ = _copy_kernel(32, 64, 16, "sliced")   # a slice of b's columns: rows 88 floats apart, read as pieces of 64
  assert k.applied_opts == [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.BLOCK, 1, 8), Opt(OptOps.SWAP, 0, 1)], k.applied_opts
  k, _, _ = _copy_kernel(64, 64, 16, "transposed")
  assert Opt(OptOps.BLOCK, 1, 8) not in k.applied_opts, k.applied_opts


@pytest.mark.parametrize("kk, n, width, view", [(64, 64, 16, "plain"), (20, 128, 32, "plain"), (18, 48, 16, "plain"), (7, 32, 16, "plain"),
                                                (24, 64, 16, "transposed"), (36, 32, 16, "sliced")])
def test_panel_copy_exact_on_python(kk: int, n: int, width: int, view: str) -> None:
  """The tiled copy (blocks of 8, 4 or 2 rows of b, or none for 7) writes numpy's panels."""
  k, src, ref = _copy_kernel(kk, n, width, view)
  got = run_kernel_on_python(k, [src], ref.shape)
  np.testing.assert_array_equal(got, ref)


def test_block_opt_checks_its_axis() -> None:
  """BLOCK splits a global axis by a proper divisor, and refuses anything else with a KernelOptError."""
  from tiny.codegen.kernel import KernelOptError
  k, _, _ = _packed_kernel(64, 32, 32, 16, Avx2LikeRenderer())
  for bad in (Opt(OptOps.BLOCK, 0, 5), Opt(OptOps.BLOCK, 0, 16), Opt(OptOps.BLOCK, 2, 2)):
    with pytest.raises(KernelOptError):
      k.copy().apply_opt(bad)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("shape_a, shape_b, dtype", [
  ((256, 128), (128, 256), np.float32),       # packed, one block
  ((3, 48, 256), (256, 96), np.float32),      # batch dims fold into the rows
  ((37, 300), (300, 512), np.float32),        # odd rows and reduce (copied in blocks of 4 rows of b)
  ((64, 129), (129, 512), np.float32),        # a reduce no block of b's rows divides: copied a row at a time
  ((128, 3072), (3072, 768), np.float32),     # a long reduce (GPT-2's MLP down-projection): one block on AVX-512
  ((128, 200), (200, 128), np.float64),
  ((256, 128), (128, 250), np.float32),       # n not a multiple of the panel: not packed
])
def test_packed_matmul_matches_numpy(device: str, shape_a: Tuple[int, ...], shape_b: Tuple[int, int], dtype: type) -> None:
  """End to end on the CPU devices: a @ b equals numpy's, packed or not."""
  an, bn = _rand(*shape_a, seed=1, dtype=dtype), _rand(*shape_b, seed=2, dtype=dtype)
  got = (Tensor(an, device=device) @ Tensor(bn, device=device)).numpy()
  tol = 1e-4 if dtype is np.float32 else 1e-10
  np.testing.assert_allclose(got, an @ bn, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_packed_matmul_of_views(device: str) -> None:
  """b given as a transposed or sliced view is packed from what the view shows."""
  an, wn = _rand(64, 256, seed=3), _rand(160, 300, seed=4)
  a, w = Tensor(an, device=device), Tensor(wn, device=device)
  np.testing.assert_allclose((a @ w[:128, 10:266].T).numpy(), an @ wn[:128, 10:266].T, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose((a @ w.T[:256, :128]).numpy(), an @ wn.T[:256, :128], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("seed", range(6))
def test_packed_matmul_fuzz(device: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
  """Random packed products (odd row counts, batches, b as a transposed or sliced view) under random block sizes, so
  that blocked, panel-outermost and single-tile kernels all occur: each equals numpy's."""
  rng = np.random.default_rng(seed)
  block = int(rng.choice([4, 12, 64, 256]))
  for name in ("BLOCK_BYTES", "AVX2_BLOCK_BYTES", "AVX512_BLOCK_BYTES"):
    monkeypatch.setattr(f"tiny_clang.matmul_panels.{name}", block * 4 * 64)
  monkeypatch.setattr("tiny_clang.matmul_panels.AVX2_MIN_BLOCK_ROWS", block)
  monkeypatch.setattr("tiny_clang.matmul_panels.AVX512_MIN_BLOCK_ROWS", block)
  for _ in range(3):
    m, kk, n = int(rng.integers(16, 300)), int(rng.integers(64, 400)), 32 * int(rng.integers(1, 9))
    batch = (int(rng.integers(1, 4)),) if rng.random() < 0.3 else ()
    an = _rand(*batch, m, kk, seed=int(rng.integers(1 << 30)))
    view = rng.choice(["plain", "transposed", "sliced"])
    src = _rand(n + 3, kk + 5, seed=int(rng.integers(1 << 30))) if view != "plain" else _rand(kk, n, seed=int(rng.integers(1 << 30)))
    w = Tensor(src, device=device)
    b, bn = {"plain": (w, src), "transposed": (w[:n, :kk].T, src[:n, :kk].T), "sliced": (w.T[2:kk + 2, 1:n + 1], src.T[2:kk + 2, 1:n + 1])}[view]
    got = (Tensor(an, device=device) @ b).numpy()
    np.testing.assert_allclose(got, an @ bn, rtol=1e-4, atol=1e-3, err_msg=f"{batch} {m}x{kk}x{n} {view} block {block}")


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_packed_matmul_gradients_match_torch(device: str) -> None:
  """Gradients flow through the packing copy: both operands' grads equal torch's."""
  torch = pytest.importorskip("torch", reason="torch is the reference for gradients")
  an, bn = _rand(64, 256, seed=5), _rand(256, 128, seed=6)
  a, b = Tensor(an, device=device, requires_grad=True), Tensor(bn, device=device, requires_grad=True)
  ((a @ b).relu() * 0.5).sum().backward()
  ta, tb = torch.tensor(an, requires_grad=True), torch.tensor(bn, requires_grad=True)
  ((ta @ tb).relu() * 0.5).sum().backward()
  assert a.grad is not None and b.grad is not None
  np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_cpu_matmul_is_packed() -> None:
  """On CLANG a big float product runs as a panel copy plus the blocked product kernel, and a small one is not packed.
  (b takes gradients: the panels of one that does not are packed once and kept, see test_panel_cache.)"""
  a, b = Tensor.rand(256, 256, device="CLANG").realize(), Tensor.rand(256, 256, device="CLANG", requires_grad=True).realize()
  sched = create_schedule([(a @ b).lazydata])
  assert len(sched) == 2, [si.ast for si in sched]
  small = create_schedule([(a[:8, :8] @ b[:8, :16]).lazydata])
  assert len(small) == 1


def _epilogue_kernel(epilogue: str) -> Kernel:
  """The optimized product kernel of a linear layer with `epilogue` fused after the reduce, for a CPU like the host (the
  schedule packs b's panels at the host's width, so the kernel is optimized for a renderer of that width)."""
  x, w, bias = (Tensor.rand(*s, device="CLANG").realize() for s in ((128, 256), (256, 512), (512,)))
  res = Tensor.rand(128, 512, device="CLANG").realize()
  y = x @ w + bias
  out = {"bias": y, "residual": res + y, "gelu": y.gelu()}[epilogue]
  si = create_schedule([out.lazydata])[-1]
  renderer = Avx512LikeRenderer() if host_simd_bytes() >= 64 else Avx2LikeRenderer()
  return Kernel(si.ast, opts=renderer).hand_coded_optimizations()


@pytest.mark.parametrize("epilogue", ["bias", "residual", "gelu"])
def test_fused_epilogue_keeps_the_panel_tile(epilogue: str) -> None:
  """A linear layer's bias, a residual add or an activation after the product (more buffers than a and b, read after
  the reduce) still gets the packed product's register tile (GPT-2's MLP and projections are such kernels)."""
  k = _epilogue_kernel(epilogue)
  rows = 8 if host_simd_bytes() >= 64 else 4   # 4 rows x 2 vectors on AVX2, 8 x 2 with AVX-512's 32 registers
  assert Opt(OptOps.UPCAST, 0, rows) in k.applied_opts and any(o.op is OptOps.UPCAST and o.amt == 16 for o in k.applied_opts), k.applied_opts


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
def test_fused_epilogue_matches_numpy(device: str) -> None:
  xn, wn, bn, rn = _rand(96, 200, seed=7), _rand(200, 256, seed=8), _rand(256, seed=9), _rand(96, 256, seed=10)
  x, w, b, r = (Tensor(v, device=device) for v in (xn, wn, bn, rn))
  y = xn @ wn + bn
  np.testing.assert_allclose((r + (x @ w + b)).numpy(), rn + y, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose((x @ w + b).relu().numpy(), np.maximum(y, 0), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose((b + x @ w).numpy(), y, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("device", ["CLANG", "LLVM"])
@pytest.mark.parametrize("shape_a, view", [((256, 128), "plain"), ((3, 48, 128), "plain"), ((67, 128), "transposed")])
def test_untracked_product_is_the_tracked_graph(device: str, shape_a: Tuple[int, ...], view: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """A product no gradient flows through is built on the LazyBuffers directly (`Tensor._dot_panels_untracked`): it
  must be the very graph the Tensor ops build when a takes a gradient (the lazy cache then hands both the same
  LazyBuffer), carry no autograd context, and equal numpy's product."""
  an, src = _rand(*shape_a, seed=11), _rand(128, 256, seed=12) if view == "plain" else _rand(256, 128, seed=12)
  w = Tensor(src, device=device).realize()
  b, bn = (w, src) if view == "plain" else (w.T, src.T)
  a = Tensor(an, device=device).realize()
  built: List[bool] = []
  untracked = Tensor._dot_panels_untracked
  monkeypatch.setattr(Tensor, "_dot_panels_untracked", lambda *args: built.append((r := untracked(*args)) is not None) or r)
  fast = a @ b
  a.requires_grad = True
  tracked = a @ b
  assert built == [True, False]
  assert fast._ctx is None and tracked._ctx is not None
  assert fast.requires_grad is None and tracked.requires_grad is True
  assert fast.lazydata is tracked.lazydata
  np.testing.assert_allclose(fast.numpy(), an @ bn, rtol=1e-4, atol=1e-3)


def test_untracked_product_requires_grad() -> None:
  """The untracked product's requires_grad is what Function.apply would give it: False when both operands say False,
  True (with no context) for an operand that takes gradients under Tensor.inference_mode, the graph of the Tensor ops."""
  a = Tensor.rand(64, 128, device="CLANG", requires_grad=False).realize()
  b = Tensor.rand(128, 256, device="CLANG", requires_grad=False).realize()
  out = a @ b
  assert out.requires_grad is False and out._ctx is None
  g = Tensor.rand(64, 128, device="CLANG", requires_grad=True).realize()
  with Tensor.inference_mode():
    ng = g @ b
  assert ng._ctx is None and ng.requires_grad is True
  assert ng.lazydata is (g @ b).lazydata
  np.testing.assert_allclose(out.numpy(), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(ng.numpy(), g.numpy() @ b.numpy(), rtol=1e-4, atol=1e-3)
