"""Multi-device tensors (tiny.multi): Tensor.shard, ops across shards, allreduce, gather, autograd, TinyJit, data-parallel training.

Every result is compared with numpy or with the same computation on one device. The main pair of devices is CLANG:0 and
CLANG:1 (two instances of the clang device, each with its own allocator); a few small cases also run on PYTHON:0 + PYTHON:1
and on an OpenCL GPU where one is available.
"""
from __future__ import annotations

import collections
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

from tiny import Tensor
from tiny.engine.jit import TinyJit
from tiny.engine.realize import run_schedule
from tiny.helpers import Context
from tiny.multi import MultiDeviceError, MultiLazyBuffer, split_sizes
from tiny.ops import MetaOps
from tiny.registry import Device

D2 = ("CLANG:0", "CLANG:1")
D3 = ("CLANG:0", "CLANG:1", "CLANG:2")


def _need(*devices: str) -> Tuple[str, ...]:
  for d in devices:
    try:
      Device[d]
    except Exception as e:  # an absent driver or toolchain: the test cannot run here
      pytest.skip(f"device {d} is not available: {type(e).__name__}: {str(e).splitlines()[0]}")
  return devices


@pytest.fixture
def d2() -> Tuple[str, ...]:
  return _need(*D2)


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _mlb(t: Tensor) -> MultiLazyBuffer:
  assert isinstance(t.lazydata, MultiLazyBuffer)
  return t.lazydata


# ---------------- splitting ----------------

def test_split_sizes_rule() -> None:
  assert split_sizes(7, 2) == [4, 3]
  assert split_sizes(8, 2) == [4, 4]
  assert split_sizes(5, 4) == [2, 1, 1, 1]
  assert split_sizes(2, 3) == [1, 1, 0]
  for n in range(0, 20):
    for k in range(1, 6):
      s = split_sizes(n, k)
      assert sum(s) == n and max(s) - min(s) <= 1 and s == sorted(s, reverse=True)
  with pytest.raises(ValueError):
    split_sizes(3, 0)


def test_device_instances_are_separate(d2: Tuple[str, ...]) -> None:
  dev0, dev1 = Device[d2[0]], Device[d2[1]]
  assert dev0 is not dev1 and dev0.allocator is not dev1.allocator
  a = _rand(5)
  moved = Tensor(a, device=d2[0]).to(d2[1]) * 2
  sched = moved.schedule()
  assert any(si.ast.op is MetaOps.COPY and si.outputs[0].device == Device.canonicalize(d2[1]) for si in sched)
  run_schedule(sched)
  np.testing.assert_allclose(moved.numpy(), a * 2)


def test_shard_layout_uneven(d2: Tuple[str, ...]) -> None:
  a = _rand(7, 3)
  t = Tensor(a).shard(d2, axis=0)
  m = _mlb(t)
  assert t.device == tuple(Device.canonicalize(d) for d in d2)
  assert t.shape == (7, 3) and m.axis == 0 and m.bounds == ((0, 4), (4, 7)) and m.real == [True, True]
  assert [lb.shape for lb in m.lbs] == [(4, 3), (3, 3)]
  assert [lb.device for lb in m.lbs] == list(t.device)
  np.testing.assert_array_equal(t.numpy(), a)
  # each shard holds its own rows
  for lb, (lo, hi) in zip(m.lbs, m.bounds or ()):
    np.testing.assert_array_equal(Tensor(lb, device=lb.device).numpy(), a[lo:hi])
  # negative axis and axis 1
  t1 = Tensor(a).shard(d2, axis=-1)
  assert _mlb(t1).axis == 1 and _mlb(t1).bounds == ((0, 2), (2, 3))
  np.testing.assert_array_equal(t1.numpy(), a)


def test_shard_errors(d2: Tuple[str, ...]) -> None:
  t = Tensor(_rand(4, 2))
  with pytest.raises(ValueError):
    t.shard((d2[0], d2[0]), axis=0)
  with pytest.raises((IndexError, ValueError)):
    t.shard(d2, axis=2)
  with pytest.raises(TypeError):
    t.shard("CLANG:0", axis=0)  # type: ignore[arg-type]


