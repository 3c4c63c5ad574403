"""The packed panels of a weight kept between calls (tiny.panel_cache) and the buffer write versions that keep them honest.

Every test changes the weight between two products in one of the ways a program can (assign, optimizer step, copyin,
a copy from another device, a JIT that writes it, a disk load) and checks the next product, eager and replayed by a
TinyJit, against numpy. The JIT tests also check that the capture did read cached panels (a replay guard exists), so a
replay without the guard would have read the old weight."""
from __future__ import annotations

import gc
from typing import Any, Callable

import numpy as np
import pytest

from tiny import panel_cache
from tiny.device import Buffer
from tiny.engine.jit import TinyJit
from tiny.engine.schedule import create_schedule
from tiny.helpers import GlobalCounters
from tiny.tensor import Tensor

M, K, N = 64, 256, 256   # packed on every CPU (see tiny_clang.matmul_panels.panel_width)


def _rand(*shape: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _close(got: Tensor, want: np.ndarray) -> None:
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-3)


def _buf(t: Tensor) -> Buffer:
  buf = t.lazydata.base.realized
  assert buf is not None
  return buf


@pytest.fixture(params=["CLANG", "LLVM"])
def device(request: Any) -> str:
  if request.param == "LLVM":
    pytest.importorskip("llvmlite", reason="LLVM needs llvmlite")
  return request.param


def test_second_product_reads_cached_panels(device: str) -> None:
  """The first product packs the weight and keeps the panels; the second one is the product kernel alone."""
  xn, wn = _rand(M, K, seed=1), _rand(K, N, seed=2)
  x, w = Tensor(xn, device=device).realize(), Tensor(wn, device=device).realize()
  _close(x @ w, xn @ wn)
  assert len(create_schedule([(x @ w).lazydata])) == 1
  # a weight that takes gradients is packed inside the graph, so the gradient reaches it
  wg = Tensor(wn, device=device, requires_grad=True).realize()
  assert len(create_schedule([(x @ wg).lazydata])) == 2


def test_eager_assign_copyin_and_views(device: str) -> None:
  """assign, copyin and another view of the same buffer each give the product of what the weight holds now."""
  xn, wn = _rand(M, K, seed=3), _rand(K, N, seed=4)
  x, w = Tensor(xn, device=device).realize(), Tensor(wn, device=device).realize()
  _close(x @ w, xn @ wn)
  w.assign(w * 2 + 1).realize()
  wn = wn * 2 + 1
  _close(x @ w, xn @ wn)
  w[:, :32].assign(Tensor.full((K, 32), 3.0, device=device)).realize()   # in place through a view: same buffer
  wn[:, :32] = 3.0
  _close(x @ w, xn @ wn)
  wn = _rand(K, N, seed=5)
  _buf(w).copyin(memoryview(np.ascontiguousarray(wn)))
  _close(x @ w, xn @ wn)
  # views of one buffer have panels of their own: the transpose and a slice
  _close(x @ w.T, xn @ wn.T)
  _close(x @ w[:, 64:].pad((None, (0, 64))), xn @ np.pad(wn[:, 64:], ((0, 0), (0, 64))))
  _close(x @ w, xn @ wn)


def test_copy_from_another_device(device: str) -> None:
  """A weight overwritten by a copy from another device (a BufferCopy, not a kernel) is repacked."""
  xn, wn, vn = _rand(M, K, seed=6), _rand(K, N, seed=7), _rand(K, N, seed=8)
  x, w = Tensor(xn, device=device).realize(), Tensor(wn, device=device).realize()
  _close(x @ w, xn @ wn)
  w.assign(Tensor(vn, device=f"{device}:1").to(device)).realize()
  _close(x @ w, xn @ vn)


def test_disk_load(device: str, tmp_path: Any) -> None:
  """A weight assigned from a file on the DISK device is repacked."""
  xn, wn, vn = _rand(M, K, seed=9), _rand(K, N, seed=10), _rand(K, N, seed=11)
  path = tmp_path / "w.bin"
  vn.tofile(path)
  x, w = Tensor(xn, device=device).realize(), Tensor(wn, device=device).realize()
  _close(x @ w, xn @ wn)
  w.assign(Tensor.empty(K, N, device=f"disk:{path}").to(device)).realize()
  _close(x @ w, xn @ vn)


def test_optimizer_step_then_eval(device: str) -> None:
  """Training steps write the weight (an SGD step, eager); an evaluation under no_grad between them caches panels and
  must see every step's weight."""
  from tiny_nn.optim import SGD
  xn, wn = _rand(M, K, seed=12), _rand(K, N, seed=13)
  x, w = Tensor(xn, device=device).realize(), Tensor(wn, device=device, requires_grad=True).realize()
  opt = SGD([w], lr=0.1)
  for _ in range(3):
    with Tensor.train():
      opt.zero_grad()
      (x @ w).sum().backward()
      opt.step()
    wn = wn - 0.1 * xn.sum(0)[:, None]
    with Tensor.inference_mode():
      _close(x @ w, xn @ wn)


