"""Optimizers on a half model (dtypes.default_float = half): the update math runs in float32, as in tinygrad.

References: torch optimizers running in float32 on the same gradients, with the weights rounded to half after every step
(what a float32 update cast back to a half parameter gives), and hand-computed values for the overflow/underflow cases.
"""
import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from tiny_nn import optim

torch = pytest.importorskip("torch", reason="torch is the reference for the optimizer tests (pip install torch==2.13.0)")

W0 = np.random.RandomState(0).randn(4, 3).astype(np.float16)
B0 = np.random.RandomState(1).randn(4).astype(np.float16)
X = np.random.RandomState(2).randn(6, 3).astype(np.float16)


@pytest.fixture(autouse=True)
def _half_default_and_train():
  prev_float, prev_training = dtypes.default_float, Tensor.training
  dtypes.default_float = dtypes.half
  Tensor.training = True
  yield
  dtypes.default_float, Tensor.training = prev_float, prev_training


def half_linear():
  # created from float literals so that they pick up the (half) default dtype like a ported model's layers would
  w, b = Tensor(W0.astype(np.float32).tolist(), requires_grad=True), Tensor(B0.astype(np.float32).tolist(), requires_grad=True)
  assert w.dtype == dtypes.half and b.dtype == dtypes.half
  return w, b


def half_loss(w, b):
  h = Tensor(X) @ w.T + b
  return (h * h).mean() + h.sum() * 0.1


MAKERS = {
  "sgd": (lambda p: optim.SGD(p, lr=0.05), lambda p: torch.optim.SGD(p, lr=0.05)),
  "sgd_momentum_wd": (lambda p: optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True),
                      lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True)),
  "adam": (lambda p: optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
  "adamw": (lambda p: optim.AdamW(p, lr=0.02, weight_decay=0.1), lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.1)),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_half_model_steps_match_float32_math_rounded_to_half(name):
  ours, theirs = MAKERS[name]
  w, b = half_linear()
  opt = ours([w, b])
  rw, rb = torch.tensor(W0.astype(np.float32)), torch.tensor(B0.astype(np.float32))
  ref = theirs([rw, rb])
  for step in range(5):
    opt.zero_grad()
    half_loss(w, b).backward()
    assert w.grad is not None and b.grad is not None and w.grad.dtype == dtypes.half
    # the reference gets the same (half) gradients in float32 and keeps its state in float32
    rw.grad, rb.grad = torch.tensor(w.grad.numpy().astype(np.float32)), torch.tensor(b.grad.numpy().astype(np.float32))
    opt.step()
    ref.step()
    with torch.no_grad():
      rw.copy_(rw.half().float())
      rb.copy_(rb.half().float())
    assert w.dtype == dtypes.half and b.dtype == dtypes.half
    for got, want in ((w, rw), (b, rb)):
      # float32 math may differ in the last float32 bit, which can flip one half rounding: allow one half ulp
      np.testing.assert_allclose(got.numpy().astype(np.float32), want.numpy(), rtol=1e-3, atol=1e-4, err_msg=f"{name} step {step}")


def test_state_is_float32():
  w, b = half_linear()
  sgd, adam, lamb = optim.SGD([w], lr=0.1, momentum=0.9), optim.Adam([b], lr=0.1), optim.LAMB([w, b], lr=0.1)
  for opt in (sgd, adam, lamb):
    assert opt.lr.dtype == dtypes.float32
  assert all(x.dtype == dtypes.float32 for x in sgd.b)
  assert all(x.dtype == dtypes.float32 for o in (adam, lamb) for x in o.m + o.v + [o.b1_t, o.b2_t])
  half_loss(w, b).backward()
  optim.OptimizerGroup(sgd, adam).step()
  assert w.dtype == dtypes.half and b.dtype == dtypes.half
  assert sgd.b[0].dtype == dtypes.float32 and adam.v[0].dtype == dtypes.float32


