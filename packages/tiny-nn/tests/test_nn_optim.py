"""tiny_nn.optim and tiny_nn.lr against torch.optim (and numpy for LAMB/LARS, which torch lacks)."""
import numpy as np
import pytest

from tiny.tensor import Tensor

from tiny_nn import lr as lr_sched
from tiny_nn import optim

torch = pytest.importorskip("torch", reason="torch is the reference for the optimizer tests (pip install torch==2.13.0)")

STEPS = 4
INIT = [np.random.RandomState(0).randn(3, 4).astype(np.float32), np.random.RandomState(1).randn(4).astype(np.float32)]
DATA = np.random.RandomState(2).randn(5, 3).astype(np.float32)


@pytest.fixture(autouse=True)
def _train_mode():
  prev = Tensor.training
  Tensor.training = True
  yield
  Tensor.training = prev


def loss_fn(w, b, x, lib):
  # a small nonlinear loss so that every step sees a different gradient
  h = (x @ w + b)
  return (h.tanh() * h).sum() + (w * w * w).mean() if lib == "tiny" else (torch.tanh(h) * h).sum() + (w * w * w).mean()


def run_tiny(make_opt, steps=STEPS):
  w, b = Tensor(INIT[0].copy(), requires_grad=True), Tensor(INIT[1].copy(), requires_grad=True)
  opt = make_opt([w, b])
  x = Tensor(DATA)
  for _ in range(steps):
    opt.zero_grad()
    loss_fn(w, b, x, "tiny").backward()
    opt.step()
  return w.numpy(), b.numpy()


def run_torch(make_opt, steps=STEPS):
  w, b = torch.tensor(INIT[0].copy(), requires_grad=True), torch.tensor(INIT[1].copy(), requires_grad=True)
  opt = make_opt([w, b])
  x = torch.tensor(DATA)
  for _ in range(steps):
    opt.zero_grad()
    loss_fn(w, b, x, "torch").backward()
    opt.step()
  return w.detach().numpy(), b.detach().numpy()


def assert_same(a, b, atol=1e-5, rtol=1e-4):
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, atol=atol, rtol=rtol)


@pytest.mark.parametrize("kw", [dict(lr=0.05), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True),
                                dict(lr=0.05, momentum=0.8, weight_decay=0.1), dict(lr=0.02, weight_decay=0.3)])
def test_sgd(kw):
  assert_same(run_tiny(lambda p: optim.SGD(p, **kw)), run_torch(lambda p: torch.optim.SGD(p, **kw)))


@pytest.mark.parametrize("lr,b1,b2,eps", [(0.01, 0.9, 0.999, 1e-8), (0.1, 0.5, 0.9, 1e-3)])
def test_adam(lr, b1, b2, eps):
  assert_same(run_tiny(lambda p: optim.Adam(p, lr=lr, b1=b1, b2=b2, eps=eps)),
              run_torch(lambda p: torch.optim.Adam(p, lr=lr, betas=(b1, b2), eps=eps)))


@pytest.mark.parametrize("wd", [0.01, 0.5])
def test_adamw(wd):
  assert_same(run_tiny(lambda p: optim.AdamW(p, lr=0.03, weight_decay=wd)),
              run_torch(lambda p: torch.optim.AdamW(p, lr=0.03, weight_decay=wd)))


def numpy_lamb(lr, b1, b2, eps, wd, steps=STEPS):
  """LAMB (You et al. 2019, with Adam bias correction) in float64 numpy, gradients from torch."""
  ps = [x.astype(np.float64) for x in INIT]
  m, v = [np.zeros_like(p) for p in ps], [np.zeros_like(p) for p in ps]
  for t in range(1, steps + 1):
    grads = _torch_grads(ps)
    for i, (p, g) in enumerate(zip(ps, grads)):
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      up = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * p
      wn, un = np.linalg.norm(p), np.linalg.norm(up)
      trust = wn / un if wn > 0 and un > 0 else 1.0
      ps[i] = p - lr * trust * up
  return ps


def numpy_lars(lr, momentum, wd, tcoef, steps=STEPS):
  """LARS (You et al. 2017): local lr = tcoef*|w|/(|g|+wd*|w|) scales (g + wd*w) before the momentum buffer."""
  ps = [x.astype(np.float64) for x in INIT]
  bufs = [np.zeros_like(p) for p in ps]
  for _ in range(steps):
    grads = _torch_grads(ps)
    for i, (p, g) in enumerate(zip(ps, grads)):
      wn, gn = np.linalg.norm(p), np.linalg.norm(g)
      trust = tcoef * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
      bufs[i] = momentum * bufs[i] + lr * trust * (g + wd * p)
      ps[i] = p - bufs[i]
  return ps


