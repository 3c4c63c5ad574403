"""Kernel counts of whole programs (a training step, conv + batchnorm, conv backward, arange) and their values.

Each program is scheduled once; the count of KERNEL items (copies excluded) is asserted as an upper bound so that a
fusion regression fails, and the very schedule that was counted is run and checked against torch or numpy, so a
fusion that computes the wrong thing fails too. Run with `-s` to see the counts.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest

import tiny_nn as nn
from tiny.engine.realize import run_schedule
from tiny.ops import BinaryOps, MetaOps
from tiny.tensor import Tensor
from tiny_nn import optim

torch = pytest.importorskip("torch")


def run_counted(name: str, *outs: Tensor) -> int:
  """Schedule outs together, run that schedule, and return how many kernels it had."""
  sched = Tensor.schedule(*outs)
  n = len([si for si in sched if si.ast.op is MetaOps.KERNEL])
  print(f"{name}: {n} kernels")
  run_schedule(sched)
  return n


def data(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ***** a small conv model trained one step: Conv2d(1, 4, 3) -> relu -> flatten -> Linear(144, 10), loss = mean(out^2) *****

def _weights() -> Dict[str, np.ndarray]:
  return {"cw": data(4, 1, 3, 3, seed=1) * 0.3, "cb": data(4, seed=2) * 0.1, "lw": data(10, 144, seed=3) * 0.1, "lb": data(10, seed=4) * 0.1}


def _tiny_step(make_opt, steps: int = 2) -> Tuple[List[int], List[np.ndarray]]:
  w = _weights()
  conv, lin = nn.Conv2d(1, 4, 3), nn.Linear(144, 10)
  conv.weight, conv.bias, lin.weight, lin.bias = (Tensor(w[k]).realize() for k in ("cw", "cb", "lw", "lb"))
  params = [conv.weight, conv.bias, lin.weight, lin.bias]
  opt = make_opt(params)
  # the optimizer's state starts lazy (zeros, lr): create it first so that the counted schedules are steps only
  Tensor.realize(opt.lr, *[t for k in ("m", "v", "b") for t in getattr(opt, k, [])], *[getattr(opt, k) for k in ("b1_t", "b2_t") if hasattr(opt, k)])
  x = Tensor(data(2, 1, 8, 8)).realize()
  counts = []
  with Tensor.train():
    for _ in range(steps):
      opt.zero_grad()
      loss = lin(conv(x).relu().flatten(1)).square().mean()
      loss.backward()
      counts.append(run_counted("train step", loss, *opt.schedule_step()))
  return counts, [p.numpy() for p in params]


def _torch_step(make_opt, steps: int = 2) -> List[np.ndarray]:
  w = _weights()
  params = [torch.tensor(w[k], requires_grad=True) for k in ("cw", "cb", "lw", "lb")]
  opt = make_opt(params)
  x = torch.tensor(data(2, 1, 8, 8))
  for _ in range(steps):
    opt.zero_grad()
    out = torch.nn.functional.conv2d(x, params[0], params[1]).relu().flatten(1)
    torch.nn.functional.linear(out, params[2], params[3]).square().mean().backward()
    opt.step()
  return [p.detach().numpy() for p in params]


# (tiny optimizer, torch optimizer, the most kernels one step may take); tinygrad 0.9.1 counted 11 for an Adam step and 7
# for an SGD step of a similar model: Adam takes 10 here, SGD 8 (the loss and the bias gradient reduce the same values
# over different axes, so they stay two kernels)
OPTIMIZERS = {
  "adam": (lambda p: optim.Adam(p, lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2), 11),
  "sgd_momentum": (lambda p: optim.SGD(p, lr=1e-2, momentum=0.9), lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9), 8),
  "sgd": (lambda p: optim.SGD(p, lr=1e-2), lambda p: torch.optim.SGD(p, lr=1e-2), 8),
  "adamw": (lambda p: optim.AdamW(p, lr=1e-2, weight_decay=0.1), lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1), 11),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_train_step_kernel_count_and_values(name: str) -> None:
  tiny_opt, torch_opt, max_kernels = OPTIMIZERS[name]
  counts, got = _tiny_step(tiny_opt)
  # forward (conv+relu, linear, loss), loss backward, relu backward, and one kernel per parameter holding its gradient's
  # reduce together with every state and weight update of that parameter; Adam adds its two bias-correction products
  assert all(n <= max_kernels for n in counts), counts
  for g, e in zip(got, _torch_step(torch_opt)):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


# ***** inference and backward programs *****

def test_conv_batchnorm_eval_is_one_kernel() -> None:
  conv, bn = nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)
  w, b, g, beta, mean, var = data(4, 1, 3, 3, seed=1), data(4, seed=2), data(4, seed=3), data(4, seed=4), data(4, seed=5), np.abs(data(4, seed=6)) + 0.5
  conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var = (Tensor(a).realize() for a in (w, b, g, beta, mean, var))
  x = data(2, 1, 8, 8)
  out = bn(conv(Tensor(x)))
  # the eval batchnorm is an affine map per channel: it joins the conv's kernel, rsqrt(var + eps) recomputed inline
  assert run_counted("conv + batchnorm (eval)", out) <= 1   # tinygrad 0.9.1: 1
  ref = torch.nn.functional.batch_norm(torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b)), torch.tensor(mean),
                                       torch.tensor(var), torch.tensor(g), torch.tensor(beta), training=False, eps=1e-5)
  np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_conv_relu_backward() -> None:
  xn, wn = data(2, 1, 8, 8), data(4, 1, 3, 3, seed=1)
  x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
  loss = x.conv2d(w).relu().sum()
  loss.backward()
  assert x.grad is not None and w.grad is not None
  assert run_counted("conv + relu backward", loss, x.grad, w.grad) <= 5   # tinygrad 0.9.1: 5
  tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
  tl = torch.nn.functional.conv2d(tx, tw).relu().sum()
  tl.backward()
  np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-5)
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,max_kernels", [(10, 2), (500, 2), (1000, 2), (60000, 3)])
def test_arange_sum(n: int, max_kernels: int) -> None:
  out = Tensor.arange(n).sum()
  # arange is one kernel at any length (its cumsum of a constant folds to a count); the sum is one more, and from 32768
  # elements on it is split in two kernels for parallelism
  assert run_counted(f"arange({n}).sum()", out) <= max_kernels   # tinygrad 0.9.1: 2 (n=1000)
  assert out.item() == n * (n - 1) // 2


@pytest.mark.parametrize("args", [(0, 70000, 3), (5.0, -20000.0, -0.25), (-3, 4097)])
def test_long_arange_values(args: Tuple[float, ...]) -> None:
  got = Tensor.arange(*args)
  assert run_counted(f"arange{args}", got) <= 1
  np.testing.assert_allclose(got.numpy(), np.arange(*args, dtype=np.float32 if any(isinstance(a, float) for a in args) else np.int32), rtol=1e-6)


# ***** fusions that must not change values *****

def test_multi_output_kernel_does_not_read_an_output_permuted() -> None:
  # g1 and g2 share the reduce's kernel; d reads g1 transposed, so recomputing g1 inside that kernel would use the
  # reduce's value of the wrong element: d must read g1's stored buffer instead
  an = data(4, 4, 4)
  r = Tensor(an).sum(2)
  g1, g2 = r * 2, r + 1
  d = g1.permute(1, 0) + 1
  run_counted("permuted multi-output read", g1, g2, d)
  rn = an.sum(2)
  np.testing.assert_allclose(d.numpy(), (rn * 2).T + 1, rtol=1e-5)
  np.testing.assert_allclose(g1.numpy(), rn * 2, rtol=1e-5)
  np.testing.assert_allclose(g2.numpy(), rn + 1, rtol=1e-5)


def test_broadcast_of_old_contents_before_assign() -> None:
  # s reads t before t is overwritten and is broadcast into the assign: it must keep the old value
  tn = data(4, 3)
  t = Tensor(tn).realize()
  s = t[0:1, 0:1] * 2 + 1
  t.assign(t + s.expand(4, 3))
  run_counted("broadcast of old contents", t)
  np.testing.assert_allclose(t.numpy(), tn + (tn[0, 0] * 2 + 1), rtol=1e-6)


def test_broadcast_of_new_contents_after_assign() -> None:
  tn, yn = data(1, 3), data(4, 3, seed=1)
  t = Tensor(tn).realize()
  t.assign(t * 3)
  out = Tensor(yn) * (t - 1).expand(4, 3)
  run_counted("broadcast of an assigned value", out, t)
  np.testing.assert_allclose(out.numpy(), yn * (tn * 3 - 1), rtol=1e-6)


def test_padded_broadcast_of_small_value() -> None:
  # 1 - a is not zero where the pad adds zeros: the padded broadcast must not compute 1 - 0 there
  an, bn = data(1, 3), data(4, 5, seed=1)
  a = Tensor(an).realize()
  out = (1 - a).expand(2, 3).pad(((1, 1), (1, 1))) + Tensor(bn)
  run_counted("padded broadcast", out)
  np.testing.assert_allclose(out.numpy(), np.pad(np.broadcast_to(1 - an, (2, 3)), ((1, 1), (1, 1))) + bn, rtol=1e-6)


def test_broadcast_recomputed_in_several_kernels() -> None:
  # the same small value broadcast into two reduces of different shapes: each kernel recomputes it correctly
  an, xn = data(3), data(3, 5, seed=1)
  a, x = Tensor(an).realize(), Tensor(xn).realize()
  c = (a * a + 1).reshape(3, 1)
  s1, s2 = (x * c).sum(1), (x * c).sum(0)
  run_counted("shared broadcast", s1, s2)
  ref = xn * (an * an + 1)[:, None]
  np.testing.assert_allclose(s1.numpy(), ref.sum(1), rtol=1e-5)
  np.testing.assert_allclose(s2.numpy(), ref.sum(0), rtol=1e-5)


def test_large_broadcast_of_a_fresh_buffer_gets_its_own_kernel() -> None:
  # a layernorm of a buffer computed in the same schedule, read by a matmul through a broadcast: recomputing it in the
  # matmul would re-read the buffer once per column (panel), so it is realized; the one-hot mask of an embedding lookup
  # (large, but made from small inputs) is still recomputed inside the lookup's kernel
  rng = np.random.default_rng(2)
  tok, emb, wn = rng.integers(0, 500, (1, 128)).astype(np.int32), data(500, 256), data(256, 512, seed=3)
  w = Tensor(wn).realize()
  posn = data(128, 256, seed=4)
  h = Tensor(emb).realize()[Tensor(tok).realize()] + Tensor(posn).realize()   # token + position embeddings
  x = h.layernorm()
  out = x @ w
  sched = Tensor.schedule(out)
  assert all(b.size != 128 * 500 for si in sched for b in si.bufs), "the one-hot mask got a buffer"
  normalize = [si for si in sched if si.ast.op is MetaOps.KERNEL and [m.name for m in si.metadata or []] == ["layernorm"]
               and si.outputs[0].size == 128 * 256]
  assert len(normalize) == 1, [si.metadata for si in sched]
  run_schedule(sched)
  hn = emb[tok] + posn
  ref = (hn - hn.mean(-1, keepdims=True)) / np.sqrt(hn.var(-1, keepdims=True) + 1e-5) @ wn
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_max_pool_input_gradient_is_written_once() -> None:
  """BatchNorm-like per-channel scale and shift before a 2x2 max pool: the gradients of the scale and the shift are two
  reductions over the pool's input gradient. That gradient (a compare with the window max, a count, the pooled gradient
  spread over the window) is computed in one kernel, which both reductions read, and the values match torch's."""
  xn, sn, bn, gn = data(2, 3, 6, 6), data(1, 3, 1, 1, seed=1), data(1, 3, 1, 1, seed=2), data(2, 3, 3, 3, seed=3)
  x = Tensor(xn)
  s, b = Tensor(sn, requires_grad=True), Tensor(bn, requires_grad=True)
  ((x * s + b).max_pool2d() * Tensor(gn)).sum().backward()
  assert s.grad is not None and b.grad is not None
  sched = Tensor.schedule(s.grad, b.grad)
  kernels = [si for si in sched if si.ast.op is MetaOps.KERNEL]
  # the compare with the window max is in two kernels: the count of maxima per window (a reduce of its own) and the
  # gradient itself; left lazy, the gradient was recomputed inside each of the two reductions (3 kernels)
  assert len([si for si in kernels if any(op.op is BinaryOps.CMPNE for op in si.ast.lazyops)]) == 2
  run_schedule(sched)
  ts, tb = torch.tensor(sn, requires_grad=True), torch.tensor(bn, requires_grad=True)
  (torch.nn.functional.max_pool2d(torch.tensor(xn) * ts + tb, 2) * torch.tensor(gn)).sum().backward()
  np.testing.assert_allclose(s.grad.numpy(), ts.grad.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)