def test_replicated_creation(d2: Tuple[str, ...]) -> None:
  a = _rand(3, 4)
  t = Tensor(a, device=d2)
  m = _mlb(t)
  assert m.axis is None and t.device == tuple(Device.canonicalize(d) for d in d2)
  for lb in m.lbs:
    np.testing.assert_array_equal(Tensor(lb, device=lb.device).numpy(), a)
  np.testing.assert_array_equal(Tensor([[1, 2], [3, 4]], device=d2).numpy(), [[1, 2], [3, 4]])
  np.testing.assert_array_equal(Tensor.zeros(2, 3, device=d2).numpy(), np.zeros((2, 3)))
  np.testing.assert_array_equal(Tensor.ones(4, device=d2).numpy(), np.ones(4))
  np.testing.assert_array_equal(Tensor.arange(5, device=d2).numpy(), np.arange(5))
  e = Tensor.empty(2, 2, device=d2)
  assert e.shape == (2, 2) and isinstance(e.lazydata, MultiLazyBuffer)
  assert Tensor(3.5, device=d2).item() == 3.5
  assert Tensor([[1, 2], [3, 4]], device=d2).tolist() == [[1, 2], [3, 4]]
  assert isinstance(Tensor(a).to(d2).lazydata, MultiLazyBuffer)


def test_rand_on_devices_matches_single_device(d2: Tuple[str, ...]) -> None:
  Tensor.manual_seed(5)
  single = Tensor.rand(6, 3).numpy()
  Tensor.manual_seed(5)
  multi = Tensor.rand(6, 3, device=d2)
  assert isinstance(multi.lazydata, MultiLazyBuffer)
  np.testing.assert_array_equal(multi.numpy(), single)
  Tensor.manual_seed(5)
  again = Tensor.rand(6, 3, device=d2).numpy()
  np.testing.assert_array_equal(again, single)


# ---------------- elementwise ----------------

@pytest.mark.parametrize("axis", [None, 0, 1])
def test_elementwise_and_broadcast(d2: Tuple[str, ...], axis: Any) -> None:
  a, b, c = _rand(7, 5, seed=1), _rand(7, 5, seed=2), _rand(5, seed=3)
  ta, tb = Tensor(a).shard(d2, axis), Tensor(b).shard(d2, axis)
  tc = Tensor(c).shard(d2)
  np.testing.assert_allclose((ta * tb + 1).numpy(), a * b + 1, rtol=1e-6)
  np.testing.assert_allclose((ta - tc).relu().numpy(), np.maximum(a - c, 0), rtol=1e-6)
  np.testing.assert_allclose(ta.exp().numpy(), np.exp(a), rtol=1e-6)
  np.testing.assert_array_equal((ta < tb).numpy(), a < b)
  np.testing.assert_allclose((ta > 0).where(ta, tb).numpy(), np.where(a > 0, a, b))
  np.testing.assert_allclose((ta.cast("float16").cast("float32")).numpy(), a.astype(np.float16).astype(np.float32))
  out = ta * tc
  assert _mlb(out).axis == axis


def test_elementwise_between_different_axes_reshards(d2: Tuple[str, ...]) -> None:
  a, b = _rand(6, 4, seed=1), _rand(6, 4, seed=2)
  t0, t1 = Tensor(a).shard(d2, 0), Tensor(b).shard(d2, 1)
  out = t0 + t1
  assert _mlb(out).axis == 0 and _mlb(out).bounds == _mlb(t0).bounds
  np.testing.assert_allclose(out.numpy(), a + b, rtol=1e-6)
  out2 = t1 * t0
  assert _mlb(out2).axis == 1
  np.testing.assert_allclose(out2.numpy(), a * b, rtol=1e-6)


def test_mixing_single_and_multi_device_raises(d2: Tuple[str, ...]) -> None:
  t = Tensor(_rand(4, 2)).shard(d2, 0)
  with pytest.raises(MultiDeviceError):
    (t + Tensor(_rand(4, 2), device=d2[0])).realize()


# ---------------- matmul ----------------

def test_matmul_batch_sharded_weight_replicated(d2: Tuple[str, ...]) -> None:
  x, w = _rand(9, 6, seed=1), _rand(6, 4, seed=2)
  out = Tensor(x).shard(d2, 0) @ Tensor(w).shard(d2)
  assert _mlb(out).axis == 0
  np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)


def test_matmul_weight_sharded_on_output_features(d2: Tuple[str, ...]) -> None:
  x, w = _rand(5, 6, seed=1), _rand(6, 8, seed=2)
  out = Tensor(x).shard(d2) @ Tensor(w).shard(d2, 1)
  assert _mlb(out).axis == 1
  np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)