def _jit_after_changes(device: str, change: Callable[[Tensor, np.ndarray, int], np.ndarray]) -> None:
  """A jitted product replayed after `change(w, wn, step)` wrote the weight (and returned its new contents)."""
  xn, wn = _rand(M, K, seed=14), _rand(K, N, seed=15)
  x, w = Tensor(xn, device=device).realize(), Tensor(wn, device=device).realize()

  @TinyJit
  def f(inp: Tensor) -> Tensor:
    return (inp @ w + 1).realize()

  for step in range(6):
    if step >= 3:   # the first call packs, the second (the capture) reads the cached panels; then replays
      wn = change(w, wn, step)
    _close(f(x), xn @ wn + 1)
    _close(x @ w, xn @ wn)       # the eager product agrees
  assert len(f.replay_guards) == 1


def test_jit_replay_after_assign(device: str) -> None:
  def change(w: Tensor, wn: np.ndarray, step: int) -> np.ndarray:
    w.assign(w - 0.5).realize()
    return wn - 0.5
  _jit_after_changes(device, change)


def test_jit_replay_after_copyin(device: str) -> None:
  def change(w: Tensor, wn: np.ndarray, step: int) -> np.ndarray:
    new = _rand(K, N, seed=100 + step)
    _buf(w).copyin(memoryview(new))
    return new
  _jit_after_changes(device, change)


def test_jit_replay_after_another_jits_writes(device: str) -> None:
  """The weight written by the replays of a second JIT (an update step) between the product's replays."""
  state = {}

  def change(w: Tensor, wn: np.ndarray, step: int) -> np.ndarray:
    if "update" not in state:
      @TinyJit
      def update(scale: Tensor) -> Tensor:
        w.assign(w * scale).realize()
        return scale.contiguous().realize()
      state["update"] = update
    for _ in range(4):   # eager, capture and replays of the update
      state["update"](Tensor([1.5], device=w.device).realize())
      wn = wn * np.float32(1.5)
    return wn
  _jit_after_changes(device, change)


def test_jit_that_writes_its_weight(device: str) -> None:
  """A JIT that updates the weight after the product: its first call wrote the weight, so the capture finds the panels
  stale and captures the copy with the product; every replay then packs what the weight holds."""
  xn, wn = _rand(M, K, seed=16), _rand(K, N, seed=17)
  x, w = Tensor(xn, device=device).realize(), Tensor(wn, device=device).realize()
  _close(x @ w, xn @ wn)   # packed and cached before the JIT's first call

  @TinyJit
  def step(inp: Tensor, flag: Tensor) -> Tensor:
    y = (inp @ w).realize()
    w.assign(w + flag).realize()
    return y

  for i in range(5):
    _close(step(x, Tensor([0.25], device=device).realize()), xn @ wn)
    wn = wn + np.float32(0.25)
  _close(x @ w, xn @ wn)


def test_write_versions_of_kernels_copies_and_jit(device: str) -> None:
  """A kernel's outputs change version and its inputs do not; copyin, views and JIT replays count as writes."""
  Buffer.track_writes()   # (the panel cache turns it on before its first version; this test reads versions itself)
  a = Tensor(_rand(16, seed=18), device=device).realize()
  b = Tensor(_rand(16, seed=19), device=device).realize()
  va, vb = _buf(a).write_version(), _buf(b).write_version()
  b.assign(a + b).realize()
  assert _buf(a).write_version() == va and _buf(b).write_version() != vb
  vb = _buf(b).write_version()
  _buf(b).copyin(memoryview(_rand(16, seed=20)))
  assert _buf(b).write_version() != vb

  @TinyJit
  def bump(inp: Tensor) -> Tensor:
    b.assign(b + inp).realize()
    return inp.contiguous().realize()

  seen = set()
  for _ in range(5):
    vin = _buf(a).write_version()
    bump(a)
    assert _buf(a).write_version() == vin   # read, not written
    seen.add(_buf(b).write_version())
  assert len(seen) == 5


def test_panels_freed_with_the_weight(device: str) -> None:
  """The panels go when the weight's buffer does (eager cache and a JIT that used them); memory returns to where it was."""
  x = Tensor(_rand(M, K, seed=21), device=device).realize()
  gc.collect()
  before, entries = GlobalCounters.mem_used, panel_cache.cache_size()
  state = {"w": Tensor(_rand(K, N, seed=22), device=device).realize()}

  @TinyJit
  def f(inp: Tensor) -> Tensor:
    return (inp @ state["w"]).realize()

  for _ in range(3):
    f(x)
  assert panel_cache.cache_size() == entries + 1 and len(f.replay_guards) == 1
  del state["w"], f
  gc.collect()
  assert panel_cache.cache_size() == entries
  assert GlobalCounters.mem_used == before
