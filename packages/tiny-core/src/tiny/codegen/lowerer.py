"""Lower a kernel AST (all ShapeTrackers in the kernel's axis order) to a UOp graph.

Axis layout of an optimized kernel (the same as `Kernel`):
`[global dims | local dims | grouped reduce dims | reduce loops | upcasted dims]`.
Global/local dims become SPECIALs (or loops when the renderer has no local memory model), reduce dims
become RANGE loops owned by each reduce, upcasted dims become EXPANDs that the expander turns into lanes.
Index and valid expressions come from `ShapeTracker.expr_idxs`, rendered from symbolic nodes to uops.
"""
from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple, cast

from tiny.dtype import DType, PtrDType, dtypes
from tiny.helpers import prod
from tiny.ops import ArangeBuffer, BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps, TernaryOps, UnaryOps
from tiny.codegen.uops import UOp, UOps
from tiny.codegen.symbolic_rules import sum_result
from tiny.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, NumNode, SumNode, Variable

if TYPE_CHECKING:
  from tiny.renderer import Renderer, TensorCore

IDX = dtypes.int32


def _render_table() -> Dict[type, Any]:

  def sub(b: Any, ops: Any, ctx: Any) -> UOp:
    return UOp.const(IDX, b) if isinstance(b, int) else b.render(ops, ctx)

  def var(n: Any, ops: Any, ctx: Any) -> UOp:
    if n.expr in ctx:
      return ctx[n.expr]
    return UOp(UOps.DEFINE_VAR, IDX, (), Variable(n.expr, n.min, n.max))
  return {
    Variable: var,
    NumNode: lambda n, ops, ctx: UOp.const(IDX, n.b),
    MulNode: lambda n, ops, ctx: n.a.render(ops, ctx) * sub(n.b, ops, ctx),
    DivNode: lambda n, ops, ctx: n.a.render(ops, ctx) // sub(n.b, ops, ctx),
    ModNode: lambda n, ops, ctx: n.a.render(ops, ctx) % sub(n.b, ops, ctx),
    LtNode: lambda n, ops, ctx: n.a.render(ops, ctx).lt(sub(n.b, ops, ctx)),
    SumNode: lambda n, ops, ctx: functools.reduce(lambda a, b: a + b, [x.render(ops, ctx) for x in n.nodes]),
    AndNode: lambda n, ops, ctx: functools.reduce(lambda a, b: a & b, [x.render(ops, ctx) for x in n.nodes]),
  }


def sym_to_uop(x: Any, ctx: Optional[Dict[str, UOp]] = None) -> UOp:
  """An int or symbolic Node as an int32 uop (Variables not in ctx become DEFINE_VARs)."""
  if isinstance(x, int):
    return UOp.const(IDX, x)
  return x.render(_render_table(), ctx or {})


def grouped_dim_sizes(sizes: Sequence[Any], max_count: int, reverse: bool = False) -> List[Any]:
  """The size of each SPECIAL that get_grouped_dims makes from sizes: the leading dims merged down to max_count, in
  launch order (reversed for reverse=True). The kernel optimizer checks launch limits on these."""
  if not sizes:
    return []
  cut = max(1, len(sizes) - max_count + 1)
  out = [prod(sizes[:cut]), *sizes[cut:]]
  return out[::-1] if reverse else out


