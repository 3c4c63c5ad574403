"""`Kernel`: shape analysis and optimizations (opts) of one kernel AST, then lowering, linearizing and rendering.

All buffers' ShapeTrackers are kept in one axis order:
`[global | local | grouped reduce | reduce | upcasted]` (upcasted = UPCAST'ed outputs and UNROLL'ed reduce axes).
Each opt reshapes/permutes every ShapeTracker the same way; lowering then reads that layout.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from enum import Enum, auto
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, cast

from tiny.dtype import ImageDType
from tiny.helpers import DEBUG, TC_OPT, USE_TC, all_int, ansilen, colored, dedup, prod, round_up, to_function_name
from tiny.ops import UNSAFE_PAD_OPS, ArangeBuffer, BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, UnaryOps, \
  elementwise_shape, get_lazyop_info, verify_lazyop
from tiny.shape.shapetracker import ShapeTracker
from tiny.codegen.uopgraph import UOpGraph
from tiny.codegen.lowerer import grouped_dim_sizes, lazyop_to_uop, row_store_axes
from tiny.codegen.uops import PatternMatcher

if TYPE_CHECKING:
  # the renderer layer sits above codegen: only its types are needed here (the device objects come from tiny.registry on demand)
  from tiny.renderer import Program, Renderer, TensorCore


class OptOps(Enum):
  """Kinds of kernel optimization."""

  TC = auto(); UPCAST = auto(); UPCASTMID = auto(); UNROLL = auto(); LOCAL = auto()  # noqa: E702
  GROUP = auto(); GROUPTOP = auto(); NOLOCALS = auto(); PADTO = auto(); SWAP = auto(); BLOCK = auto()  # noqa: E702

  def __lt__(self, x: OptOps) -> bool:
    return self.value < x.value


class KernelOptError(Exception):
  """An opt that does not apply to this kernel (bad axis, size, or unsupported by the renderer)."""


def check(cond: bool, msg: str = "") -> None:
  if not cond:
    raise KernelOptError(msg)


# the heuristics compare sizes and strides with ints; a symbolic one is unknown, so they use these instead of raw comparisons
def _upper(x: Any) -> int:
  """An int, or the upper bound of a symbolic one."""
  while not isinstance(x, int):
    x = x.max
  return x


def _size_hint(shape: Sequence[Any]) -> int:
  """Number of elements of `shape`, taking each symbolic dim at its upper bound (used only to decide if work is 'big')."""
  return prod(_upper(x) for x in shape)


# upcast_reused_axes(skip_hoisted=True): a broadcast load hoisted out of inner loops running this many times in all is
# reused enough by the hoisting alone
HOISTED_MIN_TRIPS = 8


def _is_zero(st: Any) -> bool:
  """A stride known to be 0 (broadcast); a symbolic stride counts as non-zero."""
  return isinstance(st, int) and st == 0


def _divides(d: int, x: Any) -> bool:
  """`x` is an int that `d` divides."""
  return isinstance(x, int) and x % d == 0


@dataclass(frozen=True, order=True)
class Opt:
  """One optimization: op on axis (counted as the op counts axes) by amt (0 = the whole axis)."""

  op: OptOps
  axis: Optional[int] = None
  amt: Optional[int] = None

  def __repr__(self) -> str:
    return f"Opt(op={self.op}, axis={self.axis}, amt={self.amt})"

  def real_axis(self, k: Kernel) -> int:
    """The axis in the kernel's full layout this opt refers to."""
    if self.axis is None:
      return -1
    if self.op is OptOps.UNROLL:
      return k.first_reduce + self.axis
    if self.op in (OptOps.GROUP, OptOps.GROUPTOP):
      return k.first_reduce + k.group_for_reduces + self.axis
    return self.axis


@dataclass
class TensorCoreOptions:
  """Where a tensor core was placed: the n, m, k axes and the axes of the two inputs."""

  axes: Tuple[int, ...]
  axes_exist: Tuple[bool, ...]
  axis_pads: List[Tuple[int, int]]

  def fix_axes(self, removed_axis: int) -> None:
    """Shift the remembered axes after simplify_ones removed one."""
    for tc_dim in [i for i in range(2) if self.axes_exist[i]]:
      if removed_axis < self.axes[tc_dim]:
        lst = list(self.axes)
        lst[tc_dim] -= 1
        self.axes = tuple(lst)
      elif removed_axis == self.axes[tc_dim]:
        exist = list(self.axes_exist)
        exist[tc_dim] = False
        self.axes_exist = tuple(exist)


def _compared_positions(reduceops: Sequence[LazyOp]) -> List[ArangeBuffer]:
  """The ARANGE leaves that a sum compares with (`where(idx == arange(n), x, 0)`, maybe through casts)."""
  found: List[ArangeBuffer] = []
  for r in reduceops:
    if r.op is not ReduceOps.SUM:
      continue
    for op in r.src[0].lazyops:
      if op.op is BinaryOps.CMPNE:
        for x in op.src:
          while x.op is UnaryOps.CAST:
            x = x.src[0]
          if x.op is BufferOps.ARANGE:
            found.append(x.arg)
  return found


