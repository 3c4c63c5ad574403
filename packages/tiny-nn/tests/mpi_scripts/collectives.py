"""Launched by test_nn_mpi.py under mpirun: runs every collective on rank-dependent inputs and saves the results.

    mpirun -np N python collectives.py OUT_DIR       # writes OUT_DIR/rank{r}.npz
"""
import sys

import numpy as np

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from tiny_nn import distributed as dist


def inputs(rank: int) -> np.ndarray:
  """Rank r's float input; the test rebuilds it for every rank to compute the expected results with numpy."""
  return (np.arange(12, dtype=np.float32).reshape(3, 4) - 5) * (rank + 1) + rank * 0.25


def main(out_dir: str) -> None:
  g = dist.init()
  x = Tensor(inputs(g.rank))
  res = {op: dist.allreduce(x, op).numpy() for op in dist.REDUCE_OPS}
  res["int_sum"] = dist.allreduce(Tensor(np.arange(5, dtype=np.int32) * (g.rank + 1)), "sum").numpy()
  res["half_sum"] = dist.allreduce(x.cast(dtypes.float16), "sum").numpy()
  res["scalar_max"] = dist.allreduce(Tensor(float(g.rank) + 0.5), "max").numpy()
  res["bcast_root0"] = dist.broadcast(x).numpy()
  res["bcast_last"] = dist.broadcast(x, root=g.world_size - 1).numpy()
  res["gather"] = dist.allgather(x).numpy()
  res["gather_scalar"] = dist.allgather(Tensor(float(g.rank) * 10)).numpy()
  res["world_size"] = np.array(g.world_size)
  res["is_main"] = np.array(dist.is_main())
  np.savez(f"{out_dir}/rank{g.rank}.npz", **res)


if __name__ == "__main__":
  main(sys.argv[1])