def test_matmul_contracting_sharded_axis_allreduces(d2: Tuple[str, ...]) -> None:
  x, w = _rand(5, 7, seed=1), _rand(7, 3, seed=2)
  out = Tensor(x).shard(d2, 1) @ Tensor(w).shard(d2, 0)
  assert _mlb(out).axis is None  # the partial products were allreduced
  np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)
  # every device holds the full result
  for lb in _mlb(out).lbs:
    np.testing.assert_allclose(Tensor(lb, device=lb.device).numpy(), x @ w, rtol=1e-5, atol=1e-5)


# ---------------- reductions ----------------

@pytest.mark.parametrize("shape,axis", [((7, 5), 0), ((7, 5), 1), ((2, 9, 3), 1), ((5,), 0)])
def test_reductions(d2: Tuple[str, ...], shape: Tuple[int, ...], axis: int) -> None:
  a = _rand(*shape, seed=4)
  t = Tensor(a).shard(d2, axis)
  for red_axis in [None, *range(len(shape))]:
    np.testing.assert_allclose(t.sum(red_axis).numpy(), a.sum(red_axis), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t.max(red_axis).numpy(), a.max(red_axis))
    np.testing.assert_allclose(t.min(red_axis).numpy(), a.min(red_axis))
    np.testing.assert_allclose(t.mean(red_axis).numpy(), a.mean(red_axis), rtol=1e-5, atol=1e-6)
  assert _mlb(t.sum(axis)).axis is None
  if len(shape) > 1:
    other = (axis + 1) % len(shape)
    assert _mlb(t.sum(other, keepdim=True)).axis == axis


@pytest.mark.parametrize("n", [1, 7, 100])
@pytest.mark.parametrize("devices", [D2, D3])
def test_ring_allreduce_matches_naive(n: int, devices: Tuple[str, ...]) -> None:
  devs = _need(*devices)
  a = _rand(n, 4, seed=n)
  for ring in (0, 2):
    with Context(RING=ring):
      t = Tensor(a).shard(devs, 0)
      s, m = t.sum(0), t.max(0)
      np.testing.assert_allclose(s.numpy(), a.sum(0), rtol=1e-5, atol=1e-5)
      np.testing.assert_array_equal(m.numpy(), a.max(0))
      # every device ends with the same values
      per_dev = [Tensor(lb, device=lb.device).numpy() for lb in _mlb(s).lbs]
      for p in per_dev[1:]:
        np.testing.assert_array_equal(p, per_dev[0])


def test_ring_allreduce_copies_less_per_device() -> None:
  devs = _need(*D3)
  a = _rand(3, 600, seed=9)

  def copies(ring: int) -> Tuple[int, int]:
    with Context(RING=ring):
      t = Tensor(a).shard(devs, 0).realize()
      sched = t.sum(0).schedule()
    cps = [si for si in sched if si.ast.op is MetaOps.COPY]
    return len(cps), sum(si.outputs[0].nbytes for si in cps)

  n_naive, bytes_naive = copies(0)
  n_ring, bytes_ring = copies(2)
  assert n_naive == 3 * 2 and bytes_naive == 6 * 600 * 4
  # ring: 2(n-1) steps of n chunks each, a third of the data per chunk
  assert n_ring == 2 * 2 * 3 and bytes_ring == 2 * 2 * 3 * 200 * 4


# ---------------- movement ----------------

def test_reshape_keeps_sharded_axis(d2: Tuple[str, ...]) -> None:
  a = _rand(8, 6)
  t = Tensor(a).shard(d2, 0)
  for shape in [(8, 2, 3), (2, 4, 6), (48,), (1, 8, 6), (8, 6, 1)]:
    r = t.reshape(shape)
    np.testing.assert_array_equal(r.numpy(), a.reshape(shape))
    assert _mlb(r).axis is not None
  with pytest.raises(MultiDeviceError):
    Tensor(a).shard(d2, 1).reshape(48)   # rows of the second axis interleave: not a per-device reshape


