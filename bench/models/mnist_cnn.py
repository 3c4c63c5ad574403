"""An MNIST-style CNN training step (forward, cross-entropy, backward, Adam) for tiny/tinygrad and for torch.

The architecture is the common small MNIST convnet: two 5x5 convs (32 ch), BatchNorm, 2x2 max-pool, two 3x3 convs
(64 ch), BatchNorm, 2x2 max-pool, a linear head; input (batch, 1, 28, 28), 10 classes. The data is random (the
benchmark measures speed, not accuracy): the same batch is fed at every step.

tiny builds it with `tiny_nn` and tinygrad with `tinygrad.nn` (same layer names); both compile the whole step with
TinyJit. torch runs the same layers eagerly.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator, Tuple

import numpy as np

NN_MODULE = {"tiny": "tiny_nn", "tinygrad": "tinygrad.nn"}


def batch_numpy(batch: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
  """A random batch shaped like MNIST: float images in [0, 1) and integer labels."""
  rng = np.random.default_rng(seed)
  return rng.random((batch, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, batch).astype(np.int32)


def step_flops(batch: int) -> float:
  """Approximate FLOPs of one training step: conv and linear multiply-adds, forward plus twice that for backward."""
  per_image = 2 * (32 * 1 * 25 * 24 * 24 + 32 * 32 * 25 * 20 * 20 + 64 * 32 * 9 * 8 * 8 + 64 * 64 * 9 * 6 * 6 + 576 * 10)
  return 3.0 * per_image * batch


@contextlib.contextmanager
def _training(mod: Any) -> Iterator[None]:
  """Training mode: tiny (like tinygrad 0.9.1) keeps it in the class flag Tensor.training; newer tinygrad releases use the
  context variable TRAINING instead (their optimizers refuse to step without it)."""
  Tensor = mod.Tensor
  if not hasattr(Tensor, "training"):
    with mod.Context(TRAINING=1):
      yield
    return
  prev, Tensor.training = Tensor.training, True
  try:
    yield
  finally:
    Tensor.training = prev


def tensor_step(module: str, batch: int, lr: float = 1e-3) -> Callable[[], Any]:
  """A closure that runs one jitted training step on tiny (`module="tiny"`) or tinygrad and returns the loss Tensor."""
  mod = importlib.import_module(module)
  nn = importlib.import_module(NN_MODULE[module])
  optim, state = importlib.import_module(NN_MODULE[module] + ".optim"), importlib.import_module(NN_MODULE[module] + ".state")
  Tensor, TinyJit = mod.Tensor, mod.TinyJit

  class Net:
    def __init__(self) -> None:
      self.c1, self.c2, self.bn1 = nn.Conv2d(1, 32, 5), nn.Conv2d(32, 32, 5), nn.BatchNorm(32)
      self.c3, self.c4, self.bn2 = nn.Conv2d(32, 64, 3), nn.Conv2d(64, 64, 3), nn.BatchNorm(64)
      self.head = nn.Linear(576, 10)

    def __call__(self, x: Any) -> Any:
      x = self.bn1(self.c2(self.c1(x).relu()).relu()).max_pool2d()
      x = self.bn2(self.c4(self.c3(x).relu()).relu()).max_pool2d()
      return self.head(x.flatten(1))

  with _training(mod):
    model = Net()
    opt = optim.Adam(state.get_parameters(model), lr=lr)
  # the weights exist once the model is built, as torch's do: tiny and tinygrad draw them lazily, which would otherwise
  # put the weight init (a random-number kernel per tensor) into the first training step ("first call" row)
  Tensor.realize(*state.get_parameters(model))
  xs, ys = batch_numpy(batch)
  x, y = Tensor(xs).realize(), Tensor(ys).realize()

  @TinyJit
  def step(x: Any, y: Any) -> Any:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    if hasattr(opt, "schedule_step"):
      return loss.realize(*opt.schedule_step())
    opt.step()
    return loss.realize()

  def run() -> Any:
    with _training(mod):
      return step(x, y)
  return run


def torch_step(batch: int, lr: float = 1e-3) -> Callable[[], Any]:
  """The same network and optimizer in eager torch."""
  import torch
  from torch import nn

  model = nn.Sequential(nn.Conv2d(1, 32, 5), nn.ReLU(), nn.Conv2d(32, 32, 5), nn.ReLU(), nn.BatchNorm2d(32), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(), nn.BatchNorm2d(64), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(576, 10))
  model.train()
  opt = torch.optim.Adam(model.parameters(), lr=lr)
  xs, ys = batch_numpy(batch)
  x, y = torch.from_numpy(xs), torch.from_numpy(ys).long()

  def run() -> Any:
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()
  return run
