"""Data-parallel training over MPI: one process per device, gradients averaged between them (`pip install tiny-nn[mpi]`).

    mpirun -np 2 python train.py        # every rank runs the same script

    group = init()                                   # rank / world_size from the MPI launcher (1 rank without one)
    Tensor.manual_seed(0); model = Net()             # same seed everywhere, then make sure of it:
    broadcast_parameters(get_parameters(model))
    opt = DistributedOptimizer(Adam(get_parameters(model)))
    for idx in batches:                              # the same global batch on every rank ...
      mine = idx[shard_indices(len(idx), group.rank, group.world_size)]   # ... each rank takes its slice
      opt.zero_grad(); loss_fn(model, x[mine], y[mine]).backward(); opt.step()   # step() averages p.grad first

MPI (mpi4py over OpenMPI, MPICH, ...) is the transport: a collective copies the tensor to a host numpy buffer, runs the
buffer-protocol MPI call in place (no pickling) and copies the result back to the tensor's device. Without mpi4py, or
when the script was not started by an MPI launcher, `init()` returns a 1-rank group whose collectives are identities,
so the same script runs alone unchanged.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from types import ModuleType, TracebackType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union, cast

import numpy as np

from tiny.dtype import dtypes, to_np_dtype
from tiny.tensor import Tensor

from tiny_nn.optim import Optimizer, OptimizerGroup
from tiny_nn.state import get_state_dict, safe_save

__all__ = ["DEFAULT_BUCKET_BYTES", "DistributedError", "DistributedOptimizer", "DistributedSampler", "GradBuckets", "ProcessGroup",
           "allgather", "allreduce", "average_buffers", "barrier", "broadcast", "broadcast_parameters", "get_group", "init", "is_main",
           "print_main", "save_on_main", "shard_indices"]

DEFAULT_BUCKET_BYTES = 25 * 2**20
REDUCE_OPS = ("sum", "mean", "max", "min", "prod")
# environment variables that MPI launchers set in every rank they start, with the world size where they carry it
_LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE")
_LAUNCHER_MARKER_VARS = ("PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
_INSTALL_HINT = "install the MPI binding with `pip install 'tiny-nn[mpi]'` (mpi4py; it needs an MPI library such as OpenMPI)"


class DistributedError(RuntimeError):
  """Distributed mode was requested but cannot be set up, or ranks disagree about a collective."""


def _launched_world_size() -> Optional[int]:
  """The world size an MPI launcher announced to this process (None when no launcher started it)."""
  for var in _LAUNCHER_SIZE_VARS:
    if (v := os.environ.get(var)) is not None and v.isdigit():
      return int(v)
  return 0 if any(var in os.environ for var in _LAUNCHER_MARKER_VARS) else None


def _import_mpi() -> Optional[ModuleType]:
  # imported by name so that tiny_nn neither needs mpi4py to import nor its type stubs to type-check
  try:
    return importlib.import_module("mpi4py.MPI")
  except ImportError:
    return None


class ProcessGroup:
  """The ranks taking part in training: `rank`, `world_size`, `is_main`, and the collectives between them.

  `comm` is an mpi4py communicator, or None for the 1-rank group (every collective then returns its input's value).
  """

  def __init__(self, comm: Any = None, mpi: Optional[ModuleType] = None):
    if comm is not None and mpi is None:
      raise ValueError("a ProcessGroup with a communicator needs the mpi4py.MPI module too")
    self.comm, self._mpi = comm, mpi
    self.rank: int = comm.Get_rank() if comm is not None else 0
    self.world_size: int = comm.Get_size() if comm is not None else 1

  def __repr__(self) -> str:
    return f"ProcessGroup(rank={self.rank}, world_size={self.world_size}, mpi={self.comm is not None})"

  @property
  def is_main(self) -> bool:
    """True on rank 0, the rank that logs, evaluates and writes checkpoints."""
    return self.rank == 0

  @property
  def distributed(self) -> bool:
    """True when there is more than one rank."""
    return self.world_size > 1

  def barrier(self) -> None:
    """Waits until every rank got here."""
    if self.comm is not None:
      self.comm.Barrier()

  # *** numpy collectives (in place, buffer protocol) ***

  def _mpi_op(self, op: str) -> Any:
    assert self._mpi is not None
    return {"sum": self._mpi.SUM, "mean": self._mpi.SUM, "max": self._mpi.MAX, "min": self._mpi.MIN, "prod": self._mpi.PROD}[op]

  def allreduce_numpy(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
    """Reduces the C-contiguous array `a` over all ranks in place (one MPI call) and returns it; "mean" divides by world_size."""
    _check_op(op, a.dtype)
    if not a.flags.c_contiguous or not a.flags.writeable:
      raise ValueError("allreduce_numpy needs a writeable C-contiguous array")
    if self.comm is not None and self.world_size > 1:
      assert self._mpi is not None
      self.comm.Allreduce(self._mpi.IN_PLACE, a, op=self._mpi_op(op))
      if op == "mean":
        a /= self.world_size
    return a

  # *** Tensor collectives ***

  def allreduce(self, t: Tensor, op: str = "sum") -> Tensor:
    """`t` reduced element-wise over all ranks ("sum", "mean", "max", "min", "prod"), on t's device with t's dtype."""
    if not isinstance(t, Tensor):
      raise TypeError(f"allreduce expects a Tensor, got {type(t).__name__}")
    _check_op(op, _wire_dtype(t))
    if self.world_size == 1:
      return t.detach()
    return _from_host(self.allreduce_numpy(_to_host(t), op), t)

  def broadcast(self, t: Tensor, root: int = 0) -> Tensor:
    """Rank `root`'s value of `t`, on every rank (t's shape and dtype must agree on all ranks)."""
    if not isinstance(t, Tensor):
      raise TypeError(f"broadcast expects a Tensor, got {type(t).__name__}")
    self._check_root(root)
    if self.world_size == 1:
      return t.detach()
    a = _to_host(t)
    self.comm.Bcast(a, root=root)
    return _from_host(a, t)

  def allgather(self, t: Tensor) -> Tensor:
    """Every rank's `t` stacked along a new first axis: shape (world_size, *t.shape), rank r's value at index r."""
    if not isinstance(t, Tensor):
      raise TypeError(f"allgather expects a Tensor, got {type(t).__name__}")
    if self.world_size == 1:
      return t.detach().unsqueeze(0)
    mine = _to_host(t)
    # a mismatch would make MPI read past the buffers; the (tiny, pickled) metadata check costs one more round trip
    metas = self.comm.allgather((tuple(t.shape), str(mine.dtype)))
    if len(set(metas)) != 1:
      raise DistributedError(f"allgather needs the same shape and dtype on every rank, got {metas}")
    out = np.empty((self.world_size,) + mine.shape, dtype=mine.dtype)
    self.comm.Allgather(mine, out)
    return _from_host(out, t, shape=(self.world_size,) + _shape(t))

  def _check_root(self, root: int) -> None:
    if not isinstance(root, int) or not 0 <= root < self.world_size:
      raise ValueError(f"root must be a rank in [0, {self.world_size}), got {root!r}")


def _check_op(op: str, dtype: np.dtype) -> None:
  if op not in REDUCE_OPS:
    raise ValueError(f"unknown reduction {op!r}; use one of {', '.join(REDUCE_OPS)}")
  if op == "mean" and dtype.kind != "f":
    raise TypeError(f"reduction 'mean' needs a floating-point tensor, got {dtype}")


def _wire_dtype(t: Tensor) -> np.dtype:
  """The numpy dtype a tensor travels as: its own, with half floats widened (MPI has no standard 16-bit float)."""
  if t.dtype == dtypes.bool:
    raise TypeError("collectives on bool tensors are not supported: cast to an integer dtype first")
  if t.dtype in (dtypes.float16, dtypes.bfloat16):
    return np.dtype(np.float32)
  if (npdt := to_np_dtype(t.dtype)) is None:
    raise TypeError(f"{t.dtype} has no numpy equivalent and cannot travel over MPI")
  return np.dtype(npdt)


def _shape(t: Tensor) -> Tuple[int, ...]:
  if not all(isinstance(s, int) for s in t.shape):
    raise ValueError(f"collectives need concrete shapes, got {t.shape}")
  return tuple(int(cast(int, s)) for s in t.shape)


def _to_host(t: Tensor) -> np.ndarray:
  """A fresh, writeable, C-contiguous host copy of t (1-d for 0-d tensors, which MPI cannot address)."""
  return np.ascontiguousarray(t.detach().numpy(), dtype=_wire_dtype(t)).reshape(-1 if t.ndim == 0 else t.shape).copy()


def _from_host(a: np.ndarray, like: Tensor, shape: Optional[Tuple[int, ...]] = None) -> Tensor:
  """`a` as a Tensor on like's device with like's dtype (shape: like's unless given)."""
  out = Tensor(a.reshape(shape if shape is not None else like.shape), device=like.device, requires_grad=False)
  return out if out.dtype == like.dtype else out.cast(like.dtype)


# *** the default group ***

_group: Optional[ProcessGroup] = None
_prev_excepthook: Optional[Callable[..., Any]] = None


def init(distributed: Optional[bool] = None, abort_on_exception: bool = True) -> ProcessGroup:
  """Sets up (once) and returns the default process group from the MPI environment.

  distributed=None (auto) joins MPI's world when an MPI launcher started this process and mpi4py is installed, and is a
  1-rank group otherwise; distributed=True requires mpi4py (DistributedError when it is missing); False is always the
  1-rank group. Under a launcher that started several ranks, a missing mpi4py is an error in auto mode too: each rank
  would otherwise train alone. With several ranks and `abort_on_exception`, an uncaught exception on any rank prints
  its traceback and calls MPI_Abort, so the other ranks (maybe waiting in a collective) end instead of hanging.
  """
  global _group
  if _group is not None:
    if distributed is True and _group.comm is None:
      raise DistributedError("init(distributed=True) after the default group was already set up as a 1-rank group")
    return _group
  launched = _launched_world_size()
  mpi: Optional[ModuleType] = None
  if distributed is True or (distributed is None and launched is not None):
    _yield_when_cores_are_shared()
    mpi = _import_mpi()
    if mpi is None and (distributed is True or (launched or 0) > 1):
      why = "distributed mode was requested" if distributed else f"this process was started by an MPI launcher with {launched} ranks"
      raise DistributedError(f"{why}, but mpi4py is not installed: {_INSTALL_HINT}")
  _group = ProcessGroup(mpi.COMM_WORLD, mpi) if mpi is not None else ProcessGroup()
  if abort_on_exception and _group.world_size > 1:
    _install_excepthook(_group)
  return _group


def _yield_when_cores_are_shared() -> None:
  """With at least as many ranks on this machine as cores, a rank waiting in a collective must not spin on its core.

  Open MPI busy-polls by default; when the ranks fill the cores, the waiting rank then steals time from the rank it is
  waiting for (on 2 cores, 2 ranks: up to 2x slower steps). Only sets the default: OMPI_MCA_mpi_yield_when_idle=0 wins.
  """
  local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "")
  if local.isdigit() and int(local) >= (os.cpu_count() or 1):
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


