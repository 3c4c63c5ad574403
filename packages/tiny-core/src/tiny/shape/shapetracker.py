"""ShapeTracker: a stack of Views; movement ops never copy, they change the index expression of a position."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple, cast

from tiny.helpers import merge_dicts
from tiny.shape.symbolic import MulNode, Node, NumNode, SumNode, Variable, create_ge_node, create_lt_node, sint
from tiny.shape.view import View, strides_for_shape


def _default_idxs(shape: Tuple[sint, ...]) -> List[Node]:
  # a zero-size dim has no positions; NumNode(0) stands in for its (empty) index range
  return [Variable(f"idx{i}", 0, s - 1) if not (isinstance(s, int) and s == 0) else NumNode(0) for i, s in enumerate(shape)]


def _expr_view(view: View, idxs: List[Node], valid: Optional[Node] = None) -> Tuple[Node, Node]:
  assert len(idxs) == len(view.shape), f"need an idx for all dimensions {idxs} vs {view.shape}"
  iexpr: List[Node] = [NumNode(view.offset) if isinstance(view.offset, int) else view.offset]
  vexpr: List[Node] = [valid] if valid is not None else []
  masks = view.mask if view.mask is not None else [None] * len(view.shape)
  for idx, sh, st, m in zip(idxs, view.shape, view.strides, masks):
    if sh != 1 and st != 0:
      iexpr.append(idx * st)
    if m is not None:
      vexpr += [create_ge_node(idx, m[0]), create_lt_node(idx, m[1])]
  return Node.sum(iexpr), Node.ands(vexpr)


@dataclass(frozen=True)
class ShapeTracker:
  """Views applied last-to-first: the last view gives the shape; each earlier one reinterprets the flat index of the next."""

  views: Tuple[View, ...]

  def __hash__(self) -> int:
    # trackers key the lazy cache, the schedule and the kernel caches: hash the views once (they cache their own hash)
    if (ret := self.__dict__.get("_hash")) is None:
      ret = self.__dict__["_hash"] = hash(self.views)
    return ret

  def __getstate__(self) -> Dict[str, Any]:
    # str hashes are salted per process: a cached hash must not travel in a pickle
    return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "shape", "size")}

  def __add__(self, st: ShapeTracker) -> ShapeTracker:
    """Compose: st's views applied on top of self (st indexes self's shape)."""
    ret = self
    for v in st.views:
      ret = ShapeTracker(ret.views + (v,)).simplify()  # one view at a time merges best
    return ret

  def invert(self, out_shape: Tuple[sint, ...]) -> Optional[ShapeTracker]:
    """The tracker mapping this one's output back to out_shape, when every view is invertible."""
    inverted_views: List[View] = []
    for v, s in zip(self.views[::-1], [x.shape for x in self.views[::-1][1:]] + [out_shape]):
      if (inverted := v.invert(s)) is None or (reshaped := inverted.reshape(s)) is None:
        return None
      inverted_views.append(reshaped)
    return ShapeTracker(tuple(inverted_views)).reshape(out_shape)

  @staticmethod
  def from_shape(shape: Tuple[sint, ...]) -> ShapeTracker:
    """A contiguous tracker of shape (one shared instance per shape: trackers are immutable, and a shared one keeps its
    cached hash, which every LazyBuffer and kernel cache lookup of that shape reuses)."""
    return _contiguous_tracker(tuple(shape))

  @property
  def contiguous(self) -> bool:
    return len(self.views) == 1 and self.views[0].contiguous

  @property
  def consecutive(self) -> bool:
    return len(self.views) == 1 and (v := self.views[0]).mask is None and v.strides == strides_for_shape(v.shape)

  # shape and size are read for every LazyBuffer made on this tracker (and the trackers of from_shape are shared): kept in
  # the instance dict once read (the views are frozen, so they cannot go stale)
  @functools.cached_property
  def shape(self) -> Tuple[sint, ...]:
    return self.views[-1].shape

  @functools.cached_property
  def size(self) -> int:
    return self.views[-1].size()

  def real_size(self) -> int:
    """Number of buffer elements the tracker can touch (1 + the largest valid index)."""
    if 0 in self.shape:
      return 0
    idx, valid = self.expr_idxs()
    if not valid:
      return 0
    ret: sint = idx.max
    while not isinstance(ret, int):
      ret = ret.max
    # the first view addresses the buffer: over its valid box the largest index is exact (idx.max ignores validity)
    v = self.views[0]
    if all(isinstance(x, int) for x in v.shape + v.strides + (v.offset,)) and (v.mask is None or all(isinstance(x, int) for m in v.mask for x in m)):
      box = v.mask if v.mask is not None else tuple((0, s) for s in v.shape)
      if any(b >= e for b, e in box):
        return 0
      box_max = cast(int, v.offset + sum(st * (e - 1) if st > 0 else st * b for st, (b, e) in zip(v.strides, box)))  # type: ignore[operator]
      return min(ret, box_max) + 1
    return ret + 1

  def vars(self) -> Set[Variable]:
    return set().union(*[v.vars() for v in self.views])

  @property
  def var_vals(self) -> Dict[Variable, int]:
    if not any(v.vars() for v in self.views):
      return {}
    return merge_dicts([dict([v.unbind()]) for v in self.vars()])

  def unbind(self) -> Tuple[ShapeTracker, Dict[Variable, int]]:
    """The tracker with unbound Variables, and the values they were bound to."""
    if not any(v.vars() for v in self.views):
      return self, {}   # no symbolic dims (the usual case): nothing to unbind
    unbound_views, var_vals = zip(*[v.unbind() for v in self.views])
    return ShapeTracker(tuple(unbound_views)), merge_dicts(var_vals)

  def bind(self, var_vals: Mapping[Variable, int]) -> ShapeTracker:
    """The tracker with its Variables bound to var_vals' values (keys unbound), e.g. a TinyJit replay's output shape."""
    unbound, old_vals = self.unbind()
    if not old_vals or not any(v in var_vals for v in old_vals):
      return self
    # a Variable var_vals does not name keeps its old value
    binding: Dict[Variable, Node] = {v: v.bind(var_vals.get(v, val)) for v, val in old_vals.items()}
    return ShapeTracker(tuple(v.substitute(binding) for v in unbound.views))

  def real_strides(self, ignore_valid: bool = False) -> Tuple[Optional[sint], ...]:
    """The stride of each dim in the final index expression; None where it isn't a plain stride (or is masked)."""
    if len(self.views) == 1 and self.views[-1].mask is None:
      return self.views[-1].strides
    idxs: List[Node] = _default_idxs(self.shape)
    idx, valid = self.expr_idxs(idxs)
    ret: List[Optional[sint]] = [None] * len(self.shape)
    bad_idx_vars: Set[Variable] = set()
    for this_dim in (idx.nodes if isinstance(idx, SumNode) else [idx]):
      idx_maybe, stride_maybe = (this_dim.a, this_dim.b) if isinstance(this_dim, MulNode) else (this_dim, 1)
      if idx_maybe in idxs and not isinstance(idx_maybe, NumNode):
        ret[idxs.index(idx_maybe)] = stride_maybe
      else:
        bad_idx_vars |= idx_maybe.vars()
    idx_vars, valid_vars = idx.vars(), valid.vars()
    for i, tidx in enumerate(idxs):
      if tidx in bad_idx_vars or (tidx in valid_vars and not ignore_valid):
        ret[i] = None
      elif tidx not in idx_vars:
        ret[i] = 0
    return tuple(ret)

  def unit_stride_axes(self, ignore_valid: bool = False) -> List[int]:
    """Dims whose real stride is 1."""
    return [i for i, st in enumerate(self.real_strides(ignore_valid)) if st == 1]

  def expr_idxs(self, idxs: Optional[Iterable[Node]] = None) -> Tuple[Node, Node]:
    """(buffer index, validity) of the position idxs; by default idx{i} Variables ranging over each dim."""
    idxs = _default_idxs(self.shape) if idxs is None else list(idxs)
    if len(idxs) != len(self.shape):
      raise ValueError(f"expr_idxs needs {len(self.shape)} indices for shape {self.shape}, got {len(idxs)}")
    idx, valid = _expr_view(self.views[-1], idxs)
    for view in reversed(self.views[0:-1]):
      if valid.max == 0:
        return NumNode(-1), valid
      view = view.minify()
      acc: sint = 1
      vidxs: List[Node] = []
      for d in reversed(view.shape):
        vidxs.append((idx // acc) % d)
        acc = acc * d
      idx, valid = _expr_view(view, vidxs[::-1], valid)
    return idx, valid

  def expr_node(self, idx: str = "idx") -> Tuple[Node, Node]:
    """(buffer index, validity) as a function of one flat index Variable over the whole shape."""
    if not self.shape:
      return self.expr_idxs([])
    acc: sint = 1
    fidx = Variable(idx, 0, self.size - 1)
    parts: List[Node] = []
    for d in reversed(self.shape):
      parts.append((fidx // acc) % d)
      acc = acc * d
    return self.expr_idxs(parts[::-1])

  def axis_is_masked(self, axis: int) -> bool:
    """True when the validity depends on dim axis."""
    _, valid = self.expr_idxs()
    return f"idx{axis}" in [v.expr for v in valid.vars()]

  def simplify(self) -> ShapeTracker:
    """Merge the last two views while they can be one."""
    if len(self.views) >= 2 and (new_view := self.views[-2] + self.views[-1]) is not None:
      return ShapeTracker(self.views[:-2] + (new_view,)).simplify()
    return self

  # *** movement ops ***

  def pad(self, arg: Tuple[Tuple[sint, sint], ...]) -> ShapeTracker:
    return ShapeTracker(self.views[0:-1] + (self.views[-1].pad(tuple(arg)),))

  def shrink(self, arg: Tuple[Tuple[sint, sint], ...]) -> ShapeTracker:
    return ShapeTracker(self.views[0:-1] + (self.views[-1].shrink(tuple(arg)),))

  def expand(self, new_shape: Tuple[sint, ...]) -> ShapeTracker:
    return ShapeTracker(self.views[0:-1] + (self.views[-1].expand(tuple(new_shape)),))

  def permute(self, axis: Tuple[int, ...]) -> ShapeTracker:
    return ShapeTracker(self.views[0:-1] + (self.views[-1].permute(tuple(axis)),))

  def stride(self, mul: Tuple[int, ...]) -> ShapeTracker:
    return ShapeTracker(self.views[0:-1] + (self.views[-1].stride(tuple(mul)),))

  def reshape(self, new_shape: Tuple[sint, ...]) -> ShapeTracker:
    new_shape = tuple(new_shape)
    if (new_view := self.views[-1].reshape(new_shape)) is not None:
      return ShapeTracker(self.views[0:-1] + (new_view,))
    return ShapeTracker(self.views + (View.create(new_shape),))


@functools.lru_cache(maxsize=4096)
def _contiguous_tracker(shape: Tuple[sint, ...]) -> ShapeTracker:
  return ShapeTracker((View.create(shape),))
