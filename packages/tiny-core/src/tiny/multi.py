"""MultiLazyBuffer: one tensor spread over several devices, one ordinary LazyBuffer per device.

`Tensor.shard(devices, axis)` makes one. With `axis=None` every device holds the whole tensor (replicated); otherwise
device i holds the slice `bounds[i]` of the sharded axis. The split rule is numpy's `array_split`: n rows over k devices
give the first n % k devices n // k + 1 rows and the rest n // k (7 over 2 is 4 + 3, 5 over 4 is 2 + 1 + 1 + 1).

A MultiLazyBuffer answers the same calls the autograd Functions make on a LazyBuffer (`e`, `r`, movement ops, `cast`,
`const`, `contiguous`, ...), running each one per shard. Work that crosses shards is done with device-to-device COPY
LazyBuffers, so a whole step (every device's kernels and the copies between them) is one ordinary schedule:
- an elementwise op between a sharded and a replicated operand slices the replicated one locally (no copy); operands
  sharded differently are first gathered onto every device (an allgather) and sliced;
- a reduce over the sharded axis reduces each shard and then allreduces the partial results: a ring allreduce
  (reduce-scatter then allgather, chunk by chunk) for big tensors, every device summing all partials for small ones;
- shrinking to exactly one shard's bounds keeps the other shards but marks them not `real`; padding that result back
  to the full size (what the gradient of that shrink does) makes them real again, holding zeros.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any, List, Optional, Sequence, Tuple, Union, cast

from tiny.dtype import ConstType, DType
from tiny.helpers import ContextVar, all_int, all_same, prod
from tiny.lazy import LazyBuffer
from tiny.ops import BinaryOps, Op, ReduceOps
from tiny.shape.symbolic import Variable, sint

# RING=0: always the simple allreduce, 1: the ring allreduce from RING_THRESHOLD elements on, 2: always the ring
RING = ContextVar("RING", 1)
RING_THRESHOLD = ContextVar("RING_THRESHOLD", 65536)


class MultiDeviceError(RuntimeError):
  """An operation that a tensor sharded this way cannot do (gather it with .to(device) or shard it on another axis)."""


def split_sizes(n: int, parts: int) -> List[int]:
  """The shard sizes of n rows over parts devices: the first n % parts shards get one row more (numpy's array_split)."""
  if parts <= 0:
    raise ValueError(f"need at least one device, got {parts}")
  return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _bounds(sizes: Sequence[int]) -> Tuple[Tuple[int, int], ...]:
  offs = [0, *itertools.accumulate(sizes)]
  return tuple((offs[i], offs[i + 1]) for i in range(len(sizes)))


def _reduce_lbs(op: ReduceOps, lbs: Sequence[LazyBuffer]) -> LazyBuffer:
  bop = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
  return functools.reduce(lambda a, b: a.e(bop, b), lbs)


def _concat_flat(chunks: Sequence[LazyBuffer], total: int) -> LazyBuffer:
  """1-D chunks (on one device) laid end to end: padded with zeros to the full length and added (one fused kernel)."""
  offs = [0, *itertools.accumulate(cast(int, c.shape[0]) for c in chunks)]
  parts = [c.pad(((offs[i], total - offs[i + 1]),)) for i, c in enumerate(chunks) if c.shape[0] != 0]
  return functools.reduce(lambda a, b: a.e(BinaryOps.ADD, b), parts)


def allreduce(op: ReduceOps, lbs: Sequence[LazyBuffer]) -> List[LazyBuffer]:
  """Reduce lbs (one per device, equal shapes) elementwise; every device gets the same result.

  The ring version splits the data in one chunk per device: in n-1 steps each device passes a chunk to its neighbour,
  which adds its own (reduce-scatter, after which device i holds the whole sum of chunk i+1), then in n-1 more steps the
  finished chunks go round the ring (allgather). Each device sends 2(n-1)/n of the data instead of n-1 times all of it."""
  n = len(lbs)
  if n == 1:
    return list(lbs)
  devices = [lb.device for lb in lbs]
  numel = prod(lbs[0].shape)
  use_ring = all_int(lbs[0].shape) and numel >= n and (RING.value >= 2 or (RING.value >= 1 and numel >= RING_THRESHOLD.value))
  if not use_ring:
    # every device sums every partial in device order, so all devices compute bit-identical results
    return [_reduce_lbs(op, [lb.copy_to_device(d) for lb in lbs]) for d in devices]
  total = cast(int, numel)
  flat = [lb.reshape((total,)) for lb in lbs]
  cb = _bounds(split_sizes(total, n))
  chunks = [[f.shrink((b,)) for b in cb] for f in flat]
  bop = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
  for step in range(n - 1):
    for i in range(n):
      c, dst = (i - step) % n, (i + 1) % n
      chunks[dst][c] = chunks[dst][c].e(bop, chunks[i][c].copy_to_device(devices[dst]))
  for step in range(n - 1):
    for i in range(n):
      c, dst = (i + 1 - step) % n, (i + 1) % n
      chunks[dst][c] = chunks[i][c].copy_to_device(devices[dst])
  return [_concat_flat(chunks[i], total).reshape(lbs[0].shape) for i in range(n)]


class MultiLazyBuffer:
  """A tensor on several devices: `lbs[i]` lives on `devices[i]`; `axis` is the sharded axis (None: replicated).

  `real[i]` is False for a shard a shrink has dropped (its LazyBuffer is kept so a pad can bring it back); `bounds[i]`
  is the (start, end) of shard i along the sharded axis, counting every shard, real or not."""

  def __init__(self, lbs: List[LazyBuffer], axis: Optional[int], real: Optional[List[bool]] = None):
    if not lbs or not all(isinstance(x, LazyBuffer) for x in lbs):
      raise TypeError("a MultiLazyBuffer needs one LazyBuffer per device")
    if not all_same([x.dtype for x in lbs]):
      raise TypeError(f"all shards need one dtype, got {[x.dtype for x in lbs]}")
    if len({x.device for x in lbs}) != len(lbs):
      raise ValueError(f"each shard needs its own device, got {[x.device for x in lbs]}")
    self.lbs, self.axis, self.dtype = lbs, axis, lbs[0].dtype
    self.devices: Tuple[str, ...] = tuple(x.device for x in lbs)
    self.real: List[bool] = [True] * len(lbs) if real is None else list(real)
    if axis is not None:
      if not all_same([tuple(s for i, s in enumerate(x.shape) if i != axis) for x in lbs]):
        raise ValueError(f"shards may differ only along axis {axis}, got {[x.shape for x in lbs]}")
    elif not all_same([x.shape for x in lbs]):
      raise ValueError(f"replicated shards need one shape, got {[x.shape for x in lbs]}")
    if not any(self.real):
      raise ValueError("a MultiLazyBuffer needs at least one real shard")

  def __repr__(self) -> str:
    return f"<MLB axis={self.axis} real={self.real} {self.lbs}>"

  # *** identity ***

  @property
  def device(self) -> Tuple[str, ...]:
    return self.devices

  @property
  def bounds(self) -> Optional[Tuple[Tuple[int, int], ...]]:
    """(start, end) of every shard along the sharded axis (None when replicated)."""
    if self.axis is None:
      return None
    return _bounds([cast(int, x.shape[self.axis]) for x in self.lbs])

  @property
  def shape(self) -> Tuple[sint, ...]:
    first = self.lbs[self.real.index(True)]
    if self.axis is None:
      return first.shape
    return tuple(sum(cast(int, x.shape[a]) for x, r in zip(self.lbs, self.real) if r) if a == self.axis else s for a, s in enumerate(first.shape))

  @property
  def size(self) -> sint:
    return prod(self.shape)

  @property
  def base(self) -> LazyBuffer:
    """The first real shard's base: enough to read back the value of an unrealized constant."""
    return self.lbs[self.real.index(True)].base

  @property
  def st(self) -> Any:
    return self.lbs[self.real.index(True)].st

  def real_lbs(self) -> List[LazyBuffer]:
    return [lb for lb, r in zip(self.lbs, self.real) if r]

  def is_realized(self) -> bool:
    return all(lb.is_realized() for lb in self.real_lbs())

  def is_unrealized_const(self) -> bool:
    return all(lb.is_unrealized_const() for lb in self.lbs)

  def is_unrealized_unmasked_const(self) -> bool:
    return all(lb.is_unrealized_unmasked_const() for lb in self.lbs) and all_same([lb.base.arg for lb in self.lbs])

  # *** creation ***

  @staticmethod
  def from_sharded(lb: Union[LazyBuffer, MultiLazyBuffer], devices: Tuple[str, ...], axis: Optional[int]) -> MultiLazyBuffer:
    """lb split over devices along axis (split_sizes rule), or copied to every device when axis is None."""
    if len(devices) == 0:
      raise ValueError("shard needs at least one device")
    if len(set(devices)) != len(devices):
      raise ValueError(f"shard needs distinct devices, got {devices}")
    if isinstance(lb, MultiLazyBuffer):
      if lb.devices == devices and lb.axis == axis and all(lb.real):
        return lb
      lb = lb.copy_to_device(devices[0])
    if axis is None:
      return MultiLazyBuffer([lb.copy_to_device(d) for d in devices], None)
    if not 0 <= axis < len(lb.shape):
      raise ValueError(f"shard axis {axis} out of range for shape {lb.shape}")
    if not isinstance(lb.shape[axis], int):
      raise MultiDeviceError(f"cannot shard along symbolic axis {axis} of shape {lb.shape}")
    out = []
    for d, (a, b) in zip(devices, _bounds(split_sizes(cast(int, lb.shape[axis]), len(devices)))):
      part = lb.shrink(tuple((a, b) if i == axis else (0, s) for i, s in enumerate(lb.shape)))
      # each shard gets a buffer of its own, also the one that stays on lb's device
      out.append(part.copy_to_device(d) if d != lb.device else part.contiguous())
    return MultiLazyBuffer(out, axis)

  def copy_to_device(self, device: str) -> LazyBuffer:
    """Gather: the whole tensor on one device (the shards copied there and laid end to end)."""
    if self.axis is None:
      src = self.lbs[self.devices.index(device)] if device in self.devices else self.real_lbs()[0]
      return src.copy_to_device(device)
    ax = self.axis
    shape = self.shape
    off, parts = 0, []
    for lb in self.real_lbs():
      sz = cast(int, lb.shape[ax])
      if sz:
        parts.append(lb.copy_to_device(device).pad(tuple((off, cast(int, shape[ax]) - off - sz) if i == ax else (0, 0) for i in range(len(shape)))))
      off += sz
    if not parts:
      return self.real_lbs()[0].copy_to_device(device)
    return functools.reduce(lambda a, b: a.e(BinaryOps.ADD, b), parts)

  def reshard(self, axis: Optional[int], like: Optional[MultiLazyBuffer] = None) -> MultiLazyBuffer:
    """The same tensor sharded along axis (with like's bounds and real shards when given; split_sizes otherwise)."""
    if like is None and axis == self.axis and all(self.real):
      return self
    if like is not None and like.axis == self.axis and like.bounds == self.bounds and like.real == self.real:
      return self
    full = self if self.axis is None else MultiLazyBuffer([self.copy_to_device(d) for d in self.devices], None)
    if axis is None:
      return full
    sizes = [cast(int, x.shape[axis]) for x in like.lbs] if like is not None else split_sizes(cast(int, self.shape[axis]), len(self.devices))
    real = like.real if like is not None else [True] * len(self.devices)
    shape = full.shape
    out = []
    off = 0
    for lb, sz, r in zip(full.lbs, sizes, real):
      if r:
        out.append(lb.shrink(tuple((off, off + sz) if i == axis else (0, s) for i, s in enumerate(shape))))
        off += sz
      else:
        # a dropped shard: a placeholder of the shard's shape (its values are never read)
        out.append(lb.const(0, tuple(sz if i == axis else s for i, s in enumerate(shape))))
    return MultiLazyBuffer(out, axis, real)

  def const(self, val: Union[ConstType, Variable], shape: Optional[Tuple[sint, ...]] = None) -> MultiLazyBuffer:
    """A constant shaped (and sharded) like this tensor, or replicated when another shape is given."""
    if isinstance(val, MultiLazyBuffer):
      # function._exp's fma takes a float or a buffer and tells them apart by isinstance(c, LazyBuffer): a buffer passes through
      return val
    if shape is None or tuple(shape) == tuple(self.shape):
      return MultiLazyBuffer([lb.const(val) for lb in self.lbs], self.axis, self.real)
    return MultiLazyBuffer([lb.const(val, shape) for lb in self.lbs], None)

  # *** compute ***

  def e(self, op: Op, *in_srcs: MultiLazyBuffer, arg: Any = None) -> MultiLazyBuffer:
    """Elementwise op per shard; operands are resharded to the layout of the first sharded one."""
    srcs = (self,) + in_srcs
    for s in srcs:
      if not isinstance(s, MultiLazyBuffer):
        raise MultiDeviceError(f"{op} mixes a multi-device tensor with a tensor on {getattr(s, 'device', s)}: shard or copy it first")
      if s.devices != self.devices:
        raise MultiDeviceError(f"{op} mixes tensors on devices {self.devices} and {s.devices}")
    target = next((s for s in srcs if s.axis is not None), None)
    if target is not None:
      srcs = tuple(s.reshard(target.axis, like=target) for s in srcs)
    real = srcs[0].real
    return MultiLazyBuffer([lbs[0].e(op, *lbs[1:], arg=arg) for lbs in zip(*[s.lbs for s in srcs])], srcs[0].axis, real)

  def r(self, op: ReduceOps, axis: Tuple[int, ...]) -> MultiLazyBuffer:
    """Reduce over axis; a reduce over the sharded axis allreduces the per-device partial results."""
    if self.axis is not None and self.axis in axis:
      partial = [lb.r(op, axis) for lb in self.real_lbs()]
      reduced = allreduce(op, partial)
      # a dropped shard takes its result from the first real device
      it = iter(reduced)
      by_dev = [next(it) if r else None for r in self.real]
      return MultiLazyBuffer([x if x is not None else reduced[0].copy_to_device(d) for x, d in zip(by_dev, self.devices)], None)
    return MultiLazyBuffer([lb.r(op, axis) for lb in self.lbs], self.axis, self.real)

  def cast(self, dtype: DType, bitcast: bool = False, allow_buffer_view: bool = True) -> MultiLazyBuffer:
    return MultiLazyBuffer([lb.cast(dtype, bitcast, allow_buffer_view) for lb in self.lbs], self.axis, self.real)

  def contiguous(self, allow_buffer_view: bool = True) -> MultiLazyBuffer:
    return MultiLazyBuffer([lb.contiguous(allow_buffer_view) for lb in self.lbs], self.axis, self.real)

  def assign(self, x: MultiLazyBuffer) -> MultiLazyBuffer:
    """Write x (resharded like this tensor) into every shard's buffer."""
    if not isinstance(x, MultiLazyBuffer) or x.devices != self.devices:
      raise MultiDeviceError(f"assign to a tensor on {self.devices} needs a value on the same devices")
    x = x.reshard(self.axis, like=self if self.axis is not None else None)
    return MultiLazyBuffer([a.assign(b) if r else a for a, b, r in zip(self.lbs, x.lbs, self.real)], self.axis, self.real)

  # *** movement ***

  def _per_shard(self, fn: Any, axis: Optional[int] = None, real: Optional[List[bool]] = None) -> MultiLazyBuffer:
    return MultiLazyBuffer([fn(lb) for lb in self.lbs], axis, self.real if real is None else real)

  def reshape(self, arg: Tuple[sint, ...]) -> MultiLazyBuffer:
    if self.axis is None:
      return self._per_shard(lambda lb: lb.reshape(arg))
    ax, shape = self.axis, self.shape
    before, after = prod(shape[:ax]), prod(shape[ax + 1:])
    # the sharded axis maps to the new axis with the same number of elements in front of it whose shards still split evenly
    for new_ax in reversed(range(len(arg))):
      if prod(arg[:new_ax]) != before or not all_int(arg):
        continue
      rest = prod(arg[new_ax + 1:])
      sizes = [cast(int, lb.shape[ax]) * after for lb in self.lbs]
      if rest == 0 or any(s % rest for s in sizes):
        continue
      new_sizes = [s // rest for s in sizes]
      if sum(n for n, r in zip(new_sizes, self.real) if r) != arg[new_ax]:
        continue
      return MultiLazyBuffer([lb.reshape(tuple(n if i == new_ax else s for i, s in enumerate(arg))) for lb, n in zip(self.lbs, new_sizes)],
                             new_ax, self.real)
    raise MultiDeviceError(f"reshape {shape} -> {arg} does not keep sharded axis {ax} whole on every device: gather with .to(device) "
                           "or shard on another axis")

  def permute(self, arg: Tuple[int, ...]) -> MultiLazyBuffer:
    return self._per_shard(lambda lb: lb.permute(arg), None if self.axis is None else arg.index(self.axis))

  def expand(self, arg: Tuple[sint, ...]) -> MultiLazyBuffer:
    if self.axis is not None and arg[self.axis] != self.shape[self.axis]:
      raise MultiDeviceError(f"cannot expand sharded axis {self.axis} of shape {self.shape} to {arg}")
    return self._per_shard(lambda lb: lb.expand(tuple(lb.shape[i] if i == self.axis else s for i, s in enumerate(arg))), self.axis)

  def pad(self, arg: Tuple[Tuple[sint, sint], ...]) -> MultiLazyBuffer:
    ax = self.axis
    if ax is None or arg[ax] == (0, 0):
      return self._per_shard(lambda lb: lb.pad(arg), ax)
    p0, p1 = arg[ax]
    if all(self.real):
      # the padding goes on the outer shards: the bounds become uneven, which every other op handles
      n = len(self.lbs)
      return MultiLazyBuffer([lb.pad(tuple(((p0 if i == 0 else 0), (p1 if i == n - 1 else 0)) if a == ax else p for a, p in enumerate(arg)))
                              for i, lb in enumerate(self.lbs)], ax)
    bounds = self.bounds
    assert bounds is not None
    if sum(self.real) == 1:
      i = self.real.index(True)
      if (p0, p1) == (bounds[i][0], bounds[-1][1] - bounds[i][1]):
        # undoing a shrink to shard i: the other shards come back as zeros
        other = tuple((0, 0) if a == ax else p for a, p in enumerate(arg))
        out = [lb.pad(other) if j == i else lb.pad(other).const(0) for j, lb in enumerate(self.lbs)]
        return MultiLazyBuffer(out, ax)
    raise MultiDeviceError(f"pad {arg} along sharded axis {ax} of a tensor with dropped shards {self.real} is not supported: "
                           "gather it with .to(device) first")

  def shrink(self, arg: Tuple[Tuple[sint, sint], ...]) -> MultiLazyBuffer:
    ax = self.axis
    if ax is None or arg[ax] == (0, self.shape[ax]):
      return self._per_shard(lambda lb: lb.shrink(tuple((0, lb.shape[a]) if a == ax else p for a, p in enumerate(arg))), ax)
    if not all(self.real):
      raise MultiDeviceError(f"shrink {arg} along sharded axis {ax} of a tensor with dropped shards is not supported: gather it first")
    bounds = self.bounds
    assert bounds is not None
    lo, hi = arg[ax]
    if not isinstance(lo, int) or not isinstance(hi, int):
      raise MultiDeviceError(f"cannot shrink sharded axis {ax} by a symbolic range {arg[ax]}")
    if (lo, hi) in bounds:
      # exactly one shard: select it, keep the others (unreal) so that a pad can restore the full tensor
      i = bounds.index((lo, hi))
      out = [lb.shrink(tuple((0, lb.shape[a]) if a == ax else p for a, p in enumerate(arg))) for lb in self.lbs]
      return MultiLazyBuffer(out, ax, [j == i for j in range(len(self.lbs))])
    # any other range: each shard keeps its part of it (possibly nothing)
    out = []
    for lb, (a, b) in zip(self.lbs, bounds):
      s, t = min(max(lo, a), b) - a, min(max(hi, a), b) - a
      out.append(lb.shrink(tuple((s, max(s, t)) if i == ax else p for i, p in enumerate(arg))))
    return MultiLazyBuffer(out, ax)

  def stride(self, arg: Tuple[int, ...]) -> MultiLazyBuffer:
    if self.axis is not None and arg[self.axis] != 1:
      raise MultiDeviceError(f"cannot flip or stride sharded axis {self.axis}: gather with .to(device) or shard on another axis")
    return self._per_shard(lambda lb: lb.stride(arg), self.axis)


def is_multi(x: Any) -> bool:
  """True for the lazydata of a multi-device tensor."""
  return isinstance(x, MultiLazyBuffer)