def get_grouped_dims(prefix: str, start_dim: int, sizes: Sequence[Any], max_count: int, reverse: bool = False) -> Tuple[List[UOp], List[UOp]]:
  """SPECIAL uops for a list of dims, merging leading dims when there are more than max_count.

  Returns (the index uop of each dim, the SPECIAL uops)."""
  if not sizes:
    return [], []
  axes = list(range(len(sizes)))
  groups: List[List[int]] = [[a] for a in axes]
  while len(groups) > max_count:
    groups = [groups[0] + groups[1]] + groups[2:]
  order = list(reversed(groups)) if reverse else groups
  idxs: List[Optional[UOp]] = [None] * len(sizes)
  specials = []
  for d, g in enumerate(order):
    size = prod([sizes[a] for a in g])
    sp = UOp(UOps.SPECIAL, IDX, (), (d, f"{prefix}{d}", size))
    specials.append(sp)
    div = 1
    for a in reversed(g):
      v = sp if len(g) == 1 else (sp // div) % sizes[a] if a != g[0] else sp // div
      idxs[a] = v
      div = div * sizes[a]
  return [x for x in idxs if x is not None], specials


class Lowerer:
  """Builds the UOp graph of one kernel AST."""

  def __init__(self, ast: LazyOp, opts: Renderer, group_for_reduces: int = 0, tensor_core: Optional[TensorCore] = None) -> None:
    if ast.op is not MetaOps.KERNEL:
      raise ValueError(f"lowering needs a KERNEL LazyOp, got {ast.op}")
    self.ast, self.opts = ast, opts
    self.ki: KernelInfo = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    bufs = [x.arg for x in ast.lazyops if x.op in BufferOps]
    shapes = [b.st.shape for b in bufs]
    self.shape_len = len(shapes[0])
    if any(len(s) != self.shape_len for s in shapes):
      raise ValueError(f"all ShapeTrackers of a kernel need the same number of dims, got {shapes}")
    self.full_shape = tuple(next((s[i] for s in shapes if s[i] != 1), 1) for i in range(self.shape_len))
    self.out_shape = ast.src[0].arg.st.shape
    # a row kernel is laid out by its reduces' output shape; its store gets loops of its own over the row axes
    self.row_axes = row_axes = row_store_axes(ast)
    if row_axes:
      if group_for_reduces or tensor_core is not None:
        raise ValueError("a row kernel has no grouped reduce or tensor core")
      self.out_shape = tuple(1 if i in row_axes else s for i, s in enumerate(self.out_shape))
      if len([a for a in row_axes if a < self.shape_len - self.ki.upcasted]) > 1:
        raise ValueError("a row kernel's store walks its row in one loop (the linearizer cannot order two free loops)")
    self.first_upcasted = self.shape_len - self.ki.upcasted
    self.first_reduce = next((i for i in range(self.first_upcasted) if self.out_shape[i] != self.full_shape[i]), self.first_upcasted)
    # (a reduce, its source): the reduce's loop keeps each value of its source in the output for the store loop to load
    self.row_keep = _row_kept_value(ast, row_axes, self.first_upcasted) if row_axes else None
    self.side_store: Optional[Tuple[UOp, Tuple[UOp, ...]]] = None   # that loop's STORE, and its RANGEs
    self.local_dims, self.group = self.ki.local_dims, group_for_reduces
    self.global_dims = self.first_reduce - self.local_dims
    self.outbufs = {x.arg.idx for x in ast.src}
    self.cache: Dict[Tuple[int, Tuple[Optional[int], ...]], UOp] = {}
    self.range_ids = itertools.count(0)
    self.local_ids = itertools.count(0)
    self.bufs: Dict[Tuple[Any, ...], UOp] = {}
    self._vars = {a: self._var(a) for a in range(self.shape_len)}
    self.tc = tensor_core
    if self.tc is not None:
      # the register layouts come with the TensorCore (its device declares them); the WMMA uop carries them on for the emulator
      self.tc_layout = self.tc.register_layout()
      self.tc_warp = self.tc.num_threads()
      self.tc_arg = (str(self.tc), tuple(self.tc.dims), self.tc.dtype_in, self.tc.dtype_out, getattr(opts, "device", ""), self.tc_warp)
      self.tc_axes = (self.first_upcasted, self.first_upcasted + 1, self.first_upcasted + 2)
      if self.ki.upcasted < 3 or self.group:
        raise ValueError("a tensor-core kernel keeps its N, M, K tile as the first three upcasted axes")

  def _var(self, a: int) -> Any:
    s = self.full_shape[a]
    hi = s - 1 if isinstance(s, int) else s.max - 1
    return Variable(f"_uidx{a}", 0, hi) if (not isinstance(hi, int) or hi > 0) else NumNode(0)

  # *** index uops ***

  def base_idxs(self) -> List[UOp]:
    fs = self.full_shape
    idxs: List[UOp] = []
    has_local = getattr(self.opts, "has_local", False)
    if has_local:
      if self.ki.dont_use_locals:
        gi, _ = get_grouped_dims("idx", 0, fs[:self.global_dims], 3, reverse=True)
        idxs += gi
      else:
        gi, _ = get_grouped_dims("gidx", 0, fs[:self.global_dims], 3, reverse=True)
        lsizes = list(fs[self.global_dims:self.first_reduce + self.group])
        if self.tc is not None:
          # lidx0 is the lane inside the warp: the threads that share one tensor-core instruction
          if len(lsizes) > 2:
            raise ValueError("tensor-core kernels allow at most two local dims")
          li, _ = get_grouped_dims("lidx", 0, [self.tc_warp] + lsizes, 3)
          self.lane, li = li[0], li[1:]
        else:
          li, _ = get_grouped_dims("lidx", 0, lsizes, 3)
        idxs += gi + li
    else:
      idxs += [UOp(UOps.RANGE, IDX, (UOp.const(IDX, 0), sym_to_uop(s)), (i, False)) for i, s in enumerate(fs[:self.first_reduce])]
      if self.group:
        raise ValueError("grouped reduces need local memory")
    # reduce dims get their ranges from each reduce; views that see this placeholder have size 1 there
    while len(idxs) < self.first_upcasted:
      idxs.append(UOp.const(IDX, 0))
    # an unrolled reduce axis is a lane only inside its reduce: outside it (the store, elementwise ops after the
    # reduce) views have size 1 there, and an EXPAND would turn one store into one store per lane
    for a in range(self.first_upcasted, self.shape_len):
      idxs.append(self._upcast_expand(a) if self.out_shape[a] == fs[a] else UOp.const(IDX, 0))
    if self.tc is not None:
      # outside the tensor-core reduce, the N and M tile coordinates are those of the C registers this lane holds
      n_ax, m_ax, k_ax = self.tc_axes
      idxs[m_ax], idxs[n_ax] = self._layout_expand("c", 0), self._layout_expand("c", 1)
      idxs[k_ax] = UOp.const(IDX, 0)
    assert len(idxs) == self.shape_len
    return idxs

  def _upcast_expand(self, a: int) -> UOp:
    s = self.full_shape[a]
    return UOp(UOps.EXPAND, IDX, tuple(UOp.const(IDX, i) for i in range(s)), ((a, s),))

  def _layout_expand(self, operand: str, coord: int) -> UOp:
    """An EXPAND over the registers of a tensor-core operand, giving row (coord 0) or column (coord 1) per register."""
    i = "abc".index(operand)
    lay, vaxis = self.tc_layout[i], 10001 + i
    count = lay.count
    vals = []
    for e in range(count):
      v = lay.coords(self.lane, e)[coord]
      vals.append(v if isinstance(v, UOp) else UOp.const(IDX, v))
    return UOp(UOps.EXPAND, IDX, tuple(vals), ((vaxis, count),))

  def render_st(self, st: Any, idxs: Sequence[UOp]) -> Tuple[UOp, UOp]:
    idx, valid = st.expr_idxs([self._vars[a] for a in range(self.shape_len)])
    ctx = {f"_uidx{a}": idxs[a] for a in range(self.shape_len)}
    tbl = _render_table()
    iu = UOp.const(IDX, idx) if isinstance(idx, int) else idx.render(tbl, ctx)
    vu = UOp.const(dtypes.bool, bool(valid)) if isinstance(valid, int) else valid.render(tbl, ctx)
    if vu.dtype != dtypes.bool:
      vu = vu.ne(0)
    return iu, vu

  def global_buf(self, mb: MemBuffer) -> UOp:
    key = ("g", mb.idx)
    if key not in self.bufs:
      self.bufs[key] = UOp(UOps.DEFINE_GLOBAL, PtrDType(mb.dtype), (), (mb.idx, mb.idx in self.outbufs))
    return self.bufs[key]

  # *** lowering ***

  def lower(self) -> UOp:
    idxs = self.base_idxs()
    return UOp(UOps.SINK, None, tuple(self.to_uop(s, idxs) for s in self.ast.src), self.ki)

  def _row_idxs(self, idxs: List[UOp], after: Optional[UOp] = None) -> List[UOp]:
    """idxs with a fresh loop (or, for an unrolled part, the lanes) on each row axis: the store loop of a row kernel,
    opened only once `after` is done when given."""
    new_idxs = list(idxs)
    for a in self.row_axes:
      new_idxs[a] = self._upcast_expand(a) if a >= self.first_upcasted else self._fresh_range(a, after)
    return new_idxs

  def _keep_row_values(self, idxs: List[UOp]) -> UOp:
    """Lower the reduce of row_keep (its loop stores each value of its source into the output, see reduce) and return
    the AFTER that is done once that loop has ended."""
    assert self.row_keep is not None
    # the reduce covers every row axis, so this is the cache entry the store's value finds too (reduce keys skip its axes)
    self.to_uop(self.row_keep[0], idxs)
    assert self.side_store is not None, "the kept reduce has a loop, which stores its values"
    store, ranges = self.side_store
    return UOp(UOps.AFTER, None, (store, *ranges))

  def to_uop(self, x: LazyOp, idxs: List[UOp]) -> UOp:
    if x.op in ReduceOps and not self.group and self.tc is None:
      # a reduce's value does not depend on the index along the axes it reduces: one reduce serves every reader of the row
      key = (id(x), tuple(None if a in x.arg else id(i) for a, i in enumerate(idxs)))
    else:
      key = (id(x), tuple(id(i) for i in idxs))
    if (ret := self.cache.get(key)) is None:
      ret = self.cache[key] = self._to_uop(x, idxs)
    return ret

  def _to_uop(self, x: LazyOp, idxs: List[UOp]) -> UOp:
    if x.op is BufferOps.CONST:
      cb: ConstBuffer = x.arg
      _, valid = self.render_st(cb.st, idxs)
      val = cb.val
      c = UOp.const(cb.dtype, val) if isinstance(val, (int, float, bool)) else sym_to_uop(val).cast(cb.dtype) if cb.dtype != IDX \
        else sym_to_uop(val)
      return c if valid.op is UOps.CONST and valid.arg is True else valid.where(c, UOp.const(cb.dtype, 0))
    if x.op is BufferOps.ARANGE:
      ab: ArangeBuffer = x.arg
      # the value is the position in the 1-D base: the index a load from it would use
      pos, ok = self.render_st(ab.st, idxs)
      at = pos if ab.dtype == IDX else pos.cast(ab.dtype)
      return at if ok.op is UOps.CONST and ok.arg is True else ok.where(at, UOp.const(ab.dtype, 0))
    if x.op is BufferOps.LOAD:
      mb: MemBuffer = x.arg
      idx, valid = self.render_st(mb.st, idxs)
      buf = self.global_buf(mb)
      if valid.op is UOps.CONST and valid.arg is True:
        return UOp(UOps.LOAD, mb.dtype, (buf, idx))
      return UOp(UOps.LOAD, mb.dtype, (buf, idx, valid, UOp.const(mb.dtype, 0)))
    if x.op is BufferOps.STORE:
      mb = x.arg
      if self.row_axes:
        after = self._keep_row_values(idxs) if self.row_keep is not None else None
        idxs = self._row_idxs(idxs, after)
        if self.row_keep is not None:
          # the value the reduce's loop stored at this index is loaded back instead of computed again; this LOAD and the
          # store below are in the store loop, which opens after that loop (after), whatever the rewrites fold away
          kidx, _ = self.render_st(mb.st, idxs)
          self.cache[(id(self.row_keep[1]), tuple(id(i) for i in idxs))] = UOp(UOps.LOAD, mb.dtype, (self.global_buf(mb), kidx))
      idx, valid = self.render_st(mb.st, idxs)
      sval = self.to_uop(x.src[0], idxs)
      # after a grouped reduce every thread of the group holds the result: only the first one writes
      for a in range(self.first_reduce, self.first_reduce + self.group):
        valid = valid & idxs[a].eq(0)
      buf = self.global_buf(mb)
      return UOp(UOps.STORE, None, (buf, idx, sval) + (() if valid.op is UOps.CONST and valid.arg is True else (valid,)))
    if x.op in ReduceOps:
      return self.reduce(x, idxs)
    srcs = [self.to_uop(s, idxs) for s in x.src]
    if x.op is UnaryOps.CAST:
      return UOp(UOps.CAST, x.arg.scalar() if hasattr(x.arg, "scalar") else x.arg, (srcs[0],))
    if x.op is UnaryOps.BITCAST:
      return UOp(UOps.BITCAST, x.arg, (srcs[0],))
    if isinstance(x.op, (UnaryOps, BinaryOps, TernaryOps)):
      return srcs[0].alu(x.op, *srcs[1:])
    raise ValueError(f"cannot lower {x.op}")

  def _fresh_range(self, a: int, after: Optional[UOp] = None) -> UOp:
    rid = 1000 * (1 + next(self.range_ids)) + a
    return UOp(UOps.RANGE, IDX, (UOp.const(IDX, 0), sym_to_uop(self.full_shape[a])) + ((after,) if after is not None else ()), (rid, True))

  def reduce(self, x: LazyOp, idxs: List[UOp]) -> UOp:
    if x.op is ReduceOps.WMMA:
      return self.wmma(x, idxs)
    if self.tc is not None and self.tc_axes[2] in x.arg:
      return self.tc_reduce(x, idxs)
    alu = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}[cast(ReduceOps, x.op)]
    dtype: DType = x.dtype
    axes = sorted(x.arg)
    group_axes = [a for a in axes if self.first_reduce <= a < self.first_reduce + self.group]
    new_idxs = list(idxs)
    ranges = []
    for a in axes:
      if a >= self.first_upcasted:
        new_idxs[a] = self._upcast_expand(a)
      elif a >= self.first_reduce + self.group:
        new_idxs[a] = r = self._fresh_range(a)
        ranges.append(r)
    val = self.to_uop(x.src[0], new_idxs)
    if self.row_keep is not None and x is self.row_keep[0]:
      # the store loop needs this source again at the same indices: keep each value in the output (see _row_kept_value)
      mb: MemBuffer = self.ast.src[0].arg
      kidx, _ = self.render_st(mb.st, new_idxs)
      self.side_store = (UOp(UOps.STORE, None, (self.global_buf(mb), kidx, val)), tuple(ranges))
    contract = tuple((a, self.full_shape[a]) for a in axes if a >= self.first_upcasted)
    if contract:
      n = prod([s for _, s in contract])
      con = UOp(UOps.CONTRACT, dtype.vec(n), (val,), contract)
      val = functools.reduce(lambda p, q: p.alu(alu, q), [con.gep(i) for i in range(n)])
    # no loop left (a reduce over size-1 or upcast axes only): the lanes' sum, started at +0.0 like every sum
    ret = UOp(UOps.REDUCE, dtype, (val, *ranges), alu) if ranges else sum_result(alu, val)
    if not group_axes:
      return ret
    # grouped reduce: each thread's partial result goes to local memory, then every thread reduces the group's slots
    laxes = [a for a in range(self.global_dims, self.first_reduce + self.group)] + \
            [a for a in range(self.first_upcasted, self.shape_len) if a not in axes]
    lsizes = [self.full_shape[a] for a in laxes]
    lbuf = UOp(UOps.DEFINE_LOCAL, PtrDType(dtype, True), (), (f"temp{next(self.local_ids)}", prod(lsizes)))

    def lidx(ix: Sequence[UOp]) -> UOp:
      out, mul = UOp.const(IDX, 0), 1
      for a, s in reversed(list(zip(laxes, lsizes))):
        out = out + ix[a] * mul
        mul *= s
      return out
    barrier = UOp(UOps.BARRIER, None, (UOp(UOps.STORE, None, (lbuf, lidx(idxs), ret)),))
    idxs2 = list(idxs)
    ranges2 = []
    for a in group_axes:
      idxs2[a] = r = self._fresh_range(a)
      ranges2.append(r)
    ld = UOp(UOps.LOAD, dtype, (lbuf, lidx(idxs2), barrier))
    return UOp(UOps.REDUCE, dtype, (ld, *ranges2), alu)

  def wmma(self, x: LazyOp, idxs: List[UOp]) -> UOp:
    raise NotImplementedError("ReduceOps.WMMA in an AST is not supported: tensor cores are placed with Opt(OptOps.TC)")

  def tc_reduce(self, x: LazyOp, idxs: List[UOp]) -> UOp:
    """The tensor-core SUM: each lane loads its A and B registers, one WMMA per step of the outer K loop accumulates C."""
    tc = self.tc
    assert tc is not None, "tc_reduce runs only for a kernel with a tensor core"
    n_ax, m_ax, k_ax = self.tc_axes
    ranges = []
    base = list(idxs)
    for a in sorted(x.arg):
      if a < self.first_upcasted:
        base[a] = r = self._fresh_range(a)
        ranges.append(r)
    mul = x.src[0]
    if mul.op is UnaryOps.CAST:  # SUM(CAST(MUL(a, b))): the WMMA does the multiply in dtype_out
      mul = mul.src[0]
    srcs = []
    for s in mul.src:
      srcs.append(s.src[0] if s.op is UnaryOps.CAST and s.src[0].op is BufferOps.LOAD else s)
    # A (M x K) is the source that is broadcast along the N tile
    strides0 = srcs[0].arg.st.real_strides()
    a_src, b_src = (srcs[0], srcs[1]) if strides0[n_ax] == 0 else (srcs[1], srcs[0])
    ctx_a, ctx_b = list(base), list(base)
    ctx_a[m_ax], ctx_a[k_ax], ctx_a[n_ax] = self._layout_expand("a", 0), self._layout_expand("a", 1), UOp.const(IDX, 0)
    ctx_b[k_ax], ctx_b[n_ax], ctx_b[m_ax] = self._layout_expand("b", 0), self._layout_expand("b", 1), UOp.const(IDX, 0)
    na, nb, nc = (x.count for x in self.tc_layout)
    av = UOp(UOps.CONTRACT, tc.dtype_in.vec(na), (self.to_uop(a_src, ctx_a),), ((10001, na),))
    bv = UOp(UOps.CONTRACT, tc.dtype_in.vec(nb), (self.to_uop(b_src, ctx_b),), ((10002, nb),))
    out_dt = tc.dtype_out.vec(nc)
    arg = self.tc_arg + ((((10001, na),), ((10002, nb),), ((10003, nc),)), (), tc.layout)
    w = UOp(UOps.WMMA, out_dt, (av, bv, UOp.const(out_dt, 0)), arg)
    red = UOp(UOps.REDUCE, out_dt, (w, *ranges), BinaryOps.ADD) if ranges else w
    return UOp(UOps.EXPAND, tc.dtype_out, tuple(red.gep(e) for e in range(nc)), ((10003, nc),))


