"""Launched by test_nn_mpi.py under mpirun: the last rank raises while the others wait in an allreduce that never completes.

Without the excepthook that tiny_nn.distributed.init() installs, the waiting ranks would hang forever.
"""
from tiny.tensor import Tensor

from tiny_nn import distributed as dist

g = dist.init()
if g.rank == g.world_size - 1:
  raise ValueError("deliberate failure on the last rank")
dist.allreduce(Tensor([1.0]))
print("unreachable: the allreduce completed without the failed rank", flush=True)