def test_permute_expand_flip(d2: Tuple[str, ...]) -> None:
  a = _rand(4, 1, 6)
  t = Tensor(a).shard(d2, 2)
  p = t.permute(2, 0, 1)
  assert _mlb(p).axis == 0
  np.testing.assert_array_equal(p.numpy(), a.transpose(2, 0, 1))
  np.testing.assert_array_equal(t.expand(4, 3, 6).numpy(), np.broadcast_to(a, (4, 3, 6)))
  np.testing.assert_array_equal(t.flip(0).numpy(), a[::-1])
  with pytest.raises(MultiDeviceError):
    t.flip(2)
  np.testing.assert_array_equal(t.transpose(0, 2).numpy(), a.transpose(2, 1, 0))


def test_shrink_and_pad_along_sharded_axis(d2: Tuple[str, ...]) -> None:
  a = _rand(7, 3)
  t = Tensor(a).shard(d2, 0)
  # exactly one shard: selected, the other shard kept but not real
  first, second = t[:4], t[4:]
  assert _mlb(first).real == [True, False] and _mlb(second).real == [False, True]
  np.testing.assert_array_equal(first.numpy(), a[:4])
  np.testing.assert_array_equal(second.numpy(), a[4:])
  np.testing.assert_allclose((first * 2 + 1).sum(0).numpy(), (a[:4] * 2 + 1).sum(0), rtol=1e-6)
  # padding a selected shard back to full size restores the layout (zeros elsewhere)
  back = second.pad(((4, 0), None))
  assert _mlb(back).real == [True, True] and _mlb(back).bounds == ((0, 4), (4, 7))
  np.testing.assert_array_equal(back.numpy(), np.pad(a[4:], ((4, 0), (0, 0))))
  # any other range: each shard keeps its part
  np.testing.assert_array_equal(t[2:6].numpy(), a[2:6])
  np.testing.assert_array_equal(t[1:3].numpy(), a[1:3])
  np.testing.assert_array_equal(t[5:].numpy(), a[5:])
  # padding along the sharded axis of a whole tensor pads the outer shards
  np.testing.assert_array_equal(t.pad(((1, 2), (0, 1))).numpy(), np.pad(a, ((1, 2), (0, 1))))
  # shrink/pad on another axis is per shard
  np.testing.assert_array_equal(t[:, 1:].numpy(), a[:, 1:])


def test_more_devices_than_rows() -> None:
  devs = _need(*D3)
  a = _rand(2, 3)
  t = Tensor(a).shard(devs, 0)
  assert [lb.shape for lb in _mlb(t).lbs] == [(1, 3), (1, 3), (0, 3)]
  np.testing.assert_array_equal(t.numpy(), a)
  np.testing.assert_allclose((t * 2).sum(0).numpy(), (a * 2).sum(0), rtol=1e-6)
  np.testing.assert_array_equal(t.max(0).numpy(), a.max(0))
  np.testing.assert_allclose((t @ Tensor(a.T).shard(devs)).numpy(), a @ a.T, rtol=1e-5)


def test_integer_index_on_sharded_axis(d2: Tuple[str, ...]) -> None:
  a = _rand(7, 3)
  t = Tensor(a).shard(d2, 0)
  for i in (0, 3, 4, 6, -1):
    np.testing.assert_array_equal(t[i].numpy(), a[i])
  np.testing.assert_array_equal(t[:, 2].numpy(), a[:, 2])


def test_cat(d2: Tuple[str, ...]) -> None:
  a, b = _rand(5, 3, seed=1), _rand(5, 3, seed=2)
  ta, tb = Tensor(a).shard(d2, 0), Tensor(b).shard(d2, 0)
  np.testing.assert_array_equal(ta.cat(tb, dim=0).numpy(), np.concatenate([a, b], 0))
  np.testing.assert_array_equal(ta.cat(tb, dim=1).numpy(), np.concatenate([a, b], 1))
  np.testing.assert_array_equal(Tensor.stack(ta, tb, dim=0).numpy(), np.stack([a, b]))


def test_gather_to_one_device(d2: Tuple[str, ...]) -> None:
  a = _rand(7, 2)
  t = Tensor(a).shard(d2, 0) * 3
  for dev in (d2[0], d2[1], "PYTHON"):
    g = t.to(dev)
    assert g.device == Device.canonicalize(dev) and not isinstance(g.lazydata, MultiLazyBuffer)
    np.testing.assert_allclose(g.numpy(), a * 3, rtol=1e-6)
  # resharding a sharded tensor on another axis
  r = t.shard(d2, 1)
  assert _mlb(r).axis == 1
  np.testing.assert_allclose(r.numpy(), a * 3, rtol=1e-6)


