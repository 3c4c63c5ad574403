"""Tensor: the user-facing lazy n-dimensional array with automatic differentiation.

A Tensor wraps a LazyBuffer. Every operation builds more of the lazy graph (through the autograd `Function`s in
`tiny.function`); nothing runs until `realize()` (or `numpy()`, `item()`, ...) schedules and executes the kernels.
The API mirrors tinygrad v0.9.1 so programs port by renaming the package.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import string
import time
from contextlib import ContextDecorator
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Type, Union, cast

import numpy as np

from tiny.dtype import ConstType, DType, ImageDType, dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype, to_np_dtype
from tiny.helpers import (_METADATA, CHECK_INDEX, DEBUG, ContextVar, Metadata, all_int, argfix, argsort, dedup, flatten, fully_flatten, get_shape,
                          make_pair, prod, round_up)
from tiny.lazy import LazyBuffer, scalar_binop
from tiny.ops import BinaryOps, MetaOps, ReduceOps, UnaryOps, exec_alu
from tiny.registry import Device
from tiny.shape.symbolic import MulNode, Node, NumNode, SumNode, Variable, sint, sym_infer

if TYPE_CHECKING:
  from tiny.renderer import Renderer

DTypeLike = Union[str, DType]
TRACEMETA = ContextVar("TRACEMETA", 1)


class TensorError(ValueError):
  """Base of the errors a user can cause through the Tensor API (bad shapes, axes, dtypes)."""


class ShapeError(TensorError, RuntimeError):
  """Shapes that do not fit the operation (mismatch, not broadcastable, bad reshape); a RuntimeError too, as torch raises."""


class AxisError(TensorError, IndexError):
  """A dimension/axis argument out of range for the tensor; an IndexError too, as torch raises."""


class DTypeError(TensorError, TypeError, RuntimeError):
  """An operation used on a dtype it does not support (bitwise ops on floats, a bitcast whose sizes don't fit).

  Also a TypeError, and a RuntimeError since that is what torch raises for these, so ported except clauses still match."""


# *********** autograd Function base ***********

class Function:
  """One differentiable operation. Subclasses implement forward (on LazyBuffers) and backward (on the output gradient)."""

  differentiable: ClassVar[bool] = True

  def __init__(self, device: Union[str, Tuple[str, ...]], *tensors: Tensor, metadata: Optional[Metadata] = None):
    self.device = device
    self.needs_input_grad = rg = [t.requires_grad for t in tensors]
    # True when some input needs a gradient, None when it is undecided, False when none can
    self.requires_grad: Optional[bool] = True if True in rg else None if None in rg else False
    if self.requires_grad:
      self.parents = tensors
    self.metadata = metadata

  def forward(self, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(f"forward not implemented for {type(self)}")

  def backward(self, *args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(f"backward not implemented for {type(self)}")

  @classmethod
  def apply(fxn: Type[Function], *x: Tensor, **kwargs: Any) -> Tensor:
    """Run forward on the inputs' LazyBuffers and link the result into the autograd graph."""
    ctx = fxn(x[0].device, *x, metadata=_METADATA.get())
    ret = Tensor.__new__(Tensor)
    ret.lazydata, ret.grad = ctx.forward(*[t.lazydata for t in x], **kwargs), None
    # comparisons and bit ops have no gradient: their outputs start a fresh graph
    ret.requires_grad = ctx.requires_grad if fxn.differentiable else False
    ret._ctx = ctx if ctx.requires_grad and fxn.differentiable and not Tensor.no_grad else None
    return ret


# *********** creation helpers ***********

def _to_dtype(dtype: Any) -> DType:
  if isinstance(dtype, DType):
    return dtype
  if isinstance(dtype, str) and isinstance(dt := getattr(dtypes, dtype.lower(), None), DType):
    return dt
  if isinstance(dtype, (np.dtype, type)) and not isinstance(dtype, str):
    try:
      return dtypes.from_np(dtype)
    except TypeError:
      pass
  raise TypeError(f"{dtype!r} is not a dtype: pass a tiny.dtype.DType (e.g. dtypes.float32) or its name")


def _from_np_dtype(npdtype: Any) -> DType:
  try:
    return dtypes.from_np(npdtype)
  except TypeError as e:
    raise TypeError(f"numpy arrays of dtype {np.dtype(npdtype)} are not supported") from e


def _fromnp(x: np.ndarray) -> LazyBuffer:
  """A realized LazyBuffer on the NPY device that holds (aliases) the numpy array."""
  dtype = _from_np_dtype(x.dtype)
  if x.size == 0:
    return LazyBuffer.metaop(MetaOps.EMPTY, x.shape, dtype, "NPY")
  ret = LazyBuffer.metaop(MetaOps.EMPTY, x.shape, dtype, "NPY")
  ret.buffer.allocate(np.require(x, requirements="C"))
  del ret.srcs  # a base without srcs reads as realized
  return ret


def _is_multi(x: Any) -> bool:
  """True for a tiny.multi.MultiLazyBuffer; by name, since tiny.multi is only imported once a tensor is sharded."""
  return type(x).__name__ == "MultiLazyBuffer" and type(x).__module__ == "tiny.multi"


def _multi_lazydata(data: Any, device: Any, dtype: Optional[DType]) -> LazyBuffer:
  """The lazydata of Tensor(data, device) for a tuple of devices or a MultiLazyBuffer (typed as a LazyBuffer, which it mimics)."""
  from tiny.multi import MultiLazyBuffer
  if isinstance(data, MultiLazyBuffer):
    if dtype is not None and dtype != data.dtype:
      raise TypeError(f"a MultiLazyBuffer of {data.dtype} can't become a Tensor of {dtype}: use .cast()")
    if device is None or (isinstance(device, (tuple, list)) and tuple(Device.canonicalize(d) for d in device) == data.devices):
      return cast(LazyBuffer, data)
    if isinstance(device, str):
      return data.copy_to_device(Device.canonicalize(device))
    return cast(LazyBuffer, MultiLazyBuffer.from_sharded(data, tuple(Device.canonicalize(d) for d in device), data.axis))
  devs = tuple(Device.canonicalize(d) for d in device)
  if not devs:
    raise ValueError("a multi-device tensor needs at least one device")
  return cast(LazyBuffer, MultiLazyBuffer.from_sharded(Tensor(data, device=devs[0], dtype=dtype).lazydata, devs, None))


def _shard_like(g: Tensor, t: Tensor) -> None:
  """Give the gradient g of the multi-device tensor t t's layout when t is sharded (a replicated gradient is sliced locally).

  The gradient of a replicated tensor keeps its layout: gathering a sharded one would copy it for nothing."""
  gl, tl = cast(Any, g.lazydata), cast(Any, t.lazydata)
  if _is_multi(gl) and tl.axis is not None and (gl.axis != tl.axis or gl.bounds != tl.bounds or gl.real != tl.real):
    g.lazydata = gl.reshard(tl.axis, like=tl)


def _pad_left(*shapes: Tuple[sint, ...]) -> Tuple[Tuple[sint, ...], ...]:
  max_dim = max(len(shape) for shape in shapes)
  return tuple((1,) * (max_dim - len(shape)) + shape for shape in shapes)


def _broadcast_shape(*shapes: Tuple[sint, ...]) -> Tuple[sint, ...]:
  """The numpy broadcast of shapes; raises ShapeError when they are incompatible."""
  out: List[sint] = []
  for dims in zip(*_pad_left(*shapes)):
    sizes = dedup([d for d in dims if not (isinstance(d, int) and d == 1)])
    if len(sizes) > 1:
      raise ShapeError(f"shapes {', '.join(str(tuple(s)) for s in shapes)} cannot be broadcast together")
    out.append(sizes[0] if sizes else 1)
  return tuple(out)


_FLOAT_MANTISSA = {2: 10, 4: 23, 8: 52}   # float16, float32, float64
_ONE_BITS = {2: 0x3C00, 4: 0x3F800000, 8: 0x3FF0000000000000}
_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


class Tensor:
  """A lazily evaluated multi-dimensional array that can compute gradients.

  ```python
  t = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  (t * t).sum().backward()
  print(t.grad.numpy())   # [2. 4. 6.]
  ```
  """

  __slots__ = "lazydata", "requires_grad", "grad", "_ctx"
  __deletable__ = ("_ctx",)
  training: ClassVar[bool] = False
  no_grad: ClassVar[bool] = False
  _seed: ClassVar[int] = int(time.time())
  _rng_counter: ClassVar[Optional[Tensor]] = None

  def __init__(self, data: Union[None, ConstType, List, Tuple, LazyBuffer, np.ndarray, bytes, Variable],
               device: Optional[Union[str, Tuple[str, ...]]] = None, dtype: Optional[DTypeLike] = None, requires_grad: Optional[bool] = None):
    if dtype is not None:
      dtype = _to_dtype(dtype)
    # set only when .backward() computes it
    self.grad: Optional[Tensor] = None
    # None: undecided (an optimizer may switch it on); False: never; True: compute gradients for this tensor
    self.requires_grad: Optional[bool] = requires_grad
    self._ctx: Optional[Function] = None
    if isinstance(device, (tuple, list)) or _is_multi(data):
      # several devices: tiny.multi builds a MultiLazyBuffer (replicated data, or a gather when device is one device)
      self.lazydata: LazyBuffer = _multi_lazydata(data, device, dtype)
      return
    device = Device.canonicalize(device)

    lb: LazyBuffer
    if isinstance(data, LazyBuffer):
      if dtype is not None and dtype != data.dtype:
        raise TypeError(f"a LazyBuffer of {data.dtype} can't become a Tensor of {dtype}: use .cast()")
      lb = data
    elif isinstance(data, (bool, int, float)) or (isinstance(data, np.generic) and data.shape == ()):
      if isinstance(data, np.generic):
        dtype, data = dtype or _from_np_dtype(data.dtype), data.item()
      if dtype is None and data.__class__ is int:
        dtype = _infer_list_dtype([data])   # int64 for an int that int32 can't hold
      lb = LazyBuffer.metaop(MetaOps.CONST, (), dtype or dtypes.from_py(data), device, dtypes.as_const(data, dtype or dtypes.from_py(data)))
    elif isinstance(data, Variable):
      lb = LazyBuffer.metaop(MetaOps.CONST, (), dtype or dtypes.from_py(data.unbind()[1]), device, data)
    elif isinstance(data, bytes):
      lb = _fromnp(np.frombuffer(data, dtype=np.uint8)) if dtype is None or dtype == dtypes.uint8 else \
        _fromnp(np.frombuffer(data, dtype=_np_dtype_or_raise(dtype)))
    elif isinstance(data, (list, tuple)):
      data = _nested_tolist(data)
      if dtype is None:
        dtype = _infer_list_dtype(fully_flatten(data))
      shape = get_shape(data)
      if dtype == dtypes.bfloat16:
        lb = Tensor(np.array(data, dtype=np.float32).reshape(shape), device=device).cast(dtypes.bfloat16).lazydata
      else:
        lb = _fromnp(np.array(data, dtype=_np_dtype_or_raise(dtype)).reshape(shape))
    elif data is None:
      lb = LazyBuffer.metaop(MetaOps.EMPTY, (0,), dtype or dtypes.default_float, device)
    elif isinstance(data, np.ndarray):
      if data.shape == ():
        lb = LazyBuffer.metaop(MetaOps.CONST, (), dtype or _from_np_dtype(data.dtype), device, data.item())
      elif dtype == dtypes.bfloat16:
        lb = Tensor(data.astype(np.float32), device=device).cast(dtypes.bfloat16).lazydata
      else:
        lb = _fromnp(data.astype(_np_dtype_or_raise(dtype)) if dtype is not None else data)
    else:
      raise TypeError(f"can't create a Tensor from {data!r} of type {type(data).__name__}")
    # the data may have been made on another device (NPY for host arrays)
    self.lazydata = lb if lb.device == device else lb.copy_to_device(device)

  class train(ContextDecorator):
    """`with Tensor.train():` enables training mode (dropout, batchnorm statistics); `train(False)` disables it."""

    def __init__(self, mode: bool = True):
      self.mode = mode

    def __enter__(self) -> None:
      self.prev, Tensor.training = Tensor.training, self.mode

    def __exit__(self, *exc: Any) -> None:
      Tensor.training = self.prev

  class inference_mode(ContextDecorator):
    """`with Tensor.inference_mode():` builds no autograd graph."""

    def __init__(self, mode: bool = True):
      self.mode = mode

    def __enter__(self) -> None:
      self.prev, Tensor.no_grad = Tensor.no_grad, self.mode

    def __exit__(self, *exc: Any) -> None:
      Tensor.no_grad = self.prev

  def __repr__(self) -> str:
    return f"<Tensor {self.lazydata!r} on {self.device} with grad {(self.grad.lazydata if self.grad is not None else None)!r}>"

  # identity hashing: Python's GC never moves objects, and __eq__ builds a Tensor
  def __hash__(self) -> int:
    return id(self)

  def __bool__(self) -> bool:
    raise TypeError("the truth value of a Tensor is ambiguous: use .item(), .numpy(), .any() or .all()")

  def __len__(self) -> int:
    if not self.shape:
      raise TypeError("len() of a 0-d tensor")
    return cast(int, self.shape[0])

  def __iter__(self) -> Iterator[Tensor]:
    if not self.shape:
      raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(cast(int, self.shape[0])))

  def __getattr__(self, name: str) -> Any:
    # t.clang(), t.cuda(), ...: move to the device of that name (like tinygrad's per-device methods)
    if not name.startswith("_") and name.islower() and name.upper() in _device_names():
      return functools.partial(self.to, name.upper())
    raise AttributeError(f"'Tensor' object has no attribute {name!r}")

  @property
  def device(self) -> str:
    return self.lazydata.device

  @property
  def shape(self) -> Tuple[sint, ...]:
    return self.lazydata.shape

  @property
  def dtype(self) -> DType:
    return self.lazydata.dtype

  # ***** data handlers *****

  def schedule_with_vars(self, *lst: Tensor, seen: Optional[Set[LazyBuffer]] = None) -> Tuple[List[Any], Dict[Variable, int]]:
    """The ScheduleItems (kernels and copies) that realize these tensors, and the values of their symbolic Variables."""
    from tiny.engine import schedule as sched
    outs = flatten([x.lazydata.lbs for x in (self,) + lst])
    # create_schedule_with_vars has already let the intermediates share memory
    return sched.create_schedule_with_vars(outs) if seen is None else sched.create_schedule_with_vars(outs, seen)

  def schedule(self, *lst: Tensor, seen: Optional[Set[LazyBuffer]] = None) -> List[Any]:
    """The ScheduleItems that realize these tensors (which must not depend on symbolic Variables)."""
    schedule, var_vals = self.schedule_with_vars(*lst, seen=seen)
    if var_vals:
      raise RuntimeError(f"the schedule depends on Variables {list(var_vals)}: use schedule_with_vars")
    return schedule

  def realize(self, *lst: Tensor, do_update_stats: bool = True) -> Tensor:
    """Compute these tensors now (run their kernels). Returns self."""
    eng = _engine if _engine is not None else _engine_realize()
    with eng.realize_lock:
      if eng.pending.live:
        # a schedule handed out and not run yet: the buffers it writes read as computed, so run what this reads first
        eng.pending.ensure_graph_ready(flatten([x.lazydata.lbs for x in (self,) + lst]))
      # one eager op seen before runs its cached kernel directly (see realize_eager); the rest is scheduled
      if not lst and do_update_stats and self.lazydata.__class__ is LazyBuffer and eng.realize_eager(self.lazydata):
        return self
      schedule, var_vals = eng.schedule_to_run(flatten([x.lazydata.lbs for x in (self,) + lst]))
      if do_update_stats:
        eng.run_schedule(schedule, var_vals)
      else:
        eng.run_schedule(schedule, var_vals, do_update_stats=False)
    return self

  def replace(self, x: Tensor) -> Tensor:
    """Make this Tensor hold x's data (same shape), dropping any autograd history."""
    if x.requires_grad:
      raise RuntimeError("replace with a tensor that requires grad is not supported: detach it first")
    if self.shape != x.shape:
      raise ShapeError(f"replace shape mismatch {self.shape} != {x.shape}")
    self.lazydata = x.lazydata
    return self

  def assign(self, x: Any) -> Tensor:
    """Write x into this tensor's buffer (in place when it is realized)."""
    if isinstance(self.device, str) and self.device.startswith("DISK"):
      if not isinstance(x, Tensor):
        x = Tensor(x, device="NPY", dtype=self.dtype)
      realized = self.contiguous().realize().lazydata.base.realized
      assert realized is not None
      realized.copyin(memoryview(np.ascontiguousarray(x.numpy()).tobytes()))
      return self
    if not isinstance(x, Tensor):
      x = Tensor(x, device=self.device, dtype=self.dtype)
    if DEBUG >= 4:
      print(f"assign {self.lazydata} <- {x.lazydata}")
    if self.shape != x.shape:
      raise ShapeError(f"assign shape mismatch {self.shape} != {x.shape}")
    if self.device != x.device:
      raise TensorError(f"assign device mismatch {self.device} != {x.device}")
    if self.dtype != x.dtype:
      raise TypeError(f"assign dtype mismatch {self.dtype} != {x.dtype}")
    if x.requires_grad:
      raise RuntimeError("assign of a tensor that requires grad is not supported: detach it first")
    if self.lazydata is x.lazydata:
      return self
    if not self.lazydata.is_realized():
      return self.replace(x)
    self.lazydata = self.lazydata.assign(x.lazydata)
    return self

  def detach(self) -> Tensor:
    """The same data, cut off from the autograd graph."""
    return Tensor(self.lazydata, device=self.device, requires_grad=False)

  def _data(self) -> memoryview:
    if 0 in self.shape:
      return memoryview(bytearray(0))
    if _is_multi(self.lazydata):
      return self.to(self.device[0])._data()
    from tiny.engine.realize import realize_lock
    with realize_lock:
      t = self.cast(self.dtype.scalar()).contiguous()
      t = t.realize()
      buf = t.lazydata.base.realized
      assert buf is not None, f"{t.lazydata.base} was not realized"
      return buf.as_buffer()

  def data(self) -> memoryview[Any]:
    """The contents as a memoryview shaped like the tensor."""
    if self.dtype.fmt is None:
      raise TypeError(f"{self.dtype} has no memoryview format: cast it first")
    fmt: Any = self.dtype.fmt
    if not all_int(self.shape):
      if (bound := _bound_shape(self.shape)) is None:
        raise RuntimeError(f"data() needs a concrete shape or bound Variables, got {self.shape}")
      return memoryview(bytearray(0)).cast(fmt) if 0 in bound else self.reshape(bound).data()
    return self._data().cast(fmt) if 0 in self.shape else self._data().cast(fmt, cast(Tuple[int, ...], self.shape))

  def item(self) -> ConstType:
    """The single element as a Python scalar."""
    if self.numel() != 1:
      raise TensorError(f"item() needs a tensor with one element, this one has shape {self.shape}")
    return self.numpy().reshape(-1)[0].item()

  def tolist(self) -> Union[ConstType, List[Any]]:
    """The contents as (nested) Python lists."""
    return self.numpy().tolist()

  def numpy(self) -> np.ndarray:
    """The contents as a numpy array (a copy)."""
    if self.dtype == dtypes.bfloat16:
      return self.float().numpy()
    if (npdt := to_np_dtype(self.dtype)) is None:
      raise TypeError(f"{self.dtype} has no numpy equivalent")
    if not all_int(self.shape):
      # a shape of bound Variables reads back at the bound sizes (the elements this binding covers)
      if (bound := _bound_shape(self.shape)) is None:
        raise RuntimeError(f"numpy() needs a concrete shape or bound Variables, got {self.shape}")
      return np.zeros(bound, dtype=npdt) if 0 in bound else self.reshape(bound).numpy()
    if 0 in self.shape:
      return np.zeros(cast(Tuple[int, ...], self.shape), dtype=npdt)
    return np.frombuffer(self._data(), dtype=npdt).reshape(self.shape).copy()

  def to(self, device: Optional[Union[str, Tuple[str, ...]]]) -> Tensor:
    """This tensor on another device (self when it is already there); gradients follow."""
    if isinstance(device, (tuple, list)):
      return self.shard(device)
    device = Device.canonicalize(device)
    if device == self.device:
      return self
    ret = Tensor(self.lazydata, device, requires_grad=self.requires_grad)
    if self.grad is not None:
      ret.grad = self.grad.to(device)
    ret._ctx = self._ctx
    return ret

  def to_(self, device: Optional[str]) -> None:
    """Move this tensor (and its gradient) to device in place."""
    real = self.to(device)
    if self.grad is not None and real.grad is not None:
      self.grad.lazydata = real.grad.lazydata
    self.lazydata = real.lazydata

  def shard(self, devices: Tuple[str, ...], axis: Optional[int] = None) -> Tensor:
    """Split this tensor across devices along axis (see tiny.multi for the split rule), or copy it to each when axis is None."""
    from tiny.multi import MultiLazyBuffer
    if not isinstance(devices, (tuple, list)):
      raise TypeError(f"shard needs a tuple of devices, got {devices!r}")
    canonical = tuple(Device.canonicalize(d) for d in devices)
    mlb = MultiLazyBuffer.from_sharded(self.lazydata, canonical, None if axis is None else self._resolve_dim(axis))
    return Tensor(cast(LazyBuffer, mlb), device=canonical, requires_grad=self.requires_grad)

  def shard_(self, devices: Tuple[str, ...], axis: Optional[int] = None) -> Tensor:
    """shard in place."""
    self.lazydata = self.shard(devices, axis).lazydata
    return self

  # ***** creation entrypoints *****

  @staticmethod
  def _metaop(op: MetaOps, shape: Tuple[sint, ...], device: Optional[str] = None, dtype: Optional[DTypeLike] = None, arg: Any = None,
              **kwargs: Any) -> Tensor:
    dt = _to_dtype(dtype) if dtype is not None else dtypes.default_float
    if isinstance(device, (tuple, list)):
      from tiny.multi import MultiLazyBuffer
      devs = tuple(Device.canonicalize(d) for d in device)
      return Tensor(cast(LazyBuffer, MultiLazyBuffer([LazyBuffer.metaop(op, shape, dt, d, arg) for d in devs], None)), devs, dt, **kwargs)
    return Tensor(LazyBuffer.metaop(op, shape, dt, Device.canonicalize(device), arg), device, dt, **kwargs)

  @staticmethod
  def empty(*shape: Any, **kwargs: Any) -> Tensor:
    """An uninitialized tensor of the given shape."""
    return Tensor._metaop(MetaOps.EMPTY, _check_shape(argfix(*shape)), **kwargs)

  @staticmethod
  def manual_seed(seed: int = 0) -> None:
    """Seed the random number generator: the same seed gives the same numbers on every device."""
    if not isinstance(seed, int):
      raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    Tensor._seed, Tensor._rng_counter = seed, None

  @staticmethod
  def _threefry_bits(num: int, device: str) -> Tensor:
    """num uint32 random words from Threefry-2x32 keyed by the seed, at the current counter (which then advances)."""
    if Tensor._rng_counter is None:
      Tensor._rng_counter = Tensor([0], dtype=dtypes.uint32, requires_grad=False).contiguous().realize()
    counter = Tensor._rng_counter
    # the words are the low words of the blocks at counters (c + k, c + k + half) for k < half, then their high words:
    # word i takes the block of k = i (or i - half in the upper part) and keeps one half of it, so each block is computed
    # once per word it gives, in one elementwise kernel (not twice over a padded range, as lo.cat(hi) would)
    half, rest = (num + 1) // 2, num // 2
    k = Tensor.arange(half, device=device, dtype=dtypes.uint32, requires_grad=False)
    if rest:
      # k and the upper part as padded views, not compares of a position: their masks fold to one condition for all
      # lanes of an upcast kernel, which keeps the threefry rounds one vector chain
      k = k.cat(Tensor.arange(rest, device=device, dtype=dtypes.uint32, requires_grad=False))
    counts1 = k + counter.to(device)
    counts2 = counts1 + half
    x = (counts2.cast(dtypes.uint64) * (1 << 32)).bitwise_or(counts1.cast(dtypes.uint64))
    x = F.Threefry.apply(*x._broadcasted(Tensor._seed % (1 << 64)))
    Tensor._rng_counter = counter.assign(counter + num)
    lo = x.bitwise_and(0xFFFFFFFF)
    if not rest:
      return lo.cast(dtypes.uint32)
    upper = Tensor.ones(rest, device=device, dtype=dtypes.bool, requires_grad=False).pad(((half, 0),))
    return upper.where(x.idiv(1 << 32), lo).cast(dtypes.uint32)

  @staticmethod
  def _bits_to_float(bits: Tensor, dt: DType) -> Tensor:
    """bits reinterpreted as dt inside the kernel that computes them: a bitcast view would need bits in a buffer of
    their own, one more kernel per draw (the first training step draws every weight)."""
    return F.Cast.apply(bits, dtype=dt, bitcast=True, in_kernel=True)

  @staticmethod
  def rand(*shape: Any, device: Optional[str] = None, dtype: Optional[DTypeLike] = None, **kwargs: Any) -> Tensor:
    """Uniform random numbers in [0, 1), from the counter-based Threefry generator run on the device.

    dtype=dtypes.bool follows tinygrad 0.9: uniform float32 numbers cast to bool, so an element is False only when its
    draw is exactly 0.0 (probability 2**-23) -- almost all True; use `Tensor.rand(...) < p` for random booleans.
    Integer dtypes raise DTypeError (torch refuses them too)."""
    dt = _to_dtype(dtype or dtypes.default_float)
    if dt == dtypes.bool:
      return Tensor.rand(*shape, device=device, dtype=dtypes.float32, **kwargs).cast(dtypes.bool)
    if not dtypes.is_float(dt):
      raise DTypeError(f"rand makes floats (or bools), not {dt}")
    shape = _check_shape(argfix(*shape))
    if isinstance(device, (tuple, list)):
      # several devices: the numbers are drawn on the first and copied, so they equal a single-device draw
      return Tensor.rand(*shape, device=device[0], dtype=dt, **kwargs).shard(tuple(device))
    device = Device.canonicalize(device)
    if (num := prod(shape)) == 0:
      return Tensor.zeros(shape, device=device, dtype=dt, **kwargs)
    bits = Tensor._threefry_bits(cast(int, num), device)
    if dt == dtypes.bfloat16:
      # 7 random mantissa bits in a float32, which bfloat16 holds exactly
      out = Tensor._bits_to_float(bits.idiv(1 << 25).mul(1 << 16).bitwise_or(_ONE_BITS[4]), dtypes.float32).sub(1).cast(dt).reshape(shape)
      out.requires_grad = kwargs.get("requires_grad")
      return out.contiguous()
    # keep the top mantissa bits, set the exponent of 1.0: a float in [1, 2)
    uint_dt = _UINT_OF_SIZE[dt.itemsize]
    bits = bits.cast(uint_dt).idiv(1 << (dt.itemsize * 8 - _FLOAT_MANTISSA[dt.itemsize])) if dt.itemsize < 8 else \
      bits.cast(uint_dt).mul(1 << (_FLOAT_MANTISSA[8] - 32))
    out = Tensor._bits_to_float(bits.bitwise_or(_ONE_BITS[dt.itemsize]), dt).sub(1).reshape(shape)
    out.requires_grad = kwargs.get("requires_grad")
    return out.contiguous()

  @staticmethod
  def full(shape: Tuple[sint, ...], fill_value: ConstType, **kwargs: Any) -> Tensor:
    """A tensor of shape filled with fill_value."""
    new_shape = _check_shape(argfix(shape))
    return Tensor(fill_value, **kwargs).reshape((1,) * len(new_shape)).expand(new_shape)

  @staticmethod
  def zeros(*shape: Any, **kwargs: Any) -> Tensor:
    """A tensor of zeros."""
    return Tensor.full(argfix(*shape), 0.0, **kwargs)

  @staticmethod
  def ones(*shape: Any, **kwargs: Any) -> Tensor:
    """A tensor of ones."""
    return Tensor.full(argfix(*shape), 1.0, **kwargs)

  @staticmethod
  def arange(start: Union[int, float], stop: Optional[Union[int, float]] = None, step: Union[int, float] = 1, **kwargs: Any) -> Tensor:
    """Evenly spaced values in [start, stop) (an int dtype when all arguments are ints)."""
    if stop is None:
      stop, start = start, 0
    if not all(isinstance(s, (int, float)) for s in (start, stop, step)):
      raise TypeError(f"arange takes int/float arguments, got {start!r}, {stop!r}, {step!r}")
    if step == 0:
      raise ValueError("arange step must not be 0")
    dtype = _to_dtype(kwargs.pop("dtype", dtypes.default_float if any(isinstance(x, float) for x in (start, stop, step)) else dtypes.default_int))
    if (n := max(0, math.ceil((stop - start) / step))) == 0:
      return Tensor.zeros(0, dtype=dtype, **kwargs)
    if n < 2 ** 31:
      # positions computed where they are read (no kernel of their own), so `idx == arange(n)` in a gather stays visible
      # to codegen, which folds the one-hot sum over n to one load
      pos = Tensor._metaop(MetaOps.ARANGE, (n,), dtype=dtypes.int32, **kwargs)
    else:
      # past int32 positions: the one-stage cumsum of a constant (its window sum over a padded constant folds to a count)
      pos = Tensor.full((n,), 1, dtype=dtypes.int64, **kwargs)._cumsum() - 1
    # start + i * step as numpy has it, in at least float32: a 16-bit float rounds i * step itself, and a running float
    # sum drifts from it for steps like 0.1; int ranges in a wide signed type, as unsigned or narrow ones may overflow
    work = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32 if dtypes.is_float(dtype) else \
      dtypes.int64 if max(abs(start), abs(stop)) + abs(step) >= 2 ** 31 else dtypes.int32
    return (pos.cast(work) * step + start).cast(dtype)

  @staticmethod
  def linspace(start: Union[int, float], stop: Union[int, float], steps: int, **kwargs: Any) -> Tensor:
    """steps evenly spaced values from start to stop inclusive."""
    if steps < 0:
      raise ValueError(f"linspace needs steps >= 0, got {steps}")
    dtype = _to_dtype(kwargs.pop("dtype", dtypes.default_float))
    if steps == 1:
      return Tensor([start], dtype=dtype, **kwargs)
    return (start + Tensor.arange(steps, **kwargs) * ((stop - start) / max(steps - 1, 1))).cast(dtype)

  @staticmethod
  def eye(n: int, m: Optional[int] = None, **kwargs: Any) -> Tensor:
    """The n x m identity matrix (m defaults to n)."""
    if n < 0 or (m is not None and m < 0):
      raise ValueError(f"eye dimensions must be non-negative, got {n=} {m=}")
    m = n if m is None else m
    if n == 0 or m == 0:
      return Tensor.zeros(n, m, **kwargs)
    x = Tensor.ones((n, 1), **kwargs).pad((None, (0, n))).flatten().shrink(((0, n * n),)).reshape(n, n)
    return x.shrink((None, (0, m))) if n >= m else x.pad((None, (0, m - n)))

  def full_like(self, fill_value: ConstType, **kwargs: Any) -> Tensor:
    """A tensor like self (shape, dtype, device unless overridden) filled with fill_value."""
    return Tensor.full(self.shape, fill_value, dtype=kwargs.pop("dtype", self.dtype), device=kwargs.pop("device", self.device), **kwargs)

  def zeros_like(self, **kwargs: Any) -> Tensor:
    """zeros shaped like self."""
    return self.full_like(0, **kwargs)

  def ones_like(self, **kwargs: Any) -> Tensor:
    """ones shaped like self."""
    return self.full_like(1, **kwargs)

  def rand_like(self, **kwargs: Any) -> Tensor:
    """uniform random numbers shaped like self."""
    dtype = kwargs.pop("dtype", self.dtype if dtypes.is_float(self.dtype) else dtypes.default_float)
    return Tensor.rand(*self.shape, device=kwargs.pop("device", self.device), dtype=dtype, **kwargs)

  @staticmethod
  def randn(*shape: Any, dtype: Optional[DTypeLike] = None, **kwargs: Any) -> Tensor:
    """Standard normal random numbers (Box-Muller on two uniform draws)."""
    src = Tensor.rand((2, *argfix(*shape)), **{**kwargs, "dtype": dtypes.float32})
    ret = src[0].mul(2 * math.pi).cos().mul((1 - src[1]).log().mul(-2).sqrt()).cast(_to_dtype(dtype or dtypes.default_float))
    ret.requires_grad = kwargs.get("requires_grad")
    return ret

  @staticmethod
  def randint(*shape: Any, low: int = 0, high: int = 10, **kwargs: Any) -> Tensor:
    """Random integers in [low, high)."""
    if not isinstance(low, int) or not isinstance(high, int):
      raise TypeError(f"randint bounds must be ints, got {low=} {high=}")
    if high <= low:
      raise ValueError(f"randint needs low < high, got {low=} {high=}")
    dtype = _to_dtype(kwargs.pop("dtype", dtypes.int32))
    if not dtypes.is_int(dtype):
      raise DTypeError(f"randint makes ints, not {dtype}")
    return Tensor.uniform(*shape, low=low, high=high, dtype=dtype, **kwargs)

  @staticmethod
  def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Tensor:
    """Normal random numbers with the given mean and standard deviation."""
    return (std * Tensor.randn(*shape, **kwargs)) + mean

  @staticmethod
  def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, **kwargs: Any) -> Tensor:
    """Uniform random numbers in [low, high)."""
    dtype = _to_dtype(kwargs.pop("dtype", dtypes.default_float))
    return ((high - low) * Tensor.rand(*shape, **kwargs)).cast(dtype) + low

  @staticmethod
  def scaled_uniform(*shape: Any, **kwargs: Any) -> Tensor:
    """Uniform in [-1, 1) scaled by 1/sqrt(number of elements)."""
    return Tensor.uniform(*shape, low=-1.0, high=1.0, **kwargs).mul(prod(argfix(*shape)) ** -0.5)

  @staticmethod
  def glorot_uniform(*shape: Any, **kwargs: Any) -> Tensor:
    """Xavier/Glorot uniform initialization."""
    shp = argfix(*shape)
    return Tensor.uniform(*shape, low=-1.0, high=1.0, **kwargs).mul((6 / (shp[0] + prod(shp[1:]))) ** 0.5)

  @staticmethod
  def kaiming_uniform(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
    """He/Kaiming uniform initialization (leaky relu slope a)."""
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(argfix(*shape)[1:]))
    return Tensor.uniform(*shape, low=-bound, high=bound, **kwargs)

  @staticmethod
  def kaiming_normal(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
    """He/Kaiming normal initialization (leaky relu slope a)."""
    std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(argfix(*shape)[1:]))
    return Tensor.normal(*shape, mean=0.0, std=std, **kwargs)

  def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
    """Sample indices from the categorical distribution(s) given by the (unnormalized) weights in self."""
    if not 1 <= self.ndim <= 2:
      raise ShapeError(f"multinomial needs a 1D or 2D tensor of weights, got shape {self.shape}")
    if num_samples <= 0:
      raise ValueError(f"num_samples must be positive, got {num_samples}")
    if not replacement and num_samples != 1:
      raise NotImplementedError("multinomial without replacement supports only num_samples=1")
    weight = self.unsqueeze(0) if self.ndim == 1 else self
    cw = weight.cumsum(1).float()
    cdf = cw / cw[:, -1].unsqueeze(1)
    unif = Tensor.rand(num_samples, cdf.shape[0], 1, device=self.device)
    indices = (unif.expand((-1, -1, cdf.shape[1])) >= cdf).sum(2).permute((1, 0))
    return (indices.squeeze(0) if self.ndim == 1 else indices).cast(dtypes.int32)

  # ***** autograd *****

  def _deepwalk(self) -> List[Tensor]:
    """Tensors of the autograd graph below self, in topological order (inputs first); iterative to allow deep graphs."""
    visited: Set[int] = set()
    order: List[Tensor] = []
    stack: List[Tuple[Tensor, bool]] = [(self, False)]
    while stack:
      node, done = stack.pop()
      if done:
        order.append(node)
        continue
      if id(node) in visited:
        continue
      visited.add(id(node))
      if node._ctx is None:
        continue
      stack.append((node, True))
      for p in reversed(node._ctx.parents):
        if id(p) not in visited:
          stack.append((p, False))
    return order

  def backward(self, gradient: Optional[Tensor] = None) -> Tensor:
    """Accumulate d(self)/d(t) into t.grad for every tensor t below self that requires grad."""
    if gradient is None:
      if self.shape != ():
        raise ShapeError(f"backward without a gradient needs a scalar tensor, this one has shape {self.shape}")
      gradient = Tensor(1.0, dtype=self.dtype, device=self.device, requires_grad=False)
    elif gradient.shape != self.shape:
      raise ShapeError(f"backward gradient shape {gradient.shape} != tensor shape {self.shape}")
    if self._ctx is None and not self.requires_grad:
      raise RuntimeError("backward on a tensor that has no autograd graph (nothing requires grad)")
    self.grad = gradient
    for t0 in reversed(self._deepwalk()):
      ctx = t0._ctx
      assert ctx is not None
      if t0.grad is None:  # nothing that was differentiated depends on t0
        t0._ctx = None
        continue
      token = _METADATA.set(dataclasses.replace(md, backward=True) if (md := ctx.metadata) is not None else None)
      grads = ctx.backward(t0.grad.lazydata)
      _METADATA.reset(token)
      grad_list = [Tensor(g, device=self.device, requires_grad=False) if g is not None else None
                   for g in ([grads] if len(ctx.parents) == 1 else grads)]
      for t, g in zip(ctx.parents, grad_list):
        if g is not None and t.requires_grad:
          assert g.shape == t.shape, f"grad shape must match tensor shape, {g.shape!r} != {t.shape!r}"
          if _is_multi(t.lazydata):
            _shard_like(g, t)
          t.grad = g if t.grad is None else (t.grad + g)
      t0._ctx = None
    return self

  # ***** movement ops *****

  def view(self, *shape: Any) -> Tensor:
    """Same as reshape."""
    return self.reshape(argfix(*shape))

  def reshape(self, shape: Any, *args: Any) -> Tensor:
    """The same elements in a new shape; one dimension may be -1 (inferred), None keeps the old size."""
    new_shape = list(argfix(shape, *args))
    for i, s in enumerate(new_shape):
      if s is None:
        if i >= self.ndim:
          raise ShapeError(f"reshape: None at dim {i} but the tensor has only {self.ndim} dims")
        new_shape[i] = self.shape[i]
    if (n_infer := sum(1 for s in new_shape if isinstance(s, int) and s == -1)) > 1:
      raise ShapeError(f"reshape: only one dimension can be -1, got {tuple(new_shape)}")
    if any(isinstance(s, int) and s < -1 for s in new_shape):
      raise ShapeError(f"reshape: negative dimension in {tuple(new_shape)}")
    if n_infer:
      rest = prod(s for s in new_shape if not (isinstance(s, int) and s == -1))
      if rest == 0 or self.numel() % rest != 0:
        raise ShapeError(f"cannot reshape {self.shape} to {tuple(new_shape)}")
      new_shape = [self.numel() // rest if isinstance(s, int) and s == -1 else s for s in new_shape]
    if prod(new_shape) != self.numel() and not _same_bound_size(prod(new_shape), self.numel()):
      raise ShapeError(f"cannot reshape {self.shape} ({self.numel()} elements) to {tuple(new_shape)} ({prod(new_shape)} elements)")
    return F.Reshape.apply(self, shape=tuple(new_shape)) if tuple(new_shape) != self.shape else self

  def expand(self, shape: Any, *args: Any) -> Tensor:
    """Broadcast to a bigger shape without copying (-1 or None keep a dimension)."""
    new_shape = argfix(shape, *args)
    if len(new_shape) < self.ndim:
      raise ShapeError(f"cannot expand {self.shape} to fewer dimensions {new_shape}")
    padded = _pad_left(self.shape, new_shape)[0]
    return self._broadcast_to(tuple(from_ if to is None or (isinstance(to, int) and to == -1) else to for from_, to in zip(padded, new_shape)))

  def permute(self, order: Any, *args: Any) -> Tensor:
    """Reorder the dimensions."""
    if len(raw := argfix(order, *args)) != self.ndim:
      raise ShapeError(f"permute order {raw} needs exactly one entry per dim of {self.shape}")
    order_arg = tuple(self._resolve_dim(x) for x in raw)
    if sorted(order_arg) != list(range(self.ndim)):
      raise ShapeError(f"permute order {order_arg} is not a permutation of the {self.ndim} dims of {self.shape}")
    return F.Permute.apply(self, order=order_arg) if order_arg != tuple(range(self.ndim)) else self

  def flip(self, axis: Any, *args: Any) -> Tensor:
    """Reverse the order of elements along the given axes."""
    axis_arg = tuple(self._resolve_dim(x) for x in argfix(axis, *args))
    if len(axis_arg) != len(dedup(axis_arg)):
      raise ShapeError(f"flip axes {axis_arg} contain duplicates")
    return F.Flip.apply(self, axis=axis_arg) if axis_arg else self

  def shrink(self, arg: Tuple[Optional[Tuple[sint, sint]], ...]) -> Tensor:
    """Keep [start, end) of every dimension (None keeps all of it)."""
    if len(arg) != self.ndim:
      raise ShapeError(f"shrink needs one (start, end) per dim of {self.shape}, got {arg}")
    shrink_arg = tuple(x if x is not None else (0, s) for x, s in zip(arg, self.shape))
    for (b, e), s in zip(shrink_arg, self.shape):
      if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
        raise ShapeError(f"shrink {arg} is out of bounds for shape {self.shape}")
    if shrink_arg == tuple((0, s) for s in self.shape):
      return self
    return F.Shrink.apply(self, arg=shrink_arg)

  def pad(self, arg: Tuple[Optional[Tuple[sint, sint]], ...], value: float = 0.0) -> Tensor:
    """Pad (before, after) elements of value around every dimension; negative amounts cut elements off."""
    if len(arg) != self.ndim:
      raise ShapeError(f"pad needs one (before, after) per dim of {self.shape}, got {arg}")
    narg = tuple(x if x is not None else (0, 0) for x in arg)
    if any(not isinstance(p, (tuple, list)) or len(p) != 2 for p in narg):
      raise ShapeError(f"pad needs (before, after) pairs, got {arg}")
    x = self
    if any(isinstance(p, int) and p < 0 for pp in narg for p in pp):
      x = x.shrink(tuple((-min(b, 0), s + min(e, 0)) for (b, e), s in zip(narg, self.shape)))
      narg = tuple((max(b, 0), max(e, 0)) for b, e in narg)
    if all(p == (0, 0) for p in narg):
      return x
    ret = F.Pad.apply(x, arg=narg)
    if value == 0:
      return ret
    return F.Pad.apply(Tensor.ones_like(x, dtype=dtypes.bool, requires_grad=False), arg=narg).where(ret, value)

  def pad2d(self, padding: Sequence[int], value: float = 0.0) -> Tensor:
    """Pad the last len(padding)//2 dims; padding is (left, right, top, bottom, ...), innermost dim first."""
    if len(padding) % 2 != 0 or len(padding) // 2 > self.ndim:
      raise ShapeError(f"pad2d needs an even number of paddings for at most {self.ndim} dims, got {padding}")
    pairs = [(padding[2 * i], padding[2 * i + 1]) for i in range(len(padding) // 2)]
    lead: List[Optional[Tuple[sint, sint]]] = [None] * (self.ndim - len(pairs))
    return self.pad(tuple(lead + list(pairs[::-1])), value=value)

  @property
  def T(self) -> Tensor:  # noqa: N802 - the public name follows tinygrad
    """Swap the first two dims."""
    return self.transpose()

  def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
    """Swap dim0 and dim1."""
    order = list(range(self.ndim))
    a, b = self._resolve_dim(dim0), self._resolve_dim(dim1)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims start_dim..end_dim into one."""
    if self.ndim == 0:
      return self.reshape(1)
    start, end = self._resolve_dim(start_dim), self._resolve_dim(end_dim)
    if start > end:
      raise ShapeError(f"flatten start_dim {start_dim} comes after end_dim {end_dim}")
    return self.reshape(self.shape[:start] + (prod(self.shape[start:end + 1]),) + self.shape[end + 1:])

  def unflatten(self, dim: int, sizes: Tuple[int, ...]) -> Tensor:
    """Split dim into several dims of the given sizes (one may be -1)."""
    dim = self._resolve_dim(dim)
    return self.reshape(self.shape[:dim] + tuple(sizes) + self.shape[dim + 1:])

  def squeeze(self, dim: Optional[int] = None) -> Tensor:
    """Remove dims of size 1 (only dim when given; a dim of another size is left alone)."""
    if dim is None:
      return self.reshape(tuple(s for s in self.shape if s != 1))
    dim = self._resolve_dim(dim)
    if not self.ndim or self.shape[dim] != 1:
      return self
    return self.reshape(self.shape[:dim] + self.shape[dim + 1:])

  def unsqueeze(self, dim: int) -> Tensor:
    """Insert a dim of size 1 at dim."""
    dim = self._resolve_dim(dim, outer=True)
    return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

  def repeat(self, repeats: Any, *args: Any) -> Tensor:
    """Tile the tensor repeats[i] times along dim i (like torch.Tensor.repeat)."""
    reps = argfix(repeats, *args)
    if len(reps) < self.ndim:
      raise ShapeError(f"repeat needs at least {self.ndim} repeats for shape {self.shape}, got {reps}")
    if any(not isinstance(r, int) or r < 0 for r in reps):
      raise ValueError(f"repeats must be non-negative ints, got {reps}")
    base_shape = (1,) * (len(reps) - self.ndim) + self.shape
    new_shape = [x for b in base_shape for x in (1, b)]
    expand_shape = [x for rs in zip(reps, base_shape) for x in rs]
    final_shape = [r * s for r, s in zip(reps, base_shape)]
    return self.reshape(new_shape).expand(expand_shape).reshape(final_shape)

  def _resolve_dim(self, dim: int, *, outer: bool = False) -> int:
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
      raise TypeError(f"dimension must be an int, got {dim!r}")
    total = max(1, self.ndim + int(outer))
    if not -total <= dim < total:
      raise AxisError(f"dimension {dim} is out of range for a tensor of {self.ndim} dims (expected [{-total}, {total - 1}])")
    return int(dim) + self.ndim + int(outer) if dim < 0 else int(dim)

  # ***** indexing *****

  def _normalize_indices(self, indices: Any) -> List[Any]:
    """Indices as a list of None | int | slice | Tensor covering every dim (Ellipsis expanded).

    Integer lists/tuples/ranges/arrays are bounds-checked here against their axis (IndexError), since their values are
    on the host already; Tensor indices only under CHECK_INDEX=1 (see check_index_tensor)."""
    if not isinstance(indices, tuple):
      indices = (indices,)
    indices = self._expand_masks(indices)
    items: List[Any] = []
    hosts: List[Optional[np.ndarray]] = []   # host values of the list/array indices, parallel to items
    for i in indices:
      host: Optional[np.ndarray] = None
      if isinstance(i, (range, tuple)):  # a tuple inside the index tuple is a sequence index, as in numpy and torch
        i = list(i)
      if isinstance(i, (list, np.ndarray)):
        src = i
        i = Tensor(np.asarray(i) if isinstance(i, list) and len(i) == 0 else i, device=self.device, requires_grad=False)
        if i.numel() == 0 and not dtypes.is_int(i.dtype):
          i = i.cast(dtypes.int32)
        host = np.asarray(src)
      elif isinstance(i, (np.integer,)):
        i = int(i)
      if isinstance(i, Tensor):
        if i.dtype == dtypes.bool:
          raise IndexError("indexing with a boolean tensor is not supported (the result shape would depend on the data)")
        if not dtypes.is_int(i.dtype):
          raise IndexError(f"tensor indices must be integers, got {i.dtype}")
        i = i.to(self.device)
      elif i is not None and i is not Ellipsis and not isinstance(i, (int, slice)) or isinstance(i, bool):
        raise IndexError(f"unsupported index {i!r} of type {type(i).__name__}")
      items.append(i)
      hosts.append(host if host is not None and host.dtype.kind in "iu" else None)
    if sum(1 for i in items if i is Ellipsis) > 1:
      raise IndexError("an index can only have a single ellipsis ('...')")
    num_real = sum(1 for i in items if i is not None and i is not Ellipsis)
    if num_real > self.ndim:
      raise IndexError(f"too many indices for tensor of dimension {self.ndim}: got {num_real}")
    fill = [slice(None)] * (self.ndim - num_real)
    if (ell := next((k for k, i in enumerate(items) if i is Ellipsis), None)) is not None:
      items[ell:ell + 1], hosts[ell:ell + 1] = fill, [None] * len(fill)
    else:
      items, hosts = items + fill, hosts + [None] * len(fill)
    # the gather kernel masks out-of-range indices to 0, so a bad index must be caught here to raise like torch
    dim = 0
    for it, host in zip(items, hosts):
      if it is None:
        continue
      if isinstance(it, Tensor) and isinstance(size := self.shape[dim], int):
        if host is not None:
          _raise_if_out_of_range(host, size, f"axis {dim} with size {size}", allow_negative=True)
        else:
          check_index_tensor(it, size, f"axis {dim} with size {size}")
      dim += 1
    return items

  def _expand_masks(self, indices: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """indices with lists of (0-d) Tensors stacked into one Tensor, and each boolean mask (bool Tensor, array or list) over
    k dims replaced by the k integer arrays of its True positions, as numpy/torch read a mask. A bool Tensor mask is read
    back to the host for that (a device sync; its count sets the result's shape)."""
    out: List[Any] = []
    ell = next((k for k, i in enumerate(indices) if i is Ellipsis), None)
    for k, i in enumerate(indices):
      if isinstance(i, (list, tuple)) and i and any(isinstance(v, Tensor) for v in i):
        i = Tensor.stack(*[(v if isinstance(v, Tensor) else Tensor(v, requires_grad=False)).to(self.device) for v in i])
      mask: Optional[np.ndarray] = None
      if isinstance(i, Tensor) and i.dtype == dtypes.bool:
        mask = i.numpy()
      elif isinstance(i, np.ndarray) and i.dtype == np.bool_:
        mask = i
      elif isinstance(i, (list, tuple)) and i and (arr := np.asarray(i)).dtype == np.bool_:
        mask = arr
      if mask is None:
        out.append(i)
        continue
      if mask.ndim == 0:
        raise IndexError("indexing with a 0-d boolean mask is not supported")
      # the dims the mask covers: counted from the front before an Ellipsis, from the back after it
      start = _indexed_dims(indices[:k]) if ell is None or k < ell else self.ndim - _indexed_dims(indices[k:])
      if tuple(self.shape[start:start + mask.ndim]) != mask.shape:
        raise IndexError(f"boolean mask of shape {mask.shape} does not match the dims {tuple(self.shape[start:start + mask.ndim])} "
                         f"it indexes (from dim {start}) of shape {self.shape}")
      out.extend(np.nonzero(mask))
    return tuple(out)

  def _getitem(self, indices: Any, v: Optional[Tensor] = None) -> Any:
    """x[indices]; with v, instead return (v scattered to self's shape, mask of the positions written) for __setitem__."""
    items = self._normalize_indices(indices)
    # basic indexing: ints and slices become shrink + flip + stride, recorded so __setitem__ can undo them
    steps: List[Tuple[str, Any, Tuple[sint, ...]]] = []
    shrink_arg: List[Tuple[sint, sint]] = []
    flips: List[int] = []
    strides: List[int] = []
    out_shape_items: List[Tuple[str, Any]] = []   # how each item maps to the output dims
    dim = 0
    for it in items:
      if it is None:
        out_shape_items.append(("none", None))
        continue
      size = self.shape[dim]
      if isinstance(it, int):
        if not -size <= it < size:
          raise IndexError(f"index {it} is out of bounds for dim {dim} with size {size}")
        i = it + size if it < 0 else it
        shrink_arg.append((i, i + 1))
        strides.append(1)
        out_shape_items.append(("int", dim))
      elif isinstance(it, slice) and any(isinstance(x, Node) for x in (it.start, it.stop, size)):
        shrink_arg.append(_symbolic_slice(it, size, dim))
        strides.append(1)
        out_shape_items.append(("slice", dim))
      elif isinstance(it, slice):
        if it.step == 0:
          raise ValueError(f"slice step cannot be zero (dim {dim})")
        start, stop, step = it.indices(cast(int, size))
        n = len(range(start, stop, step))
        if n == 0:
          shrink_arg.append((0, 0))
        elif step > 0:
          shrink_arg.append((start, start + (n - 1) * step + 1))
        else:
          shrink_arg.append((start + (n - 1) * step, start + 1))
          flips.append(dim)
        strides.append(abs(step) if n > 1 else 1)
        out_shape_items.append(("slice", dim))
      else:
        shrink_arg.append((0, size))
        strides.append(1)
        out_shape_items.append(("tensor", (dim, it)))
      dim += 1

    def move(t: Tensor, op: str, arg: Any) -> Tensor:
      steps.append((op, arg, t.shape))
      return getattr(t, op)(arg)

    ret = move(self, "shrink", tuple(shrink_arg))
    if flips:
      ret = move(ret, "flip", tuple(flips))
    if any(s != 1 for s in strides):
      # a strided dim came from a slice, whose size is concrete; step-1 dims round up to themselves
      ret = move(ret, "pad", tuple((0, round_up(cast(int, sh), s) - sh) for s, sh in zip(strides, ret.shape)))
      ret = move(ret, "reshape", tuple(flatten((sh // s, s) for s, sh in zip(strides, ret.shape))))
      ret = move(ret, "shrink", tuple(flatten(((0, sh), (0, 1)) for sh in ret.shape[::2])))
      ret = move(ret, "reshape", tuple(ret.shape[::2]))
    final_shape: List[sint] = []
    tensor_dims: List[Tuple[int, Tensor]] = []   # (dim in final_shape, index tensor)
    for kind, arg in out_shape_items:
      if kind == "none":
        final_shape.append(1)
      elif kind in ("slice", "tensor"):
        if kind == "tensor":
          tensor_dims.append((len(final_shape), arg[1]))
        final_shape.append(ret.shape[arg if kind == "slice" else arg[0]])
    ret = move(ret, "reshape", tuple(final_shape))

    adv_value: Optional[Tensor] = None
    adv_mask: Optional[Tensor] = None
    if tensor_dims:
      ret, adv_value, adv_mask = ret._advanced_index(tensor_dims, [k for k, _ in out_shape_items if k != "int"], v)
    if v is None:
      return ret
    # __setitem__: bring the value (and a mask of the written positions) back through the movement ops, in reverse
    if adv_value is None:
      adv_value = v.cast(self.dtype)._broadcast_to(_broadcast_shape(ret.shape, v.shape))
      if adv_value.shape != ret.shape:
        raise ShapeError(f"cannot assign a value of shape {v.shape} to an index of shape {ret.shape}")
      adv_mask = Tensor.ones(ret.shape, dtype=dtypes.bool, device=self.device, requires_grad=False)
    assert adv_mask is not None
    val, mask = adv_value, adv_mask
    for op, arg, in_shape in reversed(steps):
      val, mask = _undo_movement(val, op, arg, in_shape), _undo_movement(mask, op, arg, in_shape)
    return val, mask

  def _advanced_index(self, tensor_dims: List[Tuple[int, Tensor]], kinds: List[str],
                      v: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """Gather with integer tensor indices on the given dims (numpy/torch rules for where the index dims go)."""
    dims = [d for d, _ in tensor_dims]
    sizes = [self.shape[d] for d in dims]
    try:
      big = _broadcast_shape(*(t.shape for _, t in tensor_dims))
    except ShapeError as e:
      raise IndexError(f"index tensors cannot be broadcast together: {e}") from e
    rest = [d for d in range(self.ndim) if d not in dims]
    # the index dims go where the first tensor index was when the tensor indices are adjacent, else in front
    tensor_positions = [k for k, kind in enumerate(kinds) if kind == "tensor"]
    adjacent = tensor_positions == list(range(tensor_positions[0], tensor_positions[-1] + 1))
    q = sum(1 for d in rest if d < dims[0]) if adjacent else 0
    nr, nb, nk = len(rest), len(big), len(dims)
    # x: rest[:q] + (1,)*nb + rest[q:] + index dims
    x = self.permute(*rest, *dims)
    rest_shape = tuple(self.shape[d] for d in rest)
    x = x.reshape(rest_shape[:q] + (1,) * nb + rest_shape[q:] + tuple(sizes))
    mask: Optional[Tensor] = None
    for j, ((_, idx), n) in enumerate(zip(tensor_dims, sizes)):
      if idx.dtype.itemsize < 4:
        idx = idx.cast(dtypes.int32)   # idx + n of a negative int16 index overflows for n past its range
      idx = (idx < 0).where(idx + n, idx)
      idx = idx.reshape((1,) * q + _pad_left(idx.shape, big)[0] + (1,) * (nr - q) + (1,) * nk)
      ar = Tensor.arange(cast(int, n), device=self.device, requires_grad=False).reshape((1,) * (q + nb + nr - q + j) + (n,) + (1,) * (nk - j - 1))
      m = idx == ar
      mask = m if mask is None else mask & m
    assert mask is not None
    reduce_axes = tuple(range(nr + nb, nr + nb + nk))
    work_dtype = dtypes.uint8 if self.dtype == dtypes.bool else self.dtype
    if v is None:
      out = mask.where(x.cast(work_dtype), 0).sum(reduce_axes, acc_dtype=work_dtype).cast(self.dtype)
      return out, None, None
    # setitem: scatter v (shaped like the gather result) back to self's shape
    out_shape = rest_shape[:q] + big + rest_shape[q:]
    vb = v.cast(work_dtype)._broadcast_to(_broadcast_shape(out_shape, v.shape))
    if vb.shape != out_shape:
      raise ShapeError(f"cannot assign a value of shape {v.shape} to an index of shape {out_shape}")
    vb = vb.reshape(out_shape + (1,) * nk)
    big_axes = tuple(range(q, q + nb))
    scattered = mask.where(vb, 0).sum(big_axes, acc_dtype=work_dtype).cast(self.dtype)  # rest + index dims
    written = mask.cast(dtypes.int32).sum(big_axes) > 0
    back = argsort([*rest, *dims])
    scattered = scattered.reshape(rest_shape + tuple(sizes)).permute(back)
    written = written._broadcast_to(rest_shape + tuple(sizes)).permute(back)
    return self, scattered, written

  def __getitem__(self, indices: Any) -> Tensor:
    """numpy-style indexing: ints, slices (any step), None, Ellipsis and integer tensors/lists/tuples/ranges/arrays.

    A boolean mask (bool Tensor, numpy array or list) selects its True positions over the dims it covers, like torch's
    x[mask]; a bool Tensor mask is realized and read back for that (a device sync), since its count sets the shape.
    A list of 0-d Tensors is one index tensor (numpy's reading).

    Negative indices count from the end (-size..size-1 are valid). An out-of-range int, list, tuple, range or numpy
    index raises IndexError, as in torch. Integer Tensor indices are not checked by default (that would need a device
    sync): an out-of-range one reads 0. Set CHECK_INDEX=1 (or `with Context(CHECK_INDEX=1)`) to read them back and
    raise IndexError; that check is skipped while a TinyJit captures."""
    return self._getitem(indices)

  def __setitem__(self, indices: Any, v: Union[Tensor, ConstType]) -> None:
    """self[indices] = v, in place; indices as in __getitem__, with the same IndexError for out-of-range host indices.
    An out-of-range integer Tensor index writes nothing unless CHECK_INDEX=1, which raises IndexError."""
    if self.device.startswith("DISK"):
      self._getitem(indices).assign(v)
      return
    if not isinstance(v, (Tensor, float, int, bool)):
      raise TypeError(f"can't set a {type(v).__name__} into a Tensor")
    if self.requires_grad or (isinstance(v, Tensor) and v.requires_grad):
      raise NotImplementedError("setitem on tensors that require grad is not supported")
    if not isinstance(v, Tensor):
      v = Tensor(v, device=self.device, dtype=self.dtype)
    val, mask = self._getitem(indices, v.to(self.device))
    self.assign(mask.where(val, self).cast(self.dtype)).realize()

  def gather(self, dim: int, index: Tensor) -> Tensor:
    """out[i][j][k] = self[index[i][j][k]][j][k] for dim=0 (and so on), like torch.gather.

    Valid index values are 0..self.shape[dim]-1 (torch's rule: no negative indices). They are not checked by default
    (that would need a device sync): an out-of-range one gives 0. With CHECK_INDEX=1 they are read back and an
    out-of-range one raises IndexError (torch raises RuntimeError); the check is skipped while a TinyJit captures."""
    if index.ndim != self.ndim:
      raise ShapeError(f"gather needs index.ndim == self.ndim, got {index.ndim} and {self.ndim}")
    dim = self._resolve_dim(dim)
    if any(i > s for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != dim):
      raise ShapeError(f"gather index shape {index.shape} is bigger than {self.shape} outside dim {dim}")
    if not dtypes.is_int(index.dtype):
      raise DTypeError(f"gather index must be an integer tensor, got {index.dtype}")
    index = index.to(self.device)
    n = self.shape[dim]
    check_index_tensor(index, n, f"gather along axis {dim} with size {n}", allow_negative=False)
    xs = self.shrink(tuple((0, i) if d != dim else None for d, i in enumerate(index.shape)))
    # xs.unsqueeze(dim) puts the gathered dim at dim+1: move it to the end, the mask compares against it there
    x = xs.unsqueeze(dim).permute(*[d for d in range(self.ndim + 1) if d != dim + 1], dim + 1)
    mask = index.unsqueeze(-1) == Tensor.arange(cast(int, n), device=self.device, requires_grad=False)
    work_dtype = dtypes.uint8 if self.dtype == dtypes.bool else self.dtype
    return mask.where(x.cast(work_dtype), 0).sum(-1, acc_dtype=work_dtype).cast(self.dtype)

  def scatter(self, dim: int, index: Tensor, src: Union[Tensor, ConstType], reduce: Optional[str] = None) -> Tensor:
    """Out-of-place torch.Tensor.scatter: out[index[i][j]][j] = src[i][j] for dim=0 (and so on), self elsewhere.

    src may be a number. reduce='add'/'multiply' accumulate into self instead (torch's legacy form of scatter_reduce).
    Where several positions of index name the same target, the last one (in row-major order) wins, as on torch's CPU.
    Index values are not bounds-checked unless CHECK_INDEX=1 (an out-of-range one writes nothing)."""
    if reduce is not None:
      if reduce not in ("add", "multiply"):
        raise ValueError(f"scatter reduce must be 'add' or 'multiply', got {reduce!r}")
      return self.scatter_reduce(dim, index, src if isinstance(src, Tensor) else index.full_like(src, dtype=self.dtype),
                                 "sum" if reduce == "add" else "prod")
    dim, src_t, sel = self._scatter_setup(dim, index, src, "scatter")
    # keep only the last source position per target: the one whose position along dim is the largest
    pos = Tensor.arange(cast(int, index.shape[dim]), device=self.device, requires_grad=False).reshape(
      (1,) * dim + (-1,) + (1,) * (index.ndim - dim))
    last = sel.where(pos, -1).max(axis=dim, keepdim=True)
    sel = sel & (pos == last)
    vals = sel.where(src_t, 0).sum(axis=dim, acc_dtype=src_t.dtype)
    return self._scatter_finish(dim, index, sel.any(axis=dim), vals.cast(self.dtype))

  def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
    """Out-of-place torch.Tensor.scatter_reduce: reduce ('sum', 'prod', 'mean', 'amax', 'amin') the src values that index
    sends to each position of self along dim, together with self's value there when include_self; untouched positions keep
    self. 'mean' on integer tensors rounds toward negative infinity, like torch. Index values are not bounds-checked
    unless CHECK_INDEX=1 (an out-of-range one contributes nothing)."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
      raise ValueError(f"scatter_reduce reduce must be one of sum, prod, mean, amax, amin; got {reduce!r}")
    dim, src_t, sel = self._scatter_setup(dim, index, src, "scatter_reduce")
    written = sel.any(axis=dim)
    src_t = src_t.cast(self.dtype)
    if reduce in ("sum", "mean"):
      red = sel.where(src_t, 0).sum(axis=dim, acc_dtype=self.dtype if dtypes.is_float(self.dtype) else None)
    elif reduce == "prod":
      red = sel.where(src_t, 1).prod(axis=dim)
    elif reduce == "amax":
      red = sel.where(src_t, dtypes.min(self.dtype)).max(axis=dim)
    else:
      red = sel.where(src_t, dtypes.max(self.dtype)).min(axis=dim)
    base = self._scatter_finish(dim, index, written, red.cast(self.dtype), fill_only=True)
    count = self._scatter_finish(dim, index, written, sel.cast(dtypes.int32).sum(axis=dim), fill_only=True)
    full_written = self._scatter_finish(dim, index, written, written, fill_only=True)
    if include_self:
      combine = {"sum": lambda a, b: a + b, "mean": lambda a, b: a + b, "prod": lambda a, b: a * b, "amax": Tensor.maximum, "amin": Tensor.minimum}
      base = combine[reduce](self, base)
      count = count + 1
    if reduce == "mean":
      # untouched positions have count 0 but keep self below; 1 there avoids an integer division by zero
      count = count.maximum(1)
      base = base / count if dtypes.is_float(self.dtype) else base.floordiv(count)
    return full_written.where(base, self).cast(self.dtype)

  def _scatter_setup(self, dim: int, index: Tensor, src: Union[Tensor, ConstType], name: str) -> Tuple[int, Tensor, Tensor]:
    """Checks, and (dim, src cut to index's shape with a trailing target axis, one-hot mask index.shape + (n,))."""
    if not isinstance(index, Tensor) or not dtypes.is_int(index.dtype):
      raise DTypeError(f"{name} index must be an integer Tensor, got {getattr(index, 'dtype', type(index).__name__)}")
    if index.ndim != self.ndim:
      raise ShapeError(f"{name} needs index.ndim == self.ndim, got {index.ndim} and {self.ndim}")
    dim = self._resolve_dim(dim)
    index = index.to(self.device)
    if any(i > s for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != dim):
      raise ShapeError(f"{name} index shape {index.shape} is bigger than self {self.shape} outside dim {dim}")
    if isinstance(src, Tensor):
      if src.ndim != self.ndim or any(i > s for s, i in zip(src.shape, index.shape)):
        raise ShapeError(f"{name} index shape {index.shape} is bigger than src {src.shape}")
      src_t = src.to(self.device).shrink(tuple((0, i) for i in index.shape))
    else:
      src_t = Tensor.full(index.shape, src, dtype=self.dtype, device=self.device)
    n = self.shape[dim]
    check_index_tensor(index, n, f"{name} along axis {dim} with size {n}", allow_negative=False)
    sel = index.unsqueeze(-1) == Tensor.arange(cast(int, n), device=self.device, requires_grad=False)
    return dim, src_t.unsqueeze(-1), sel

  def _scatter_finish(self, dim: int, index: Tensor, written: Tensor, vals: Tensor, fill_only: bool = False) -> Tensor:
    """vals (index.shape without dim, + target axis n) moved back to self's layout and padded out to self's shape; unless
    fill_only, written positions take vals and the rest keep self."""
    order = list(range(index.ndim - 1))
    order.insert(dim, index.ndim - 1)
    vals, written = vals.permute(order), written.permute(order)
    pad = tuple((0, s - v) for s, v in zip(self.shape, vals.shape))
    vals, written = vals.pad(pad), written.pad(pad)
    return vals if fill_only else written.where(vals, self).cast(self.dtype)

  def sort(self, dim: int = -1, descending: bool = False) -> Tuple[Tensor, Tensor]:
    """(values, indices) sorted along dim, stable (equal elements keep their order, like torch's stable=True); NaN sorts
    as the largest value, as in torch. Lazy: each element's rank is a count of comparisons against its whole row
    (work n*n per row, no data-dependent control flow). Indices are int32, like argmax."""
    if self.ndim == 0:
      return self, Tensor(0, dtype=dtypes.int32, device=self.device)
    dim = self._resolve_dim(dim)
    n = cast(int, self.shape[dim])
    x = self.detach().transpose(dim, -1)
    a, b = x.unsqueeze(-1), x.unsqueeze(-2)     # a[..., i, j] = x[i], b[..., i, j] = x[j]
    if dtypes.is_float(self.dtype):
      a_nan, b_nan = a.isnan(), b.isnan()
      before = ((b > a) | (b_nan & ~a_nan)) if descending else ((b < a) | (a_nan & ~b_nan))
      same = (a == b) | (a_nan & b_nan)
    else:
      before, same = (b > a) if descending else (b < a), a == b
    ar = Tensor.arange(n, device=self.device, requires_grad=False)
    earlier = ar.unsqueeze(0) < ar.unsqueeze(1)    # [i, j]: j comes before i
    rank = (before | (same & earlier)).cast(dtypes.int32).sum(-1)     # the sorted position of each element
    idx = (rank.unsqueeze(-1) == ar).where(ar.unsqueeze(-1).cast(dtypes.int32), 0).sum(-2, acc_dtype=dtypes.int32).transpose(dim, -1)
    return self.gather(dim, idx), idx

  def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Tuple[Tensor, Tensor]:  # noqa: A002 - torch's name
    """(values, indices) of the k largest (smallest when not largest) elements along dim, in sorted order (also when
    sorted=False, which torch allows). Ties keep the lower index first."""
    dim = self._resolve_dim(dim) if self.ndim else 0
    if not 0 <= k <= (self.shape[dim] if self.ndim else 1):
      raise AxisError(f"topk k={k} is out of range for dim {dim} of shape {self.shape}")
    values, indices = self.sort(dim, descending=largest)
    if not self.ndim:
      return values, indices
    sl = (slice(None),) * dim + (slice(0, k),)
    return values[sl], indices[sl]

  def interpolate(self, size: Optional[Union[int, Tuple[int, ...]]] = None, mode: str = "linear", align_corners: bool = False,
                  scale_factor: Optional[Union[float, Tuple[float, ...]]] = None, recompute_scale_factor: bool = False) -> Tensor:
    """Resize the last dims like torch.nn.functional.interpolate: to `size`, or by `scale_factor` (the output size is
    floor(in * factor), and the source positions use 1/factor unless recompute_scale_factor, as torch does). Linear is
    applied per dim, so it is also torch's bilinear/trilinear; modes 'linear' (aliases 'bilinear', 'trilinear'),
    'nearest', 'nearest-exact'. Source positions and weights are computed on the host in float32, the way torch does."""
    if mode in ("bilinear", "trilinear"):
      mode = "linear"
    if mode not in ("linear", "nearest", "nearest-exact"):
      raise ValueError(f"interpolate mode must be 'linear', 'nearest' or 'nearest-exact', got {mode!r}")
    if align_corners and mode != "linear":
      raise ValueError("align_corners only applies to mode='linear'")
    if (size is None) == (scale_factor is None):
      raise ValueError("interpolate needs exactly one of size and scale_factor")
    factors: Tuple[Optional[float], ...]
    if scale_factor is not None:
      sf = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else (scale_factor,) * max(self.ndim - 2, 1)
      if not 0 < len(sf) <= self.ndim or any(isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0 for f in sf):
        raise ValueError(f"interpolate scale_factor {scale_factor} must be positive numbers for at most the {self.ndim} dims of {self.shape}")
      sizes: Tuple[int, ...] = tuple(math.floor(cast(int, s) * f) for s, f in zip(self.shape[self.ndim - len(sf):], sf))
      if any(m <= 0 for m in sizes):
        raise ShapeError(f"interpolate scale_factor {scale_factor} of shape {self.shape} gives the empty size {sizes}")
      factors = (None,) * len(sf) if recompute_scale_factor else tuple(float(f) for f in sf)
    else:
      sizes = tuple(size) if isinstance(size, (tuple, list)) else (cast(int, size),) * max(self.ndim - 2, 1)
      factors = (None,) * len(sizes)
    if not 0 < len(sizes) <= self.ndim or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
      raise ShapeError(f"interpolate size {sizes} must be positive ints for at most the {self.ndim} dims of {self.shape}")
    x = self if dtypes.is_float(self.dtype) else self.cast(dtypes.default_float)
    for d, m, f in zip(range(self.ndim - len(sizes), self.ndim), sizes, factors):
      n = cast(int, self.shape[d])
      t = np.arange(m, dtype=np.float32)
      # torch's scale: the inverse of a given factor, else in/out, both in float32
      scale = np.float32(1.0 / f) if f is not None else np.float32(n) / np.float32(m)
      pre = (slice(None),) * d
      if mode == "nearest":
        x = x[pre + (np.minimum(np.floor(t * scale).astype(np.int64), n - 1),)]
      elif mode == "nearest-exact":
        x = x[pre + (np.minimum(np.floor((t + np.float32(0.5)) * scale).astype(np.int64), n - 1),)]
      else:
        if align_corners:
          src = t * (np.float32(n - 1) / np.float32(m - 1)) if m > 1 else np.zeros(m, np.float32)
        else:
          src = np.maximum((t + np.float32(0.5)) * scale - np.float32(0.5), np.float32(0))
        lo = np.minimum(np.floor(src).astype(np.int64), n - 1)
        hi = np.minimum(lo + 1, n - 1)
        w = Tensor((src - lo).astype(np.float32), device=self.device, requires_grad=False).reshape((m,) + (1,) * (self.ndim - d - 1))
        x = x[pre + (lo,)] * (1 - w).cast(x.dtype) + x[pre + (hi,)] * w.cast(x.dtype)
    return x

  def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
    """Concatenate along dim (dtypes are promoted)."""
    if isinstance(self, (list, tuple)):
      return Tensor.cat(*self, *args, dim=dim)
    dim = self._resolve_dim(dim)
    for y in args:
      if y.ndim != self.ndim or any(ys != s for i, (ys, s) in enumerate(zip(y.shape, self.shape)) if i != dim):
        raise ShapeError(f"cat: shape {y.shape} does not match {self.shape} outside dim {dim}")
    catargs = [self, *args]
    dt = least_upper_dtype(*[t.dtype for t in catargs])
    cat_dims = [t.shape[dim] for t in catargs]
    offsets = [0, *itertools.accumulate(cat_dims)]
    total = offsets[-1]
    padded = []
    for t, off, d in zip(catargs, offsets[:-1], cat_dims):
      arg: List[Optional[Tuple[sint, sint]]] = [None] * self.ndim
      arg[dim] = (off, total - off - d)
      padded.append(t.cast(dt).pad(tuple(arg)))
    if dt == dtypes.bool:
      return functools.reduce(Tensor.bitwise_or, padded)
    return functools.reduce(Tensor.__add__, padded)

  def stack(self, *args: Tensor, dim: int = 0) -> Tensor:
    """Stack tensors of the same shape along a new dim."""
    if isinstance(self, (list, tuple)):
      return Tensor.stack(*self, *args, dim=dim)
    dim = self._resolve_dim(dim, outer=True)
    return self.unsqueeze(dim).cat(*[t.unsqueeze(dim) for t in args], dim=dim)

  def split(self, sizes: Union[int, Sequence[int]], dim: int = 0) -> Tuple[Tensor, ...]:
    """Split into pieces of the given size (an int: equal pieces, the last may be smaller)."""
    dim = self._resolve_dim(dim)
    if isinstance(sizes, int):
      if sizes <= 0:
        raise ValueError(f"split size must be positive, got {sizes}")
      dim_size = cast(int, self.shape[dim])
      sizes = [min(sizes, dim_size - i) for i in range(0, max(1, dim_size), sizes)]
    if sum(sizes) != self.shape[dim]:
      raise ShapeError(f"split sizes {list(sizes)} must sum to the size {self.shape[dim]} of dim {dim}")
    offs = [0, *itertools.accumulate(sizes)]
    return tuple(self[(slice(None),) * dim + (slice(offs[i], offs[i + 1]),)] for i in range(len(sizes)))

  def chunk(self, chunks: int, dim: int = 0) -> List[Tensor]:
    """Split into `chunks` pieces of (almost) equal size."""
    if chunks <= 0:
      raise ValueError(f"chunks must be positive, got {chunks}")
    dim = self._resolve_dim(dim)
    if self.shape[dim] == 0:
      return [self] * chunks
    return list(self.split(math.ceil(cast(int, self.shape[dim]) / chunks), dim=dim))

  def meshgrid(self, *args: Tensor, indexing: str = "ij") -> Tuple[Tensor, ...]:
    """Coordinate grids from 1D tensors ('ij' or 'xy' indexing)."""
    if indexing not in ("ij", "xy"):
      raise ValueError(f"indexing must be 'ij' or 'xy', got {indexing!r}")
    tensors = [self, *args]
    # 'xy' swaps the roles of the first two inputs in the output layout
    pos = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) > 1:
      pos[0], pos[1] = 1, 0
    out_shape: List[sint] = [0] * len(tensors)
    for p, t in zip(pos, tensors):
      out_shape[p] = t.numel()
    rets = []
    for p, t in zip(pos, tensors):
      view = [1] * len(tensors)
      view[p] = -1
      rets.append(t.reshape(view).expand(out_shape))
    return tuple(rets)

  # ***** reduce ops *****

  def _reduce(self, fxn: Type[Function], axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
    raw: Tuple[Any, ...] = tuple(range(self.ndim)) if axis is None else tuple(argfix(axis)) if isinstance(axis, (list, tuple)) else (axis,)
    axis_ = tuple(dedup(self._resolve_dim(a) for a in raw))
    # a sum over no axis still starts at +0.0 like numpy's (the lazy reduce adds it): -0.0 comes out +0.0
    if self.ndim == 0 or not axis_:
      return fxn.apply(self, axis=()) if fxn is F.Sum else self
    ret = fxn.apply(self, axis=axis_)
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axis_))

  def _reduced_count(self, axis: Optional[Union[int, Sequence[int]]]) -> sint:
    if axis is None:
      return prod(self.shape)
    axes = tuple(argfix(axis)) if isinstance(axis, (list, tuple)) else (axis,)
    return prod(self.shape[self._resolve_dim(a)] for a in dedup(axes)) if self.ndim else 1

  def sum(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, acc_dtype: Optional[DTypeLike] = None) -> Tensor:
    """Sum over axis (all axes when None); ints accumulate in at least 32 bits, halves in float32."""
    acc = _to_dtype(acc_dtype) if acc_dtype is not None else sum_acc_dtype(self.dtype)
    ret = self.cast(acc)._reduce(F.Sum, axis, keepdim)
    return ret.cast(self.dtype) if acc_dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else ret

  def max(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
    """Maximum over axis."""
    return self._reduce(F.Max, axis, keepdim)

  def min(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
    """Minimum over axis."""
    return self._inverse().max(axis=axis, keepdim=keepdim)._inverse()

  def mean(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
    """Mean over axis (ints give float32)."""
    output_dtype = self.dtype if dtypes.is_float(self.dtype) else dtypes.float32
    numerator = self.cast(sum_acc_dtype(self.dtype)).sum(axis=axis, keepdim=keepdim)
    return numerator.div(self._reduced_count(axis)).cast(output_dtype)

  def var(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, correction: int = 1) -> Tensor:
    """Variance over axis with Bessel's correction (correction=0 for the population variance)."""
    # the mean is detached: its gradient term is 0 in exact arithmetic, and torch's derivative leaves it out, which
    # keeps inf/NaN where n <= correction exactly where torch has them
    squares = (self - self.mean(axis=axis, keepdim=True).detach()).square()
    n = self._reduced_count(axis)
    sums = squares.sum(axis=axis, keepdim=keepdim)
    if isinstance(dof := n - correction, int) and dof < 0 and sums.requires_grad and not Tensor.no_grad:
      # the value divides by max(0, dof), torch's derivative by dof itself: 0 * -1/|dof| is 0 there, not NaN
      return F.WithGrad.apply(sums, sums.detach().div(0), sums.detach().full_like(1.0 / dof), n=1)
    # a symbolic count (a bound Variable axis) is clamped at launch, like the int case
    return sums.div(max(0, dof) if isinstance(dof, int) else Tensor.from_node(dof, self.device, sums.dtype).maximum(0))

  def std(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, correction: int = 1) -> Tensor:
    """Standard deviation over axis; its gradient is 0 where it is 0 (torch's rule, sqrt's derivative would be inf)."""
    var = self.var(axis, keepdim, correction)
    if Tensor.no_grad or not var.requires_grad:
      return var.sqrt()
    value = var.detach().sqrt()
    return F.WithGrad.apply(var, value, (value == 0).where(0, (value * 2).reciprocal()), n=1)

  def var_mean(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, correction: int = 1) -> Tuple[Tensor, Tensor]:
    """(var, mean) over axis."""
    return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

  def std_mean(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, correction: int = 1) -> Tuple[Tensor, Tensor]:
    """(std, mean) over axis."""
    return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

  def prod(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False, acc_dtype: Optional[DTypeLike] = None) -> Tensor:
    """Product over axis (a tree of multiplies, exact for negatives and zeros)."""
    acc = _to_dtype(acc_dtype) if acc_dtype is not None else (self.dtype if dtypes.is_float(self.dtype) else sum_acc_dtype(self.dtype))
    x = self.cast(acc)
    if self.ndim == 0:
      return x
    axes = tuple(range(self.ndim)) if axis is None else tuple(dedup(self._resolve_dim(a) for a in (argfix(axis) if isinstance(axis, (list, tuple))
                                                                                                   else (axis,))))
    for a in axes:
      x = x.transpose(a, -1) if a != self.ndim - 1 else x
      while x.shape[-1] > 1:
        if x.shape[-1] % 2:
          x = x.pad(tuple([None] * (x.ndim - 1) + [(0, 1)]), value=1)
        h = x.shape[-1] // 2
        # one kernel per level: fusing all levels would make a kernel whose expression has one leaf per element
        x = (x[..., :h] * x[..., h:]).contiguous()
      if x.shape[-1] == 0:
        x = Tensor.ones(*x.shape[:-1], 1, dtype=x.dtype, device=x.device)
      x = x.transpose(a, -1) if a != self.ndim - 1 else x
    return x if keepdim else x.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def _softmax(self, axis: int) -> Tuple[Tensor, Tensor, Tensor]:
    m = self - self.max(axis=axis, keepdim=True).detach()
    # a float x - max(x) is <= 0 or NaN (the rounded difference of x <= max keeps its sign), which lets exp skip its
    # overflow handling; an int difference may wrap, so ints take the general exp
    e = F.Exp.apply(m, nonpositive=True) if dtypes.is_float(m.dtype) else m.exp()
    return m, e, e.sum(axis=axis, keepdim=True)

  def softmax(self, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along axis (shifted by the max for stability)."""
    _, e, ss = self._softmax(axis)
    return e.div(ss)

  def log_softmax(self, axis: int = -1) -> Tensor:
    """log(softmax(x)) along axis, computed stably."""
    m, _, ss = self._softmax(axis)
    return m - ss.log()

  def logsumexp(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
    """log(sum(exp(x))) over axis, computed stably."""
    m = self.max(axis=axis, keepdim=True).detach()
    m = (m.abs() == float("inf")).where(0, m) if dtypes.is_float(m.dtype) else m
    ret = (self - m).exp().sum(axis=axis, keepdim=keepdim).log()
    return ret + (m if keepdim else m.reshape(ret.shape))

  def argmax(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
    """Index of the (first) maximum along axis (of the flattened tensor when None)."""
    if axis is None:
      return self.flatten().argmax(0) if not keepdim else self.flatten().argmax(0).reshape((1,) * self.ndim)
    if self.ndim == 0:
      return Tensor(0, dtype=dtypes.int32, device=self.device)
    axis = self._resolve_dim(axis)
    if self.shape[axis] == 0:
      raise TensorError(f"argmax of an empty dimension (shape {self.shape}, axis {axis})")
    m = self == self.max(axis=axis, keepdim=True)
    if dtypes.is_float(self.dtype):
      # the max is NaN when any element is, and NaN equals nothing: the first NaN is the answer then, as in torch
      m = m | self.isnan()
    n = cast(int, self.shape[axis])
    idx = m * Tensor.arange(n, 0, -1, device=self.device, requires_grad=False).reshape((n,) + (1,) * (self.ndim - axis - 1))
    return (n - idx.max(axis=axis, keepdim=keepdim)).cast(dtypes.int32)

  def argmin(self, axis: Optional[int] = None, keepdim: bool = False) -> Tensor:
    """Index of the (first) minimum along axis."""
    return self._inverse().argmax(axis=axis, keepdim=keepdim)

  def any(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
    """True where any element along axis is nonzero."""
    return self.cast(dtypes.bool).cast(dtypes.int32).max(axis=axis, keepdim=keepdim).cast(dtypes.bool) if self.numel() \
      else Tensor.zeros(self._reduce_shape(axis, keepdim), dtype=dtypes.bool, device=self.device)

  def all(self, axis: Optional[Union[int, Sequence[int]]] = None, keepdim: bool = False) -> Tensor:
    """True where every element along axis is nonzero."""
    return self.logical_not().any(axis=axis, keepdim=keepdim).logical_not()

  def _reduce_shape(self, axis: Optional[Union[int, Sequence[int]]], keepdim: bool) -> Tuple[sint, ...]:
    axes = tuple(range(self.ndim)) if axis is None else tuple(self._resolve_dim(a) for a in (argfix(axis) if isinstance(axis, (list, tuple))
                                                                                             else (axis,)))
    return tuple(1 if i in axes else s for i, s in enumerate(self.shape)) if keepdim else tuple(s for i, s in enumerate(self.shape) if i not in axes)

  def _cumsum(self, axis: int = 0, _first_zero: bool = False) -> Tensor:
    # a sliding window over the left-padded axis: out[i] = sum(x[i-n+1 .. i])
    n = cast(int, self.shape[axis])
    pl_sz = n - int(not _first_zero and n != 0)
    x = self.transpose(axis, -1)
    x = x.pad2d((pl_sz, -int(_first_zero)))
    return x._pool((n,)).sum(-1).transpose(axis, -1)

  def cumsum(self, axis: int = 0) -> Tensor:
    """Cumulative sum along axis (two stages for long axes, which keeps the work linear-ish)."""
    if self.ndim == 0:
      return self
    axis = self._resolve_dim(axis)
    if self.shape[axis] == 0:
      return self
    split = 256
    if self.shape[axis] <= split * 2:
      return self._cumsum(axis)
    n = cast(int, self.shape[axis])
    ret = self.transpose(axis, -1).pad2d((round_up(n, split) - n, 0))
    ret = ret.unflatten(-1, (-1, split))._cumsum(-1)
    base_add = ret[..., -1]._cumsum(-1, _first_zero=True)  # exclusive: the totals of the chunks before
    base_add = base_add.unsqueeze(-1).expand(*base_add.shape, ret.shape[-1])

    def fix(x: Tensor) -> Tensor:
      return x.flatten(start_dim=-2)[..., -n:].transpose(axis, -1)
    return fix(ret) + fix(base_add)

  @staticmethod
  def _tri(r: sint, c: sint, diagonal: int = 0, **kwargs: Any) -> Tensor:
    if r == 0 or c == 0:
      return Tensor.zeros((r, c), dtype=dtypes.bool, **kwargs)
    return Tensor.arange(cast(int, r), **kwargs).unsqueeze(1).expand(r, c) <= \
      Tensor.arange(-diagonal, cast(int, c) - diagonal, **kwargs).unsqueeze(0).expand(r, c)

  def triu(self, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dims (elements with col - row >= diagonal), zeros elsewhere."""
    if self.ndim < 2:
      raise ShapeError(f"triu needs at least 2 dims, got shape {self.shape}")
    return Tensor._tri(self.shape[-2], self.shape[-1], diagonal=diagonal, device=self.device).where(self, 0).cast(self.dtype)

  def tril(self, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dims (elements with col - row <= diagonal), zeros elsewhere."""
    if self.ndim < 2:
      raise ShapeError(f"tril needs at least 2 dims, got shape {self.shape}")
    return Tensor._tri(self.shape[-2], self.shape[-1], diagonal=diagonal + 1, device=self.device).where(0, self).cast(self.dtype)

  # ***** processing ops *****

  def _pool(self, k_: Tuple[sint, ...], stride: Union[Tuple[int, ...], int] = 1, dilation: Union[Tuple[int, ...], int] = 1) -> Tensor:
    """Sliding windows over the last len(k_) dims: shape (..., *out_sizes, *k_)."""
    if self.ndim < len(k_):
      raise ShapeError(f"can't pool {self.shape} with kernel {k_}")
    s_, d_ = make_pair(stride, len(k_)), make_pair(dilation, len(k_))
    if not len(k_) == len(s_) == len(d_):
      raise ShapeError(f"stride/dilation mismatch kernel:{k_} stride:{s_} dilation:{d_}")
    nb = self.ndim - len(k_)
    noop: List[Optional[Tuple[sint, sint]]] = [None] * nb
    keep: List[sint] = list(self.shape[:nb])
    i_ = self.shape[nb:]
    if any(k > s for k, s in zip(k_, s_)) or any(d != 1 for d in d_):
      o_ = [(i - d * (k - 1) - 1) // s + 1 for i, d, k, s in zip(i_, d_, k_, s_)]
      if any(o <= 0 for o in o_):
        raise ShapeError(f"pooling window {k_} (dilation {d_}) is bigger than the input {i_}")
      # tile each dim enough times that rows of length i+d line up: row j, column c holds x[c + j*d]
      xup = self.repeat([1] * nb + [math.ceil(cast(int, k * (i + d)) / cast(int, i)) for k, i, d in zip(k_, i_, d_)])
      xup = xup.shrink(tuple(noop + [(0, k * (i + d)) for k, i, d in zip(k_, i_, d_)]))
      xup = xup.reshape(keep + flatten((k, i + d) for k, i, d in zip(k_, i_, d_)))
      # take every s-th column, o of them
      xup = xup.shrink(tuple(noop + flatten(((0, k), (0, o * s)) for k, o, s in zip(k_, o_, s_))))
      xup = xup.reshape(keep + flatten((k, o, s) for k, o, s in zip(k_, o_, s_)))
      xup = xup.shrink(tuple(noop + flatten(((0, k), (0, o), (0, 1)) for k, o in zip(k_, o_))))
      xup = xup.reshape(keep + flatten((k, o) for k, o in zip(k_, o_)))
      return xup.permute(*range(nb), *[nb + i * 2 + 1 for i in range(len(i_))], *[nb + i * 2 for i in range(len(i_))])
    # windows that do not overlap: pad/shrink to o*s, split each dim into (o, s) and keep the first k of s
    o_ = [(i + (s - k)) // s for i, s, k in zip(i_, s_, k_)]
    xup = self.pad(tuple(noop + [(0, max(0, o * s - i)) for i, o, s in zip(i_, o_, s_)]))
    xup = xup.shrink(tuple(noop + [(0, o * s) for o, s in zip(o_, s_)]))
    xup = xup.reshape(keep + flatten(((o, s) for o, s in zip(o_, s_))))
    xup = xup.shrink(tuple(noop + flatten(((0, o), (0, k)) for o, k in zip(o_, k_))))
    return xup.permute(*range(nb), *[nb + i * 2 for i in range(len(i_))], *[nb + i * 2 + 1 for i in range(len(i_))])

  def _padding_arg(self, padding: Union[int, Sequence[int]], n: int) -> List[int]:
    """Padding for pad2d order (last dim first, before/after) from an int, one per dim, or 2 per dim."""
    if isinstance(padding, int):
      return [padding] * 2 * n
    padding = list(padding)
    if len(padding) == n:
      return [p for p in reversed(padding) for _ in range(2)]
    if len(padding) == 2 * n:
      return padding
    raise ShapeError(f"padding must be an int or have {n} or {2 * n} entries, got {padding}")

  def _ceil_extra(self, k: Tuple[int, ...], stride: Optional[Union[int, Tuple[int, ...]]], dilation: Union[int, Tuple[int, ...]],
                  pads: List[int]) -> List[int]:
    """Extra right padding (pad2d order) that ceil_mode needs: torch rounds the output size up, but drops a last window
    that would start past the input and its left padding."""
    s_, d_ = make_pair(stride if stride is not None else k, len(k)), make_pair(dilation, len(k))
    extra = []
    for j, (kk, s, d) in enumerate(zip(k[::-1], s_[::-1], d_[::-1])):
      i, pl, pr = cast(int, self.shape[-1 - j]), pads[2 * j], pads[2 * j + 1]
      o = -(-(i + pl + pr - d * (kk - 1) - 1) // s) + 1
      if (o - 1) * s >= i + pl:
        o -= 1
      extra += [0, max(0, (o - 1) * s + d * (kk - 1) + 1 - (i + pl + pr))]
    return extra

  def avg_pool2d(self, kernel_size: Union[int, Tuple[int, ...]] = (2, 2), stride: Optional[Union[int, Tuple[int, ...]]] = None, dilation: int = 1,
                 padding: Union[int, Tuple[int, ...]] = 0, count_include_pad: bool = True, ceil_mode: bool = False) -> Tensor:
    """Average pooling over the last len(kernel_size) dims, like torch's avg_pool: count_include_pad counts the zero
    padding in the divisor (but never the extra windows ceil_mode adds past it); ceil_mode rounds the output size up."""
    k = make_pair(kernel_size)
    pads = self._padding_arg(padding, len(k))
    extra = self._ceil_extra(k, stride, dilation, pads) if ceil_mode else [0] * len(pads)
    all_pads = [p + e for p, e in zip(pads, extra)]
    x = self.pad2d(all_pads)._pool(k, stride if stride is not None else k, dilation)
    axes = tuple(range(-len(k), 0))
    if not any(extra) and (count_include_pad or not any(pads)):
      return x.mean(axis=axes)
    # ones over the positions the divisor counts, zeros over the rest of the padding
    ones = Tensor.ones(self.shape[-len(k):], device=self.device, requires_grad=False)
    ones = ones.pad2d(pads, value=1.0).pad2d(extra) if count_include_pad else ones.pad2d(all_pads)
    counts = ones._pool(k, stride if stride is not None else k, dilation).sum(axis=axes)
    return (x.sum(axis=axes) / counts).cast(x.dtype if dtypes.is_float(x.dtype) else dtypes.default_float)

  def max_pool2d(self, kernel_size: Union[int, Tuple[int, ...]] = (2, 2), stride: Optional[Union[int, Tuple[int, ...]]] = None, dilation: int = 1,
                 padding: Union[int, Tuple[int, ...]] = 0, ceil_mode: bool = False) -> Tensor:
    """Max pooling over the last len(kernel_size) dims (padding counts as -inf); ceil_mode rounds the output size up, like torch."""
    k = make_pair(kernel_size)
    pads = self._padding_arg(padding, len(k))
    if ceil_mode:
      pads = [p + e for p, e in zip(pads, self._ceil_extra(k, stride, dilation, pads))]
    # the input's gradient (each window's share of the pooled gradient: a compare with the max, a count, an index
    # spread back over the window) is written once: left lazy, every kernel that reads it recomputes all that, and
    # BatchNorm's backward before a pool reads it in several reductions (MNIST step b64, one thread: the BatchNorm
    # backward kernels 6.2 -> 4.7 ms)
    x = self.contiguous_backward() if self.requires_grad and not Tensor.no_grad else self
    return x.pad2d(pads, value=dtypes.min(self.dtype))._pool(k, stride if stride is not None else k, dilation).max(axis=tuple(range(-len(k), 0)))

  def conv2d(self, weight: Tensor, bias: Optional[Tensor] = None, groups: int = 1, stride: Union[int, Tuple[int, ...]] = 1,
             dilation: Union[int, Tuple[int, ...]] = 1, padding: Union[int, Sequence[int]] = 0, acc_dtype: Optional[DTypeLike] = None) -> Tensor:
    """N-d convolution (cross-correlation, like torch): self is (bs, cin, *spatial), weight is (cout, cin/groups, *kernel)."""
    from tiny.winograd import winograd_conv2d  # WINO=1: Winograd F(4x4,3x3) for eligible 3x3 convs; None means "not taken"
    if (wino := winograd_conv2d(self, weight, bias, groups, stride, dilation, padding, acc_dtype)) is not None:
      return wino
    if self.ndim < 3 or self.ndim != weight.ndim:
      raise ShapeError(f"conv2d input {self.shape} and weight {weight.shape} need the same number (>=3) of dims")
    cin_, (cout, cin), HW = self.shape[1], weight.shape[:2], weight.shape[2:]  # noqa: N806
    if groups * cin != cin_:
      raise ShapeError(f"input channels {cin_} do not match weight {weight.shape} with {groups=} ({groups * cin} expected)")
    if cout % groups != 0:
      raise ShapeError(f"output channels {cout} are not divisible by {groups=}")
    padding_ = self._padding_arg(padding, len(HW))
    if groups == 1 and all(s == 1 for s in make_pair(stride, len(HW))) and all(d == 1 for d in make_pair(dilation, len(HW))) and \
        all(isinstance(k, int) for k in HW) and all(0 <= p <= cast(int, HW[len(HW) - 1 - i // 2]) - 1 for i, p in enumerate(padding_)):
      # the common case gets a direct backward (see function.Conv)
      x = self
      if any(padding_) and self._pads_conv_input(padding_):
        x, padding_ = self.pad2d(padding_).contiguous(), [0] * len(padding_)
      ret = F.Conv.apply(x, weight, padding=tuple(padding_), acc_dtype=_to_dtype(acc_dtype) if acc_dtype is not None else None)
    else:
      ret = self._conv_composed(weight, groups, stride, dilation, padding_, acc_dtype)
    return ret if bias is None else ret.add(bias.reshape(1, -1, *[1] * len(HW)))

  def _renderer(self) -> Optional[Renderer]:
    """The renderer of this tensor's device, for the layout hooks dot and conv2d ask; None for a multi-device tensor, a
    symbolic shape, or a device without a code generator (DISK, NPY), which computes nothing itself."""
    if not isinstance(self.lazydata, LazyBuffer) or not all_int(self.shape):
      return None
    try:
      return Device.renderer(self.device)
    except Exception:  # noqa: BLE001 - a plugin's failure to build a renderer only means no layout hint
      return None

  def _pads_conv_input(self, padding: Sequence[int]) -> bool:
    """Whether the device's renderer wants this input copied into a zero-padded buffer (`Renderer.pads_conv_input`)."""
    if (renderer := self._renderer()) is None:
      return False
    spatial = self.shape[2:]
    padded = tuple(cast(int, s) + padding[2 * (len(spatial) - 1 - i)] + padding[2 * (len(spatial) - 1 - i) + 1] for i, s in enumerate(spatial))
    return renderer.pads_conv_input(padded, self.dtype)

  def _conv_composed(self, weight: Tensor, groups: int = 1, stride: Union[int, Tuple[int, ...]] = 1, dilation: Union[int, Tuple[int, ...]] = 1,
                     padding: Sequence[int] = (), acc_dtype: Optional[DTypeLike] = None) -> Tensor:
    """conv2d without bias as movement ops, a multiply and a reduce; padding in pad2d order (see _padding_arg)."""
    bs, (cout, cin), HW = self.shape[0], weight.shape[:2], weight.shape[2:]  # noqa: N806
    padding_ = list(padding) if padding else [0] * 2 * len(HW)
    x = self.pad2d(padding_)._pool(HW, stride, dilation)   # (bs, groups*cin, *oyx, *HW)
    rcout, oyx = cout // groups, x.shape[2:-len(HW)]
    x = x.reshape(bs, groups, cin, 1, *oyx, *HW).expand(bs, groups, cin, rcout, *oyx, *HW)
    x = x.permute(0, 1, 3, *[4 + i for i in range(len(oyx))], 2, *[4 + len(oyx) + i for i in range(len(HW))])
    # (bs, groups, rcout, *oyx, cin, *HW) * weight, reduced over cin and the kernel
    return (x * weight.reshape(1, groups, rcout, *[1] * len(oyx), cin, *HW)).sum([-1 - i for i in range(1 + len(oyx))], keepdim=True,
                                                                                 acc_dtype=acc_dtype).reshape(bs, cout, *oyx)

  def conv_transpose2d(self, weight: Tensor, bias: Optional[Tensor] = None, groups: int = 1, stride: Union[int, Tuple[int, ...]] = 1,
                       dilation: Union[int, Tuple[int, ...]] = 1, padding: Union[int, Tuple[int, ...]] = 0,
                       output_padding: Union[int, Tuple[int, ...]] = 0) -> Tensor:
    """Transposed convolution: weight is (cin, cout/groups, *kernel), like torch."""
    if self.ndim < 3 or self.ndim != weight.ndim:
      raise ShapeError(f"conv_transpose2d input {self.shape} and weight {weight.shape} need the same number (>=3) of dims")
    HW, trailing = cast(Tuple[int, ...], weight.shape[2:]), list(range(3, weight.ndim + 1))  # noqa: N806
    x, w = self, weight.unflatten(0, (groups, -1)).permute(0, 2, 1, *trailing).flip(trailing)
    strides = make_pair(stride, len(HW))
    if any(s > 1 for s in strides):
      # spread the input out: s-1 zeros between neighbours
      x = x.reshape(*x.shape[:2], *flatten((k, 1) for k in x.shape[2:]))
      x = x.pad((None, None, *flatten((None, (0, s - 1)) for s in strides)))
      x = x.reshape(*x.shape[:2], *[k * s for k, s in zip(x.shape[2::2], strides)])
      x = x.shrink((None, None, *[(0, k - (s - 1)) for k, s in zip(x.shape[2:], strides)]))
    pads = flatten((((k - 1) * d - p, (k - 1) * d - p + op) for k, d, p, op in
                    reversed(list(zip(HW, make_pair(dilation, len(HW)), make_pair(padding, len(HW)), make_pair(output_padding, len(HW)))))))
    return x.conv2d(w.flatten(end_dim=1), groups=groups, bias=bias, dilation=dilation, padding=pads)

  def dot(self, w: Tensor, acc_dtype: Optional[DTypeLike] = None) -> Tensor:
    """Matrix product with numpy/torch rules for 1-D operands and broadcast batch dims."""
    n1, n2 = self.ndim, w.ndim
    if n1 == 0 or n2 == 0:
      raise ShapeError(f"both arguments to matmul need to be at least 1D, got {n1}D and {n2}D")
    if (L := self.shape[-1]) != (R := w.shape[-min(n2, 2)]):  # noqa: N806
      raise ShapeError(f"shapes {self.shape} and {w.shape} cannot be multiplied ({L} != {R})")
    out_dtype = least_upper_dtype(self.dtype, w.dtype) if acc_dtype is None else _to_dtype(acc_dtype)
    if n1 >= 2 and n2 == 2 and (width := self._matmul_panel(w)):
      return self._dot_panels(w, width, acc_dtype).cast(out_dtype)
    if n2 == 2 and (block := self._matvec_split(w, acc_dtype)):
      return self._dot_split_reduce(w, block, acc_dtype).cast(out_dtype)
    if n1 >= 2 and n2 >= 3 and self._strided_columns(w):
      w = w.contiguous()
    x = self.reshape(*self.shape[0:-1], *[1] * min(n1 - 1, n2 - 1, 1), self.shape[-1])
    w = w.reshape(*w.shape[0:-2], *[1] * min(n1 - 1, n2 - 1, 1), *w.shape[-min(n2, 2):]).transpose(-1, -min(n2, 2))
    return (x * w).sum(-1, acc_dtype=acc_dtype).cast(out_dtype)

  def _matmul_panel(self, w: Tensor) -> int:
    """The panel width the device's renderer asks for self @ w (2-D w), 0 when it packs nothing."""
    if not isinstance(w.lazydata, LazyBuffer) or self.device != w.device or self.dtype != w.dtype or not all_int(w.shape) or \
        (renderer := self._renderer()) is None:
      return 0
    m, (k, n) = prod(cast(Tuple[int, ...], self.shape[:-1])), cast(Tuple[int, int], w.shape)
    width = renderer.matmul_panel(m, k, n, self.dtype)
    return width if width > 1 and n % width == 0 else 0

  def _matvec_split(self, w: Tensor, acc_dtype: Optional[DTypeLike]) -> int:
    """Rows of w per reduce block the device's renderer asks for self @ w (one row of self, 2-D row-major w), 0: none."""
    if not isinstance(w.lazydata, LazyBuffer) or self.device != w.device or self.dtype != w.dtype or not all_int(w.shape) or \
        not all_int(self.shape) or (acc_dtype is not None and _to_dtype(acc_dtype) != self.dtype) or (renderer := self._renderer()) is None:
      return 0
    m, (k, n) = prod(cast(Tuple[int, ...], self.shape[:-1])), cast(Tuple[int, int], w.shape)
    # rows of w must be contiguous for the blocks to stream them (x @ W.T reads W along its rows already)
    if w.lazydata.st.real_strides() != (n, 1):
      return 0
    block = renderer.matvec_split(m, k, n, self.dtype)
    return block if 1 < block < k and k % block == 0 else 0

  def _dot_split_reduce(self, w: Tensor, block: int, acc_dtype: Optional[DTypeLike]) -> Tensor:
    """self @ w as partial sums over blocks of `block` rows of w, then their sum (see `Renderer.matvec_split`)."""
    k, n = cast(Tuple[int, int], w.shape)
    x = self.reshape(*self.shape[:-1], k // block, block, 1)
    partial = (x * w.reshape(k // block, block, n)).sum(-2, acc_dtype=acc_dtype)   # (..., k // block, n)
    return partial.sum(-2, acc_dtype=acc_dtype)

  def _strided_columns(self, w: Tensor) -> bool:
    """True when a batched product self @ w (3-D or more w) should read w from a copy whose columns are contiguous: the
    renderer packs products of this size (`Renderer.matmul_panel`, rows counted over the batch) and w's columns are not
    contiguous (attention's q @ k^T reads k^T). Reading them strided, a CPU kernel vectorizes along the reduce and sums
    every output's vector lanes; from the copy it vectorizes along the columns (GPT-2's 12 x 128 x 128 x 64 scores on
    one AVX-512 core: ~900 us -> ~110 us copy + ~210 us product)."""
    if not isinstance(w.lazydata, LazyBuffer) or self.device != w.device or self.dtype != w.dtype or not all_int(w.shape) or \
        (renderer := self._renderer()) is None:
      return False
    m, (k, n) = prod(cast(Tuple[int, ...], self.shape[:-1])), cast(Tuple[int, int], w.shape[-2:])
    if renderer.matmul_panel(m, k, n, self.dtype) <= 1:
      return False
    # (a broadcast along the columns, stride 0, is not materialized: every column reads the same values)
    return w.lazydata.st.real_strides()[-1] not in (0, 1)

  def _dot_panels(self, w: Tensor, width: int, acc_dtype: Optional[DTypeLike]) -> Tensor:
    """self @ w with w first copied into contiguous panels of `width` columns (see `Renderer.matmul_panel`)."""
    from tiny.panel_cache import cached_panels, pack_panels
    k, n = cast(Tuple[int, int], w.shape)
    # (n // width, k, width): kept from an earlier call while w's buffer is unchanged (see tiny.panel_cache)
    if (panels := cached_panels(w, width)) is None:
      panels = pack_panels(w, width)
    if (fast := self._dot_panels_untracked(panels, acc_dtype)) is not None:
      return fast
    x = self.reshape(*self.shape[:-1], 1, 1, k)
    out = (x * panels.permute(0, 2, 1)).sum(-1, acc_dtype=acc_dtype)       # (..., n // width, width)
    return out.reshape(*self.shape[:-1], n)

  def _dot_panels_untracked(self, panels: Tensor, acc_dtype: Optional[DTypeLike]) -> Optional[Tensor]:
    """The product of `_dot_panels` built on the LazyBuffers directly, where no autograd graph is recorded for it (under
    Tensor.no_grad, or neither operand requires a gradient), both are single-device LazyBuffers and the sum accumulates in
    their own dtype. It is the same lazy graph the Tensor ops below build (reshape, permute, expand, MUL, SUM over the
    last axis, reshape), without their nine Function objects: ~130 us of Python per call, ~2% of a 1024² product on two
    cores. None: use the Tensor ops."""
    x, p = self.lazydata, panels.lazydata
    rg = (self.requires_grad, panels.requires_grad)
    if (True in rg and not Tensor.no_grad) or x.__class__ is not LazyBuffer or p.__class__ is not LazyBuffer or \
        (acc_dtype is not None and _to_dtype(acc_dtype) != self.dtype) or sum_acc_dtype(self.dtype) != self.dtype:
      return None
    lead, (groups, k, width) = self.shape[:-1], p.shape
    full = (*lead, groups, width, k)
    xs = x.reshape((*lead, 1, 1, k)).expand(full)
    ps = p.permute((0, 2, 1)).reshape((*[1] * len(lead), groups, width, k)).expand(full)
    out = Tensor.__new__(Tensor)
    out.lazydata = xs.e(BinaryOps.MUL, ps).r(ReduceOps.SUM, (len(full) - 1,)).reshape((*lead, groups * width))
    # what Function.apply gives a product it records no context for
    out.grad, out._ctx = None, None
    out.requires_grad = True if True in rg else None if None in rg else False
    return out

  def matmul(self, x: Tensor, reverse: bool = False, acc_dtype: Optional[DTypeLike] = None) -> Tensor:
    """self @ x (x @ self when reverse)."""
    return x.dot(self, acc_dtype=acc_dtype) if reverse else self.dot(x, acc_dtype=acc_dtype)

  @staticmethod
  def einsum(formula: str, *raw_xs: Any, acc_dtype: Optional[DTypeLike] = None) -> Tensor:
    """Einstein summation, e.g. Tensor.einsum('ij,jk->ik', a, b); supports '...' and implicit output."""
    xs: Tuple[Tensor, ...] = argfix(*raw_xs)
    formula = formula.replace(" ", "")
    lhs, rhs = (formula.split("->", 1)[0], formula.split("->", 1)[1]) if "->" in formula else (formula, None)
    inputs = lhs.split(",")
    if len(inputs) != len(xs):
      raise ValueError(f"einsum formula has {len(inputs)} operands but {len(xs)} tensors were given")
    if "..." in formula:
      free = [c for c in string.ascii_letters if c not in formula]
      n_ell = max((x.ndim - (len(inp) - 3) for inp, x in zip(inputs, xs) if "..." in inp), default=0)
      ell = "".join(free[:n_ell])
      inputs = [inp.replace("...", ell[len(ell) - (x.ndim - (len(inp) - 3)):] if x.ndim - (len(inp) - 3) > 0 else "") for inp, x in zip(inputs, xs)]
      if rhs is not None:
        rhs = rhs.replace("...", ell)
      else:
        rhs = ell + "".join(sorted(c for c in set("".join(inputs)) if "".join(inputs).count(c) == 1 and c not in ell))
    elif rhs is None:
      joined = "".join(inputs)
      rhs = "".join(sorted(c for c in set(joined) if joined.count(c) == 1))
    for inp, x in zip(inputs, xs):
      if len(inp) != x.ndim:
        raise ShapeError(f"einsum operand '{inp}' has {len(inp)} letters but the tensor has shape {x.shape}")
    # a letter repeated in one operand ('ii->i') takes that operand's diagonal over those dims
    diag = [_einsum_diagonal(x, inp) for inp, x in zip(inputs, xs)]
    inputs, xs = [d[1] for d in diag], tuple(d[0] for d in diag)
    sizes: Dict[str, sint] = {}
    for inp, x in zip(inputs, xs):
      for c, s in zip(inp, x.shape):
        if c in sizes and sizes[c] != s and s != 1 and sizes[c] != 1:
          raise ShapeError(f"einsum letter '{c}' has sizes {sizes[c]} and {s}")
        sizes[c] = s if c not in sizes or sizes[c] == 1 else sizes[c]
    letters = sorted(sizes)
    if any(c not in sizes for c in rhs):
      raise ValueError(f"einsum output '{rhs}' has letters that no input has")
    aligned = []
    for inp, x in zip(inputs, xs):
      order = sorted(range(len(inp)), key=lambda i: inp[i])
      x = x.permute(order) if order else x
      aligned.append(x.reshape([sizes[c] if c in inp and x.shape[sorted(inp).index(c)] != 1 else 1 for c in letters] if letters else ())
                     .expand([sizes[c] for c in letters]) if letters else x)
    prodt = functools.reduce(lambda a, b: a * b, aligned)
    summed = prodt.sum(axis=[i for i, c in enumerate(letters) if c not in rhs], acc_dtype=acc_dtype) if any(c not in rhs for c in letters) else prodt
    kept = [c for c in letters if c in rhs]
    return summed.permute([kept.index(c) for c in rhs]) if rhs else summed

  def sequential(self, ll: List[Callable[[Tensor], Tensor]]) -> Tensor:
    """Apply the callables in order."""
    return functools.reduce(lambda x, f: f(x), ll, self)

  def layernorm(self, axis: Union[int, Sequence[int]] = -1, eps: float = 1e-5) -> Tensor:
    """Normalize to zero mean and unit variance over axis (no affine part)."""
    y = self - self.mean(axis, keepdim=True)
    return y.mul((y * y).mean(axis, keepdim=True).add(eps).rsqrt())

  def batchnorm(self, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor, invstd: Tensor,
                axis: Union[int, Tuple[int, ...]] = 1) -> Tensor:
    """(self - mean) * invstd * weight + bias, the statistics broadcast along axis."""
    axis_ = tuple(self._resolve_dim(a) for a in argfix(axis))
    shape = tuple(s if ax in axis_ else 1 for ax, s in enumerate(self.shape))
    x = self - mean.reshape(shape)
    if weight is not None:
      x = x * weight.reshape(shape)
    ret = x.mul(invstd.reshape(shape) if invstd.ndim == len(axis_) else invstd)
    return (ret + bias.reshape(shape)) if bias is not None else ret

  def dropout(self, p: float = 0.5) -> Tensor:
    """Zero elements with probability p and scale the rest by 1/(1-p), in training mode only."""
    if not 0 <= p <= 1:
      raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not Tensor.training or p == 0:
      return self
    if p == 1:
      return self * 0
    mask = Tensor.rand(*self.shape, requires_grad=False, dtype=dtypes.float32, device=self.device) >= p
    return mask.where(self, 0) * (1 / (1.0 - p))

  def one_hot(self, num_classes: int = -1) -> Tensor:
    """A new last dim of size num_classes with 1 at the index held in self (num_classes=-1 uses max+1).

    Valid class values are 0..num_classes-1. They are not checked by default (that would need a device sync): an
    out-of-range one gives an all-zero row. With CHECK_INDEX=1 they are read back and an out-of-range one raises
    IndexError (torch raises RuntimeError); the check is skipped while a TinyJit captures."""
    if not dtypes.is_int(self.dtype):
      raise DTypeError(f"one_hot needs an integer tensor, got {self.dtype}")
    if num_classes == -1:
      num_classes = int(self.max().item()) + 1 if self.numel() else 0
    check_index_tensor(self, num_classes, f"one_hot with num_classes={num_classes}", allow_negative=False)
    return (self[..., None] == Tensor.arange(num_classes, requires_grad=False, device=self.device)).where(1, 0)

  def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                   is_causal: bool = False) -> Tensor:
    """softmax(q @ k^T / sqrt(d) + mask) @ v; a bool mask marks the positions that may attend, is_causal adds the causal mask."""
    if is_causal:
      if attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal, not both")
      attn_mask = Tensor.ones(self.shape[-2], key.shape[-2], requires_grad=False, device=self.device).tril(0).cast(dtypes.bool)
    if attn_mask is not None and attn_mask.dtype == dtypes.bool:
      attn_mask = attn_mask.where(0, -float("inf"))
    qk = self.matmul(key.transpose(-2, -1), acc_dtype=least_upper_dtype(self.dtype, key.dtype, dtypes.float32)) / math.sqrt(cast(int, self.shape[-1]))
    return ((qk + attn_mask) if attn_mask is not None else qk).softmax(-1).cast(self.dtype).dropout(dropout_p) @ value

  def _do_reduction(self, reduction: str = "mean") -> Tensor:
    if reduction not in ("none", "mean", "sum"):
      raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    return self.mean() if reduction == "mean" else self.sum() if reduction == "sum" else self

  def binary_crossentropy(self, y: Tensor, reduction: str = "mean") -> Tensor:
    """BCE of probabilities self against targets y (logs clamped at -100 like torch)."""
    return (-y * self.log().maximum(-100) - (1 - y) * (1 - self).log().maximum(-100))._do_reduction(reduction)

  def binary_crossentropy_logits(self, y: Tensor, reduction: str = "mean") -> Tensor:
    """BCE with the sigmoid folded in, computed stably from logits."""
    return (self.maximum(0) - y * self + (1 + self.abs().neg().exp()).log())._do_reduction(reduction)

  def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,  # noqa: N803
                                      reduction: str = "mean") -> Tensor:
    """Cross entropy of logits self (..., classes) against integer labels Y; labels equal to ignore_index count for nothing."""
    if not 0.0 <= label_smoothing <= 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if Y.shape != self.shape[:-1]:
      raise ShapeError(f"labels of shape {Y.shape} do not match logits of shape {self.shape}")
    log_probs, loss_mask = self.log_softmax(), (Y != ignore_index)
    y = (Y.unsqueeze(-1) == Tensor.arange(cast(int, self.shape[-1]), requires_grad=False, device=self.device)) & loss_mask.unsqueeze(-1)
    smoothing = label_smoothing * (log_probs.mean(-1) * loss_mask)
    loss = -((1 - label_smoothing) * y.where(log_probs, 0).sum(-1) + smoothing)
    if reduction == "mean":
      return loss.sum() / loss_mask.sum()
    return loss._do_reduction(reduction)

  def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:  # noqa: N803
    """torch-style cross entropy of logits self (N, C, ...) against class indices (N, ...) or class probabilities (N, C, ...)."""
    if not 0.0 <= label_smoothing <= 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    cdim = 1 if self.ndim > 1 else 0
    nc = cast(int, self.shape[cdim])
    if Y.ndim == self.ndim - 1:
      Y = Y.one_hot(nc)  # noqa: N806
      if cdim == 1 and Y.ndim > 2:
        Y = Y.permute(0, Y.ndim - 1, *range(1, Y.ndim - 1))  # noqa: N806
    elif Y.shape != self.shape:
      raise ShapeError(f"targets of shape {Y.shape} do not match logits of shape {self.shape}")
    Y = (1 - label_smoothing) * Y + label_smoothing / nc  # noqa: N806
    return (-self.log_softmax(axis=cdim).mul(Y).sum(axis=cdim))._do_reduction(reduction)

  def nll_loss(self, Y: Tensor, weight: Optional[Tensor] = None, ignore_index: Optional[int] = None, reduction: str = "mean") -> Tensor:  # noqa: N803
    """Negative log likelihood of log-probabilities self (N, C, ...) at class indices Y (N, ...)."""
    cdim = 1 if self.ndim > 1 else 0
    nc = cast(int, self.shape[cdim])
    w = Tensor.ones(nc, device=self.device) if weight is None else weight
    mask = Tensor.ones_like(Y, dtype=dtypes.bool) if ignore_index is None else (Y != ignore_index)
    yh = Y.one_hot(nc)
    if cdim == 1 and yh.ndim > 2:
      yh = yh.permute(0, yh.ndim - 1, *range(1, yh.ndim - 1))
    wshape = [1] * self.ndim
    wshape[cdim] = nc
    picked = (yh * w.reshape(wshape))
    loss = -(self * picked).sum(cdim) * mask
    if reduction == "mean":
      return loss.sum() / (picked.sum(cdim) * mask).sum()
    return loss._do_reduction(reduction)

  def linear(self, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """self @ weight + bias (an elementwise multiply for a 1-D weight)."""
    x = self.mul(weight) if weight.ndim == 1 else self.dot(weight)
    return x.add(bias) if bias is not None else x

  # ***** unary ops *****

  def logical_not(self) -> Tensor:
    """True where self is zero/False."""
    return F.Neq.apply(*self.cast(dtypes.bool)._broadcasted(True))

  def neg(self) -> Tensor:
    """-self (logical not for bools)."""
    return self.logical_not() if self.dtype == dtypes.bool else F.Neg.apply(self)

  def contiguous(self) -> Tensor:
    """This data in a buffer of its own (a kernel boundary)."""
    return F.Contiguous.apply(self)

  def contiguous_backward(self) -> Tensor:
    """Identity, with a contiguous gradient."""
    return F.ContiguousBackward.apply(self)

  def log(self) -> Tensor:
    """Natural logarithm."""
    return F.Log.apply(self.cast(least_upper_float(self.dtype)))

  def log2(self) -> Tensor:
    """Base-2 logarithm."""
    return self.log() / math.log(2)

  def exp(self) -> Tensor:
    """e ** self."""
    return F.Exp.apply(self.cast(least_upper_float(self.dtype)))

  def exp2(self) -> Tensor:
    """2 ** self."""
    return F.Exp2.apply(self.cast(least_upper_float(self.dtype)))

  def relu(self) -> Tensor:
    """max(self, 0)."""
    return F.Relu.apply(self)

  def sigmoid(self) -> Tensor:
    """1 / (1 + exp(-self))."""
    return F.Sigmoid.apply(self.cast(least_upper_float(self.dtype)))

  def sqrt(self) -> Tensor:
    """Square root."""
    return F.Sqrt.apply(self.cast(least_upper_float(self.dtype)))

  def rsqrt(self) -> Tensor:
    """1 / sqrt(self)."""
    # not sqrt(1/x): 1/x overflows to inf for subnormal x, whose rsqrt is finite
    return self.sqrt().reciprocal()

  def sin(self) -> Tensor:
    """Sine."""
    return F.Sin.apply(self.cast(least_upper_float(self.dtype)))

  def cos(self) -> Tensor:
    """Cosine."""
    return ((math.pi / 2) - self.cast(least_upper_float(self.dtype))).sin()

  def tan(self) -> Tensor:
    """Tangent."""
    return self.sin() / self.cos()

  def asin(self) -> Tensor:
    """Inverse sine (Abramowitz-Stegun 4.4.46 polynomial, |error| < 2e-8)."""
    coefficients = [-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874, -0.2145988016, 1.5707963050]
    x = self.cast(least_upper_float(self.dtype))
    ax = x.abs()
    poly = functools.reduce(lambda acc, c: acc * ax + c, coefficients[1:], ax * 0 + coefficients[0])
    return x.sign() * (math.pi / 2 - (1.0 - ax).sqrt() * poly)

  def acos(self) -> Tensor:
    """Inverse cosine."""
    return math.pi / 2 - self.asin()

  def atan(self) -> Tensor:
    """Inverse tangent."""
    x = self.cast(least_upper_float(self.dtype))
    return (x / (1 + x * x).sqrt()).asin()

  def _trunc_parts(self) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    # (x, s, ax, fits, i): fits marks the nonzero x that can have a fraction (floats this big are whole, inf/NaN must
    # not go through an int cast, and zeros are their own result); there s = sign(x), ax = |x| and i = int(|x|).
    # Callers rebuild the result as s * float(...): an int has no -0, and torch gives trunc(-0.5) == -0.0
    limit = 2.0 ** {2: 10, 4: 23, 8: 52}[self.dtype.itemsize] if self.dtype != dtypes.bfloat16 else 2.0 ** 7
    x = self.detach()
    s = x.sign()
    ax = x * s
    fits = (ax < limit) & (x != 0)
    return x, s, ax, fits, fits.where(ax, 0).cast(dtypes.int64 if self.dtype == dtypes.float64 else dtypes.int32)

  def trunc(self) -> Tensor:
    """Round toward zero."""
    if not dtypes.is_float(self.dtype):
      return self
    x, s, _, fits, i = self._trunc_parts()
    return fits.where(s * i.cast(self.dtype), x)

  def ceil(self) -> Tensor:
    """Round up."""
    if not dtypes.is_float(self.dtype):
      return self
    return (self > (b := self.trunc())).where(b + 1, b)

  def floor(self) -> Tensor:
    """Round down."""
    if not dtypes.is_float(self.dtype):
      return self
    return (self < (b := self.trunc())).where(b - 1, b)

  def round(self) -> Tensor:
    """Round half to even (like numpy and torch)."""
    if not dtypes.is_float(self.dtype):
      return self
    # from the truncation and the exact fraction left over: no x + 0.5 that rounds (0.49999997 + 0.5 == 1.0 in float32)
    x, s, ax, fits, i = self._trunc_parts()
    frac = ax - i.cast(self.dtype)
    away = (frac > 0.5) | ((frac == 0.5) & ((i & 1) != 0))
    return fits.where(s * (i + away.cast(i.dtype)).cast(self.dtype), x)

  def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
    """True where self is +inf (detect_positive) or -inf (detect_negative)."""
    return ((self == float("inf")) & detect_positive) | ((self == float("-inf")) & detect_negative)

  def isnan(self) -> Tensor:
    """True where self is NaN."""
    return self != self

  def lerp(self, end: Tensor, weight: Union[Tensor, float]) -> Tensor:
    """self + (end - self) * weight."""
    return self + (end - self) * weight

  def square(self) -> Tensor:
    """self * self."""
    return self * self

  def clip(self, min_: Optional[ConstType] = None, max_: Optional[ConstType] = None) -> Tensor:
    """Clamp to [min_, max_] (either may be None)."""
    if min_ is None and max_ is None:
      raise ValueError("clip needs at least one of min_ and max_")
    x = self.maximum(min_) if min_ is not None else self
    return x.minimum(max_) if max_ is not None else x

  def clamp(self, min_: Optional[ConstType] = None, max_: Optional[ConstType] = None) -> Tensor:
    """Alias of clip."""
    return self.clip(min_, max_)

  def sign(self) -> Tensor:
    """-1, 0 or 1."""
    if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool:
      return (self != 0).cast(self.dtype)
    return F.Sign.apply(self)

  def abs(self) -> Tensor:
    """Absolute value."""
    if dtypes.is_unsigned(self.dtype) or self.dtype == dtypes.bool:
      return self
    # x * s with s = -1, 1, or x itself for the zeros: 0*0 is +0.0 for -0.0 too (x * sign(x) and selects keep -0.0),
    # and the gradient at 0 is 0. A product on top, not a select, keeps the CPU kernel vectorized
    return self * (self < 0).where(-1, (self != 0).where(1, self))

  def reciprocal(self) -> Tensor:
    """1 / self."""
    return F.Reciprocal.apply(self.cast(least_upper_float(self.dtype)))

  # ***** activation functions *****

  def elu(self, alpha: float = 1.0) -> Tensor:
    """Exponential linear unit."""
    return self.relu() - alpha * (1 - self.exp()).relu()

  def celu(self, alpha: float = 1.0) -> Tensor:
    """Continuously differentiable ELU."""
    return self.maximum(0) + (alpha * ((self / alpha).exp() - 1)).minimum(0)

  def selu(self, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
    """Scaled ELU."""
    return gamma * (self >= 0).detach().where(self, alpha * (self.exp() - 1))

  def swish(self) -> Tensor:
    """self * sigmoid(self)."""
    return self * self.sigmoid()

  def silu(self) -> Tensor:
    """Alias of swish."""
    return self.swish()

  def relu6(self) -> Tensor:
    """min(max(self, 0), 6)."""
    return self.relu() - (self - 6).relu()

  def hardswish(self) -> Tensor:
    """self * relu6(self + 3) / 6."""
    return self * (self + 3).relu6() * (1 / 6)

  def tanh(self) -> Tensor:
    """Hyperbolic tangent."""
    x = self.cast(least_upper_float(self.dtype))
    # below this |x|, tanh(x) rounds to x (x^3/3 is under half an ulp): returning x there keeps -0.0 and the relative
    # accuracy that 2*sigmoid(2x)-1 loses to cancellation near 0
    small = 2.0 ** -({dtypes.float16: 6, dtypes.bfloat16: 4, dtypes.float64: 27}.get(x.dtype, 12))
    near0 = (x * x < small * small).detach()
    far = 2.0 * ((2.0 * x).sigmoid()) - 1.0
    # near0 ? x : far, as arithmetic: a select on top would keep the CPU kernel from being vectorized. Near 0 the far
    # term is -(far * +0) = -0.0, which leaves x unchanged, -0.0 included (+0.0 would turn -0.0 into +0.0)
    return near0.where(x, 0) - far * near0.where(0.0, -1.0)

  def sinh(self) -> Tensor:
    """Hyperbolic sine."""
    return (self.exp() - self.neg().exp()) / 2

  def cosh(self) -> Tensor:
    """Hyperbolic cosine."""
    return (self.exp() + self.neg().exp()) / 2

  def atanh(self) -> Tensor:
    """Inverse hyperbolic tangent."""
    return ((1 + self) / (1 - self)).log() / 2

  def asinh(self) -> Tensor:
    """Inverse hyperbolic sine."""
    return (self + (self.square() + 1).sqrt()).log()

  def acosh(self) -> Tensor:
    """Inverse hyperbolic cosine."""
    return (self + (self.square() - 1).sqrt()).log()

  def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
    """Clamp to [min_val, max_val]."""
    return self.clip(min_val, max_val)

  def gelu(self) -> Tensor:
    """GELU, tanh approximation."""
    return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self ** 3)).tanh())

  def quick_gelu(self) -> Tensor:
    """self * sigmoid(1.702 * self)."""
    return self * (self * 1.702).sigmoid()

  def leakyrelu(self, neg_slope: float = 0.01) -> Tensor:
    """relu with slope neg_slope for negatives."""
    return self.relu() - (-neg_slope * self).relu()

  def mish(self) -> Tensor:
    """self * tanh(softplus(self))."""
    return self * self.softplus().tanh()

  def softplus(self, beta: float = 1) -> Tensor:
    """log(1 + exp(beta * self)) / beta, computed without overflow."""
    bx = self * beta
    return (bx.relu() + (1 + (-bx.abs()).exp()).log()) * (1 / beta)

  def softsign(self) -> Tensor:
    """self / (1 + |self|)."""
    return self / (1 + self.abs())

  # ***** broadcasted elementwise ops *****

  def _broadcast_to(self, shape: Tuple[sint, ...]) -> Tensor:
    if self.shape == shape:
      return self
    if self.ndim > len(shape):
      raise ShapeError(f"cannot broadcast tensor of shape {self.shape} to fewer dimensions {shape}")
    padded = _pad_left(self.shape, shape)[0]
    if any(from_ != 1 and from_ != to for from_, to in zip(padded, shape)):
      raise ShapeError(f"cannot broadcast from shape {self.shape} to {shape}")
    return F.Expand.apply(self.reshape(padded), shape=shape)

  def _broadcasted(self, y: Union[Tensor, ConstType, Node], reverse: bool = False, match_dtype: bool = True) -> Tuple[Tensor, Tensor]:
    x: Tensor = self
    if (fast := _scalar_operand(x, y)) is not None:
      return (fast, x) if reverse else (x, fast)
    if isinstance(y, Tensor) and x.shape == y.shape and x.dtype == y.dtype:
      return (y, x) if reverse else (x, y)   # nothing to cast or broadcast
    if not isinstance(y, Tensor):
      if isinstance(y, np.generic):
        y = y.item()
      if not isinstance(y, (bool, int, float, Node)):
        raise TypeError(f"can't combine a Tensor with {type(y).__name__} {y!r}")
      # a Python scalar takes the tensor's dtype when that loses nothing (float tensor, or int tensor and int scalar)
      if isinstance(x.dtype, ImageDType) or dtypes.is_float(x.dtype) or (dtypes.is_int(x.dtype) and isinstance(y, int) and not isinstance(y, bool)):
        y_dtype = x.dtype
      elif x.dtype == dtypes.bool and isinstance(y, bool):
        y_dtype = dtypes.bool
      elif isinstance(y, Node):
        y_dtype = dtypes.default_int
      else:
        y_dtype = dtypes.from_py(y)
      if isinstance(y, Node):
        # a symbolic size (x / n for a bound n, a mean's divisor): computed from its Variables' launch values
        y = Tensor.from_node(y, x.device, y_dtype)
      elif y_dtype == x.dtype and not isinstance(x.dtype, ImageDType):
        # the common case (x + 1): the constant already in x's shape, the same lazy graph as the general path below
        # but without three Tensor-level steps, which were most of an eager op's Python time
        y = Tensor(x.lazydata.const(_wrap_int(int(y), y_dtype) if dtypes.is_int(y_dtype) else dtypes.as_const(y, y_dtype)), x.device, y_dtype,
                   requires_grad=False)
      else:
        y = Tensor(_wrap_int(int(y), y_dtype) if dtypes.is_int(y_dtype) else dtypes.as_const(y, y_dtype), x.device, y_dtype, requires_grad=False)
    if match_dtype and x.dtype != y.dtype:
      output_dtype = least_upper_dtype(x.dtype, y.dtype)
      x, y = x.cast(output_dtype), y.cast(output_dtype)
    if reverse:
      x, y = y, x
    out_shape = _broadcast_shape(x.shape, y.shape)
    return x._broadcast_to(out_shape), y._broadcast_to(out_shape)

  @staticmethod
  def from_node(node: sint, device: Optional[str] = None, dtype: Optional[DTypeLike] = None) -> Tensor:
    """A scalar Tensor holding the value of a symbolic size (sums and products of ints and Variables).

    Each Variable becomes a kernel argument, so a TinyJit capture computes the value of the call it replays."""
    dt = _to_dtype(dtype) if dtype is not None else dtypes.default_int
    if isinstance(node, int):
      return Tensor(node, device, dt, requires_grad=False)
    if isinstance(node, NumNode):
      return Tensor(node.b, device, dt, requires_grad=False)
    if isinstance(node, Variable):
      return Tensor(node, device, dt, requires_grad=False)
    if isinstance(node, MulNode):
      return Tensor.from_node(node.a, device, dt) * (node.b if isinstance(node.b, int) else Tensor.from_node(node.b, device, dt))
    if isinstance(node, SumNode):
      return functools.reduce(lambda acc, n: acc + Tensor.from_node(n, device, dt), node.nodes[1:], Tensor.from_node(node.nodes[0], device, dt))
    raise NotImplementedError(f"a Tensor from the symbolic expression {node} ({type(node).__name__}) is not supported")

  def _to_const_val(self, x: Union[Tensor, ConstType]) -> Union[Tensor, ConstType]:
    # an unrealized constant tensor turns back into a Python scalar, which enables the cheap pow identities
    if isinstance(x, Tensor) and x.lazydata.is_unrealized_unmasked_const() and not x.requires_grad and \
        _broadcast_shape(self.shape, x.shape) == self.shape:
      return x.lazydata.base.arg
    return x

  def add(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """self + x, broadcast."""
    return F.Add.apply(*self._broadcasted(x, reverse))

  def sub(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """self - x, broadcast."""
    a, b = self._broadcasted(x, reverse)
    if a.dtype == dtypes.bool:
      raise DTypeError("subtraction of bool tensors is not supported: use ^ (xor) or logical_not")
    return F.Sub.apply(a, b)

  def mul(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """self * x, broadcast."""
    return F.Mul.apply(*self._broadcasted(x, reverse))

  def div(self, x: Union[Tensor, ConstType, Node], reverse: bool = False, upcast: bool = True) -> Tensor:
    """True division self / x (ints are promoted to float unless upcast=False, which truncates like C)."""
    numerator, denominator = self._broadcasted(x, reverse)
    if upcast:
      numerator, denominator = numerator.cast(least_upper_float(numerator.dtype)), denominator.cast(least_upper_float(denominator.dtype))
    return F.Div.apply(numerator, denominator)

  def idiv(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """Integer division rounding toward zero (C semantics); x.idiv(0) == 0 and MIN.idiv(-1) wraps to MIN."""
    a, b = self._broadcasted(x, reverse)
    if not (dtypes.is_int(a.dtype) or a.dtype == dtypes.bool):
      raise TypeError(f"idiv needs integer tensors, got {a.dtype}")
    return F.Div.apply(a, b)

  def floordiv(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """Division rounding toward -inf (Python's //). Integers follow numpy where Python raises: x // 0 == 0, and
    MIN // -1 wraps to MIN."""
    a, b = self._broadcasted(x, reverse)
    if dtypes.is_float(a.dtype):
      return a.div(b).floor()
    if dtypes.is_unsigned(a.dtype) or a.dtype == dtypes.bool:
      return F.Div.apply(a, b)
    q = F.Div.apply(a, b)
    # truncation rounded up where the division was inexact with operands of opposite signs; the C remainder tells
    # both (and is 0 for a zero divisor, so x // 0 stays 0), without the overflowing q*b of MIN // -1
    return _floor_fix(F.Mod.apply(a, b), b).where(q - 1, q)

  def mod(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """Remainder with the sign of the divisor (Python's %, torch.remainder). Integers follow numpy: x % 0 == 0."""
    a, b = self._broadcasted(x, reverse)
    if not dtypes.is_int(a.dtype):
      return a - a.floordiv(b) * b
    r = F.Mod.apply(a, b)
    if dtypes.is_unsigned(a.dtype):
      return r
    return _floor_fix(r, b).where(r + b, r)

  def xor(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """Bitwise xor (ints and bools)."""
    return F.Xor.apply(*self._bitwise_operands(x, reverse, "xor"))

  def bitwise_and(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """Bitwise and (ints and bools)."""
    return F.BitwiseAnd.apply(*self._bitwise_operands(x, reverse, "and"))

  def bitwise_or(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """Bitwise or (ints and bools)."""
    return F.BitwiseOr.apply(*self._bitwise_operands(x, reverse, "or"))

  def _bitwise_operands(self, x: Union[Tensor, ConstType], reverse: bool, name: str) -> Tuple[Tensor, Tensor]:
    a, b = self._broadcasted(x, reverse)
    if a.dtype != dtypes.bool and not dtypes.is_int(a.dtype):
      raise DTypeError(f"bitwise {name} needs int or bool tensors, got {a.dtype}")
    return a, b

  def lshift(self, x: int) -> Tensor:
    """self << x for integer tensors."""
    if not dtypes.is_int(self.dtype) or not isinstance(x, int) or x < 0:
      raise DTypeError(f"lshift needs an integer tensor and a non-negative int shift, got {self.dtype} and {x!r}")
    return self.mul(1 << x) if x < self.dtype.itemsize * 8 else self * 0

  def rshift(self, x: int) -> Tensor:
    """self >> x for integer tensors (arithmetic shift for signed ints)."""
    if not dtypes.is_int(self.dtype) or not isinstance(x, int) or x < 0:
      raise DTypeError(f"rshift needs an integer tensor and a non-negative int shift, got {self.dtype} and {x!r}")
    if x >= self.dtype.itemsize * 8 - (0 if dtypes.is_unsigned(self.dtype) else 1):
      return self * 0 if dtypes.is_unsigned(self.dtype) else (self < 0).where(-1, 0).cast(self.dtype)
    return self.floordiv(1 << x)

  def pow(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    """self ** x (x ** self when reverse), with exact results for integer exponents.

    The gradients are torch's: d/dbase = e * b ** (e - 1), and 0 where e == 0; d/dexponent = b ** e * log(b), and 0
    where b == 0 and e >= 0 (so NaN for a negative base, -inf for 0 ** negative, as torch gives)."""
    x = self._to_const_val(x)
    if Tensor.no_grad or not (self.requires_grad or (isinstance(x, Tensor) and x.requires_grad)):
      return self._pow(x, reverse)
    if not isinstance(x, Tensor) and not isinstance(x, bool) and not reverse:
      base = self.detach()
      value = base._pow(x)
      d_base = value.zeros_like() if x == 0 else (base._pow(x - 1) * x).cast(value.dtype)
      return F.WithGrad.apply(self, value, d_base, n=1)
    if not isinstance(x, Tensor) and not isinstance(x, bool):
      value = self.detach()._pow(x, reverse=True)
      d_exp = value * math.log(x) if x > 0 else value * float("nan") if x < 0 else (self.detach() >= 0).where(0, value * -math.inf)
      return F.WithGrad.apply(self, value, d_exp.cast(value.dtype), n=1)
    b, e = self._broadcasted(x, reverse=reverse)
    b, e = b.cast(least_upper_float(b.dtype)), e.cast(least_upper_float(e.dtype))
    bd, ed = b.detach(), e.detach()
    value = bd._pow(ed)
    d_base = (ed == 0).where(0, ed * bd._pow(ed - 1))
    d_exp = ((bd == 0) & (ed >= 0)).where(0, value * bd.log())
    return F.WithGrad.apply(b, e, value, d_base, d_exp, n=2)

  def _pow(self, x: Union[Tensor, ConstType], reverse: bool = False) -> Tensor:
    if not isinstance(x, Tensor) and not reverse and not isinstance(x, bool):
      # cheap identities for constant exponents
      if x < 0 and dtypes.is_float(self.dtype):
        return self.reciprocal().pow(-x)
      if x == 0:
        # through sign, which is finite everywhere: x ** 0 is 1 for inf and NaN too (self * 0 would be NaN there)
        return self.sign() * 0 + 1
      if x == 1:
        return self
      if x == 0.5 and dtypes.is_float(self.dtype):
        return self.sqrt()
      if int(x) == x and x > 0:
        half = self.pow(int(x) // 2)
        return half * half * (self if int(x) % 2 else 1)
      if int(x - 0.5) + 0.5 == x and x > 0 and dtypes.is_float(self.dtype):
        return self.pow(int(x - 0.5)) * self.sqrt()
    if not isinstance(x, Tensor) and reverse and not isinstance(x, bool) and x > 0:
      return self.cast(least_upper_float(self.dtype)).mul(math.log(x)).exp()
    base, exponent = self._broadcasted(x, reverse=reverse)
    base, exponent = base.cast(least_upper_float(base.dtype)), exponent.cast(least_upper_float(exponent.dtype))
    # |b| ** e, then fix the sign for negative bases with odd exponents and NaN for fractional ones
    ret = base.abs().log().mul(exponent).exp()
    negative_base = (base < 0).detach()
    odd = (exponent.abs() - (exponent.abs() * 0.5).floor() * 2) == 1
    non_int = exponent != exponent.trunc()
    ret = (negative_base & odd).detach().where(-ret, ret)
    ret = (negative_base & non_int).detach().where(float("nan"), ret)
    return ((base == 0) & (exponent == 0)).detach().where(1.0, ret)

  def maximum(self, x: Union[Tensor, ConstType]) -> Tensor:
    """Elementwise max (the gradient is split evenly on ties)."""
    a, b = self._broadcasted(x)
    if dtypes.is_float(a.dtype):
      # a NaN on either side wins (torch.maximum): a NaN a falls through both compares, a NaN b needs its own
      return ((a < b) | b.isnan()).detach().where(b, (a == b).detach().where((a * 0.5 + b * 0.5).cast(a.dtype), a))
    return (a < b).where(b, a)

  def minimum(self, x: Union[Tensor, ConstType]) -> Tensor:
    """Elementwise min."""
    a, b = self._broadcasted(x)
    return a._inverse().maximum(b._inverse())._inverse()

  def _inverse(self) -> Tensor:
    # an order-reversing map with no overflow: -x for floats, ~x for ints, not for bools
    return -self if dtypes.is_float(self.dtype) else ~self if dtypes.is_int(self.dtype) else self.logical_not()

  def where(self: Tensor, x: Union[Tensor, ConstType], y: Union[Tensor, ConstType]) -> Tensor:
    """Elementwise x where self is true, y elsewhere (self, x, y broadcast)."""
    if isinstance(x, Tensor):
      x, y = x._broadcasted(y)
    elif isinstance(y, Tensor):
      y, x = y._broadcasted(x)
    cond, x_ = self._broadcasted(x, match_dtype=False)
    cond, y_ = cond._broadcasted(y, match_dtype=False)
    xb, yb = x_._broadcasted(y_)
    return F.Where.apply(cond.cast(dtypes.bool), xb, yb)

  def masked_fill(self, mask: Tensor, value: Union[Tensor, ConstType]) -> Tensor:
    """value where mask is true, self elsewhere."""
    return mask.where(value, self)

  # ***** op wrappers *****

  def __neg__(self) -> Tensor:
    return self.neg()

  def __invert__(self) -> Tensor:
    if self.dtype == dtypes.bool:
      return self.logical_not()
    if not dtypes.is_int(self.dtype):
      raise DTypeError(f"~ needs an int or bool tensor, got {self.dtype}")
    return self.xor((1 << (8 * self.dtype.itemsize)) - 1 if dtypes.is_unsigned(self.dtype) else -1)

  def __add__(self, x: Any) -> Tensor:
    return self.add(x)

  def __sub__(self, x: Any) -> Tensor:
    return self.sub(x)

  def __mul__(self, x: Any) -> Tensor:
    return self.mul(x)

  def __pow__(self, x: Any) -> Tensor:
    return self.pow(x)

  def __truediv__(self, x: Any) -> Tensor:
    return self.div(x)

  def __floordiv__(self, x: Any) -> Tensor:
    return self.floordiv(x)

  def __mod__(self, x: Any) -> Tensor:
    return self.mod(x)

  def __matmul__(self, x: Tensor) -> Tensor:
    return self.matmul(x)

  def __and__(self, x: Any) -> Tensor:
    return self.bitwise_and(x)

  def __or__(self, x: Any) -> Tensor:
    return self.bitwise_or(x)

  def __xor__(self, x: Any) -> Tensor:
    return self.xor(x)

  def __lshift__(self, x: int) -> Tensor:
    return self.lshift(x)

  def __rshift__(self, x: int) -> Tensor:
    return self.rshift(x)

  def __abs__(self) -> Tensor:
    return self.abs()

  def __radd__(self, x: Any) -> Tensor:
    return self.add(x, True)

  def __rsub__(self, x: Any) -> Tensor:
    return self.sub(x, True)

  def __rmul__(self, x: Any) -> Tensor:
    return self.mul(x, True)

  def __rpow__(self, x: Any) -> Tensor:
    return self.pow(x, True)

  def __rtruediv__(self, x: Any) -> Tensor:
    return self.div(x, True)

  def __rfloordiv__(self, x: Any) -> Tensor:
    return self.floordiv(x, True)

  def __rmod__(self, x: Any) -> Tensor:
    return self.mod(x, True)

  def __rmatmul__(self, x: Tensor) -> Tensor:
    return self.matmul(x, True)

  def __rand__(self, x: Any) -> Tensor:
    return self.bitwise_and(x, True)

  def __ror__(self, x: Any) -> Tensor:
    return self.bitwise_or(x, True)

  def __rxor__(self, x: Any) -> Tensor:
    return self.xor(x, True)

  def __iadd__(self, x: Any) -> Tensor:
    return self.assign(self.add(x))

  def __isub__(self, x: Any) -> Tensor:
    return self.assign(self.sub(x))

  def __imul__(self, x: Any) -> Tensor:
    return self.assign(self.mul(x))

  def __ipow__(self, x: Any) -> Tensor:
    return self.assign(self.pow(x))

  def __itruediv__(self, x: Any) -> Tensor:
    return self.assign(self.div(x))

  def __ifloordiv__(self, x: Any) -> Tensor:
    return self.assign(self.floordiv(x))

  def __imatmul__(self, x: Tensor) -> Tensor:
    return self.assign(self.matmul(x))

  def __iand__(self, x: Any) -> Tensor:
    return self.assign(self.bitwise_and(x))

  def __ior__(self, x: Any) -> Tensor:
    return self.assign(self.bitwise_or(x))

  def __ixor__(self, x: Any) -> Tensor:
    return self.assign(self.xor(x))

  def __ilshift__(self, x: int) -> Tensor:
    return self.assign(self.lshift(x))

  def __irshift__(self, x: int) -> Tensor:
    return self.assign(self.rshift(x))

  def __lt__(self, x: Any) -> Tensor:
    return F.Less.apply(*self._broadcasted(x, False))

  def __gt__(self, x: Any) -> Tensor:
    return F.Less.apply(*self._broadcasted(x, True))

  def __ge__(self, x: Any) -> Tensor:
    return (self < x).logical_not()

  def __le__(self, x: Any) -> Tensor:
    return (self > x).logical_not()

  def __ne__(self, x: Any) -> Tensor:  # type: ignore[override]
    return F.Neq.apply(*self._broadcasted(x))

  def __eq__(self, x: Any) -> Tensor:  # type: ignore[override]
    return (self != x).logical_not()

  def lt(self, x: Any) -> Tensor:
    """self < x."""
    return self < x

  def gt(self, x: Any) -> Tensor:
    """self > x."""
    return self > x

  def ne(self, x: Any) -> Tensor:
    """self != x."""
    return self != x

  def eq(self, x: Any) -> Tensor:
    """self == x."""
    return self == x

  # ***** attention, losses: see processing ops above *****

  # ***** properties and casting *****

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def numel(self) -> sint:
    """Number of elements."""
    return prod(self.shape)

  def element_size(self) -> int:
    """Bytes per element."""
    return self.dtype.itemsize

  def nbytes(self) -> int:
    """Bytes of the whole tensor."""
    if not isinstance(n := self.numel(), int):
      raise TypeError(f"nbytes() needs a concrete shape, got {self.shape}")
    return n * self.element_size()

  def is_floating_point(self) -> bool:
    """True for float dtypes."""
    return dtypes.is_float(self.dtype)

  def size(self, dim: Optional[int] = None) -> Union[sint, Tuple[sint, ...]]:
    """The shape, or the size of one dim."""
    return self.shape if dim is None else self.shape[self._resolve_dim(dim)]

  def cast(self, dtype: DTypeLike) -> Tensor:
    """Convert to dtype (values are converted, not reinterpreted)."""
    dt = _to_dtype(dtype)
    return self if self.dtype == dt else F.Cast.apply(self, dtype=dt)

  def bitcast(self, dtype: DTypeLike) -> Tensor:
    """Reinterpret the bits as dtype; a different item size changes the last dim."""
    if self.requires_grad:
      raise RuntimeError("can't backprop through bitcast: detach first")
    dt = _to_dtype(dtype)
    if self.dtype == dt:
      return self
    if (ns := dt.itemsize) != (os_ := self.dtype.itemsize) and not (isinstance(self.device, str) and self.device.startswith("DISK")):
      if not self.shape or (self.shape[-1] * os_) % ns != 0:
        raise DTypeError(f"can't bitcast {self.dtype} of shape {self.shape} to {dt}: the last dim's bytes do not divide")
      new_uint, old_uint = _UINT_OF_SIZE[ns], _UINT_OF_SIZE[os_]
      tmp = self.bitcast(old_uint)
      if ns > os_:
        parts = [tmp[..., i::ns // os_].cast(new_uint).lshift(8 * i * os_) for i in range(ns // os_)]
        return functools.reduce(Tensor.bitwise_or, parts).bitcast(dt)
      return Tensor.stack(*[tmp.rshift(8 * i * ns) for i in range(os_ // ns)], dim=-1).flatten(-2).cast(new_uint).bitcast(dt)
    return F.Cast.apply(self, dtype=dt, bitcast=True)

  def float(self) -> Tensor:
    """cast to float32."""
    return self.cast(dtypes.float32)

  def half(self) -> Tensor:
    """cast to float16."""
    return self.cast(dtypes.float16)

  def double(self) -> Tensor:
    """cast to float64."""
    return self.cast(dtypes.float64)

  def bfloat16(self) -> Tensor:
    """cast to bfloat16."""
    return self.cast(dtypes.bfloat16)

  def int(self) -> Tensor:
    """cast to int32."""
    return self.cast(dtypes.int32)

  def long(self) -> Tensor:
    """cast to int64."""
    return self.cast(dtypes.int64)

  def short(self) -> Tensor:
    """cast to int16."""
    return self.cast(dtypes.int16)

  def bool(self) -> Tensor:
    """cast to bool."""
    return self.cast(dtypes.bool)


# *********** module helpers ***********

def _indexed_dims(indices: Sequence[Any]) -> int:
  """How many dims of the indexed tensor these index items consume (a boolean mask one per mask dim, None and ... none)."""
  def one(i: Any) -> int:
    if isinstance(i, Tensor):
      return i.ndim if i.dtype == dtypes.bool else 1
    if isinstance(i, (np.ndarray, list, tuple)) and not any(isinstance(v, Tensor) for v in i):
      arr = np.asarray(i)
      return arr.ndim if arr.dtype == np.bool_ and arr.size else 1
    return 0 if i is None or i is Ellipsis else 1
  return sum(one(i) for i in indices)


def _einsum_diagonal(x: Tensor, letters: str) -> Tuple[Tensor, str]:
  """x with every letter that repeats in letters reduced to one dim holding the diagonal; the new letters."""
  while (c := next((c for c in letters if letters.count(c) > 1), None)) is not None:
    i, j = letters.index(c), letters.index(c, letters.index(c) + 1)
    if (n := x.shape[i]) != x.shape[j]:
      raise ShapeError(f"einsum letter '{c}' is repeated in '{letters}' over dims of different sizes {x.shape[i]} and {x.shape[j]}")
    rest = [d for d in range(x.ndim) if d not in (i, j)]
    # (..., n, n) flattened and padded to n*(n+1): each row of the (n, n+1) view starts with a diagonal element
    x = x.permute(*rest, i, j).flatten(-2).pad2d((0, cast(int, n))).unflatten(-1, (cast(int, n), cast(int, n) + 1))[..., 0]
    letters = "".join(letters[d] for d in rest) + c
  return x, letters


def _nested_tolist(x: Any) -> Any:
  """Nested lists/tuples with any numpy arrays or scalars inside turned into plain Python lists and numbers."""
  if isinstance(x, (np.ndarray, np.generic)):
    return x.tolist()
  if isinstance(x, (list, tuple)):
    return [_nested_tolist(v) for v in x]
  return x


def _infer_list_dtype(flat: List[Any]) -> DType:
  """The dtype of a Tensor made from a list, as tinygrad infers it: all bools give bool, any float gives default_float,
  else default_int, widened to int64 (uint64 when all are non-negative and need it) for ints it cannot hold, like torch."""
  if flat and all(isinstance(v, bool) for v in flat):
    return dtypes.bool
  if not flat or not all(isinstance(v, int) for v in flat):
    return dtypes.default_float
  lo, hi = min(flat), max(flat)
  for dt in (dtypes.default_int, dtypes.int64, dtypes.uint64):
    if dtypes.min(dt) <= lo and hi <= dtypes.max(dt):
      return dt
  raise OverflowError(f"integers from {lo} to {hi} do not fit in any tensor dtype (int64/uint64)")


def _np_dtype_or_raise(dtype: DType) -> Any:
  if (npdt := to_np_dtype(dtype)) is None:
    raise TypeError(f"{dtype} has no numpy equivalent")
  return npdt


def _symbolic_slice(it: slice, size: sint, dim: int) -> Tuple[sint, sint]:
  """The shrink bounds of a step-1 slice where the start, the stop or the dim size is symbolic (cache[:, :start_pos])."""
  if it.step not in (None, 1):
    raise IndexError(f"a slice with a symbolic bound or size needs step 1, got step {it.step} (dim {dim})")
  bounds: List[sint] = []
  for b, default in ((it.start, 0), (it.stop, size)):
    if b is None:
      b = default
    elif isinstance(b, int) and b < 0:
      if not isinstance(size, int):
        raise IndexError(f"a negative slice bound {b} on the symbolic dim {dim} of size {size} is not supported")
      b = max(0, b + size)
    elif isinstance(b, int) and isinstance(size, int):
      b = min(b, size)
    elif not isinstance(b, (int, Node)):
      raise TypeError(f"slice bounds must be ints or Variables, got {type(b).__name__} (dim {dim})")
    bounds.append(b)
  start, stop = bounds
  bound = _bound_shape((start, stop, size))
  if bound is not None and not 0 <= bound[0] <= bound[1] <= bound[2]:
    raise IndexError(f"slice {start}:{stop} is out of bounds for dim {dim} of size {size} (bound values {bound})")
  return start, stop


def _bound_shape(shape: Tuple[sint, ...]) -> Optional[Tuple[int, ...]]:
  """shape with every dim at the value of its bound Variables; None when a dim has an unbound Variable."""
  out: List[int] = []
  for s in shape:
    if isinstance(s, int):
      out.append(s)
      continue
    if any(v._val is None for v in s.vars()):
      return None
    out.append(sym_infer(s.unbind()[0], dict(v.unbind() for v in s.vars())))
  return tuple(out)


def _same_bound_size(a: sint, b: sint) -> bool:
  """a and b are the same number of elements once every bound Variable takes its value (x.reshape(3, k.bind(4)) of a
  (3, 4) tensor, and back): symbolic shapes that are equal only for this binding."""
  vals = {v.unbind()[0]: v.unbind()[1] for x in (a, b) if isinstance(x, Node) for v in x.vars() if v._val is not None}
  try:
    return sym_infer(a if not isinstance(a, Node) else a.unbind()[0], vals) == sym_infer(b if not isinstance(b, Node) else b.unbind()[0], vals)
  except (KeyError, TypeError, ValueError):
    return False


def _floor_fix(rem: Tensor, divisor: Tensor) -> Tensor:
  """Where a truncating division must step down to floor: a nonzero C remainder whose sign differs from the divisor's."""
  return (rem != 0) & ((rem < 0) != (divisor < 0))


_engine: Any = None


def _engine_realize() -> Any:
  """The module tiny.engine.realize, imported on the first realize (it pulls in the code generator, which `import tiny`
  does not need) and kept: an import statement in every realize cost about a microsecond."""
  global _engine
  if _engine is None:
    import tiny.engine.realize as eng
    _engine = eng
  return _engine


def _scalar_operand(x: Tensor, y: Any) -> Optional[Tensor]:
  """The common `x * 1.5` / `x + 1` of _broadcasted in one step: a Python float (or int with an int tensor) that takes x's
  dtype becomes a constant already in x's shape, so nothing is cast or broadcast. None when another path applies: the
  same Tensor the general path builds (a constant LazyBuffer of x's dtype, shape and device, with no gradient)."""
  cls = y.__class__
  if cls is not float and cls is not int:
    return None
  lb, dt = x.lazydata, x.lazydata.dtype
  if lb.__class__ is not LazyBuffer or isinstance(dt, ImageDType):
    return None
  if dt in _SCALAR_FLOATS:
    val: ConstType = float(y)   # what dtypes.as_const gives for a float dtype
  elif cls is int and dtypes.is_int(dt):
    val = _wrap_int(y, dt)
  else:
    return None
  ret = Tensor.__new__(Tensor)
  ret.lazydata, ret.grad, ret.requires_grad, ret._ctx = lb.fresh_const(val), None, False, None
  return ret


# the float dtypes of a tensor (never a vector type), for one set lookup instead of dtypes.is_float
_SCALAR_FLOATS = frozenset((dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64))
_F32 = dtypes.float32


def _wrap_int(v: int, dtype: DType) -> int:
  """v wrapped into the range of the int dtype (two's complement), like a C cast."""
  bits = 8 * dtype.itemsize
  v = int(v) & ((1 << bits) - 1)
  return v - (1 << bits) if not dtypes.is_unsigned(dtype) and v >= 1 << (bits - 1) else v


def _check_shape(shape: Tuple[Any, ...]) -> Tuple[sint, ...]:
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, np.integer, Node)):
      raise TypeError(f"shape entries must be ints, got {shape}")
    if isinstance(s, (int, np.integer)) and s < 0:
      raise ShapeError(f"shape entries must be non-negative, got {shape}")
  return tuple(int(s) if isinstance(s, np.integer) else s for s in shape)


def _device_names() -> Set[str]:
  try:
    return {d.split(":")[0].upper() for d in Device._devices}
  except Exception:  # a broken registry must not break attribute lookup
    return set()


def _undo_movement(t: Tensor, op: str, arg: Any, in_shape: Tuple[sint, ...]) -> Tensor:
  """Map a tensor shaped like the output of movement op back to in_shape (positions the op dropped are zero/False)."""
  if op == "reshape":
    return t.reshape(in_shape)
  if op == "flip":
    return t.flip(arg)
  if op == "shrink":
    return t.pad(tuple((b, s - e) for (b, e), s in zip(arg, in_shape)))
  if op == "pad":
    return t.shrink(tuple((b, b + s) for (b, _), s in zip(arg, in_shape)))
  raise AssertionError(f"can't undo {op}")


def _raise_if_out_of_range(values: np.ndarray, size: int, where: str, allow_negative: bool) -> None:
  """Raise IndexError naming the first of values (and its position) that is not a valid index of an axis of length size."""
  low = -size if allow_negative else 0
  bad = (values < low) | (values >= size)
  if not bad.any():
    return
  pos = tuple(int(p) for p in np.argwhere(bad)[0]) if values.ndim else ()
  at = f" at position {pos[0] if len(pos) == 1 else pos}" if pos else ""
  valid = f"valid range [{low}, {size - 1}]" if size > 0 else "no index is valid"
  raise IndexError(f"index {int(values[pos])}{at} is out of bounds for {where} ({valid})")


def check_index_tensor(index: Tensor, size: sint, where: str, allow_negative: bool = True) -> None:
  """Under CHECK_INDEX=1, realize the integer Tensor `index` and raise IndexError for a value outside an axis of length size.

  `where` names the axis in the message ("axis 0 with size 5"); with allow_negative, -size..size-1 are valid (Python
  rules), else 0..size-1. Does nothing by default: reading the values back costs a device sync, and the kernels give 0
  for an out-of-range index instead. Also does nothing while a TinyJit captures: its replays run no Python, so a check
  there would only cover the captured call (the jit's first, eager call is checked)."""
  if not CHECK_INDEX or not isinstance(size, int) or index.numel() == 0:
    return
  from tiny.engine.realize import capturing
  if len(capturing):
    return
  _raise_if_out_of_range(index.numpy(), size, where, allow_negative)


# *********** metadata: every Tensor method records its name on the LazyBuffers it creates ***********

def _metadata_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
  # Metadata is frozen: without a caller to record, one instance per method serves every call (made once, not per op)
  plain = Metadata(name=fn.__name__)

  @functools.wraps(fn)
  def _wrapper(*args: Any, **kwargs: Any) -> Any:
    if _METADATA.get() is not None:
      return fn(*args, **kwargs)
    md = plain
    if TRACEMETA.value >= 2:
      frm = inspect.currentframe()
      frm = frm.f_back if frm is not None else None
      md = Metadata(name=fn.__name__, caller=f"{frm.f_code.co_filename}:{frm.f_lineno}" if frm is not None else "")
    token = _METADATA.set(md)
    try:
      return fn(*args, **kwargs)
    finally:
      _METADATA.reset(token)
  return _wrapper


if TRACEMETA >= 1:
  _SKIP_META = {"__init__", "__repr__", "backward", "__getattr__", "__hash__", "__bool__", "__len__", "__iter__", "_deepwalk", "numpy",
                "item", "tolist", "data", "_data", "realize", "schedule", "schedule_with_vars", "_resolve_dim"}
  for _name, _fn in inspect.getmembers(Tensor, inspect.isfunction):
    # private helpers (_broadcasted, _reduce, ...) run inside a public method that already named the op: a wrapper there
    # would only add a call to every op
    if _name in _SKIP_META or (_name.startswith("_") and not _name.startswith("__")):
      continue
    _static = isinstance(inspect.getattr_static(Tensor, _name), staticmethod)
    setattr(Tensor, _name, staticmethod(_metadata_wrapper(_fn)) if _static else _metadata_wrapper(_fn))


def _negated(val: ConstType, dt: DType) -> Optional[ConstType]:
  # the constant `x - val` adds: what the general path folds NEG of the constant to (lazy.e, then const)
  return dtypes.as_const(exec_alu(UnaryOps.NEG, dt, [val]), dt)


def _reciprocal(val: ConstType, dt: DType) -> Optional[ConstType]:
  # the constant `x / val` multiplies by: what the general path folds RECIP of the constant to, for a float x (an int x
  # is cast to float first: the general path); None where folding it raises, so the general path raises the same
  if not dtypes.is_float(dt):
    return None
  try:
    return dtypes.as_const(exec_alu(UnaryOps.RECIP, dt, [val]), dt)
  except (ArithmeticError, ValueError):
    return None


def _with_scalar_fast_path(slow: Callable[[Tensor, Any], Tensor], op: BinaryOps, reverse: bool, name: str, tag: str,
                           fold: Optional[Callable[[ConstType, DType], Optional[ConstType]]] = None) -> Callable[[Tensor, Any], Tensor]:
  """Tensor.<name> (x + 1.5, 2 * x, x - 1, x / 4, ...) with the eager case done in one step: a Python float or int
  operand that takes the tensor's dtype, on a tensor that needs no gradient, builds its two lazy nodes directly
  (lazy.scalar_binop: `x <op> constant`, its eager id named by `tag`). `fold` turns the operand into that constant the
  way the general path folds it (x - c is x + (-c), x / c is x * (1/c) for floats). The same graph, metadata and
  requires_grad as `slow` (the method as it was), which runs for everything else."""
  plain = Metadata(name=name) if TRACEMETA >= 1 else None

  def fast(self: Tensor, x: Any) -> Tensor:
    cls = x.__class__
    if (cls is float or cls is int) and self.requires_grad is not True and (lb := self.lazydata).__class__ is LazyBuffer:
      dt = lb.dtype
      if dt is _F32 or dt in _SCALAR_FLOATS:   # (float32 by identity: a set lookup hashes the dtype in Python)
        val: ConstType = x if cls is float else float(x)
      elif cls is int and dtypes.is_int(dt):
        val = _wrap_int(x, dt)
      else:
        return slow(self, x)
      if fold is not None:
        if (folded := fold(val, dt)) is None:
          return slow(self, x)
        val = folded
      md = _METADATA.get()
      if md is None and plain is not None:
        if TRACEMETA.value >= 2:   # the wrapper records the caller
          return slow(self, x)
        md = plain
      if (out := scalar_binop(lb, op, val, reverse, tag, md)) is not None:
        ret = Tensor.__new__(Tensor)
        ret.lazydata, ret.grad, ret.requires_grad, ret._ctx = out, None, self.requires_grad, None
        return ret
    return slow(self, x)
  return functools.wraps(slow)(fast)


for _name, _op, _rev, _tag, _fold in (("__add__", BinaryOps.ADD, False, "__add__", None), ("__radd__", BinaryOps.ADD, True, "__radd__", None),
                                      ("__mul__", BinaryOps.MUL, False, "__mul__", None), ("__rmul__", BinaryOps.MUL, True, "__rmul__", None),
                                      # the same graphs as x + (-c) and x * (1/c): the same ids
                                      ("__sub__", BinaryOps.ADD, False, "__add__", _negated),
                                      ("__truediv__", BinaryOps.MUL, False, "__mul__", _reciprocal)):
  setattr(Tensor, _name, _with_scalar_fast_path(getattr(Tensor, _name), _op, _rev, _name, _tag, _fold))

# last: function.py subclasses Function and builds Tensors, so it imports this module; both names exist by now
import tiny.function as F  # noqa: E402