def get_group() -> ProcessGroup:
  """The default process group (set up in auto mode by the first call)."""
  return _group if _group is not None else init()


def _reset_for_tests() -> None:
  """Forgets the default group and restores sys.excepthook (for in-process tests only)."""
  global _group, _prev_excepthook
  _group = None
  if _prev_excepthook is not None:
    sys.excepthook, _prev_excepthook = _prev_excepthook, None


def _install_excepthook(group: ProcessGroup) -> None:
  global _prev_excepthook
  if _prev_excepthook is not None:
    return
  _prev_excepthook = prev = sys.excepthook

  def abort_all(etype: Type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
    try:
      prev(etype, value, tb)
    except Exception:  # a broken hook must not keep the job from ending
      traceback.print_exception(etype, value, tb)
    sys.stderr.write(f"tiny_nn.distributed: rank {group.rank} of {group.world_size} raised {etype.__name__}; aborting all ranks (MPI_Abort)\n")
    sys.stdout.flush()
    sys.stderr.flush()
    group.comm.Abort(1)

  sys.excepthook = abort_all


def is_main() -> bool:
  """True on rank 0 of the default group (and when running alone)."""
  return get_group().is_main


def barrier() -> None:
  """Waits until every rank of the default group got here."""
  get_group().barrier()


def print_main(*args: Any, **kwargs: Any) -> None:
  """`print` on rank 0 only (flushed, so its lines are not held back behind the other ranks' output)."""
  if is_main():
    print(*args, **kwargs, flush=True)


def allreduce(t: Tensor, op: str = "sum", group: Optional[ProcessGroup] = None) -> Tensor:
  """`t` reduced over all ranks; see ProcessGroup.allreduce."""
  return (group or get_group()).allreduce(t, op)


def broadcast(t: Tensor, root: int = 0, group: Optional[ProcessGroup] = None) -> Tensor:
  """Rank root's `t` on every rank; see ProcessGroup.broadcast."""
  return (group or get_group()).broadcast(t, root)


def allgather(t: Tensor, group: Optional[ProcessGroup] = None) -> Tensor:
  """Every rank's `t` stacked along a new first axis; see ProcessGroup.allgather."""
  return (group or get_group()).allgather(t)


# *** parameters and buffers ***

def broadcast_parameters(params: Sequence[Tensor], root: int = 0, group: Optional[ProcessGroup] = None) -> None:
  """Overwrites every tensor in `params` (in place, on every rank) with rank root's value, so all ranks start identical.

  All tensors of one dtype travel in a single MPI call.
  """
  g = group or get_group()
  g._check_root(root)
  if g.world_size == 1:
    return
  plan = GradBuckets(params, bucket_bytes=None)
  for bucket, flat in zip(plan.buckets, plan.to_host(list(params))):
    g.comm.Bcast(flat, root=root)
    for i, t in zip(bucket, plan.split(flat, bucket)):
      params[i].assign(_from_host(t, params[i])).realize()


def average_buffers(buffers: Sequence[Tensor], group: Optional[ProcessGroup] = None) -> None:
  """Replaces every floating-point tensor in `buffers` (in place) by its mean over all ranks; others are left alone.

  For BatchNorm's running statistics after data-parallel training: the running mean is linear in the batch means, so
  the average over ranks is exactly the running mean of the global batches; the running variance averages the ranks'
  batch variances, which leaves out the spread between the ranks' means (small when the shards are alike).
  """
  g = group or get_group()
  floats = [t for t in buffers if dtypes.is_float(t.dtype)]
  if g.world_size == 1 or not floats:
    return
  plan = GradBuckets(floats, bucket_bytes=None)
  for bucket, flat in zip(plan.buckets, plan.to_host(floats)):
    g.allreduce_numpy(flat, "mean")
    for i, t in zip(bucket, plan.split(flat, bucket)):
      floats[i].assign(_from_host(t, floats[i])).realize()


class GradBuckets:
  """Groups tensors into flat buckets of at most `bucket_bytes` (one dtype per bucket) so that one MPI call serves many.

  A tensor bigger than the limit gets a bucket of its own; bucket_bytes=None puts every tensor of a dtype in one bucket.
  The plan depends only on the tensors' shapes, dtypes and order, so every rank computes the same one.
  """

  def __init__(self, tensors: Sequence[Tensor], bucket_bytes: Optional[int] = DEFAULT_BUCKET_BYTES):
    if bucket_bytes is not None and bucket_bytes <= 0:
      raise ValueError(f"bucket_bytes must be positive (or None for unlimited), got {bucket_bytes}")
    self.shapes: List[Tuple[int, ...]] = [_shape(t) for t in tensors]
    self.numels: List[int] = [int(np.prod(s)) for s in self.shapes]
    self.wire: List[np.dtype] = [_wire_dtype(t) for t in tensors]
    self.buckets: List[List[int]] = []
    open_by_dtype: Dict[np.dtype, int] = {}  # index into self.buckets of the bucket that still takes tensors of a dtype
    size: Dict[int, int] = {}
    for i, (n, dt) in enumerate(zip(self.numels, self.wire)):
      nbytes = n * dt.itemsize
      b = open_by_dtype.get(dt)
      if b is None or (bucket_bytes is not None and size[b] + nbytes > bucket_bytes):
        b = open_by_dtype[dt] = len(self.buckets)
        self.buckets.append([])
        size[b] = 0
      self.buckets[b].append(i)
      size[b] += nbytes

  def __len__(self) -> int:
    return len(self.buckets)

  def to_host(self, tensors: Sequence[Tensor]) -> List[np.ndarray]:
    """One fresh flat host array per bucket holding its tensors' values back to back."""
    if len(tensors) != len(self.shapes):
      raise ValueError(f"expected {len(self.shapes)} tensors (the ones the buckets were planned for), got {len(tensors)}")
    out = []
    for bucket in self.buckets:
      flat = np.empty(sum(self.numels[i] for i in bucket), dtype=self.wire[bucket[0]])
      off = 0
      for i in bucket:
        t = tensors[i]
        if tuple(t.shape) != self.shapes[i]:
          raise ValueError(f"tensor {i} has shape {tuple(t.shape)}, but the buckets were planned for {self.shapes[i]}")
        flat[off:off + self.numels[i]] = t.detach().numpy().reshape(-1)
        off += self.numels[i]
      out.append(flat)
    return out

  def flatten(self, tensors: Sequence[Tensor]) -> List[Tensor]:
    """One lazy flat tensor per bucket, concatenated on the tensors' device (inside a jitted function: one kernel each)."""
    if len(tensors) != len(self.shapes):
      raise ValueError(f"expected {len(self.shapes)} tensors (the ones the buckets were planned for), got {len(tensors)}")
    parts = [[tensors[i].detach().reshape(-1) for i in bucket] for bucket in self.buckets]
    return [p[0] if len(p) == 1 else p[0].cat(*p[1:]) for p in parts]

  def split(self, flat: np.ndarray, bucket: List[int]) -> List[np.ndarray]:
    """The tensors of one bucket as views of its flat host array, in their shapes."""
    offs = np.cumsum([0] + [self.numels[i] for i in bucket])
    return [flat[offs[k]:offs[k + 1]].reshape(self.shapes[i]) for k, i in enumerate(bucket)]

  def unflatten(self, flats: Sequence[Tensor]) -> List[Tensor]:
    """Per-tensor views (lazy shrink + reshape, no copy) of flat device buckets, in the original tensor order."""
    if len(flats) != len(self.buckets):
      raise ValueError(f"expected {len(self.buckets)} bucket tensors, got {len(flats)}")
    out: List[Optional[Tensor]] = [None] * len(self.shapes)
    for bucket, flat in zip(self.buckets, flats):
      off = 0
      for i in bucket:
        out[i] = flat[off:off + self.numels[i]].reshape(self.shapes[i])
        off += self.numels[i]
    assert all(t is not None for t in out)
    return [t for t in out if t is not None]


class DistributedOptimizer(Optimizer):
  """Wraps any tiny_nn optimizer: `step()` replaces every parameter's gradient by its mean over all ranks, then steps.

  Gradients travel in buckets (see GradBuckets; `bucket_bytes` sets their size), one MPI allreduce per bucket. With one
  rank nothing is copied and it behaves exactly like the wrapped optimizer. `lr` is the wrapped optimizer's tensor, so
  learning-rate schedules work on either (give an OptimizerGroup's members' schedules the inner group).

  The allreduce runs on the host between backward and update, so a TinyJit cannot capture it: jit the forward/backward
  (returning the gradients) and the update separately, with `allreduce_grads` between them (see tiny_nn.examples.digits).
  """

  def __init__(self, optimizer: Optimizer, group: Optional[ProcessGroup] = None, bucket_bytes: Optional[int] = DEFAULT_BUCKET_BYTES):
    if not isinstance(optimizer, Optimizer):
      raise TypeError(f"DistributedOptimizer wraps a tiny_nn optimizer, got {type(optimizer).__name__}")
    self.optimizer = optimizer
    self.group = group or get_group()
    self.params, self.buffers = optimizer.params, optimizer.buffers
    if not isinstance(optimizer, OptimizerGroup):
      self.lr = optimizer.lr
    self.plan = GradBuckets(self.params, bucket_bytes)

  def zero_grad(self) -> None:
    self.optimizer.zero_grad()

  def _step(self) -> List[Tensor]:
    self.sync_gradients()
    return self.optimizer._step()

  def sync_gradients(self) -> None:
    """Sets every parameter's `grad` to its mean over all ranks (a no-op with one rank)."""
    if self.group.world_size == 1:
      return
    self.set_grads(self.allreduce_grads([self.optimizer._grad(p) for p in self.params]))

  def allreduce_grads(self, grads: Sequence[Tensor]) -> List[Tensor]:
    """The mean over all ranks of `grads` (one per parameter, in order) as flat bucket tensors on the parameters' device.

    Pass them to `set_grads` (inside a jitted update they are its inputs). Realizes `grads` first.
    """
    self._check_not_capturing()
    if len(grads) != len(self.params):
      raise ValueError(f"expected one gradient per parameter ({len(self.params)}), got {len(grads)}")
    pending = [g for g in grads if g.lazydata.base.realized is None]
    if pending:
      Tensor.realize(*pending)
    return [self._bucket_mean(flat, b) for b, flat in enumerate(self.plan.to_host(grads))]

  def bucket_grads(self) -> List[Tensor]:
    """The parameters' gradients flattened into one lazy device tensor per bucket (`allreduce_buckets` takes them).

    Inside a jitted backward this turns the gradients' many device-to-host copies into one per bucket.
    """
    return self.plan.flatten([self.optimizer._grad(p) for p in self.params])

  def allreduce_buckets(self, flats: Sequence[Tensor]) -> List[Tensor]:
    """The mean over all ranks of the flat bucket tensors `bucket_grads` built, on the parameters' device (for `set_grads`)."""
    self._check_not_capturing()
    if len(flats) != len(self.plan):
      raise ValueError(f"expected {len(self.plan)} bucket tensors, got {len(flats)}")
    return [self._bucket_mean(_to_host(flat), b) for b, flat in enumerate(flats)]

  def _bucket_mean(self, flat: np.ndarray, b: int) -> Tensor:
    self.group.allreduce_numpy(flat, "mean")
    p = self.params[self.plan.buckets[b][0]]
    out = Tensor(flat, device=p.device, requires_grad=False)
    return (out if out.dtype == p.dtype else out.cast(p.dtype)).realize()

  @staticmethod
  def _check_not_capturing() -> None:
    from tiny.engine.realize import capturing
    if len(capturing):
      raise DistributedError("the gradient allreduce runs on the host and cannot be captured by TinyJit: jit the forward/backward and "
                             "the optimizer update as two functions and call allreduce_grads between them")

  def set_grads(self, flats: Sequence[Tensor]) -> None:
    """Makes each parameter's `grad` the matching view of the bucket tensors `allreduce_grads` returned."""
    for p, g in zip(self.params, self.plan.unflatten(flats)):
      p.grad = g


# *** data ***

def shard_indices(n: int, rank: int, world_size: int) -> np.ndarray:
  """Rank `rank`'s contiguous share of range(n): the ranks' shares are disjoint, cover range(n) and differ by at most one."""
  for name, v in (("n", n), ("rank", rank), ("world_size", world_size)):
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
      raise TypeError(f"{name} must be an int, got {type(v).__name__}")
  if n < 0:
    raise ValueError(f"n must be non-negative, got {n}")
  if world_size < 1 or not 0 <= rank < world_size:
    raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
  q, r = divmod(n, world_size)
  start = rank * q + min(rank, r)
  return np.arange(start, start + q + (1 if rank < r else 0))


class DistributedSampler:
  """Yields this rank's indices of each global batch: every rank draws the same shuffled order from `seed` (and the epoch),
  cuts it into global batches of `batch_size` and takes its slice, so the ranks together see exactly the batches one
  process would.

  `batch_size` is the global batch and must divide by world_size (each rank gets batch_size // world_size); an
  incomplete last batch is dropped. Call `set_epoch(e)` before each epoch for a new order.
  """

  def __init__(self, n: int, batch_size: int, rank: Optional[int] = None, world_size: Optional[int] = None, seed: int = 0,
               shuffle: bool = True):
    if rank is None or world_size is None:
      g = get_group()
      rank, world_size = (g.rank if rank is None else rank), (g.world_size if world_size is None else world_size)
    if batch_size <= 0 or batch_size % world_size:
      raise ValueError(f"the global batch_size ({batch_size}) must be a positive multiple of world_size ({world_size})")
    if n < batch_size:
      raise ValueError(f"the dataset has {n} samples, fewer than one global batch of {batch_size}")
    self.n, self.batch_size, self.seed, self.shuffle, self.epoch = n, batch_size, seed, shuffle, 0
    self.mine = shard_indices(batch_size, rank, world_size)

  def set_epoch(self, epoch: int) -> None:
    """Selects the order of epoch `epoch` (the same on every rank)."""
    self.epoch = epoch

  def __len__(self) -> int:
    return self.n // self.batch_size

  def __iter__(self) -> Any:
    order = np.random.RandomState([self.seed, self.epoch]).permutation(self.n) if self.shuffle else np.arange(self.n)
    for b in range(len(self)):
      yield order[b * self.batch_size:(b + 1) * self.batch_size][self.mine]


# *** checkpoints ***

def save_on_main(state: Union[Dict[str, Tensor], Any], path: Union[str, "os.PathLike[str]"], barrier: bool = True,
                 group: Optional[ProcessGroup] = None) -> None:
  """Rank 0 writes `state` (a {name: Tensor} dict, or a model whose get_state_dict is taken) as safetensors to `path`.

  With `barrier`, every rank waits until the file is written, so any rank may read it afterwards.
  """
  g = group or get_group()
  if g.is_main:
    safe_save(state if isinstance(state, dict) else get_state_dict(state), path)
  if barrier:
    g.barrier()