def test_assign_and_realize(d2: Tuple[str, ...]) -> None:
  a = _rand(6, 2)
  t = Tensor(a).shard(d2, 0).contiguous().realize()
  bufs = [lb.base.realized for lb in _mlb(t).lbs]
  assert all(b is not None for b in bufs)
  t.assign(t * 2).realize()
  np.testing.assert_allclose(t.numpy(), a * 2, rtol=1e-6)
  assert [lb.base.realized for lb in _mlb(t).lbs] == bufs, "assign writes the same buffers"
  r = Tensor(a, device=d2).contiguous().realize()
  r.assign(Tensor(a).shard(d2, 0) + 1).realize()  # a sharded value into a replicated tensor
  np.testing.assert_allclose(r.numpy(), a + 1, rtol=1e-6)


# ---------------- autograd ----------------

def test_autograd_matches_single_device(d2: Tuple[str, ...]) -> None:
  x, w, b = _rand(7, 5, seed=1), _rand(5, 4, seed=2), _rand(4, seed=3)

  def loss(tx: Tensor, tw: Tensor, tb: Tensor) -> Tensor:
    h = (tx @ tw + tb).relu()
    return (h.softmax(1) * h).sum(1).mean() + (tx * tx).max()

  refs = [Tensor(v, requires_grad=True) for v in (x, w, b)]
  loss(*refs).backward()
  tx = Tensor(x, requires_grad=True).shard(d2, 0)
  tw, tb = Tensor(w, requires_grad=True).shard(d2), Tensor(b, requires_grad=True).shard(d2)
  out = loss(tx, tw, tb)
  out.backward()
  for t, r in zip((tx, tw, tb), refs):
    assert t.grad is not None and r.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-5, atol=1e-6)
    # the gradient of a sharded tensor is sharded like it
    assert _mlb(t.grad).axis == _mlb(t).axis and _mlb(t.grad).bounds == _mlb(t).bounds
  assert _mlb(tx.grad).axis == 0


def test_autograd_through_shard_selection(d2: Tuple[str, ...]) -> None:
  a = _rand(7, 3)
  t = Tensor(a, requires_grad=True).shard(d2, 0)
  (t[4:] * 3).sum().backward()
  assert t.grad is not None
  expect = np.zeros_like(a)
  expect[4:] = 3
  np.testing.assert_array_equal(t.grad.numpy(), expect)


# ---------------- TinyJit ----------------

def test_jit_multi_device_step(d2: Tuple[str, ...]) -> None:
  w_np = _rand(4, 3, seed=7)
  w = Tensor(w_np).shard(d2).contiguous().realize()

  @TinyJit
  def f(x: Tensor) -> Tuple[Tensor, Tensor]:
    y = (x @ w).relu()
    return y.realize(), y.sum(0).realize()

  caches: List[Any] = []
  for i in range(5):
    xn = _rand(6, 4, seed=20 + i)
    y, s = f(Tensor(xn).shard(d2, 0))
    ref = np.maximum(xn @ w_np, 0)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.numpy(), ref.sum(0), rtol=1e-5, atol=1e-5)
    assert isinstance(y.lazydata, MultiLazyBuffer) and _mlb(y).axis == 0 and _mlb(s).axis is None
    if i >= 1:
      caches.append(list(f.jit_cache))
  # captured once (second call); every replay runs the same items: both devices' kernels and the copies between them
  assert f.cnt == 5 and all(c == caches[0] for c in caches)
  assert {ei.prg.dname for ei in f.jit_cache} == {Device.canonicalize(d) for d in d2}
  assert any("Copy" in type(ei.prg).__name__ or "Xfer" in type(ei.prg).__name__ for ei in f.jit_cache)


# ---------------- other devices ----------------

def test_python_devices() -> None:
  devs = _need("PYTHON:0", "PYTHON:1")
  a, w = _rand(5, 3, seed=1), _rand(3, 2, seed=2)
  t = Tensor(a).shard(devs, 0)
  np.testing.assert_allclose((t @ Tensor(w).shard(devs)).numpy(), a @ w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.sum(0).numpy(), a.sum(0), rtol=1e-5, atol=1e-6)


