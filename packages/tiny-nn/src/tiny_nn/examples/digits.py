"""Train a small CNN on the real handwritten digits bundled with scikit-learn and print its test accuracy.

    python -m tiny_nn.examples.digits [--epochs 8] [--batch-size 64] [--lr 0.01] [--seed 0]

1437 training and 360 test images of 8x8 pixels (tiny_nn.datasets.digits). Three 3x3 conv + BatchNorm + ReLU blocks and
a linear head, trained with Adam under a one-cycle schedule; the whole training step is compiled once with TinyJit.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

import numpy as np
from tqdm import trange

from tiny.device import Device
from tiny.engine.jit import TinyJit
from tiny.tensor import Tensor

from tiny_nn import BatchNorm, Conv2d, Linear
from tiny_nn.datasets import digits_numpy
from tiny_nn.lr import OneCycleLR
from tiny_nn.optim import Adam
from tiny_nn.state import get_parameters


class DigitsNet:
  """(N, 1, 8, 8) -> (N, 10) logits."""

  def __init__(self) -> None:
    self.convs = [Conv2d(1, 16, 3, padding=1), Conv2d(16, 32, 3, padding=1), Conv2d(32, 64, 3, padding=1)]
    self.norms = [BatchNorm(16), BatchNorm(32), BatchNorm(64)]
    self.head = Linear(64 * 2 * 2, 10)

  def __call__(self, x: Tensor) -> Tensor:
    for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
      x = norm(conv(x)).relu()
      if i > 0:
        x = x.max_pool2d((2, 2))  # 8x8 -> 4x4 -> 2x2
    return self.head(x.flatten(1))


def evaluate(model: DigitsNet, x: np.ndarray, y: np.ndarray) -> float:
  """Fraction of `x` classified as `y`, in inference mode (BatchNorm uses its running statistics)."""
  prev, Tensor.training = Tensor.training, False
  try:
    pred = model(Tensor(x)).argmax(axis=1).numpy()
  finally:
    Tensor.training = prev
  return float((pred == y).mean())


def train(epochs: int = 8, batch_size: int = 64, lr: float = 0.01, seed: int = 0, progress: bool = True) -> float:
  """Trains a DigitsNet from scratch and returns its test accuracy."""
  Tensor.manual_seed(seed)
  rng = np.random.RandomState(seed)
  x_train, y_train, x_test, y_test = digits_numpy()
  model = DigitsNet()
  opt = Adam(get_parameters(model), lr=lr)
  steps = epochs * (len(x_train) // batch_size)
  sched = OneCycleLR(opt, max_lr=lr, total_steps=steps)

  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    return loss.realize(*opt.schedule_step())

  Tensor.training = True
  try:
    bar = trange(steps, disable=not progress, desc="training", unit="step")
    for i in bar:
      idx = rng.randint(0, len(x_train), batch_size)
      loss = step(Tensor(x_train[idx]), Tensor(y_train[idx]))
      sched.step()
      if i % 10 == 9 or i == steps - 1:
        bar.set_postfix(loss=f"{loss.item():.3f}")
  finally:
    Tensor.training = False
  return evaluate(model, x_test, y_test)


def main(argv: Optional[List[str]] = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
  p.add_argument("--epochs", type=int, default=8)
  p.add_argument("--batch-size", type=int, default=64)
  p.add_argument("--lr", type=float, default=0.01, help="peak learning rate of the one-cycle schedule")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--min-accuracy", type=float, default=None, help="exit with status 1 if the test accuracy is below this")
  args = p.parse_args(argv)
  print(f"device: {Device.DEFAULT}")
  t0 = time.perf_counter()
  acc = train(args.epochs, args.batch_size, args.lr, args.seed)
  print(f"test accuracy: {acc * 100:.2f}% (360 images), {time.perf_counter() - t0:.1f} s")
  return 1 if args.min_accuracy is not None and acc < args.min_accuracy else 0


if __name__ == "__main__":
  sys.exit(main())