# a reduce source that costs less than this (in ALU ops, _row_value_cost) is cheaper to compute again in the store loop
# than to store and load back
_ROW_KEEP_MIN_OPS = 8
# what a transcendental costs once decomposed (exp2: a range reduction, a polynomial and the scaling, ~25 vector ops)
_TRANSCENDENTAL_OPS = 20


def _row_value_cost(v: LazyOp) -> int:
  """The ALU ops computing v at one index: its graph without buffers and without the reduces (they have their own loops)."""
  seen: Set[LazyOp] = set()
  todo, cost = [v], 0
  while todo:
    if (x := todo.pop()) in seen:
      continue
    seen.add(x)
    if x.op in ReduceOps or x.op in BufferOps:
      continue
    cost += _TRANSCENDENTAL_OPS if x.op in (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN) else 1
    todo.extend(x.src)
  return cost


def _injective(view: Any) -> bool:
  """Every index of the view has an address of its own: no mask, and each stride (sorted by size) steps over all that
  the smaller ones reach."""
  if view.mask is not None:
    return False
  dims = sorted((abs(st), sh) for sh, st in zip(view.shape, view.strides) if sh != 1)
  reach = 0
  for st, sh in dims:
    if not isinstance(st, int) or not isinstance(sh, int) or st <= reach:
      return False
    reach += st * (sh - 1)
  return True


