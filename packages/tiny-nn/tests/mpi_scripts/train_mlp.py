"""Launched by test_nn_mpi.py, under mpirun or alone: data-parallel SGD on a small MLP; every rank saves its parameters.

    mpirun -np N python train_mlp.py OUT_DIR        # writes OUT_DIR/rank{r}.npz (and OUT_DIR/model.safetensors from rank 0)
    python train_mlp.py OUT_DIR                     # the single-process reference on the same global batches

Rank r seeds its initialization with SEED + r, so only broadcast_parameters makes the ranks start alike (from rank 0's
weights, which are the single process's). Tiny buckets force several allreduce calls per step; odd steps average the
gradients through bucket_grads/allreduce_buckets (the path a jitted step uses), even ones through opt.step().
"""
import sys

import numpy as np

from tiny.tensor import Tensor

from tiny_nn import Linear
from tiny_nn import distributed as dist
from tiny_nn.optim import SGD
from tiny_nn.state import get_state_dict

SEED, STEPS, GLOBAL_BATCH = 1234, 6, 8


class MLP:
  def __init__(self) -> None:
    self.l1, self.l2 = Linear(5, 16), Linear(16, 3)

  def __call__(self, x: Tensor) -> Tensor:
    return self.l2(self.l1(x).tanh())


def main(out_dir: str) -> None:
  g = dist.init()
  Tensor.manual_seed(SEED + g.rank)
  model = MLP()
  sd = get_state_dict(model)
  initial = {k: v.numpy() for k, v in sd.items()}
  dist.broadcast_parameters(list(sd.values()))
  opt = dist.DistributedOptimizer(SGD(list(sd.values()), lr=0.1, momentum=0.9), bucket_bytes=400)
  data = np.random.RandomState(SEED)
  x_all, y_all = data.randn(64, 5).astype(np.float32), data.randint(0, 3, 64).astype(np.int32)
  sampler = dist.DistributedSampler(len(x_all), GLOBAL_BATCH, seed=SEED)
  losses = []
  with Tensor.train():
    for step, idx in zip(range(STEPS), sampler):
      opt.zero_grad()
      loss = model(Tensor(x_all[idx])).sparse_categorical_crossentropy(Tensor(y_all[idx])).backward()
      if step % 2:  # the split path of a jitted step: device-side buckets, one host round trip each
        opt.set_grads(opt.allreduce_buckets(opt.bucket_grads()))
        opt.optimizer.step()
      else:
        opt.step()
      losses.append(dist.allreduce(loss, "mean").item())
  dist.save_on_main(model, f"{out_dir}/model.safetensors")
  np.savez(f"{out_dir}/rank{g.rank}.npz", buckets=np.array(len(opt.plan)), losses=np.array(losses),
           **{f"init.{k}": v for k, v in initial.items()}, **{k: v.numpy() for k, v in sd.items()})


if __name__ == "__main__":
  main(sys.argv[1])
