"""Learning-rate schedules with torch.optim.lr_scheduler's formulas.

A schedule writes the new rate into the optimizer's one-element `lr` tensor in place, so a TinyJit-compiled training
step that reads `optimizer.lr` picks it up. Like torch, constructing a schedule sets the epoch-0 rate, and each
`step()` advances one epoch (or one batch, for OneCycleLR and warm-ups stepped per batch).
"""
from __future__ import annotations

import bisect
import math
from typing import List, Sequence

from tiny.tensor import Tensor

from tiny_nn.optim import Optimizer, OptimizerGroup

__all__ = ["CosineAnnealingLR", "LRScheduler", "LinearLR", "LinearWarmup", "MultiStepLR", "OneCycleLR", "StepLR"]


class LRScheduler:
  """Base class: subclasses give `lr_at(epoch, base_lr)`; `step()` advances the epoch and updates every optimizer in the group."""

  def __init__(self, optimizer: Optimizer):
    self.optimizer = optimizer
    self.optimizers: List[Optimizer] = list(optimizer.optimizers) if isinstance(optimizer, OptimizerGroup) else [optimizer]
    self.base_lrs = [float(o.lr.numpy().reshape(-1)[0]) for o in self.optimizers]
    self.epoch_counter = 0
    self._apply()

  def lr_at(self, epoch: int, base_lr: float) -> float:
    raise NotImplementedError

  def get_lr(self) -> List[float]:
    """The rates for the current epoch, one per optimizer."""
    return [self.lr_at(self.epoch_counter, b) for b in self.base_lrs]

  def _apply(self) -> None:
    for o, lr in zip(self.optimizers, self.get_lr()):
      o.lr.assign(Tensor([lr], dtype=o.lr.dtype, device=o.lr.device, requires_grad=False)).realize()

  def step(self) -> None:
    """Advances one epoch and sets the new rate."""
    self.epoch_counter += 1
    self._apply()


class StepLR(LRScheduler):
  """lr = base_lr * gamma ** (epoch // step_size)."""

  def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
    if step_size <= 0:
      raise ValueError(f"step_size must be positive, got {step_size}")
    self.step_size, self.gamma = step_size, gamma
    super().__init__(optimizer)

  def lr_at(self, epoch: int, base_lr: float) -> float:
    return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
  """lr = base_lr * gamma ** (number of milestones reached)."""

  def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1):
    self.milestones, self.gamma = sorted(milestones), gamma
    super().__init__(optimizer)

  def lr_at(self, epoch: int, base_lr: float) -> float:
    return base_lr * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class CosineAnnealingLR(LRScheduler):
  """Half a cosine from base_lr down to eta_min over T_max epochs (the closed form of torch's schedule)."""

  def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
    if T_max <= 0:
      raise ValueError(f"T_max must be positive, got {T_max}")
    self.T_max, self.eta_min = T_max, eta_min
    super().__init__(optimizer)

  def lr_at(self, epoch: int, base_lr: float) -> float:
    return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
  """Scales base_lr by a factor going linearly from start_factor to end_factor over total_iters steps (a warm-up)."""

  def __init__(self, optimizer: Optimizer, start_factor: float = 1 / 3, end_factor: float = 1.0, total_iters: int = 5):
    if not 0 < start_factor <= 1 or not 0 <= end_factor <= 1:
      raise ValueError("start_factor must be in (0, 1] and end_factor in [0, 1]")
    if total_iters <= 0:
      raise ValueError(f"total_iters must be positive, got {total_iters}")
    self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
    super().__init__(optimizer)

  def lr_at(self, epoch: int, base_lr: float) -> float:
    frac = min(epoch, self.total_iters) / self.total_iters
    return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * frac)


def LinearWarmup(optimizer: Optimizer, warmup_steps: int) -> LinearLR:
  """Ramps the rate from base_lr / warmup_steps up to base_lr over `warmup_steps` steps, then holds it."""
  return LinearLR(optimizer, start_factor=1 / warmup_steps, end_factor=1.0, total_iters=warmup_steps)


class OneCycleLR(LRScheduler):
  """The one-cycle policy: warm up from max_lr/div_factor to max_lr, then anneal to max_lr/div_factor/final_div_factor.

  Stepped once per batch for `total_steps` batches; the optimizer's own lr is ignored (torch's behaviour).
  """

  def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int, pct_start: float = 0.3, anneal_strategy: str = "cos",
               div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False):
    if total_steps <= 0:
      raise ValueError(f"total_steps must be positive, got {total_steps}")
    if not 0 <= pct_start <= 1:
      raise ValueError(f"pct_start must be in [0, 1], got {pct_start}")
    if anneal_strategy not in ("cos", "linear"):
      raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
    self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
    initial, peak = max_lr / div_factor, max_lr
    final = initial / final_div_factor
    up_end = float(pct_start * total_steps) - 1
    if three_phase:
      self.phases = [(up_end, initial, peak), (2 * up_end, peak, initial), (total_steps - 1, initial, final)]
    else:
      self.phases = [(up_end, initial, peak), (total_steps - 1, peak, final)]
    super().__init__(optimizer)

  def _anneal(self, start: float, end: float, pct: float) -> float:
    if self.anneal_strategy == "cos":
      return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)
    return (end - start) * pct + start

  def lr_at(self, epoch: int, base_lr: float) -> float:
    if epoch > self.total_steps:
      raise ValueError(f"OneCycleLR stepped {epoch} times, more than total_steps={self.total_steps}")
    phase_start = 0.0
    for i, (phase_end, start, end) in enumerate(self.phases):
      if epoch <= phase_end or i == len(self.phases) - 1:
        span = phase_end - phase_start
        return self._anneal(start, end, (epoch - phase_start) / span if span else 1.0)
      phase_start = phase_end
    raise AssertionError("unreachable: the last phase always matches")