def _row_kept_value(ast: LazyOp, row_axes: Tuple[int, ...], first_upcasted: int) -> Optional[Tuple[LazyOp, LazyOp]]:
  """(a reduce, its source) of a row kernel whose store computes that source again at its own index (softmax: the sum
  of exp(x - max), then exp(x - max) / sum), when it is worth and safe to keep: the reduce's loop stores each value into
  the output, where the store loop, ordered after that loop by an AFTER, loads it back bit for bit. Only for
  - a source of the output's dtype that costs 8 or more ALU ops (an exp does);
  - a reduce over every row axis, with a loop (with none left, store and load back would have nothing to order them);
  - an output stored through one injective view (each value has its own address, written by the thread of its row);
  - an output no LOAD of the kernel reads (an assign in place): the kept values would overwrite what is read later.
  None otherwise."""
  store = ast.src[0]
  mb: MemBuffer = store.arg
  if len(mb.st.views) != 1 or not _injective(mb.st.views[-1]):
    return None
  if any(x.op is BufferOps.LOAD and x.arg.idx == mb.idx for x in ast.lazyops):
    return None
  # the ops the store computes at its own index: its value's graph, not entering reduces (they have their own loops)
  at_store: Dict[LazyOp, LazyOp] = {}   # ordered: the choice below must not depend on hashing
  todo = [store.src[0]]
  while todo:
    if (x := todo.pop()) not in at_store:
      at_store[x] = x
      if x.op not in ReduceOps:
        todo.extend(x.src)
  for r in at_store:
    if r.op not in (ReduceOps.SUM, ReduceOps.MAX) or (v := at_store.get(r.src[0])) is None:
      continue
    if v.dtype == mb.dtype and _row_value_cost(v) >= _ROW_KEEP_MIN_OPS and set(row_axes) <= set(r.arg) and \
        any(a < first_upcasted for a in r.arg):
      # (the store's graph holds v: the cache entry of that very object gets the load back)
      return r, v
  return None


def row_store_axes(ast: LazyOp) -> Tuple[int, ...]:
  """The axes a row kernel's store loops over that its reduces reduce (empty for any other kernel).

  A row kernel (softmax, layernorm: one kernel per row) has one store over the full rows, and reduces over the row axes
  whose results are read along those axes, maybe by later reduces of the same row (the sum of exp(x - max)). It loops over
  a row once per reduce, then once more to store, while the row is in cache."""
  if ast.op is not MetaOps.KERNEL or len(ast.src) != 1:
    return ()
  axes = sorted({a for x in ast.lazyops if x.op in ReduceOps and isinstance(x.arg, tuple) for a in x.arg})
  shape = ast.src[0].arg.st.shape
  return tuple(a for a in axes if a < len(shape) and not (isinstance(shape[a], int) and shape[a] == 1))


def lazyop_to_uop(ast: LazyOp, opts: Renderer, group_for_reduces: int = 0, tensor_core: Optional[TensorCore] = None) -> UOp:
  """The SINK of the uop graph of a kernel AST (KernelInfo in ast.arg); tensor_core: the TensorCore placed by Opt(OptOps.TC)."""
  return Lowerer(ast, opts, group_for_reduces, tensor_core).lower()