class Kernel:
  """A kernel being optimized. `Kernel(ast)` with ast a KERNEL LazyOp of STOREs (or the STOREs themselves)."""

  def __init__(self, *ast: LazyOp, opts: Optional[Renderer] = None) -> None:
    if len(ast) == 1 and ast[0].op is MetaOps.KERNEL:
      self.ast = ast[0]
    else:
      self.ast = LazyOp(MetaOps.KERNEL, tuple(ast))
    verify_lazyop(self.ast)
    if opts is None:
      from tiny.registry import Device
      opts = Device[Device.DEFAULT].renderer
    self.opts: Renderer = opts
    self.reduceops = dedup([x for x in self.ast.lazyops if x.op in ReduceOps])
    self.outbufs: List[MemBuffer] = [x.arg for x in self.ast.src]
    self.bufs: List[Union[MemBuffer, ConstBuffer, ArangeBuffer]] = dedup([x.arg for x in self.ast.lazyops if x.op in BufferOps])
    # positions compared inside a sum: along the axes they vary, the sum folds to one read (index collapse) if the axis
    # stays one loop
    self.compared_positions: List[int] = dedup([self.bufs.index(a) for a in _compared_positions(self.reduceops)])
    earlybufs = [x.arg for r in self.reduceops for x in r.lazyops if x.op in BufferOps]
    self.full_buf_index: int = self.bufs.index(earlybufs[0]) if earlybufs else 0
    # one ShapeTracker per buffer, then one per reduce (its output shape) so reduce axes survive reshapes
    self.sts: List[ShapeTracker] = [x.st for x in self.bufs]
    reduce_in = self._reduce_input_shapes()
    for r in self.reduceops:
      self.sts.append(ShapeTracker.from_shape(tuple(1 if i in r.arg else s for i, s in enumerate(reduce_in[r]))))
    # a row kernel (see row_store_axes) is shaped by its reduces: the output slot holds the reduced shape, so every opt and
    # heuristic sees the row axes as reduce axes, and the real store view rides along in a last slot
    row_axes = row_store_axes(self.ast)
    self.row_store = bool(row_axes)
    if self.row_store:
      self.sts.append(self.sts[0])
      self.sts[0] = ShapeTracker.from_shape(tuple(1 if i in row_axes else s for i, s in enumerate(self.sts[0].shape)))
    # move all reduce axes to the end
    red = list(enumerate(zip(self.full_shape, self.output_shape)))
    permute = tuple([i for i, (s, n) in red if s == n] + [i for i, (s, n) in red if s != n])
    self.reshape_and_permute(None, permute)
    self.applied_opts: List[Opt] = []
    self.group_for_reduces: int = 0
    self.upcasted: int = 0
    self.local_dims: int = 0
    self.tensor_core: Optional[TensorCore] = None
    self.tensor_core_opts: Optional[TensorCoreOptions] = None
    self.use_tensor_cores: int = 0
    self.dont_use_locals: bool = False
    self.uops: Optional[UOpGraph] = None
    self.simplify_ones()
    self.simplify_merge_adjacent()

  def _selects_along(self, axis: int) -> bool:
    for i in self.compared_positions:
      strides = self.sts[i].real_strides()
      if axis < len(strides) and strides[axis] != 0:
        return True
    return False

  def _reduce_input_shapes(self) -> Dict[LazyOp, Tuple[Any, ...]]:
    shapes: Dict[LazyOp, Tuple[Any, ...]] = {}

    def shape_of(x: LazyOp) -> Tuple[Any, ...]:
      if x.op in BufferOps:
        return x.arg.st.shape
      if x.op in ReduceOps:
        s = shapes[x] = shape_of(x.src[0])
        return tuple(1 if i in x.arg else d for i, d in enumerate(s))
      return elementwise_shape([shape_of(y) for y in x.src])
    for r in self.reduceops:
      shape_of(r)
    return shapes

  def copy(self) -> Kernel:
    """A copy that opts can be applied to without changing self."""
    ret = type(self).__new__(type(self))
    ret.__dict__.update(self.__dict__)
    ret.sts = self.sts[:]
    ret.applied_opts = self.applied_opts[:]
    ret.tensor_core_opts = replace(self.tensor_core_opts, axis_pads=self.tensor_core_opts.axis_pads[:]) if self.tensor_core_opts else None
    ret.uops = None
    return ret

  # *** shape properties ***

  @property
  def shape_len(self) -> int:
    return len(self.sts[0].shape)

  @property
  def first_upcast(self) -> int:
    return self.shape_len - self.upcasted

  @property
  def first_reduce(self) -> int:
    """The first axis where the output is smaller than the full shape (first_upcast when there is none)."""
    fu = self.first_upcast
    return [x != y for x, y in zip(self.sts[0].shape[:fu] + (0,), self.full_shape[:fu] + (1,))].index(True)

  @property
  def output_shape(self) -> Tuple[Any, ...]:
    return self.sts[0].shape

  @property
  def full_shape(self) -> Tuple[Any, ...]:
    return self.sts[self.full_buf_index].shape

  @property
  def full_unupcasted_shape(self) -> Tuple[Any, ...]:
    return self.full_shape[:self.first_upcast]

  @property
  def global_dims(self) -> int:
    return self.first_reduce - self.local_dims

  @property
  def upcast_in_mid_reduce_axes(self) -> List[int]:
    return [j for j in range(self.first_reduce, self.first_reduce + self.group_for_reduces) if self.full_shape[j] == self.sts[0].shape[j]]

  @property
  def vars(self) -> List[Any]:
    return self.ast.vars()

  @property
  def reduceop(self) -> Optional[LazyOp]:
    return self.reduceops[0] if self.reduceops else None

  def upcasted_axis(self, i: int) -> List[Tuple[Any, Optional[Any], bool]]:
    upcasted_shape, upcasted_stride = self.sts[i].shape[self.first_upcast:], self.sts[i].real_strides()[self.first_upcast:]
    reduced = [bool(x != y) for x, y in zip(self.sts[0].shape[self.first_upcast:], self.full_shape[self.first_upcast:])]
    return list(zip(upcasted_shape, upcasted_stride, reduced))

  # *** colored shape (DEBUG) ***

  def colors(self) -> List[str]:
    """blue: global, cyan: local, green: grouped reduce, white: upcast in mid reduce, red: reduce, yellow: upcast, magenta: unroll."""
    colors = ["blue"] * self.global_dims if not self.dont_use_locals else ["BLUE"] * self.global_dims
    colors += ["cyan"] * self.local_dims
    group = range(self.first_reduce, self.first_reduce + self.group_for_reduces)
    colors += ["white" if i in self.upcast_in_mid_reduce_axes else "green" for i in group]
    colors += ["red"] * (self.first_upcast - (self.first_reduce + self.group_for_reduces))
    colors += ["magenta" if self.full_shape[i] != self.sts[0].shape[i] else "yellow" for i in range(self.first_upcast, self.shape_len)]
    assert len(colors) == self.shape_len, "colors size mismatch"
    return colors

  def colored_shape(self, pad: Optional[int] = None, dense: bool = False) -> str:
    ret = " ".join(colored(s, color) for s, color in zip([f"{s:4d}" if isinstance(s, int) and not dense else str(s) for s in self.full_shape],
                                                           self.colors()))
    if pad:
      ret += " " * (pad - ansilen(ret))
    return ret

  @functools.cached_property
  def _name_prefix(self) -> str:
    if self.reduceops:
      return "r"
    return "C" if all(x.op in BufferOps for x in self.ast.src[0].src) else "E"

  @property
  def name(self) -> str:
    """The kernel's display name: kind, output count, the colored full shape."""
    name = self._name_prefix + (f"{len(self.ast.src)}_" if len(self.ast.src) > 1 else "_")
    name += colored("_", "BLACK").join([colored(str(x), c) for x, c in zip(self.full_shape, self.colors())])
    return name

  @property
  def function_name(self) -> str:
    return to_function_name(self.name)

  # *** reshaping ***

  def reshape_and_permute(self, new_shape_fxn: Optional[Callable[[Tuple[Any, ...]], Sequence[Any]]], axis: Optional[Sequence[int]]) -> None:
    new_sts = []
    for st in self.sts:
      if new_shape_fxn is not None:
        st = st.reshape(tuple(new_shape_fxn(st.shape)))
      if axis is not None:
        st = st.permute(tuple(axis))
      new_sts.append(st)
    self.sts = new_sts

  def shift_to(self, axis: int, amount: int, top: bool = False, insert_before: Optional[int] = None) -> None:
    """Split axis into (size/amount, amount) (amount first when top) and move the amount part before insert_before."""
    if insert_before is None:
      insert_before = self.shape_len
    move_axis = axis if top else axis + 1
    if move_axis < insert_before:
      insert_before += 1
    self.reshape_and_permute(
      lambda x: list(x[0:axis]) + ((([amount, x[axis] // amount] if top else [x[axis] // amount, amount]) if x[axis] > 1 else [1, 1])) +
      list(x[axis + 1:]),
      [i for i in range(insert_before) if i != move_axis] + [move_axis] + [i for i in range(insert_before, self.shape_len + 1) if i != move_axis])

  def simplify_ones(self) -> bool:
    """Drop axes that are 1 in every view; True when something was dropped."""
    if self.shape_len == 0:
      return False
    all_ones = [s == 1 for s in self.full_shape]
    self.local_dims -= sum(all_ones[self.first_reduce - self.local_dims:self.first_reduce])
    self.upcasted -= sum(all_ones[self.first_upcast:])
    self.reshape_and_permute(lambda shape: [x for i, x in enumerate(shape) if not all_ones[i]], None)
    return any(all_ones)

  def simplify_merge_adjacent(self) -> None:
    """Merge neighbouring axes that every view walks as one (same reduce-ness, compatible strides)."""
    if self.shape_len == 0:
      return
    shapes, strides = [x.shape for x in self.sts], [x.real_strides() for x in self.sts]
    rets = [[(s[0], st[0])] for s, st in zip(shapes, strides)]
    for i in range(1, len(shapes[0])):
      can_merge = []
      for s, st, ret in zip(shapes, strides, rets):
        si, sti, last_st = s[i], st[i], ret[-1][1]
        can_merge.append(sti is not None and last_st is not None and ((sti != 0 and last_st == si * sti) or (sti == 0 and last_st == 0)))
      mergeable = all(can_merge) and i != self.first_reduce
      for j, (s, st) in enumerate(zip(shapes, strides)):
        if mergeable:
          rets[j][-1] = (rets[j][-1][0] * s[i], st[i])
        else:
          rets[j].append((s[i], st[i]))
    for i, x in enumerate(rets[:len(self.sts)]):
      self.sts[i] = self.sts[i].reshape(tuple(y[0] for y in x))

  # *** opts ***

  def apply_opt(self, opt: Opt, append_opt: bool = True) -> None:
    """Apply one opt in place; raises KernelOptError (leaving the kernel unchanged) when it does not apply."""
    saved = (self.sts[:], self.local_dims, self.upcasted, self.group_for_reduces, self.dont_use_locals, self.tensor_core)
    before = self.launch_limit_problems()
    try:
      self._apply_opt(opt)
      # no opt may push the launch past the renderer's limits (one the kernel broke before the opt is not the opt's doing)
      if new := [why for key, why in self.launch_limit_problems().items() if key not in before]:
        raise KernelOptError(f"{opt} exceeds the launch limits: {'; '.join(new)}")
    except KernelOptError:
      self.sts, self.local_dims, self.upcasted, self.group_for_reduces, self.dont_use_locals, self.tensor_core = saved
      raise
    except (ValueError, AssertionError, ZeroDivisionError, TypeError) as e:
      self.sts, self.local_dims, self.upcasted, self.group_for_reduces, self.dont_use_locals, self.tensor_core = saved
      raise KernelOptError(f"{opt} does not apply: {e}") from e
    if append_opt:
      self.applied_opts.append(opt)
    self.uops = None

  def launch_limit_problems(self) -> Dict[Tuple[str, int], str]:
    """The renderer's launch limits this kernel breaks as it stands, as {(kind, dim): why}.

    The sizes are those of the SPECIALs the lowerer makes: local dims (after the tensor core's warp) and grouped reduce
    dims merged down to three workgroup dims, each within local_max[dim] and all together within local_threads_max;
    global dims merged down to three grid dims, each within global_max[dim]."""
    if not getattr(self.opts, "has_local", False):
      return {}  # no launch grid: global dims are loops
    out: Dict[Tuple[str, int], str] = {}
    fs, lmax, gmax = self.full_shape, getattr(self.opts, "local_max", None), getattr(self.opts, "global_max", None)
    for d, sz in enumerate(grouped_dim_sizes(fs[:self.global_dims], 3, reverse=True)):
      if gmax is not None and d < len(gmax) and isinstance(sz, int) and sz > gmax[d]:
        out[("global", d)] = f"global dim {d} is {sz}, the most is {gmax[d]}"
    if self.dont_use_locals:
      return out
    warp = [self.tensor_core.num_threads()] if self.tensor_core is not None else []
    lsizes = warp + list(fs[self.global_dims:self.first_reduce + self.group_for_reduces])
    lgrid = grouped_dim_sizes(lsizes, 3)
    for d, sz in enumerate(lgrid):
      if lmax is not None and d < len(lmax) and isinstance(sz, int) and sz > lmax[d]:
        out[("local", d)] = f"local dim {d} is {sz}, the most is {lmax[d]}"
    if (tmax := getattr(self.opts, "local_threads_max", None)) is not None and all_int(lgrid) and (n := prod(lgrid)) > tmax:
      out[("threads", 0)] = f"{n} threads per workgroup, the most is {tmax}"
    return out

  def _apply_opt(self, opt: Opt) -> None:
    check(isinstance(opt, Opt) and isinstance(opt.op, OptOps), f"not an Opt: {opt!r}")
    check(not self.dont_use_locals or opt.op not in {OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.UPCASTMID}, "not using locals")
    # a row kernel loops over its row axes once per reduce and once to store: a grouped reduce would store from a thread
    # group, and a pad would feed the later reduces padded values through the earlier ones' results
    check(not self.row_store or opt.op not in {OptOps.TC, OptOps.GROUP, OptOps.GROUPTOP, OptOps.PADTO}, f"{opt.op} in a row kernel")
    if opt.op is OptOps.TC:
      check(len(self.applied_opts) == 0, "tensor core opts must be first")
      check(opt.axis is not None and opt.amt is not None, "tensor core opts need an axis and amt")
      check(self._apply_tc_opt(max(1, int(USE_TC.value)), cast(int, opt.axis), cast(int, opt.amt)), "no tensor core available")
      self.simplify_ones()
      return
    if opt.op is OptOps.NOLOCALS:
      check(self.opts.has_local and not self.dont_use_locals, "NOLOCALS is meaningless if locals are not in use")
      check(not self.tensor_core, "tensor cores need locals")
      check(self.local_dims == 0 and self.group_for_reduces == 0, "can't have no locals with locals")
      self.dont_use_locals = True
      return
    check(opt.axis is not None and isinstance(opt.axis, int) and opt.axis >= 0, f"{opt.op} needs a non-negative axis")
    if opt.op is OptOps.SWAP:
      # the order of the global loops: which one is outermost decides what stays in cache (and what the cores split)
      other = opt.amt
      check(isinstance(other, int) and cast(int, opt.axis) < other < self.global_dims, "SWAP exchanges two global axes: axis < amt < global dims")
      check(not self.tensor_core, "can't swap axes with tensor cores")
      perm = list(range(self.shape_len))
      perm[cast(int, opt.axis)], perm[cast(int, other)] = cast(int, other), cast(int, opt.axis)
      self.reshape_and_permute(None, perm)
      return
    axis = opt.real_axis(self)
    check(axis < self.shape_len, f"invalid axis {opt.axis} for {opt.op} (real axis {axis}, {self.shape_len} dims)")
    if opt.amt is not None and opt.amt != 0:
      amt = opt.amt
      check(isinstance(amt, int) and amt > 1, f"amount must be an int > 1, got {amt}")
      check(isinstance(self.full_shape[axis], int), "cannot optimize a symbolic axis")
      if opt.op is not OptOps.PADTO:
        check(self.full_shape[axis] % amt == 0, f"axis {axis} of size {self.full_shape[axis]} is not divisible by {amt}")
    else:
      amt = self.full_shape[axis]
      check(isinstance(amt, int) and amt > 1, f"cannot {opt.op} axis {axis} of size {amt}")
    uses_shared = opt.op in {OptOps.GROUP, OptOps.GROUPTOP} or (self.group_for_reduces and opt.op not in {OptOps.NOLOCALS, OptOps.PADTO})
    if self.reduceop is not None and uses_shared:
      acc_sz = self.reduceop.dtype.itemsize
      upcast_sz = prod([a for a, b in zip(self.full_shape[self.first_upcast:], self.sts[0].shape[self.first_upcast:]) if a == b])
      local_sz = prod(self.full_shape[self.first_reduce - self.local_dims:self.first_reduce + self.group_for_reduces])
      check(amt * acc_sz * upcast_sz * local_sz <= self.opts.shared_max, "exceeds maximum shared memory size")

    if opt.op is OptOps.LOCAL:
      check(self.opts.has_local, "target does not support local")
      check(axis < self.global_dims, "local is for globals")
      check(not self.tensor_core or self.local_dims < 2, "tensor cores leave room for two local dims")
      self.shift_to(axis, amt, insert_before=self.first_reduce)
      self.local_dims += 1
    elif opt.op in {OptOps.GROUP, OptOps.GROUPTOP}:
      check(self.opts.has_local and self.opts.has_shared, "target does not support local or shared mem")
      check(self.first_reduce + self.group_for_reduces <= axis < self.first_upcast, "must be a reduce axis to group")
      check(not self.tensor_core, "can't group with tensor cores")
      check(not any(r2 in r.lazyops[1:] for r in self.reduceops for r2 in self.reduceops), "can't group nested reduces")
      check(opt.op is OptOps.GROUPTOP or not self._selects_along(axis), "a sum that selects one element along this axis reads "
            "it once if the axis stays contiguous (GROUPTOP keeps that, GROUP does not)")
      self.shift_to(axis, amt, top=(opt.op is OptOps.GROUPTOP), insert_before=self.first_reduce + self.group_for_reduces)
      self.group_for_reduces += 1
    elif opt.op is OptOps.UNROLL:
      check(not self.tensor_core, "can't unroll with tensor cores")
      check(axis < self.first_upcast, "can't upcast an upcasted axis")
      check(self.first_reduce + self.group_for_reduces <= axis, "UNROLL is for reduce axes")
      check(amt <= 32, "don't unroll more than 32")
      check(not self._selects_along(axis), "a sum that selects one element along this axis reads it once unless unrolled")
      self.shift_to(axis, amt, insert_before=None)
      self.upcasted += 1
    elif opt.op is OptOps.UPCAST:
      check(axis < self.first_reduce, "upcast is for non-reduce axes")
      check(amt <= 16, "don't upcast more than 16")
      self.shift_to(axis, amt, insert_before=None)
      self.upcasted += 1
    elif opt.op is OptOps.BLOCK:
      # cache blocking for loop-based targets: the inner amt of a global axis becomes the innermost global loop, so the
      # loops between (another output axis) run once per block instead of once per whole axis
      check(axis < self.global_dims, "BLOCK splits a global axis")
      check(not self.tensor_core, "can't block with tensor cores")
      check(self.full_shape[axis] > amt, f"BLOCK {amt} must be smaller than axis {axis} of size {self.full_shape[axis]}")
      self.shift_to(axis, amt, insert_before=self.global_dims)
    elif opt.op is OptOps.UPCASTMID:
      check(any(isinstance(b.dtype, ImageDType) for b in self.bufs) and self.group_for_reduces != 0 and self.first_reduce <= 2,
            "UPCASTMID is only for image kernels with a grouped reduce")
      raise KernelOptError("UPCASTMID is not supported by this codegen")
    elif opt.op is OptOps.PADTO:
      check(not self.vars, "does not work with symbolic shape")
      check(axis < self.first_upcast, "cannot pad upcasted")
      if self.first_reduce <= axis:
        check(all(r.op is ReduceOps.SUM for r in self.reduceops), "can only pad a SUM reduce")
        check(all(op.op not in UNSAFE_PAD_OPS for r in self.reduceops for op in r.src[0].lazyops), "cannot pad a reduce through unsafe ops")
      padded = False
      for i, st in enumerate(self.sts):
        if st.shape[axis] == 1:
          continue
        check(bool(st.shape[axis] > amt // 4), f"pad adds more than quadruple the work {st.shape[axis]=} > {amt // 4=}")
        if (ru := round_up(cast(int, st.shape[axis]), amt) - st.shape[axis]):
          self.sts[i] = st.pad(((0, 0),) * axis + ((0, ru),) + ((0, 0),) * (len(st.shape) - axis - 1))
          padded = True
      check(padded, "nothing was padded")
    if self.simplify_ones() and self.tensor_core_opts:
      self.tensor_core_opts.fix_axes(axis)

  def apply_opts(self, opts: Sequence[Opt]) -> Kernel:
    for o in opts:
      self.apply_opt(o)
    return self

  def required_optimizations(self) -> Kernel:
    """Opts a kernel needs to be correct on this target (image buffers need float4 along their unit-stride axis)."""
    for buf_index, buf in enumerate(self.bufs):
      if isinstance(buf.dtype, ImageDType):
        unit_stride_axes_mul_4 = [i for i in self.sts[buf_index].unit_stride_axes(ignore_valid=True) if self.sts[buf_index].shape[i] % 4 == 0]
        if unit_stride_axes_mul_4 and all(x < self.first_upcast for x in unit_stride_axes_mul_4) and unit_stride_axes_mul_4[0] not in \
            self.upcast_in_mid_reduce_axes:
          self.apply_opt(Opt(OptOps.UPCAST, unit_stride_axes_mul_4[0], 4))
    return self

  # *** tensor cores ***

  def _apply_tc_opt(self, use_tensor_cores: int, axis: int, amt: int) -> bool:
    check(bool(self.opts.has_local), "tensor cores need local dims (a warp of threads)")
    check(0 <= amt <= 2, f"tc_opt must be 0, 1 or 2, got {amt}")
    choices = [(tc, c) for tc in self.opts.tensor_cores for c in self._tc_candidates(tc)]
    check(len(choices) > 0, "no tensor core matches this kernel")
    check(0 <= axis < len(choices), f"tensor core choice {axis} out of range ({len(choices)} choices)")
    tc, (axis_n, axis_m, axis_k) = choices[axis]
    # the tile axes become the first three upcasted axes, in (N, M, K) order; the lowerer maps them to the warp's registers
    for ax, sz in ((axis_n, tc.dims[0]), (axis_m, tc.dims[1]), (axis_k, tc.dims[2])):
      self.shift_to(ax, sz)
      self.upcasted += 1
    self.tensor_core, self.use_tensor_cores = tc, use_tensor_cores
    return True

  def _tc_candidates(self, tc: TensorCore) -> List[Tuple[int, int, int]]:
    """(n, m, k) axis choices where this tensor core computes the kernel's single SUM of a product of two loads."""
    if len(self.reduceops) != 1 or self.row_store or self.group_for_reduces or self.upcasted or self.local_dims or self.dont_use_locals:
      return []
    r = self.reduceops[0]
    mul = r.src[0]
    # SUM(CAST(MUL(a, b))) (a half matmul accumulating in float) also fits: the tensor core multiplies in dtype_out anyway
    if mul.op is UnaryOps.CAST and mul.arg == tc.dtype_out:
      mul = mul.src[0]
    if r.op is not ReduceOps.SUM or r.dtype != tc.dtype_out or mul.op is not BinaryOps.MUL:
      return []
    bufs = []
    for s in mul.src:
      if s.op is UnaryOps.CAST and s.arg == tc.dtype_out and s.src[0].op is BufferOps.LOAD:
        s = s.src[0]
      if s.op is not BufferOps.LOAD or s.arg.dtype != tc.dtype_in:
        return []
      bufs.append(self.bufs.index(s.arg))
    st0, st1 = self.sts[bufs[0]].real_strides(), self.sts[bufs[1]].real_strides()
    fs = self.full_shape

    def fits(i: int, d: int) -> bool:
      return isinstance(fs[i], int) and fs[i] % d == 0
    axis_n = [i for i in range(self.first_reduce) if fits(i, tc.dims[0]) and ((st0[i] == 0) != (st1[i] == 0))]
    axis_m = [i for i in range(self.first_reduce) if fits(i, tc.dims[1])]
    axis_k = [i for i in range(self.first_reduce, self.first_upcast) if fits(i, tc.dims[2])]
    ret = []
    for n, m, k in itertools.product(reversed(axis_n), reversed(axis_m), reversed(axis_k)):
      # one source is broadcast along n and varies along m, the other the opposite way
      if n != m and st0[n] is not None and st1[n] is not None and st0[m] is not None and st1[m] is not None and \
          ((st0[n] == 0 and st1[n] != 0 and st0[m] != 0 and st1[m] == 0) or (st1[n] == 0 and st0[n] != 0 and st1[m] != 0 and st0[m] == 0)):
        ret.append((n, m, k))
    return ret

  def apply_tensor_cores(self, use_tensor_cores: int = 1, extra_opts: Optional[List[Opt]] = None, axis: int = 0,
                         tc_opt: Optional[int] = None) -> bool:
    """Try to place a tensor core; True when one was applied."""
    if tc_opt is None:
      tc_opt = int(TC_OPT.value)
    if not self.opts.tensor_cores or not use_tensor_cores:
      return False
    try:
      self.apply_opt(Opt(OptOps.TC, axis, tc_opt))
    except KernelOptError:
      return False
    for o in extra_opts or []:
      self.apply_opt(o)
    return True

  # *** heuristic ***

  def hand_coded_optimizations(self) -> Kernel:
    """A fast heuristic for this kernel's opts: the required ones, then tensor cores when the renderer declares some that fit,
    then the renderer's own heuristic (`Renderer.hand_coded_optimizations`, where a device keeps its hardware-specific
    tuning), and when that declines, core's device-neutral one: grouping for big reduces, upcasts along broadcast axes,
    small-reduce unrolls, local sizes."""
    self.required_optimizations()
    if self.apply_tensor_cores(int(USE_TC.value)):
      return self
    if self.opts.hand_coded_optimizations(self):
      return self
    # matvec: group the reduce, one thread per output row chunk
    if self.opts.has_local and self.opts.has_shared and len(self.reduceops) == 1 and self.reduceop is not None and \
        self.reduceop.op is ReduceOps.SUM and len(self.full_shape) >= 2 and all_int(self.full_shape):
      mulop = self.reduceop.src[0]
      if mulop.op is BinaryOps.MUL and mulop.src[0].op is BufferOps.LOAD and mulop.src[1].op is BufferOps.LOAD:
        st0 = self.sts[self.bufs.index(mulop.src[0].arg)]
        st1 = self.sts[self.bufs.index(mulop.src[1].arg)]
        strides0, strides1 = st0.real_strides(), st1.real_strides()

        def has_expanded_axis(shape: Tuple[Any, ...], strides: Tuple[Any, ...]) -> bool:
          return any(isinstance(s, int) and s > 1 and _is_zero(st) for s, st in zip(shape, strides))
        if strides0[self.first_reduce] == 1 and not (has_expanded_axis(st0.shape, strides0) and has_expanded_axis(st1.shape, strides1)):
          for global_idx in range(self.global_dims):
            if self.full_shape[self.first_reduce] % 32 == 0 and self.full_shape[global_idx] % 8 == 0:
              try:
                self.apply_opt(Opt(OptOps.GROUP, 0, 8))
                self.apply_opt(Opt(OptOps.LOCAL, global_idx, 4))
                if self.full_shape[global_idx] % 8 == 0:
                  self.apply_opt(Opt(OptOps.UPCAST, global_idx, 2))
              except KernelOptError:
                pass
              return self
    if self.opts.has_local and self.opts.has_shared and all_int(self.sts[0].shape[:self.first_reduce]):
      # big reduce with a small output: split the reduce over the threads of a group
      if self.first_reduce < self.first_upcast and prod(self.sts[0].shape[:self.first_reduce]) <= 2048 and \
          not any(r2 in r.lazyops[1:] for r in self.reduceops for r2 in self.reduceops):
        for sz in ([256, 16] if prod(self.sts[0].shape[:self.first_reduce]) <= 32 else [16]):
          if all(_divides(sz, st.shape[self.first_reduce]) or st.shape[self.first_reduce] == 1 for st in self.sts):
            try:
              self.apply_opt(Opt(OptOps.GROUPTOP, 0, sz))
              break
            except KernelOptError:
              pass
    if self.group_for_reduces:
      return self
    self.upcast_reused_axes()
    self.unroll_reduce()
    self.upcast_output()
    # local groups
    if self.opts.has_local:
      local_axis_ranking = [(any(_is_zero(st.views[-1].strides[axis]) for st in self.sts), axis) for axis in range(self.first_reduce)]
      to_local: List[Tuple[int, int]] = []
      for _, axis in sorted(local_axis_ranking, key=lambda x: (-x[0], -x[1])):
        local_size = prod(sz for _, sz in to_local)
        s = self.full_shape[axis]
        local_sz = next((x for x in ([32] * (axis == 0) + [16, 8, 4, 3, 2]) if _divides(x, s) and local_size * x <= 128),
                        None)
        if local_sz is not None:
          to_local.append((axis, local_sz))
      deleted_shape = 0
      for axis, local_sz in sorted(to_local[:3]):
        axis = axis - deleted_shape
        will_delete_shape = local_sz == self.full_shape[axis]
        try:
          self.apply_opt(Opt(OptOps.LOCAL, axis, local_sz))
        except KernelOptError:
          continue
        if will_delete_shape:
          deleted_shape += 1
    return self

  def upcast_reused_axes(self, skip_consts: bool = False, skip_hoisted: bool = False) -> None:
    """Upcast (by 3 or 4) output axes that some buffer broadcasts over, so that each loaded value is reused from a register,
    while the kernel has 1024 or more outputs. With skip_consts a constant's broadcast does not count as reuse (a device
    whose vector width that upcast would cut says so). With skip_hoisted neither does a buffer that is also broadcast
    along the innermost loops inside the axis, HOISTED_MIN_TRIPS iterations or more in all: its load is invariant in
    them, so a compiler that hoists invariant loads (a CPU's) already reuses it from a register, and the upcast only
    unrolls the loop body. A heuristic step, for core's and a device's heuristics."""
    upcasted_axis = set()
    reuse = [i for i in range(len(self.sts)) if not (skip_consts and i < len(self.bufs) and isinstance(self.bufs[i], (ConstBuffer, ArangeBuffer)))]

    def hoisted(buf_index: int, axis: int) -> bool:
      # the innermost loops (inside axis) that the buffer is broadcast along: its load sits outside them
      if not skip_hoisted:
        return False
      view, trips = self.sts[buf_index].views[-1], 1
      for a in reversed(range(axis + 1, self.first_upcast)):
        # a mask that cuts an axis makes the load's validity, so the load itself, vary along it
        if not (_is_zero(view.strides[a]) or view.shape[a] == 1) or (view.mask is not None and view.mask[a] != (0, view.shape[a])):
          break
        trips *= _upper(view.shape[a])
      return trips >= HOISTED_MIN_TRIPS
    while _size_hint(self.sts[0].shape[:self.first_reduce]) >= 1024:
      xb_choices = []
      for axis, upcast_amount in itertools.product(range(self.first_reduce), [3, 4]):
        if axis not in upcasted_axis and _divides(upcast_amount, self.full_shape[axis]) and \
            any(_is_zero(self.sts[buf_index].views[-1].strides[axis]) and not any(_is_zero(x[1]) for x in self.upcasted_axis(buf_index))
                and not hoisted(buf_index, axis) for buf_index in reuse):
          # rank by how many buffers move along the axis, then by how far (a symbolic stride counts as moving, by its upper bound)
          strides = [st.views[-1].strides[axis] for st in self.sts]
          xb_choices.append((sum(int(not isinstance(x, int) or x > 0) for x in strides), sum(_upper(x) for x in strides), axis, upcast_amount))
      if not xb_choices:
        break
      xb_choices = sorted(xb_choices)
      try:
        self.apply_opt(Opt(OptOps.UPCAST, xb_choices[0][2], xb_choices[0][3]))
      except KernelOptError:
        break
      upcasted_axis.add(xb_choices[0][2])

  def unroll_reduce(self, long_unroll: int = 4) -> None:
    """Unroll a small last reduce axis whole (twice when what is left is tiny); a longer one by long_unroll when that divides
    it (0: leave it rolled). Nothing when upcasts already hold 64 or more values. A heuristic step, like upcast_reused_axes."""
    if self.first_reduce < self.first_upcast and (prod(self.full_shape[self.first_upcast:]) <= 4 or
                                                   not any(r for _, _, r in self.upcasted_axis(self.full_buf_index))) and \
        (self.upcasted == 0 or prod(self.full_shape[-self.upcasted:]) < 64):
      s = self.full_unupcasted_shape[-1]
      if isinstance(s, int) and s <= 32:
        try:
          self.apply_opt(Opt(OptOps.UNROLL, len(self.full_unupcasted_shape) - 1 - self.first_reduce, 0))
          if self.first_reduce < self.first_upcast and isinstance(s2 := self.full_unupcasted_shape[-1], int) and s2 <= 3:
            self.apply_opt(Opt(OptOps.UNROLL, len(self.full_unupcasted_shape) - 1 - self.first_reduce, 0))
        except KernelOptError:
          pass
      elif long_unroll and _divides(long_unroll, s):
        try:
          self.apply_opt(Opt(OptOps.UNROLL, len(self.full_unupcasted_shape) - 1 - self.first_reduce, long_unroll))
        except KernelOptError:
          pass

  def upcast_output(self, amt: int = 4) -> None:
    """When nothing is upcast yet and the kernel has 64 or more outputs, upcast the last output axis by amt (if amt divides
    it), so each thread computes several neighbouring outputs. A heuristic step, like upcast_reused_axes."""
    if self.upcasted == 0 and self.first_reduce > 0 and _divides(amt, self.full_shape[self.first_reduce - 1]) and \
        _size_hint(self.sts[0].shape[:self.first_reduce]) >= 64:
      try:
        self.apply_opt(Opt(OptOps.UPCAST, self.first_reduce - 1, amt))
      except KernelOptError:
        pass

  # *** lowering ***

  def get_optimized_ast(self) -> LazyOp:
    """The AST with every ShapeTracker in the optimized layout, reduce axes renumbered, KernelInfo attached."""
    nb = len(self.bufs)
    buf_sts = {b: self.sts[i] for i, b in enumerate(self.bufs)}
    red_sts = {r: self.sts[nb + i] for i, r in enumerate(self.reduceops)}
    cache: Dict[LazyOp, LazyOp] = {}

    def shape_of(x: LazyOp) -> Tuple[Any, ...]:
      if x.op in BufferOps:
        return buf_sts[x.arg].shape
      if x.op in ReduceOps:
        return red_sts[x].shape
      return elementwise_shape([shape_of(y) for y in x.src])

    def fixup(x: LazyOp) -> LazyOp:
      if x in cache:
        return cache[x]
      if x.op is BufferOps.STORE and self.row_store:
        ret = LazyOp(x.op, tuple(fixup(s) for s in x.src), replace(x.arg, st=self.sts[-1]))
      elif x.op in BufferOps:
        ret = LazyOp(x.op, tuple(fixup(s) for s in x.src), replace(x.arg, st=buf_sts[x.arg]))
      elif x.op in ReduceOps:
        in_shape, out_shape = shape_of(x.src[0]), red_sts[x].shape
        axes = tuple(i for i, (a, b) in enumerate(zip(in_shape, out_shape)) if a != b)
        ret = LazyOp(x.op, (fixup(x.src[0]),), axes)
      else:
        ret = LazyOp(x.op, tuple(fixup(s) for s in x.src), x.arg)
      cache[x] = ret
      return ret
    return LazyOp(MetaOps.KERNEL, tuple(fixup(s) for s in self.ast.src), KernelInfo(self.local_dims, self.upcasted, self.dont_use_locals))

  def linearize(self, extra_pm: Optional[PatternMatcher] = None) -> Kernel:
    """Lower and linearize into self.uops (a UOpGraph)."""
    if DEBUG >= 3:
      print(self.colored_shape(), self.applied_opts)
    sink = lazyop_to_uop(self.get_optimized_ast(), self.opts, self.group_for_reduces, self.tensor_core)
    self.uops = UOpGraph(sink, self.opts).linearize(extra_pm)
    return self

  def to_program(self, name_override: Optional[str] = None) -> Program:
    """Linearize and render with the kernel's renderer."""
    from tiny.renderer import Program   # the renderer layer is above codegen
    self.linearize()
    assert self.uops is not None
    uops = self.uops.uops
    ansiname = name_override if name_override is not None else self.name
    src = self.opts.render(to_function_name(ansiname), uops)
    flops, _ = self.uops.flops_mem()
    mem = get_lazyop_info(self.ast).mem_estimate
    return Program(ansiname, src, self.opts.device, [1, 1, 1],
                   [1, 1, 1] if self.opts.has_local else None, uops, op_estimate=flops, mem_estimate=mem)

