"""Train a small CNN on the real handwritten digits bundled with scikit-learn and print its test accuracy.

    python -m tiny_nn.examples.digits [--epochs 8] [--batch-size 64] [--lr 0.01] [--seed 0]
    mpirun -np 2 python -m tiny_nn.examples.digits --distributed     # data-parallel over 2 processes (tiny-nn[mpi])

1437 training and 360 test images of 8x8 pixels (tiny_nn.datasets.digits). Three 3x3 conv + BatchNorm + ReLU blocks and
a linear head, trained with Adam under a one-cycle schedule; the whole training step is compiled once with TinyJit.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from tqdm import trange

from tiny.device import Device
from tiny.dtype import dtypes
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


WARMUP_STEPS = 3  # a TinyJit runs eagerly, then captures, then replays: time the steps after these


def train(epochs: int = 8, batch_size: int = 64, lr: float = 0.01, seed: int = 0, progress: bool = True, distributed: bool = False,
          timing: Optional[Dict[str, float]] = None) -> float:
  """Trains a DigitsNet from scratch and returns its test accuracy.

  With `distributed`, every rank of the MPI job (tiny_nn.distributed) draws the same global batches of `batch_size` and
  trains on its slice of each; gradients are averaged before every update and rank 0 evaluates (all ranks return its
  accuracy). `timing`, when given, receives "step_s": the mean seconds per training step after the JIT warm-up.
  """
  if distributed:
    return _train_distributed(epochs, batch_size, lr, seed, progress, timing)
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
      if i == WARMUP_STEPS:
        t_steady = time.perf_counter()
      idx = rng.randint(0, len(x_train), batch_size)
      loss = step(Tensor(x_train[idx]), Tensor(y_train[idx]))
      sched.step()
      if i % 10 == 9 or i == steps - 1:
        bar.set_postfix(loss=f"{loss.item():.3f}")
  finally:
    Tensor.training = False
  if timing is not None and steps > WARMUP_STEPS:
    timing["step_s"] = (time.perf_counter() - t_steady) / (steps - WARMUP_STEPS)
  return evaluate(model, x_test, y_test)


def _train_distributed(epochs: int, batch_size: int, lr: float, seed: int, progress: bool, timing: Optional[Dict[str, float]]) -> float:
  from tiny_nn import distributed as dist
  group = dist.init(distributed=True)
  if batch_size % group.world_size:
    raise ValueError(f"--batch-size {batch_size} (the global batch) must be a multiple of the number of ranks ({group.world_size})")
  Tensor.manual_seed(seed)  # the same initial weights on every rank (broadcast_parameters below makes sure)
  rng = np.random.RandomState(seed)  # the same global batches on every rank; each takes its slice
  mine = dist.shard_indices(batch_size, group.rank, group.world_size)
  x_train, y_train, x_test, y_test = digits_numpy()
  model = DigitsNet()
  params = get_parameters(model)
  dist.broadcast_parameters(params)
  adam = Adam(params, lr=lr)
  opt = dist.DistributedOptimizer(adam)
  steps = epochs * (len(x_train) // batch_size)
  sched = OneCycleLR(adam, max_lr=lr, total_steps=steps)

  # the gradient allreduce runs on the host, between two jitted halves of the step
  @TinyJit
  def backward(x: Tensor, y: Tensor) -> Tuple[Tensor, List[Tensor]]:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    buckets = opt.bucket_grads()  # the gradients concatenated on the device: one host copy per bucket, not per parameter
    Tensor.realize(loss, *buckets, *opt.buffers)  # buffers: BatchNorm's running statistics, updated by the forward pass
    return loss, buckets

  @TinyJit
  def update(*flat_grads: Tensor) -> Tensor:
    opt.set_grads(flat_grads)
    return Tensor.realize(*adam.schedule_step())

  Tensor.training = True
  try:
    bar = trange(steps, disable=not (progress and group.is_main), desc=f"training on {group.world_size} ranks", unit="step")
    for i in bar:
      if i == WARMUP_STEPS:
        t_steady = time.perf_counter()
      idx = rng.randint(0, len(x_train), batch_size)[mine]
      loss, buckets = backward(Tensor(x_train[idx]), Tensor(y_train[idx]))
      update(*opt.allreduce_buckets(buckets))
      sched.step()
      if i % 10 == 9 or i == steps - 1:
        mean_loss = dist.allreduce(loss, "mean").item()  # every rank reaches this collective at the same steps
        bar.set_postfix(loss=f"{mean_loss:.3f}")
  finally:
    Tensor.training = False
  if timing is not None and steps > WARMUP_STEPS:
    timing["step_s"] = (time.perf_counter() - t_steady) / (steps - WARMUP_STEPS)
  # each rank's BatchNorm statistics come from its own slices: evaluate with their mean over the ranks
  dist.average_buffers(opt.buffers)
  acc = evaluate(model, x_test, y_test) if group.is_main else 0.0
  return float(dist.broadcast(Tensor([acc], dtype=dtypes.float64)).item())


def main(argv: Optional[List[str]] = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
  p.add_argument("--epochs", type=int, default=8)
  p.add_argument("--batch-size", type=int, default=64, help="the global batch (split between the ranks with --distributed)")
  p.add_argument("--lr", type=float, default=0.01, help="peak learning rate of the one-cycle schedule")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--min-accuracy", type=float, default=None, help="exit with status 1 if the test accuracy is below this")
  p.add_argument("--distributed", action="store_true", help="data-parallel over the ranks of an MPI job (mpirun -np N ...; needs mpi4py)")
  args = p.parse_args(argv)
  say: Callable[..., None] = print
  if args.distributed:
    from tiny_nn import distributed as dist
    group = dist.init(distributed=True)
    say = dist.print_main
    say(f"device: {Device.DEFAULT}, {group.world_size} ranks over MPI, {args.batch_size // group.world_size} of each batch of "
        f"{args.batch_size} per rank")
  else:
    print(f"device: {Device.DEFAULT}")
  t0 = time.perf_counter()
  timing: Dict[str, float] = {}
  acc = train(args.epochs, args.batch_size, args.lr, args.seed, distributed=args.distributed, timing=timing)
  say(f"test accuracy: {acc * 100:.2f}% (360 images), {time.perf_counter() - t0:.1f} s")
  if "step_s" in timing:
    say(f"step time: {timing['step_s'] * 1e3:.2f} ms (mean after {WARMUP_STEPS} warm-up steps)")
  return 1 if args.min_accuracy is not None and acc < args.min_accuracy else 0


if __name__ == "__main__":
  sys.exit(main())