def _torch_grads(ps):
  w, b = (torch.tensor(p.astype(np.float32), requires_grad=True) for p in ps)
  loss_fn(w, b, torch.tensor(DATA), "torch").backward()
  return [w.grad.numpy().astype(np.float64), b.grad.numpy().astype(np.float64)]


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_lamb(wd):
  assert_same(run_tiny(lambda p: optim.LAMB(p, lr=0.05, weight_decay=wd)), numpy_lamb(0.05, 0.9, 0.999, 1e-6, wd), atol=1e-5)


def test_lars():
  assert_same(run_tiny(lambda p: optim.LARS(p, lr=0.5, momentum=0.9, weight_decay=1e-3, tcoef=0.01)), numpy_lars(0.5, 0.9, 1e-3, 0.01))


def test_optimizer_group_matches_torch_param_groups():
  def ours(p):
    return optim.OptimizerGroup(optim.SGD([p[0]], lr=0.05, momentum=0.9), optim.Adam([p[1]], lr=0.01))
  w_ref, b_ref = torch.tensor(INIT[0].copy(), requires_grad=True), torch.tensor(INIT[1].copy(), requires_grad=True)
  opts = [torch.optim.SGD([w_ref], lr=0.05, momentum=0.9), torch.optim.Adam([b_ref], lr=0.01)]
  for _ in range(STEPS):
    for o in opts:
      o.zero_grad()
    loss_fn(w_ref, b_ref, torch.tensor(DATA), "torch").backward()
    for o in opts:
      o.step()
  assert_same(run_tiny(ours), (w_ref.detach().numpy(), b_ref.detach().numpy()))


def test_step_realizes_params_and_state():
  w = Tensor(INIT[0].copy(), requires_grad=True)
  opt = optim.Adam([w], lr=0.1)
  (w * w).sum().backward()
  opt.step()
  # after one step nothing is left as an unrealized graph: the updates ran in the step's schedule
  for t in [w, opt.b1_t, opt.b2_t, *opt.m, *opt.v]:
    assert t.lazydata.base.realized is not None
  np.testing.assert_allclose(w.numpy(), INIT[0] - 0.1 * np.sign(INIT[0]), atol=1e-5)  # Adam's first step is lr * sign(g)


def test_errors():
  with pytest.raises(ValueError, match="no trainable"):
    optim.SGD([Tensor([1.0], requires_grad=False)])
  w = Tensor([1.0, 2.0], requires_grad=True)
  opt = optim.SGD([w], lr=0.1)
  with pytest.raises(RuntimeError, match="backward"):
    opt.step()
  (w * 2).sum().backward()
  Tensor.training = False
  with pytest.raises(RuntimeError, match="training"):
    opt.step()


def test_zero_grad_and_buffers():
  w, stat = Tensor([1.0, 2.0], requires_grad=True), Tensor([0.0], requires_grad=False)
  opt = optim.SGD([w, stat, w], lr=0.1)
  assert len(opt.params) == 1 and opt.buffers == [stat]
  (w * w).sum().backward()
  opt.step()
  np.testing.assert_allclose(w.numpy(), [0.8, 1.6], rtol=1e-6)
  opt.zero_grad()
  assert w.grad is None


# ---------------------------------------------------------------- learning-rate schedules

def _lrs(make_ours, make_ref, steps):
  w = Tensor([1.0], requires_grad=True)
  opt = optim.SGD([w], lr=0.1)
  sched = make_ours(opt)
  ours = [optim.get_lr(opt)]
  ref_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
  ref = make_ref(ref_opt)
  theirs = [ref_opt.param_groups[0]["lr"]]
  for _ in range(steps):
    sched.step()
    ref_opt.step()
    ref.step()
    ours.append(optim.get_lr(opt))
    theirs.append(ref_opt.param_groups[0]["lr"])
  np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-9)


def test_step_lr():
  _lrs(lambda o: lr_sched.StepLR(o, 3, 0.5), lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5), 10)


def test_multistep_lr():
  _lrs(lambda o: lr_sched.MultiStepLR(o, [2, 5], 0.3), lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 5], 0.3), 8)


def test_cosine_annealing_lr():
  _lrs(lambda o: lr_sched.CosineAnnealingLR(o, 6, 0.01), lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 6, 0.01), 6)


def test_linear_warmup():
  _lrs(lambda o: lr_sched.LinearLR(o, 0.2, 1.0, 4), lambda o: torch.optim.lr_scheduler.LinearLR(o, 0.2, 1.0, 4), 7)
  _lrs(lambda o: lr_sched.LinearWarmup(o, 5), lambda o: torch.optim.lr_scheduler.LinearLR(o, 1 / 5, 1.0, 5), 7)


@pytest.mark.parametrize("kw", [dict(), dict(anneal_strategy="linear", pct_start=0.4), dict(three_phase=True)])
def test_one_cycle_lr(kw):
  _lrs(lambda o: lr_sched.OneCycleLR(o, 0.5, 20, **kw), lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.5, 20, **kw), 19)