def test_huge_lr_does_not_overflow():
  # lr = 1e10 is inf in half, and so is lr * g for g = 1e-7; in float32 the step is about 1192
  w = Tensor([1.0, -2.0, 3.0], requires_grad=True)
  g_half = np.float16(1e-7)
  opt = optim.SGD([w], lr=1e10)
  (w * Tensor([1e-7] * 3)).sum().backward()
  opt.step()
  want = (np.array([1.0, -2.0, 3.0], np.float32) - np.float32(1e10) * np.float32(g_half)).astype(np.float16)
  got = w.numpy()
  assert np.isfinite(got).all(), got
  np.testing.assert_array_equal(got, want)


def test_lars_norms_do_not_overflow():
  # |w|^2 = 3 * 300^2 > 65504 overflows in half: the trust ratio must come from float32 norms
  w = Tensor([300.0, -300.0, 300.0], requires_grad=True)
  opt = optim.LARS([w], lr=1.0, momentum=0.0, weight_decay=0.0, tcoef=0.001)
  (w * 2.0).sum().backward()
  opt.step()
  # trust = 0.001 * |w| / |g| = 0.001 * 300 / 2, update = trust * g = 0.3 per element
  np.testing.assert_allclose(w.numpy().astype(np.float32), np.array([299.7, -300.3, 299.7], np.float16).astype(np.float32), rtol=1e-3)


def test_adam_tiny_gradient_keeps_its_update():
  # g = 1e-4: g*g = 1e-8 is 0 in half, which would make the step m/(0 + eps) = 1e4 times too large; in float32 v holds it
  w = Tensor([0.5, 0.25], requires_grad=True)
  opt = optim.Adam([w], lr=1e-3)
  (w * Tensor([1e-4, -1e-4])).sum().backward()
  opt.step()
  g = np.float32(np.float16(1e-4))
  np.testing.assert_allclose(opt.v[0].numpy(), [(1 - 0.999) * g * g] * 2, rtol=1e-5)
  assert opt.v[0].dtype == dtypes.float32
  # Adam's first step is lr * g / (|g| + eps) ~= lr * sign(g), rounded to half
  step = np.float32(1e-3) * g / (g + np.float32(1e-8))
  np.testing.assert_array_equal(w.numpy(), np.array([0.5 - step, 0.25 + step], np.float32).astype(np.float16))


def _float32_adam_run():
  w = Tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
  opt = optim.Adam([w], lr=0.1)
  for _ in range(3):
    opt.zero_grad()
    (w * w * w).sum().backward()
    opt.step()
  assert w.dtype == dtypes.float32
  return w.numpy()


def test_float32_params_unaffected_by_the_default():
  # a float32 parameter gets the same float32 update (bit for bit) whether the default float is half or float32
  in_half_program = _float32_adam_run()
  dtypes.default_float = dtypes.float32
  np.testing.assert_array_equal(in_half_program, _float32_adam_run())
  rw = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
  ref = torch.optim.Adam([rw], lr=0.1)
  for _ in range(3):
    ref.zero_grad()
    (rw * rw * rw).sum().backward()
    ref.step()
  np.testing.assert_allclose(in_half_program, rw.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_float64_params_keep_float64_math():
  # casting up to float32 must not mean casting float64 down: its state and update stay float64 (torch float64 as reference)
  init = np.random.RandomState(5).randn(6)
  w = Tensor(init.copy(), dtype=dtypes.float64, requires_grad=True)
  opt = optim.SGD([w], lr=0.1, momentum=0.9)
  rw = torch.tensor(init.copy(), requires_grad=True)
  ref = torch.optim.SGD([rw], lr=0.1, momentum=0.9)
  for _ in range(3):
    opt.zero_grad()
    ref.zero_grad()
    (w * w * w).sum().backward()
    (rw * rw * rw).sum().backward()
    opt.step()
    ref.step()
  assert w.dtype == dtypes.float64 and opt.b[0].dtype == dtypes.float64
  np.testing.assert_allclose(w.numpy(), rw.detach().numpy(), rtol=1e-12, atol=1e-12)
