"""Optimizers. Each `step()` builds every parameter and state update lazily and realizes them together in one schedule.

The update math runs in at least float32 whatever the parameter dtype (float64 parameters keep float64): gradients and
weights are cast up, optimizer state (momentum, Adam moments, lr) is kept in that dtype, and only the new weight is cast
back. A half model then trains without its updates overflowing (lr * g) or vanishing (g * g underflows in half).
"""
from __future__ import annotations

from typing import List, Optional, Union

from tiny.dtype import DType, dtypes, least_upper_dtype
from tiny.helpers import dedup, flatten
from tiny.tensor import Tensor

__all__ = ["LAMB", "LARS", "SGD", "Adam", "AdamW", "Optimizer", "OptimizerGroup"]


class Optimizer:
  """Base class: owns `params` (tensors that get updated) and `buffers` (tensors realized alongside them, e.g. BatchNorm stats).

  `lr` is a one-element tensor so that learning-rate schedules (`tiny_nn.lr`) can change it in place, also inside a TinyJit.
  Subclasses implement `_step()`, returning the state tensors they updated.
  """

  def __init__(self, params: List[Tensor], lr: float):
    params = list(params)
    # parameters whose requires_grad was never decided are trainable by default
    for x in params:
      if x.requires_grad is None:
        x.requires_grad = True
    self.params: List[Tensor] = dedup([x for x in params if x.requires_grad])
    if not self.params:
      raise ValueError("the optimizer got no trainable parameters (all have requires_grad=False, or the list is empty)")
    self.buffers: List[Tensor] = dedup([x for x in params if not x.requires_grad])
    if lr < 0:
      raise ValueError(f"learning rate must be non-negative, got {lr}")
    # float32 (float64 with float64 parameters) whatever dtypes.default_float is: a half lr would overflow past 65504
    self.state_dtype: DType = least_upper_dtype(*[self._math_dtype(t) for t in self.params])
    self.lr = Tensor([lr], dtype=self.state_dtype, requires_grad=False, device=self.params[0].device).contiguous()

  def zero_grad(self) -> None:
    """Forgets the gradients of all parameters."""
    for p in self.params:
      p.grad = None

  def step(self) -> None:
    """Applies one update to every parameter (one schedule for all of them)."""
    Tensor.realize(*self.schedule_step())

  def schedule_step(self) -> List[Tensor]:
    """Builds the update lazily and returns every tensor that must be realized to apply it."""
    if not Tensor.training:
      raise RuntimeError("optimizer step outside training mode: set Tensor.training = True (or use `with Tensor.train():`)")
    return self._step() + self.params + self.buffers

  def _step(self) -> List[Tensor]:
    raise NotImplementedError

  @staticmethod
  def _math_dtype(t: Tensor) -> DType:
    """The dtype the update of parameter `t` is computed and its state kept in: float32, or float64 for float64."""
    return least_upper_dtype(t.dtype, dtypes.float32)

  def _grad(self, t: Tensor) -> Tensor:
    """The gradient of `t` in the optimizer's math dtype."""
    if t.grad is None:
      raise RuntimeError(f"parameter of shape {t.shape} has no gradient: call .backward() on the loss before step()")
    return t.grad.cast(self._math_dtype(t))

  @staticmethod
  def _weight(t: Tensor) -> Tensor:
    """The current value of parameter `t` in the optimizer's math dtype, outside the autograd graph."""
    return t.detach().cast(Optimizer._math_dtype(t))

  def _times_lr(self, x: Tensor) -> Tensor:
    # lr has shape (1,); keep the update's own shape, which matters for 0-d parameters
    return (x * self.lr).reshape(x.shape)


class OptimizerGroup(Optimizer):
  """Several optimizers (e.g. different settings for different parameter sets) stepped as one."""

  def __init__(self, *optimizers: Optimizer):
    if not optimizers:
      raise ValueError("OptimizerGroup needs at least one optimizer")
    self.optimizers = optimizers
    self.params = flatten([o.params for o in optimizers])
    self.buffers = flatten([o.buffers for o in optimizers])

  def __getitem__(self, i: int) -> Optimizer:
    return self.optimizers[i]

  def zero_grad(self) -> None:
    for o in self.optimizers:
      o.zero_grad()

  def _step(self) -> List[Tensor]:
    return [x for o in self.optimizers for x in o._step()]


