"""LazyBuffer: a node of the lazy compute graph that Tensor builds and the scheduler turns into kernels.

A LazyBuffer is either a *base*, which owns an op, its sources and a (lazily allocated) Buffer, or a *view*,
which is a ShapeTracker over a base. Movement ops only ever create views; everything else creates bases.
Identical nodes are deduplicated through a weak-value cache, so building the same expression twice gives
the same node (and the scheduler computes it once).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Tuple, Union
from weakref import ReferenceType, ref

from tiny import eager_key
from tiny.device import Buffer, recycle_buffer, take_free_buffer
from tiny.dtype import ConstType, DType, dtypes
from tiny.helpers import DEBUG, SPLIT_REDUCEOP, _METADATA, Metadata, all_int, all_same, getenv, prod
from tiny.ops import BinaryOps, MetaOps, Op, ReduceOps, TernaryOps, UnaryOps, exec_alu, is_add_identity, python_alu
from tiny.registry import Device
from tiny.shape.shapetracker import ShapeTracker, _contiguous_tracker
from tiny.shape.symbolic import Variable, sint

# key -> weak reference to the LazyBuffer. A plain dict of weakrefs whose callback evicts the entry: WeakValueDictionary
# does the same in Python code (a KeyedRef subclass, pending-removal bookkeeping), which was a large part of every op.
lazycache: Dict[Any, ReferenceType[LazyBuffer]] = {}
_LAZYCACHE = bool(getenv("LAZYCACHE", 1))


class _BufferUse:
  """A LazyBuffer's use of its Buffer: counted (Buffer.ref) while the LazyBuffer lives. Only the bases that have a Buffer
  hold one, so the many that never get one (constants, the fused intermediates of eager ops) need no finalizer when
  they die, which a __del__ on LazyBuffer itself gave every one of them."""

  __slots__ = ("buf",)

  def __init__(self, buf: Buffer) -> None:
    self.buf = buf
    # buf.ref(1), inline: one per realized base
    (buf._base if buf._base is not None else buf)._lb_refcount += 1

  def __del__(self) -> None:
    buf = self.buf
    if buf._base is not None:
      buf._base._lb_refcount -= 1
    else:
      buf._lb_refcount = n = buf._lb_refcount - 1
      if n == 0:
        # the last LazyBuffer using it is gone: keep it for the next eager result like it, when nothing else holds it
        recycle_buffer(buf)


def _evict(key: Any, wr: ReferenceType[LazyBuffer]) -> None:
  # called by the garbage collector when the cached LazyBuffer dies; a newer entry under the same key stays
  # one lookup: pop, and put back the rare newer entry
  if (cur := lazycache.pop(key, None)) is not None and cur is not wr:
    lazycache[key] = cur


def _int_size(st: ShapeTracker) -> int:
  """Elements a base needs: symbolic sizes are allocated at their maximum."""
  sz = st.size
  if isinstance(sz, int):
    return sz
  return int(sz.max) if hasattr(sz, "max") else int(sz)


def _as_int(x: sint) -> int:
  if not isinstance(x, int):
    raise RuntimeError(f"a buffer view needs a concrete offset, got symbolic {x}")
  return x


def create_lazybuffer(device: str, st: ShapeTracker, dtype: DType, op: Optional[Op] = None, arg: Any = None, srcs: Tuple[LazyBuffer, ...] = (),
                      base: Optional[LazyBuffer] = None, enable_cache: bool = _LAZYCACHE) -> LazyBuffer:
  """Make (or find in the cache) the LazyBuffer with these properties."""
  if st.size == 0:
    # nothing to compute: an empty result is a constant of no elements
    op, arg, srcs, base = MetaOps.CONST, 0, (), None
  if op is MetaOps.CONST and not isinstance(arg, Variable):
    arg = dtypes.as_const(arg, dtype)
  if not enable_cache:
    return LazyBuffer(device, st, dtype, op, arg, srcs, base=base, metadata=_METADATA.get())
  if base is None:
    # a float arg by repr: -0.0 == 0.0, but a constant -0.0 must not come back as 0.0
    cache_key: Any = (device, st, dtype, op, ("f", repr(arg)) if isinstance(arg, float) else arg, tuple(map(ref, srcs)))
  else:
    cache_key = (st, ref(base))
  if (wr := lazycache.get(cache_key)) is not None and (hit := wr()) is not None:
    return hit
  ret = LazyBuffer(device, st, dtype, op, arg, srcs, base=base, metadata=_METADATA.get())
  lazycache[cache_key] = ref(ret, functools.partial(_evict, cache_key))
  return ret


class LazyBuffer:
  """A lazily computed array: a base (op + sources + buffer) or a view (ShapeTracker over a base)."""

  # defaults every base starts with, kept on the class: an eager op builds several bases, and each instance store costs
  _base: Optional[LazyBuffer] = None
  contiguous_child: Optional[Tuple[ReferenceType[LazyBuffer], ShapeTracker]] = None
  forced_realize = False
  _sweep_at = 32
  stale_readers: Tuple[ReferenceType[LazyBuffer], ...] = ()
  # True on a constant made for one `Tensor <op> python scalar` (see fresh_const): no other node can read it, so an op
  # on it is never found in the lazy cache and is not put there (see e)
  _fresh_const = False
  # (epoch, structural id, realized bases read) of an elementwise base, see tiny.eager_key
  _ekey: Optional[Tuple[int, int, Tuple[LazyBuffer, ...]]] = None
  # on a node made by scalar_binop: whether the constant is its first source (`val <op> x`); None on any other node
  _scalar_rev: Optional[bool] = None

  def __init__(self, device: str, st: ShapeTracker, dtype: DType, op: Optional[Op] = None, arg: Any = None, srcs: Tuple[LazyBuffer, ...] = (),
               base: Optional[LazyBuffer] = None, metadata: Optional[Metadata] = None):
    self.device, self.st, self.dtype, self.shape, self.size, self.metadata = device, st, dtype, st.shape, st.size, metadata
    if base is None:
      assert op is not None, "a base LazyBuffer needs an op"
      self.op: Op = op
      self.arg, self.srcs = arg, srcs
      if op is MetaOps.ASSIGN and srcs[1].base.realized is None:
        raise RuntimeError("the target of an assign must be realized")
      if op is MetaOps.VIEW:
        # a view op needs no kernel: it is a Buffer aliasing the source's memory
        src = srcs[0]
        self._buffer: Buffer = src.base.buffer.view(_int_size(st), dtype, _as_int(src.st.views[0].offset) * src.dtype.itemsize)
        self._use = _BufferUse(self._buffer)
      elif op is MetaOps.ASSIGN:
        self._buffer = srcs[1].base.buffer
        self._use = _BufferUse(self._buffer)
      # any other base makes its Buffer on first use (see `buffer`): the intermediates of a fused kernel and the constants
      # never need one, and they are most of the bases an eager op builds
      # the ops reading this base (weakly), so an assign can tell which lazy results were made from the old contents
      self._readers: List[ReferenceType[LazyBuffer]] = []
      if srcs:
        me = ref(self)
        for s in srcs:
          b = s._base if s._base is not None else s
          (rs := b._readers).append(me)
          if len(rs) >= b._sweep_at:
            b._sweep_readers()
    else:
      if base._base is not None:
        raise RuntimeError("the base of a view must be a base")
      self._base = base

  def mark_scheduled(self) -> None:
    """This base's kernel is scheduled: from now on it reads as realized and no longer holds its graph."""
    del self.srcs
    if self._ekey is not None:
      self._ekey = None   # its leaves: a realized base must not keep its inputs alive
    if self._readers:
      self._lazy_readers_changed()

  def _lazy_readers_changed(self) -> None:
    # this unrealized base is realized or forced to realize now: a lazy op reading it may have inlined it into its eager
    # id (see tiny.eager_key), which no longer describes its graph. Without a live reader, no id can hold it.
    for r in self._readers:
      if r() is not None:
        eager_key.graph_changed()
        return

  def _sweep_readers(self) -> None:
    # a weight read by every step would collect dead refs for ever: drop them once the list is twice what lived at the
    # last sweep (amortized O(1) per reader)
    rs = self._readers
    rs[:] = [x for x in rs if x() is not None]
    self._sweep_at = max(32, 2 * len(rs))

  def pending_stale_readers(self) -> List[LazyBuffer]:
    """For an ASSIGN: the lazy results made from the target's old contents before the assign, not yet scheduled.

    They must run before the assign overwrites the buffer (as they would have in eager code), whichever is realized first."""
    out = []
    for r in self.stale_readers:
      x = r()
      if x is not None and x.realized is None and getattr(x, "srcs", None) is not None:
        out.append(x)
    return out

  def __repr__(self) -> str:
    dt = str(self.dtype).removeprefix("dtypes.")
    return f"<LB {self.device} {self.shape} {dt} {self.st if self.base is not self else (self.op, self.realized)}>"

  # *** identity ***

  @property
  def base(self) -> LazyBuffer:
    return self._base if self._base is not None else self

  @property
  def buffer(self) -> Buffer:
    """The Buffer of the base (made on first use, allocated when the schedule that computes it runs)."""
    b = self._base if self._base is not None else self
    # getattr with a default, not try/except: every computed base takes the miss once, and a raised AttributeError costs
    # about a microsecond
    if (buf := getattr(b, "_buffer", None)) is not None:
      return buf
    buf = b._buffer = Buffer(b.device, _int_size(b.st), b.dtype)
    b._use = _BufferUse(buf)
    return buf

  @buffer.setter
  def buffer(self, buf: Buffer) -> None:
    if self._base is not None:
      raise RuntimeError("only a base LazyBuffer has a buffer")
    # the new use counts before the old one is dropped (they may be the same Buffer)
    self._use = _BufferUse(buf)
    self._buffer = buf

  def result_buffer(self, allocator: Any) -> Buffer:
    """`buffer` of this base, for the output of an eager kernel about to run on its device, whose allocator is given: a
    kept Buffer of that allocator, size and dtype (see device.take_free_buffer) when there is one, already allocated."""
    if (buf := getattr(self, "_buffer", None)) is not None:
      return buf
    if self.size.__class__ is not int or (buf := take_free_buffer(allocator, self.size, self.dtype)) is None:
      return self.buffer
    # _buffer first: when this LazyBuffer dies its attributes go in order, so _use is the last to hold the Buffer (see
    # device.recycle_buffer)
    self._buffer = buf
    # _BufferUse(buf) without its __init__ call (a kept Buffer is a base: its own count goes up)
    use = self._use = _BufferUse.__new__(_BufferUse)
    use.buf = buf
    buf._lb_refcount += 1
    return buf

  @property
  def realized(self) -> Optional[Buffer]:
    # scheduled bases drop their srcs; a base without srcs is backed by its buffer
    return self.buffer if self._base is None and not hasattr(self, "srcs") else None

  @property
  def lbs(self) -> List[LazyBuffer]:
    return [self]

  def is_realized(self) -> bool:
    return self.base.realized is not None

  def is_unrealized_const(self) -> bool:
    return self.base.realized is None and self.base.op is MetaOps.CONST and not isinstance(self.base.arg, Variable)

  def _is_lazy_const(self) -> bool:
    """An unrealized CONST base, a bound Variable's included (which is_unrealized_const leaves out: it has no fixed
    value to fold), so it has no buffer to view or to force-realize."""
    return self.base.realized is None and self.base.op is MetaOps.CONST

  def is_unrealized_unmasked_const(self) -> bool:
    return _unmasked_const(self)

  # *** creation ***

  @staticmethod
  def metaop(op: MetaOps, shape: Tuple[sint, ...], dtype: DType, device: str, arg: Any = None, src: Tuple[LazyBuffer, ...] = (),
             enable_cache: bool = False) -> LazyBuffer:
    """A new base computed by a meta op (EMPTY, CONST, COPY, CUSTOM, ...)."""
    if not isinstance(src, tuple):
      raise TypeError(f"metaop src must be a tuple, got {type(src).__name__}")
    return create_lazybuffer(device, ShapeTracker.from_shape(shape), dtype, op, arg, src, enable_cache=enable_cache)

  def const(self, val: Union[ConstType, Variable], shape: Optional[Tuple[sint, ...]] = None) -> LazyBuffer:
    """A constant of this buffer's dtype and device, broadcast to shape (default: this shape)."""
    if not isinstance(val, (int, float, bool, Variable)):
      raise TypeError(f"const value must be a bool, int, float or Variable, got {type(val).__name__}")
    value = val if isinstance(val, Variable) else dtypes.as_const(val, self.dtype)
    return self._broadcast_const(value, self.shape if shape is None else tuple(shape))

  def fresh_const(self, val: ConstType) -> LazyBuffer:
    """const(val) in this shape for one `Tensor <op> python scalar`: val must already be what dtypes.as_const gives for
    this dtype. The op reading it is its only reader, so that op skips the lazy cache (see e): it could never be found
    there, since no other node reads this constant."""
    ret = self._broadcast_const(val, self.shape)
    if ret.size != 0:   # (an empty one is a constant of its own, see _broadcast_const)
      ret._fresh_const = True
    return ret

  def _broadcast_const(self, val: Union[ConstType, Variable], shape: Tuple[sint, ...]) -> LazyBuffer:
    # built directly: a fresh scalar base is never in the cache, and nor is a view of it (the key holds the new base)
    base = LazyBuffer(self.device, _SCALAR_ST, self.dtype, MetaOps.CONST, val, metadata=_METADATA.get())
    if not shape:
      return base
    st = _broadcast_st(shape)
    # an empty shape takes the general path, which turns it into an empty constant of its own
    return LazyBuffer(self.device, st, self.dtype, base=base) if st.size != 0 else base._view(st)

  def assign(self, x: LazyBuffer) -> LazyBuffer:
    """Write x into this (realized) buffer; the result aliases it."""
    if x.size != self.size:
      raise ValueError(f"assign needs equal sizes, target has {self.size} elements and value {x.size}")
    ret = LazyBuffer.metaop(MetaOps.ASSIGN, self.shape, self.dtype, self.device, arg=() if self.st.contiguous else (self.st,), src=(x, self.base))
    # what reads the old contents now: x's own graph is scheduled with the assign anyway, the rest is checked at schedule time
    ret.stale_readers = tuple(r for r in self.base._readers if (y := r()) is not None and y is not ret)
    return ret

  def can_view(self) -> bool:
    """True when this data can be a Buffer view of its base: consecutive, the device declares caps.buffer_views, and the
    view starts at a multiple of caps.view_alignment bytes (a view of a view adds aligned offsets, so it stays aligned)."""
    if not self.st.consecutive or self._is_lazy_const():
      return False
    caps = Device.caps(self.device)
    offset = self.st.views[0].offset
    return caps.buffer_views and isinstance(offset, int) and (offset * self.dtype.itemsize) % caps.view_alignment == 0

  def contiguous(self, allow_buffer_view: bool = True) -> LazyBuffer:
    """This data in a contiguous buffer of its own shape; marks an already-contiguous base for realization."""
    if not self.st.contiguous or self.size != self.base.size or self._is_lazy_const():
      ret = self.e(MetaOps.VIEW) if allow_buffer_view and self.can_view() else self.e(MetaOps.CONTIGUOUS)
      # let later users of the base read the contiguous copy instead when the view can be undone
      inv = self.st.invert(self.base.shape) if hasattr(self.st, "invert") else None
      if inv is not None:
        self.base.contiguous_child = ref(ret), inv
      return ret
    b = self.base
    if not b.forced_realize:
      b.forced_realize = True
      if hasattr(b, "srcs"):
        b._lazy_readers_changed()
    return self

  def cast(self, dtype: DType, bitcast: bool = False, allow_buffer_view: bool = True) -> LazyBuffer:
    """Convert to dtype (bitcast reinterprets the bits; on DISK it may change the last dimension)."""
    if self.dtype == dtype:
      return self
    if self.device.startswith("DISK") and not bitcast:
      raise RuntimeError("a DISK buffer can only be bitcast, not cast: copy it to a compute device first")
    if self.is_unrealized_unmasked_const() and not bitcast:
      return create_lazybuffer(self.device, self.st, dtype, MetaOps.CONST, dtypes.as_const(self.base.arg, dtype))
    new_shape = self.shape
    if bitcast and self.dtype.itemsize != dtype.itemsize:
      if not self.device.startswith("DISK"):
        raise RuntimeError("a bitcast that changes the item size is only supported on DISK")
      if not all_int(new_shape):
        raise RuntimeError("a bitcast that changes the item size needs a concrete shape")
      if (new_shape[-1] * self.dtype.itemsize) % dtype.itemsize != 0:
        raise RuntimeError(f"cannot bitcast last dim {new_shape[-1]} of {self.dtype} to {dtype}: bytes do not divide")
      new_shape = new_shape[:-1] + ((new_shape[-1] * self.dtype.itemsize) // dtype.itemsize,)
    elif getenv("CAST_BEFORE_VIEW", 1) and dtype.itemsize <= self.dtype.itemsize and self is not self.base:
      # cast the (smaller or equal) base and re-apply the view: less data through the view
      return self.base.cast(dtype, bitcast)._view(self.st)
    cast_op: Op = (MetaOps.VIEW if self.can_view() and allow_buffer_view else UnaryOps.BITCAST) if bitcast else UnaryOps.CAST
    return create_lazybuffer(self.device, ShapeTracker.from_shape(new_shape), dtype, cast_op, dtype, (self,))

  def _copy(self, device: str) -> LazyBuffer:
    return create_lazybuffer(device, ShapeTracker.from_shape(self.shape), self.dtype, MetaOps.COPY, self.buffer.nbytes, (self,), enable_cache=False)

  def copy_to_device(self, device: str, force: bool = False) -> LazyBuffer:
    """The same data on another device."""
    if self.device == device:
      return self
    # a copy of an unrealized copy goes straight from the original
    if not force and self.st.contiguous and self.size == self.base.size and self.base.realized is None and self.base.op is MetaOps.COPY:
      return self.base.srcs[0].copy_to_device(device).reshape(self.st.shape)
    if self.is_unrealized_const():
      return LazyBuffer.metaop(MetaOps.CONST, (), self.dtype, device, arg=self.base.arg)._view(self.st)
    # copy only what the view uses
    if prod(self.st.shape) < prod(self.base.st.shape):
      return self.contiguous()._copy(device)
    return self.base._copy(device)._view(self.st)

  # *** compute ***

  def e(self, op: Op, *in_srcs: LazyBuffer, arg: Any = None) -> LazyBuffer:
    """Elementwise op (Unary/Binary/Ternary, or CONTIGUOUS/VIEW) of self and in_srcs, with constant folding."""
    srcs = (self,) + in_srcs
    # plain loops, not any(genexpr): this runs for every op, and the usual sources (one or two bases or views of one dtype
    # and shape) need none of the rare paths
    for s in srcs:
      if s._base is None and s.contiguous_child is not None:
        # a base that was made contiguous elsewhere is read from that copy
        srcs = tuple(root._view(s.contiguous_child[1]) if s._base is None and s.contiguous_child is not None and
                     (root := s.contiguous_child[0]()) is not None else s for s in srcs)
        break
    dtype0, shape0 = srcs[-1].dtype, srcs[0].shape
    cache, check = True, op is TernaryOps.WHERE
    for s in srcs:
      if s.dtype is not dtype0 or s.shape != shape0:
        check = True
      if s._fresh_const:
        cache = False
    if check:
      _check_elementwise(op, srcs)
    out_dtype = dtypes.bool if op is BinaryOps.CMPLT or op is BinaryOps.CMPNE else dtype0

    consts = [_unmasked_const(x) for x in srcs]
    if all(consts) and op in python_alu:
      return self.cast(out_dtype).const(exec_alu(op, out_dtype, [s.base.arg for s in srcs]))
    if op is UnaryOps.NEG and self._base is None and self.op is UnaryOps.NEG and self.realized is None:
      return self.srcs[0]
    if (op is BinaryOps.ADD or op is BinaryOps.MUL) and (consts[0] or consts[1]):
      x, y = srcs[0], srcs[1]
      for a, b, is_const in ((x, y, consts[1]), (y, x, consts[0])):
        if not is_const:
          continue
        val = b.base.arg
        if op is BinaryOps.ADD and is_add_identity(val, out_dtype):
          return a
        if op is BinaryOps.MUL and val == 1:
          return a
        # float x*0 is NaN for x inf/NaN (and -0 for negative x): only ints and bools fold to 0
        if op is BinaryOps.MUL and val == 0 and not dtypes.is_float(out_dtype):
          return a.const(0)
        if op is BinaryOps.MUL and val == -1:
          return a.e(UnaryOps.NEG)
    return create_lazybuffer(self.device, ShapeTracker.from_shape(shape0), out_dtype, op, arg, srcs, enable_cache=cache and _LAZYCACHE)

  def _reduce_op(self, op: ReduceOps, axis: Tuple[int, ...]) -> LazyBuffer:
    if any(not 0 <= a < len(self.shape) for a in axis):
      raise ValueError(f"reduce axes {axis} out of range for shape {self.shape}")
    axis = tuple(sorted(a for a in axis if self.shape[a] != 1))
    if not axis:
      # a sum of one element starts at +0.0 as numpy's and torch's do: -0.0 comes out +0.0 (x + 0.0, not folded away)
      return self.e(BinaryOps.ADD, self.const(0.0)) if op is ReduceOps.SUM and dtypes.is_float(self.dtype) else self
    return create_lazybuffer(self.device, ShapeTracker.from_shape(_reduced_shape(self.shape, axis)), self.dtype, op, axis, (self,))

  def r(self, op: ReduceOps, axis: Tuple[int, ...]) -> LazyBuffer:
    """Reduce over axis (kept as size-1 dims). Large reductions with few outputs are split in two kernels."""
    new_shape = _reduced_shape(self.shape, axis)
    if 0 in self.shape and 0 not in new_shape:
      return self.const({ReduceOps.SUM: 0.0, ReduceOps.MAX: dtypes.min(self.dtype)}[op], new_shape)
    if self.is_unrealized_unmasked_const() and all_int(self.shape):
      folded = self.base.arg * prod(self.shape[i] for i in axis) if op is ReduceOps.SUM else self.base.arg
      if op is ReduceOps.SUM and isinstance(folded, float):
        folded += 0.0   # a sum starts at +0.0: the sum of -0.0s is +0.0
      return self.const(folded, new_shape)
    # a (padded, windowed) constant is not split: its sum folds to a count in codegen (loop collapse), so the long
    # reduction costs nothing and splitting it would only add a kernel (arange is such a sum)
    # nor is a one-hot select over positions (a gather): codegen folds its sum to one read (index collapse)
    if not SPLIT_REDUCEOP or not all_int(self.shape) or 0 in self.shape or self.is_unrealized_const() or \
        prod(self.shape) // prod(new_shape) < getenv("REDUCEOP_SPLIT_THRESHOLD", 32768) or (op is ReduceOps.SUM and _selects_by_position(self, axis)):
      return self._reduce_op(op, axis)
    # few outputs and a long reduction: reduce a split-off factor of one axis first (as a global dim of the
    # first kernel), then reduce that factor in a second kernel. The factor goes first: the partial results keep
    # the output's own layout, so the first kernel can tile its contiguous output axis (a one-hot gather over a
    # vocabulary becomes a matmul-shaped kernel) and the second is a column sum.
    strides = self.st.real_strides()
    max_split = min(256, 2 ** getenv("REDUCEOP_SPLIT_SIZE", 22) // prod(new_shape))
    # the first (axis, largest divisor) pair wins: a generator stops there instead of testing every divisor of every axis
    # (building that whole list cost ~20 us on every large sum)
    first = next(((i, d) for i in axis if strides[i] != 0 for d in range(max_split, 8 - 1, -1) if self.shape[i] % d == 0), None)
    if first is None:
      return self._reduce_op(op, axis)
    dim, divisor = first
    split_shape = self.shape[:dim] + (divisor, self.shape[dim] // divisor) + self.shape[dim + 1:]
    order = tuple([dim] + [x for x in range(len(split_shape)) if x != dim])
    splitted = self.reshape(split_shape).permute(order)
    if DEBUG >= 3:
      print(f"split {divisor}: {self.shape} -> {splitted.shape} -> {new_shape}")
    return splitted._reduce_op(op, tuple(a + 1 for a in axis))._reduce_op(op, (0,)).reshape(new_shape)

  # *** movement ***

  def _view(self, new_st: ShapeTracker) -> LazyBuffer:
    if self.st.size == 0 or (new_st.views[-1].mask is not None and any((b - a) == 0 for a, b in new_st.views[-1].mask)):
      return self.const(0, new_st.shape)
    if new_st.contiguous and self.base.shape == new_st.shape:
      return self.base
    return create_lazybuffer(self.device, new_st, self.dtype, base=self.base)

  def reshape(self, arg: Tuple[sint, ...]) -> LazyBuffer:
    return self._view(self.st.reshape(arg))

  def pad(self, arg: Tuple[Tuple[sint, sint], ...]) -> LazyBuffer:
    return self._view(self.st.pad(arg))

  def expand(self, arg: Tuple[sint, ...]) -> LazyBuffer:
    return self._view(self.st.expand(arg))

  def permute(self, arg: Tuple[int, ...]) -> LazyBuffer:
    return self._view(self.st.permute(arg))

  def shrink(self, arg: Tuple[Tuple[sint, sint], ...]) -> LazyBuffer:
    return self._view(self.st.shrink(arg))

  def stride(self, arg: Tuple[int, ...]) -> LazyBuffer:
    return self._view(self.st.stride(arg))


# every attribute name a LazyBuffer may get, set once on a throwaway instance before any real one exists. CPython keeps the
# attribute values of a class's instances in a compact array with one table of names shared by the class; that table only
# takes new names while few instances have been made (3.11 stops after a few dozen), and an instance setting a name
# missing there gets a dictionary of its own, several hundred ns more per instance. _ekey is only set once an eager id is
# made and stale_readers on an assign, both long after the first LazyBuffers: without this every eager result paid it.
_ATTRIBUTE_NAMES = ("device", "st", "dtype", "shape", "size", "metadata", "op", "arg", "srcs", "_readers", "_base", "_buffer", "_use",
                    "_ekey", "_scalar_rev", "_fresh_const", "contiguous_child", "forced_realize", "_sweep_at", "stale_readers")


def _share_attribute_names() -> None:
  first = LazyBuffer.__new__(LazyBuffer)
  for name in _ATTRIBUTE_NAMES:
    setattr(first, name, None)


_share_attribute_names()


def scalar_binop(x: LazyBuffer, op: BinaryOps, val: ConstType, reverse: bool, tag: str, metadata: Optional[Metadata]) -> Optional[LazyBuffer]:
  """`x <op> val` (`val <op> x` when reverse) for op ADD or MUL and a Python scalar val that is already what
  dtypes.as_const gives for x's dtype: the graph x.e(op, x.fresh_const(val)) builds, without its generic checks, and with
  its eager id (see tiny.eager_key.scalar_op_id; `tag` names op and side there). None where e() has more to decide: a
  folding (x + 0 for ints and x + -0.0 for floats, x * 1, x * -1, integer x * 0, a lazy constant x), a contiguous_child
  to read instead, a symbolic or empty shape."""
  b = x._base if x._base is not None else x
  if b.contiguous_child is not None or (b.op is MetaOps.CONST and hasattr(b, "srcs")):
    return None
  # only a zero or a one can fold: any other constant (the usual one) skips the dtype checks, which are Python calls
  if val == 0 or val == 1 or val == -1:
    if op is BinaryOps.ADD:
      if is_add_identity(val, x.dtype):
        return None
    elif val != 0 or not dtypes.is_float(x.dtype):
      return None
  size = x.size
  if size.__class__ is not int or size == 0:
    return None
  shape, dtype, device = x.shape, x.dtype, x.device
  if (sts := _scalar_op_trackers.get(shape)) is None and (sts := _scalar_op_st(shape)) is None:
    return None
  cst, csize, rst = sts
  # the constant, as one base already in x's shape (as cast() makes of a broadcast constant): one node instead of a
  # scalar base and its view. Read only by the op below, so it needs no list of readers.
  c = LazyBuffer.__new__(LazyBuffer)
  c.device, c.st, c.dtype, c.metadata, c.op, c.arg, c.srcs = device, cst, dtype, metadata, MetaOps.CONST, val, ()
  c.shape, c.size, c._readers, c._fresh_const = shape, csize, [], True
  ret = LazyBuffer.__new__(LazyBuffer)
  ret.device, ret.st, ret.dtype, ret.shape, ret.size, ret.metadata = device, rst, dtype, shape, size, metadata
  ret.op, ret.arg, ret.srcs, ret._readers, ret._scalar_rev = op, None, (c, x) if reverse else (x, c), [], reverse
  (rs := b._readers).append(ref(ret))
  if len(rs) >= b._sweep_at:
    b._sweep_readers()
  eager_key.scalar_op_id(ret, x, b, tag, val)
  return ret


def _selects_by_position(x: LazyBuffer, axis: Tuple[int, ...]) -> bool:
  """x is elementwise on a comparison with a position (an arange) that varies along one of `axis`: `where(idx ==
  arange(n), w, 0)` summed over n reads one element of w (see the index collapse of codegen)."""
  todo: List[Tuple[LazyBuffer, ShapeTracker]] = [(x.base, x.st)]
  for _ in range(16):
    if not todo:
      break
    b, st = todo.pop()
    if b.realized is not None or not isinstance(b.op, (UnaryOps, BinaryOps, TernaryOps)):
      continue
    for v in b.srcs:
      vst = v.st + st   # v's base as x's elements read it
      if b.op is BinaryOps.CMPNE:
        p, pst = v, vst
        while p.base.op is UnaryOps.CAST and p.base.realized is None:
          p, pst = p.base.srcs[0], p.base.srcs[0].st + pst
        if p.base.op is MetaOps.ARANGE and any(s != 0 for i, s in enumerate(pst.real_strides()) if i in axis):
          return True
      todo.append((v.base, vst))
  return False


def _unmasked_const(x: LazyBuffer) -> bool:
  """x.is_unrealized_unmasked_const(), in one call: e() asks it of every source of every op."""
  b = x._base
  if b is None:
    return x.op is MetaOps.CONST and hasattr(x, "srcs") and not isinstance(x.arg, Variable)
  if b.op is not MetaOps.CONST or not hasattr(b, "srcs") or isinstance(b.arg, Variable):
    return False
  for v in x.st.views:
    if v.mask is not None:
      return False
  return True


def _check_elementwise(op: Op, srcs: Tuple[LazyBuffer, ...]) -> None:
  """Raise when the sources of an elementwise op disagree in dtype or shape."""
  dts = [x.dtype.scalar() if hasattr(x.dtype, "scalar") else x.dtype for x in (srcs[1:] if op is TernaryOps.WHERE else srcs)]
  if not all_same(dts):
    raise TypeError(f"all sources of {op} need the same dtype, got {dts}")
  if op is TernaryOps.WHERE and srcs[0].dtype != dtypes.bool:
    raise TypeError(f"the condition of WHERE must be bool, got {srcs[0].dtype}")
  if not all_same([x.shape for x in srcs]):
    raise ValueError(f"all sources of {op} need the same shape, got {[x.shape for x in srcs]}")


_SCALAR_ST = ShapeTracker.from_shape(())


@functools.lru_cache(maxsize=4096)
def _broadcast_st(shape: Tuple[sint, ...]) -> ShapeTracker:
  """The tracker of a scalar broadcast to shape (what reshape to all ones and expand give, kept per shape: constants
  are made for almost every op, and building it took two tracker ops and a LazyBuffer each time)."""
  return _SCALAR_ST.reshape((1,) * len(shape)).expand(shape)


# shape -> (the constant's tracker, its size, the result's tracker) of scalar_binop: one dict lookup per op instead of two
# cached calls. Trackers are immutable and made the same way for equal shapes, so an entry is never stale.
_scalar_op_trackers: Dict[Tuple[sint, ...], Tuple[ShapeTracker, int, ShapeTracker]] = {}


def _scalar_op_st(shape: Tuple[sint, ...]) -> Optional[Tuple[ShapeTracker, int, ShapeTracker]]:
  """Fill (and return) the _scalar_op_trackers entry of shape; None for a shape whose size is not concrete."""
  cst = _broadcast_st(shape) if shape else _SCALAR_ST
  if not isinstance(csize := cst.size, int):
    return None
  if len(_scalar_op_trackers) >= 4096:
    _scalar_op_trackers.clear()
  ret = _scalar_op_trackers[shape] = (cst, csize, _contiguous_tracker(shape))
  return ret


def _reduced_shape(shape: Tuple[sint, ...], axis: Tuple[int, ...]) -> Tuple[sint, ...]:
  return tuple(1 if i in axis else s for i, s in enumerate(shape))

