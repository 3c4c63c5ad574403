"""A packed matmul with its panels outermost prefetches the next panel (tiny_clang.panel_prefetch) on CLANG and LLVM.

The decision tests look at the linearized kernels of an AVX-512-like renderer (any host); the source tests check the
prefetch in what CLANG and LLVM render on a host with 512-bit vectors; the end-to-end tests check against numpy that the
products (with a fused bias, gelu or residual) are unchanged with the prefetch on and off."""
from __future__ import annotations

import re
from typing import Any, Iterator, Optional

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel
from tiny.device import Device
from tiny.engine.realize import get_runner
from tiny.engine.schedule import create_schedule
from tiny.ops import MetaOps
from tiny.tensor import Tensor
from tiny_clang.panel_prefetch import PanelPrefetch, panel_prefetch
from tiny_clang.testing import Avx2LikeRenderer, Avx512LikeRenderer


def _rand(*shape: int, seed: int) -> np.ndarray:
  return (np.random.default_rng(seed).standard_normal(shape) * 0.1).astype(np.float32)


def _packed(m: int, kk: int, n: int, width: int = 32, renderer: Any = None) -> Kernel:
  """The linearized, optimized product kernel of (m, kk) @ (kk, n) with b packed into width-column panels."""
  a, b = Tensor(_rand(m, kk, seed=1), device="PYTHON"), Tensor(_rand(kk, n, seed=2), device="PYTHON")
  panels = b.reshape(kk, n // width, width).permute(1, 0, 2).contiguous().realize()
  out = (a.reshape(m, 1, 1, kk) * panels.permute(0, 2, 1)).sum(-1).reshape(m, n)
  si = create_schedule([out.lazydata])[-1]
  k = Kernel(si.ast, opts=renderer or Avx512LikeRenderer()).hand_coded_optimizations()
  k.linearize()
  return k


def _decide(k: Kernel, simd_bytes: int = 64) -> Optional[PanelPrefetch]:
  assert k.uops is not None
  return panel_prefetch(k.uops.uops, simd_bytes)


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr("tiny_clang.matmul_panels.num_threads", lambda: 2)


def test_panels_outermost_prefetch_the_next_panel(two_threads: None) -> None:
  """GPT-2's MLP up-projection (128 x 768 @ 768 x 3072, 96 panels of 768 x 32 floats, 16 row tiles of 8): each row
  tile prefetches 1/16 of the next panel, 8 bytes further each reduce step, from the panel load 96 KB ahead."""
  k = _packed(128, 768, 3072)
  pp = _decide(k)
  assert pp is not None
  panel = 768 * 32 * 4
  assert (pp.ahead, pp.share, pp.step) == (panel, panel // 16, panel // 16 // 768 - 32 * 4), pp
  assert pp.load.dtype is not None and pp.load.dtype.count == 16 and pp.tile.arg[1] is False and pp.reduce.arg[1] is True
  # the down-projection (128 x 3072 @ 3072 x 768): 24 panels of 3072 x 32
  pp = _decide(_packed(128, 3072, 768))
  assert pp is not None and pp.ahead == 3072 * 32 * 4 and pp.share == 3072 * 32 * 4 // 16


def test_tiles_that_do_not_divide_the_panel(two_threads: None) -> None:
  """5 row tiles (40 rows): each tile's share is rounded up to whole bytes a step, so the shares cover the panel."""
  pp = _decide(_packed(40, 1024, 512))
  assert pp is not None
  panel = 1024 * 32 * 4
  assert pp.share * 5 >= panel and pp.share == 1024 * (pp.step + 32 * 4), pp


def test_no_prefetch_where_it_does_not_apply(two_threads: None) -> None:
  """No prefetch: a blocked kernel (row blocks outermost, 1024²), a buffer of panels under MIN_BYTES, too few or too
  many row tiles, a renderer without 512-bit vectors, and the AVX2 tile."""
  assert _decide(_packed(1024, 1024, 1024)) is None                      # blocks, panels, tiles, reduce: four loops
  assert _decide(_packed(2048, 2048, 2048)) is None                      # panels outermost, but 256 row tiles
  assert _decide(_packed(128, 256, 512)) is None                         # 512 KB of panels
  assert _decide(_packed(24, 4096, 512)) is None                         # 3 row tiles
  assert _decide(_packed(128, 768, 3072), simd_bytes=32) is None
  assert _decide(_packed(128, 768, 3072, 16, Avx2LikeRenderer()), simd_bytes=32) is None


@pytest.fixture(params=["CLANG", "LLVM"])
def dev(request: Any) -> Iterator[str]:
  name = request.param
  if name == "LLVM":
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
  yield name


def _product_source(dev: str, x: Tensor, w: Tensor) -> str:
  sched = [si for si in create_schedule([(x @ w).lazydata]) if si.ast.op is MetaOps.KERNEL]
  return get_runner(dev, sched[-1].ast).p.src


def test_rendered_prefetch(dev: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """On a host with 512-bit vectors the up-projection's kernel carries one L2 prefetch (read) next to its panel load."""
  if Device[dev].renderer.simd_bytes < 64:
    pytest.skip("the prefetch is for hosts with 512-bit vectors")
  monkeypatch.setattr("tiny_clang.matmul_panels.num_threads", lambda: 2)
  monkeypatch.setattr(Device[dev].renderer, "next_panel_prefetch", True)
  x, w = Tensor(_rand(128, 768, seed=3), device=dev), Tensor(_rand(768, 3072, seed=4), device=dev).realize()
  src = _product_source(dev, x, w)
  if dev == "CLANG":
    assert re.findall(r"__builtin_prefetch\(.*\+\(98304\+\(long long\)ridx\d+\*6144\+\(long long\)ridx\d+\*\(-120\)\)\), 0, 2\)", src), src
  else:
    assert len(re.findall(r"call void @llvm.prefetch.p0\(ptr %\w+, i32 0, i32 2, i32 1\)", src)) == 1, src
  monkeypatch.setattr(Device[dev].renderer, "next_panel_prefetch", False)
  assert "prefetch" not in _product_source(dev, x, w)


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("m, kk, n, epilogue", [(128, 768, 3072, "gelu"), (128, 3072, 768, "residual"), (40, 1024, 512, "bias"),
                                                (96, 768, 2304, "bias")])
def test_products_match_numpy(dev: str, on: bool, m: int, kk: int, n: int, epilogue: str, monkeypatch: pytest.MonkeyPatch) -> None:
  """GPT-2's prefill linear layers and an odd tile count: the same results as numpy with the prefetch on and off."""
  monkeypatch.setattr("tiny_clang.matmul_panels.num_threads", lambda: 2)
  monkeypatch.setattr(Device[dev].renderer, "next_panel_prefetch", on)
  xn, wn, bn, rn = _rand(m, kk, seed=5), _rand(kk, n, seed=6), _rand(n, seed=7), _rand(m, n, seed=8)
  x, w, b, r = (Tensor(v, device=dev) for v in (xn, wn, bn, rn))
  y = xn.astype(np.float64) @ wn.astype(np.float64) + bn
  if epilogue == "gelu":
    got, ref = (x @ w + b).gelu().numpy(), 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
  elif epilogue == "residual":
    got, ref = (r + (x @ w + b)).numpy(), rn + y
  else:
    got, ref = (x @ w + b).numpy(), y
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