class LARS(Optimizer):
  """Layer-wise adaptive rate scaling on top of SGD with momentum; `tcoef=0` turns the scaling off (plain SGD).

  The trust ratio is r = tcoef * |w| / (|g| + wd * |w|) (1 where either norm is 0). `classic=True` scales the
  gradient by r * lr before the momentum buffer; `classic=False` scales after it (torch's SGD order).
  """

  def __init__(self, params: List[Tensor], lr: float = 0.001, momentum: float = 0.9, weight_decay: float = 1e-4, nesterov: bool = False,
               classic: bool = True, tcoef: float = 0.001):
    super().__init__(params, lr)
    if nesterov and momentum == 0:
      raise ValueError("nesterov momentum needs momentum > 0")
    self.momentum, self.wd, self.nesterov, self.classic, self.tcoef = momentum, weight_decay, nesterov, classic, tcoef
    self.b: List[Tensor] = [Tensor.zeros(*t.shape, dtype=self._math_dtype(t), device=t.device, requires_grad=False).contiguous()
                            for t in self.params] if momentum else []

  def _step(self) -> List[Tensor]:
    for i, t in enumerate(self.params):
      g, w = self._grad(t), self._weight(t)
      r: Union[Tensor, float] = 1.0
      if self.tcoef != 0:
        w_norm, g_norm = w.square().sum().sqrt(), g.square().sum().sqrt()
        r = (w_norm > 0).where((g_norm > 0).where(self.tcoef * w_norm / (g_norm + self.wd * w_norm), 1.0), 1.0)
      if self.wd:
        # skipped, not multiplied by 0: that costs work and turns an inf weight into a NaN step (torch skips it too)
        g = g + self.wd * w
      if self.classic:
        g = self._times_lr(g * r)
      if self.momentum:
        self.b[i].assign(self.momentum * self.b[i] + g)
        g = (g + self.momentum * self.b[i]) if self.nesterov else self.b[i]
      if not self.classic:
        g = self._times_lr(g * r)
      t.assign((w - g).cast(t.dtype))
    return self.b


def SGD(params: List[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
        classic: bool = False) -> LARS:
  """Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay, updating like torch.optim.SGD."""
  return LARS(params, lr, momentum, weight_decay, nesterov, classic, tcoef=0.0)


class LAMB(Optimizer):
  """LAMB: Adam moments with a layer-wise trust ratio |w| / |update|; `adam=True` drops the ratio (Adam/AdamW).

  Weight decay is decoupled (added to the update, not to the gradient), as in AdamW.
  """

  def __init__(self, params: List[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False):
    super().__init__(params, lr)
    for name, b in (("b1", b1), ("b2", b2)):
      if not 0 <= b < 1:
        raise ValueError(f"{name} must be in [0, 1), got {b}")
    self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
    dev = self.params[0].device
    # running products b1^t and b2^t for the bias correction
    self.b1_t, self.b2_t = (Tensor([1], dtype=self.state_dtype, device=dev, requires_grad=False).contiguous() for _ in range(2))
    self.m = [Tensor.zeros(*t.shape, dtype=self._math_dtype(t), device=t.device, requires_grad=False).contiguous() for t in self.params]
    self.v = [Tensor.zeros(*t.shape, dtype=self._math_dtype(t), device=t.device, requires_grad=False).contiguous() for t in self.params]

  def _step(self) -> List[Tensor]:
    self.b1_t.assign(self.b1_t * self.b1)
    self.b2_t.assign(self.b2_t * self.b2)
    for i, t in enumerate(self.params):
      g, w = self._grad(t), self._weight(t)
      self.m[i].assign(self.b1 * self.m[i] + (1.0 - self.b1) * g)
      self.v[i].assign(self.b2 * self.v[i] + (1.0 - self.b2) * (g * g))
      m_hat = (self.m[i] / (1.0 - self.b1_t)).reshape(t.shape)
      v_hat = (self.v[i] / (1.0 - self.b2_t)).reshape(t.shape)
      up = m_hat / (v_hat.sqrt() + self.eps)
      if self.wd:
        up = up + self.wd * w
      r: Union[Tensor, float] = 1.0
      if not self.adam:
        w_norm, u_norm = w.square().sum().sqrt(), up.square().sum().sqrt()
        r = (w_norm > 0).where((u_norm > 0).where(w_norm / u_norm, 1.0), 1.0)
      t.assign((w - self._times_lr(up * r)).cast(t.dtype))
    return [self.b1_t, self.b2_t] + self.m + self.v


def AdamW(params: List[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01) -> LAMB:
  """Adam with decoupled weight decay, updating like torch.optim.AdamW."""
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True)


def Adam(params: List[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> LAMB:
  """Adam, updating like torch.optim.Adam."""
  return LAMB(params, lr, b1, b2, eps, 0.0, adam=True)


def get_lr(optimizer: Optimizer) -> Optional[float]:
  """The current learning rate as a float (None for an OptimizerGroup, whose members may differ)."""
  if isinstance(optimizer, OptimizerGroup):
    return None
  return float(optimizer.lr.numpy().reshape(-1)[0])