def test_gpu_devices() -> None:
  devs = _need("GPU:0", "GPU:1")
  a = _rand(5, 3)
  t = Tensor(a).shard(devs, 0)
  np.testing.assert_allclose((t * 2).sum(0).numpy(), (a * 2).sum(0), rtol=1e-5, atol=1e-6)


def test_mixed_device_kinds() -> None:
  devs = _need("GPU:0", "CLANG:0")
  a = _rand(5, 3)
  t = Tensor(a).shard(devs, 0)
  np.testing.assert_allclose((t * 2).sum(0).numpy(), (a * 2).sum(0), rtol=1e-5, atol=1e-6)


# ---------------- tiny_nn: state dicts and data-parallel training ----------------

def test_load_state_dict_into_sharded_model(d2: Tuple[str, ...]) -> None:
  from tiny_nn import Linear
  from tiny_nn.state import get_state_dict, load_state_dict
  model = Linear(4, 6)
  for k, t in get_state_dict(model).items():
    t.shard_(d2, 0 if k == "weight" else None)
  w, b = _rand(6, 4, seed=1), _rand(6, seed=2)
  load_state_dict(model, {"weight": Tensor(w), "bias": Tensor(b)}, verbose=False)
  assert _mlb(model.weight).axis == 0 and _mlb(model.bias).axis is None
  np.testing.assert_array_equal(model.weight.numpy(), w)
  np.testing.assert_array_equal(model.bias.numpy(), b)
  x = _rand(3, 4, seed=3)
  np.testing.assert_allclose(model(Tensor(x, device=d2)).numpy(), x @ w.T + b, rtol=1e-5, atol=1e-6)


def _train_digits(devices: Tuple[str, ...], steps: int, batch: int = 32) -> Tuple[List[float], Dict[str, np.ndarray], List[Any]]:
  from tiny_nn.datasets import digits_numpy
  from tiny_nn.examples.digits import DigitsNet
  from tiny_nn.optim import SGD
  from tiny_nn.state import get_parameters, get_state_dict
  x_train, y_train, _, _ = digits_numpy()
  Tensor.manual_seed(0)
  model = DigitsNet()
  if len(devices) > 1:
    for t in get_state_dict(model).values():
      t.shard_(devices)      # parameters and BatchNorm statistics replicated
  opt = SGD(get_parameters(model), lr=0.05, momentum=0.9)
  schedules: List[Any] = []

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    outs = opt.schedule_step()
    if step.cnt == 1:  # the captured call: record what one step schedules
      schedules.append(loss.schedule(*outs))
      run_schedule(list(schedules[-1]))
    return loss.realize(*outs)

  rng = np.random.RandomState(0)
  losses = []
  prev, Tensor.training = Tensor.training, True
  try:
    for _ in range(steps):
      idx = rng.randint(0, len(x_train), batch)
      x, y = Tensor(x_train[idx]), Tensor(y_train[idx])
      if len(devices) > 1:
        x, y = x.shard(devices, 0), y.shard(devices, 0)   # the batch split over the devices
      losses.append(step(x, y).item())
  finally:
    Tensor.training = prev
  state = {k: v.numpy() for k, v in get_state_dict(model).items()}
  return losses, state, schedules


def test_data_parallel_digits_training_matches_single_device(d2: Tuple[str, ...]) -> None:
  pytest.importorskip("sklearn", reason="the digits dataset needs scikit-learn")
  single, state1, _ = _train_digits((d2[0],), steps=5)
  multi, state2, scheds = _train_digits(d2, steps=5)
  # the sums run in another order, so not bit-identical; BatchNorm uses the global batch statistics (an allreduce)
  np.testing.assert_allclose(multi, single, rtol=1e-4)
  assert single[-1] < single[0]
  for k in state1:
    np.testing.assert_allclose(state2[k], state1[k], rtol=1e-3, atol=1e-5, err_msg=k)
  # one step: kernels on both devices and device-to-device copies between them
  sched = scheds[0]
  counts = collections.Counter((si.ast.op, si.outputs[0].device) for si in sched)
  devs = tuple(Device.canonicalize(d) for d in d2)
  assert all(counts[(MetaOps.KERNEL, d)] > 0 for d in devs)
  assert all(counts[(MetaOps.COPY, d)] > 0 for d in devs)
  assert counts[(MetaOps.KERNEL, devs[0])] == counts[(MetaOps.KERNEL, devs[1])]
