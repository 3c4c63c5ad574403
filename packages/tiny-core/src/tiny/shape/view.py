"""View: one strided window (shape, strides, offset, optional validity mask) onto a flat buffer."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, cast

from tiny.helpers import all_int, argsort, prod
from tiny.shape.symbolic import Node, NumNode, Variable, sint, sym_infer

Mask = Tuple[Tuple[sint, sint], ...]


@functools.lru_cache(maxsize=None)
def canonicalize_strides(shape: Tuple[sint, ...], strides: Tuple[sint, ...]) -> Tuple[sint, ...]:
  """Strides with the stride of every size-1 dimension set to 0 (it is never used)."""
  return tuple(0 if s == 1 else st for s, st in zip(shape, strides))


@functools.lru_cache(maxsize=None)
def strides_for_shape(shape: Tuple[sint, ...]) -> Tuple[sint, ...]:
  """Row-major (C order) strides of shape, canonicalized."""
  strides: List[sint] = []
  acc: sint = 1
  for s in reversed(shape):
    strides.append(acc)
    acc = acc * s
  return canonicalize_strides(shape, tuple(reversed(strides)))


def un1d(shape: Tuple[int, ...], offs: int) -> List[int]:
  """The coordinates of flat index offs in a row-major array of shape."""
  out: List[int] = []
  for s in reversed(shape):
    offs, r = divmod(offs, s) if s else (offs, 0)
    out.append(r)
  return out[::-1]


# a dimension while reshaping or merging: (size, stride, mask begin, mask end)
_Dim = Tuple[int, int, int, int]


def _merge_pair(outer: _Dim, inner: _Dim) -> Optional[Tuple[_Dim, int]]:
  """Merge two adjacent dims into one, with the offset correction; None when the valid region or strides don't allow it."""
  (na, sa, la, ha), (nb, sb, lb, hb) = outer, inner
  if ha - la == 1:
    # only one coordinate of the outer dim is valid: its stride doesn't matter, fold it into the offset
    return (na * nb, sb, la * nb + lb, la * nb + hb), la * sa - la * nb * sb
  if lb == 0 and hb == nb and sa == sb * nb:
    return (na * nb, sb, la * nb, ha * nb), 0
  return None


def _split_dim(d: _Dim, n_outer: int, n_inner: int) -> Optional[Tuple[_Dim, _Dim]]:
  """Split one dim into (outer, inner); None when the mask interval isn't a box in the new coordinates."""
  _, s, lo, hi = d
  if lo // n_inner == (hi - 1) // n_inner:
    q = lo // n_inner
    return (n_outer, s * n_inner, q, q + 1), (n_inner, s, lo % n_inner, (hi - 1) % n_inner + 1)
  if lo % n_inner == 0 and hi % n_inner == 0:
    return (n_outer, s * n_inner, lo // n_inner, hi // n_inner), (n_inner, s, 0, n_inner)
  return None


def _split_only(shape: Tuple[int, ...], strides: Tuple[sint, ...], mask: Tuple[Tuple[int, int], ...],
                new_shape: Tuple[int, ...]) -> Optional[List[Tuple[sint, Tuple[int, int]]]]:
  """(stride, mask) of each new dim when new_shape only splits dims of shape (each old dim becomes a run of new dims
  with the same size); None for any merge. The strides may be symbolic: a split only multiplies them."""
  out: List[Tuple[sint, Tuple[int, int]]] = []
  j = 0
  for size, st, (lo, hi) in zip(shape, strides, mask):
    run: List[int] = []
    while prod(run) < size and j < len(new_shape):
      run.append(new_shape[j])
      j += 1
    if prod(run) != size:
      return None
    dim: Tuple[int, sint, int, int] = (size, st, lo, hi)
    for k in range(len(run) - 1):
      if (sp := _split_dim(cast(_Dim, dim), run[k], prod(run[k + 1:]))) is None:
        return None
      out.append((sp[0][1], (sp[0][2], sp[0][3])))
      dim = sp[1]
    out.append((dim[1], (dim[2], dim[3])))
  return out if j == len(new_shape) else None


def _merge_dims(shape: Tuple[int, ...], strides: Tuple[int, ...], mask: Optional[Mask] = None) -> Tuple[Tuple[int, int, int], ...]:
  """Greedy merge of adjacent mergeable dims: ((size, stride, real size without zero strides), ...) for int views."""
  if not shape:
    return ()
  m = cast(Tuple[Tuple[int, int], ...], mask) if mask is not None else tuple((0, s) for s in shape)
  dims = [(s, st, b, e) for s, st, (b, e) in zip(shape, strides, m) if s != 1]
  if not dims:
    return ((1, 0, 0),)
  out = [dims[0]]
  for d in dims[1:]:
    merged = _merge_pair(out[-1], d)
    if merged is None:
      out.append(d)
    else:
      out[-1] = merged[0]
  return tuple((n, st, n if st else 0) for n, st, _, _ in out)


def _sym_val(s: sint) -> Optional[int]:
  """The value of s with its Variables at their bound values, or None when some is unbound."""
  if isinstance(s, int):
    return s
  try:
    return sym_infer(s, {v: v.val for v in s.vars()})
  except ValueError:
    return None


def _check_shape(shape: Tuple[sint, ...], what: str) -> None:
  if not isinstance(shape, tuple):
    raise TypeError(f"{what} must be a tuple, got {shape!r}")
  for s in shape:
    if isinstance(s, bool) or not isinstance(s, (int, Node)):
      raise TypeError(f"{what} {shape} contains {s!r}, not an int or symbolic node")
    if isinstance(s, int) and s < 0:
      raise ValueError(f"{what} {shape} can't contain negative sizes")


@dataclass(frozen=True)
class View:
  """A strided view: position p is valid when every mask[i] = (b, e) has b <= p[i] < e; it reads buffer[offset + sum(p*strides)]."""

  shape: Tuple[sint, ...]
  strides: Tuple[sint, ...]
  offset: sint
  mask: Optional[Mask]
  contiguous: bool

  # size and hash are asked for many times per op (every LazyBuffer, cache key and schedule lookup): they are computed
  # once and kept in the instance dict (fields are frozen, so they cannot go stale)
  def size(self) -> int:
    """Number of positions (a symbolic dim counts as its max)."""
    if (ret := self.__dict__.get("_size")) is None:
      ret = prod([_imax_dim(x) for x in self.shape])
      assert isinstance(ret, int), f"{ret=} is not an int"
      self.__dict__["_size"] = ret
    return ret

  def __hash__(self) -> int:
    if (ret := self.__dict__.get("_hash")) is None:
      ret = self.__dict__["_hash"] = hash((self.shape, self.strides, self.offset, self.mask, self.contiguous))
    return ret

  def __getstate__(self) -> Dict[str, Any]:
    # a hash of Variable names is only valid in this process (str hashes are salted): never pickle the cached one
    return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_size")}

  @staticmethod
  @functools.lru_cache(maxsize=None)
  def create(shape: Tuple[sint, ...], strides: Optional[Tuple[sint, ...]] = None, offset: sint = 0, mask: Optional[Mask] = None) -> View:
    """The canonical View: zero-size views collapse, size-1 strides are 0, a full mask is dropped, single-valid masked dims get stride 0."""
    if strides is not None and len(strides) != len(shape):
      raise ValueError(f"strides {strides} don't match shape {shape}")
    if mask is not None and len(mask) != len(shape):
      raise ValueError(f"mask {mask} doesn't match shape {shape}")
    all_plain_ints = all(type(s) is int and s >= 0 for s in shape) and (strides is None or all(type(s) is int for s in strides)) \
      and type(offset) is int and (mask is None or all(type(b) is int and type(e) is int for b, e in mask))
    if not all_plain_ints:
      _check_shape(shape, "shape")
      if any(isinstance(x, NumNode) for x in shape + (strides or ()) + (offset,) + (tuple(x for m in mask for x in m) if mask else ())):
        # a NumNode equals (and hashes like) its int: store plain ints so that int views stay int views
        shape, offset = tuple(_num(s) for s in shape), _num(offset)
        strides = tuple(_num(s) for s in strides) if strides is not None else None
        mask = tuple((_num(b), _num(e)) for b, e in mask) if mask is not None else None
    strides = canonicalize_strides(shape, strides) if strides else strides_for_shape(shape)
    if 0 in shape:
      return View(shape, (0,) * len(shape), 0, None, True)
    if mask is not None and all(m[0] == 0 and m[1] == s for m, s in zip(mask, shape)):
      mask = None
    if mask is not None and all(isinstance(x, int) for m in mask for x in m):
      int_mask = cast(Tuple[Tuple[int, int], ...], mask)
      if any(b >= e for b, e in int_mask):
        # nothing is valid: the canonical fully-masked view
        strides, offset, mask = (0,) * len(shape), 0, ((0, 0),) * len(shape)
      elif any(e - b == 1 for b, e in int_mask):
        # a dim with one valid index reads one place: fold it into the offset
        offset = offset + sum(st * b for st, (b, e) in zip(strides, int_mask) if e - b == 1 and st != 0)
        strides = tuple(0 if e - b == 1 else st for st, (b, e) in zip(strides, int_mask))
    contiguous = offset == 0 and mask is None and strides == strides_for_shape(shape)
    return View(shape, strides, offset, mask, contiguous)

  @functools.lru_cache(None)  # noqa: B019 - views are immutable and few
  def vars(self) -> Set[Variable]:
    """Every Variable in shape, strides, offset and mask."""
    flat_mask = tuple(x for m in self.mask for x in m) if self.mask is not None else ()
    return set().union(*[x.vars() for x in self.shape + self.strides + (self.offset,) + flat_mask if isinstance(x, Node)])

  @functools.lru_cache(None)  # noqa: B019
  def unbind(self) -> Tuple[View, Dict[Variable, int]]:
    """The view with bound Variables replaced by unbound ones, and their values."""
    bound = [v for v in self.vars() if v._val is not None]
    if not bound:
      return self, {}
    unbound: Dict[Variable, Node] = {v: v.unbind()[0] for v in bound}
    return self.substitute(unbound), {v.unbind()[0]: v.val for v in bound}

  def substitute(self, var_map: Mapping[Variable, Node]) -> View:
    """The view with Variables replaced by var_map's nodes (e.g. unbound ones by the same Variable bound to a new value)."""
    def sub(x: sint) -> sint:
      if isinstance(x, int):
        return x
      ret = x.substitute(var_map)
      return ret.b if isinstance(ret, NumNode) else ret
    mask = tuple((sub(b), sub(e)) for b, e in self.mask) if self.mask is not None else None
    return View.create(tuple(sub(s) for s in self.shape), tuple(sub(s) for s in self.strides), sub(self.offset), mask)

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def __add__(self, vm1: View) -> Optional[View]:
    """The single view equal to applying vm1 on top of self (vm1 indexes self's shape), or None when there is none."""
    vm2 = self
    if vm2.contiguous:
      return vm1
    if 0 in vm1.shape:
      return View.create(vm1.shape)
    if vm1.contiguous and vm1.shape == vm2.shape:
      return vm2
    if vm1.contiguous and vm1.size() == vm2.size():
      try:
        if (ret := vm2.reshape(vm1.shape)) is not None:
          return ret
      except ValueError:
        return None
    if not _all_int_view(vm1) or not _all_int_view(vm2):
      return None
    if vm1.mask:
      mask1 = cast(Tuple[Tuple[int, int], ...], vm1.mask)
      if any(b >= e for b, e in mask1):
        return View.create(vm1.shape, (0,) * len(vm1.shape), 0, ((0, 0),) * len(vm1.shape))
      merged = vm2 + vm1.shrink(mask1)
      return merged.pad(tuple((b, s - e) for (b, e), s in zip(mask1, cast(Tuple[int, ...], vm1.shape)))) if merged is not None else None
    return _merge_unmasked(vm2, vm1)

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def invert(self, out_shape: Tuple[sint, ...]) -> Optional[View]:
    """The view undoing this one (for permutes, flips and reshapes); None when it has none (shrink, expand, stride)."""
    ret = View.create(self.shape)
    if self.mask:
      ret = ret.shrink(self.mask)
    ret = ret.stride(tuple(-1 if x < 0 else 1 for x in self.strides)).permute(tuple(argsort(tuple(-x if x > 0 else x for x in self.strides))))
    return ret if prod(ret.shape) == prod(out_shape) else None

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def minify(self) -> View:
    """The same view with every mergeable run of dims merged into one."""
    if not _all_int_view(self):
      return self
    min_shape = tuple(x[0] for x in _merge_dims(cast(Tuple[int, ...], self.shape), cast(Tuple[int, ...], self.strides), self.mask))
    return nv if (nv := self.reshape(min_shape)) is not None else self

  def _unsafe_resize(self, arg: Tuple[Tuple[sint, sint], ...], mask: Optional[Mask] = None) -> View:
    offset = sum([s * x[0] for s, x in zip(self.strides, arg)])
    if self.mask:
      # move the old mask into the new window, then intersect with the new one
      nmask = tuple((_smax(0, _smin(mx - ax, ay - ax)), _smax(0, _smin(my - ax, ay - ax))) for (mx, my), (ax, ay) in zip(self.mask, arg))
      mask = tuple((_smax(mx1, mx2), _smin(my1, my2)) for (mx1, my1), (mx2, my2) in zip(nmask, mask)) if mask is not None else nmask
    shape = tuple(_num(y - x) for x, y in arg)
    return View.create(shape, self.strides, _num(self.offset + offset), mask)

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def pad(self, arg: Tuple[Tuple[sint, sint], ...]) -> View:
    """Pad each dim with (before, after) invalid positions."""
    if len(arg) != len(self.shape):
      raise ValueError(f"pad arg {arg} must have one (before, after) pair per dim of {self.shape}")
    if any(isinstance(x, int) and x < 0 for be in arg for x in be):
      raise ValueError(f"pad arg {arg} can't be negative")
    if any(b != 0 or e != 0 for b, e in arg):
      zvarg = tuple((-b, s + e) for s, (b, e) in zip(self.shape, arg))
      mask = tuple((b, s + b) for s, (b, _) in zip(self.shape, arg))
      return self._unsafe_resize(zvarg, mask=mask)
    return self

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def shrink(self, arg: Tuple[Tuple[sint, sint], ...]) -> View:
    """Keep positions b..e-1 of each dim."""
    if len(arg) != len(self.shape):
      raise ValueError(f"shrink arg {arg} must have one (begin, end) pair per dim of {self.shape}")
    for s, (b, e) in zip(self.shape, arg):
      if all(isinstance(x, int) for x in (s, b, e)) and not (0 <= b <= e <= s):
        raise ValueError(f"invalid shrink {arg} for {self.shape}: need 0 <= begin <= end <= size")
    return self._unsafe_resize(arg)

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def expand(self, new_shape: Tuple[sint, ...]) -> View:
    """Broadcast size-1 dims to new_shape (stride 0)."""
    _check_shape(new_shape, "expand shape")
    if len(new_shape) != len(self.shape):
      raise ValueError(f"expand arg {new_shape=} must have same number of dimensions as shape {self.shape=}")
    if 0 in self.shape:
      if not all(s == x or s == 1 for s, x in zip(self.shape, new_shape)):
        raise ValueError(f"can't expand {self.shape} into {new_shape}")
      return View.create(new_shape)
    if not all(s == x or (s == 1 and st == 0) for s, x, st in zip(self.shape, new_shape, self.strides)):
      raise ValueError(f"can't expand {self.shape} into {new_shape}: only size-1 dims can be expanded")
    mask = tuple(((0, 0) if m != (0, 1) else (0, ns)) if s != ns else m for m, s, ns in zip(self.mask, self.shape, new_shape)) if self.mask else None
    return View.create(new_shape, self.strides, self.offset, mask)

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def permute(self, axis: Tuple[int, ...]) -> View:
    """Reorder dims: new dim i is old dim axis[i]."""
    if sorted(axis) != list(range(len(self.shape))):
      raise ValueError(f"invalid permutation {axis} of len {len(self.shape)}")
    return View.create(tuple(self.shape[a] for a in axis), tuple(self.strides[a] for a in axis), self.offset,
                       tuple(self.mask[a] for a in axis) if self.mask is not None else None)

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def stride(self, mul: Tuple[int, ...]) -> View:
    """Take every mul[i]-th element of each dim; a negative mul walks the dim backwards (flip)."""
    if len(mul) != len(self.shape) or not all(isinstance(x, int) and not isinstance(x, bool) and x != 0 for x in mul):
      raise ValueError(f"invalid stride {mul} for {self.shape}: need one non-zero int per dim")
    strides = tuple(z * m for z, m in zip(self.strides, mul))
    new_shape = tuple((s + (abs(m) - 1)) // abs(m) for s, m in zip(self.shape, mul))
    offset = sum((s - 1) * z for s, z, m in zip(self.shape, self.strides, mul) if m < 0)
    mask = tuple((((mx if m > 0 else s - my) + (abs(m) - 1)) // abs(m), ((my if m > 0 else s - mx) + (abs(m) - 1)) // abs(m))
                 for (mx, my), s, m in zip(self.mask, self.shape, mul)) if self.mask is not None else None
    return View.create(new_shape, strides, self.offset + offset, mask)

  @functools.lru_cache(maxsize=None)  # noqa: B019
  def reshape(self, new_shape: Tuple[sint, ...]) -> Optional[View]:
    """The same positions in row-major order with a new shape, as one view; None when one view can't express it."""
    _check_shape(new_shape, "reshape shape")
    if self.shape == new_shape:
      return self
    if 0 in self.shape or 0 in new_shape:
      if not (0 in self.shape and 0 in new_shape):
        raise ValueError(f"size mismatched, can't reshape {self.shape=} -> {new_shape=}")
      return View.create(new_shape)
    old_size, new_size = _sym_val(prod(self.shape)), _sym_val(prod(new_shape))
    if old_size is not None and new_size is not None and old_size != new_size:
      raise ValueError(f"size mismatched, can't reshape {self.shape=} -> {new_shape=}")
    if self.contiguous:
      return View.create(new_shape)
    # only the offset symbolic (a shrink by a Variable): it just moves along, so the integer path applies
    if not (all_int(self.shape) and all_int(self.strides) and (self.mask is None or all(all_int(m) for m in self.mask))) or not all_int(new_shape):
      return self._reshape_symbolic(new_shape)
    shape, strides = cast(Tuple[int, ...], self.shape), cast(Tuple[int, ...], self.strides)
    mask = cast(Tuple[Tuple[int, int], ...], self.mask) if self.mask is not None else tuple((0, s) for s in shape)
    if any(b >= e for b, e in mask):
      # nothing is valid; a 0-dim view has no mask to say so
      return View.create(new_shape, mask=((0, 0),) * len(new_shape)) if new_shape else None
    ishape = cast(Tuple[int, ...], new_shape)
    dims: List[_Dim] = [(s, st, b, e) for s, st, (b, e) in zip(shape, strides, mask) if s != 1]
    targets = [s for s in ishape if s != 1]
    offset = self.offset
    out: List[_Dim] = []
    i = j = 0
    while i < len(dims):
      # the smallest run of old dims and new dims with the same number of elements
      group, tgroup = [dims[i]], [targets[j]]
      po, pn = dims[i][0], targets[j]
      i, j = i + 1, j + 1
      while po != pn:
        if po < pn:
          group.append(dims[i])
          po, i = po * dims[i][0], i + 1
        else:
          tgroup.append(targets[j])
          pn, j = pn * targets[j], j + 1
      merged = group[0]
      for d in group[1:]:
        if (m := _merge_pair(merged, d)) is None:
          return None
        merged, offset = m[0], offset + m[1]
      for k in range(len(tgroup) - 1):
        if (sp := _split_dim(merged, tgroup[k], prod(tgroup[k + 1:]))) is None:
          return None
        out.append(sp[0])
        merged = sp[1]
      out.append(merged)
    it = iter(out)
    final = [(1, 0, 0, 1) if s == 1 else next(it) for s in ishape]
    new_mask = tuple((b, e) for _, _, b, e in final) if self.mask is not None else None
    return View.create(new_shape, tuple(st for _, st, _, _ in final), offset, new_mask)

  def _reshape_symbolic(self, new_shape: Tuple[sint, ...]) -> Optional[View]:
    if self.mask is not None and any(isinstance(b, int) and isinstance(e, int) and b >= e for b, e in self.mask):
      return None
    old_nz = [(s, st, m) for s, st, m in zip(self.shape, self.strides, self.mask or [None] * len(self.shape)) if not (isinstance(s, int) and s == 1)]
    new_nz = [s for s in new_shape if not (isinstance(s, int) and s == 1)]
    if len(old_nz) == len(new_nz) and all(o[0] is n or o[0] == n or (isinstance(o[0], int) and _sym_val(n) == o[0]) or
                                          (isinstance(n, int) and _sym_val(o[0]) == n) for o, n in zip(old_nz, new_nz)):
      # the same dims (a bound symbolic dim may replace the int it is bound to, or the other way), with size-1 dims added or removed
      it = iter(old_nz)
      final = [(1, 0, (0, 1)) if isinstance(s, int) and s == 1 else next(it) for s in new_shape]
      mask = tuple(m if m is not None else (0, s) for (_, _, m), s in zip(final, new_shape)) if self.mask is not None else None
      if all_int(self.shape):
        return View(new_shape, tuple(st for _, st, _ in final), self.offset, mask, self.contiguous)
      return View.create(new_shape, tuple(st for _, st, _ in final), self.offset, mask)
    if all_int(self.shape):
      raise ValueError(f"cannot symbolic reshape non-contiguous {self} -> {new_shape}")
    return self._reshape_around_symbolic(new_shape)

  def _reshape_around_symbolic(self, new_shape: Tuple[sint, ...]) -> Optional[View]:
    """A reshape that keeps every symbolic dim as it is and regroups only the int dims between them (a KV cache shrunk
    to a Variable length, then (n, 768) -> (n, 12, 64)): each int run goes through the int reshape on its own. Without
    this the reshape stacks a second view, whose indices divide by the Variable in every load of the kernel."""
    old_nz = [i for i, s in enumerate(self.shape) if not (isinstance(s, int) and s == 1)]
    new_nz = [i for i, s in enumerate(new_shape) if not (isinstance(s, int) and s == 1)]
    old_sym = [i for i in old_nz if not isinstance(self.shape[i], int)]
    new_sym = [i for i in new_nz if not isinstance(new_shape[i], int)]
    if len(old_sym) != len(new_sym) or any(self.shape[a] is not new_shape[b] and self.shape[a] != new_shape[b] for a, b in zip(old_sym, new_sym)):
      return None
    mask = self.mask if self.mask is not None else tuple((0, s) for s in self.shape)
    strides: List[sint] = [0] * len(new_shape)
    new_mask: List[Tuple[sint, sint]] = [(0, s) for s in new_shape]
    offset: sint = self.offset
    for a, b in zip(old_sym, new_sym):
      strides[b], new_mask[b] = self.strides[a], mask[a]
    # the int runs between consecutive symbolic dims (and before the first, after the last)
    bounds_old, bounds_new = [-1, *old_sym, len(self.shape)], [-1, *new_sym, len(new_shape)]
    for k in range(len(bounds_old) - 1):
      o_idx = [i for i in old_nz if bounds_old[k] < i < bounds_old[k + 1]]
      n_idx = [i for i in new_nz if bounds_new[k] < i < bounds_new[k + 1]]
      if not o_idx and not n_idx:
        continue
      o_shape, n_shape = tuple(cast(int, self.shape[i]) for i in o_idx), tuple(cast(int, new_shape[i]) for i in n_idx)
      o_strides, o_mask = tuple(self.strides[i] for i in o_idx), tuple(mask[i] for i in o_idx)
      if o_shape == n_shape:
        # the run is unchanged (only size-1 dims come or go): its strides and mask may be symbolic
        for j, i in enumerate(n_idx):
          strides[i], new_mask[i] = o_strides[j], o_mask[j]
        continue
      if prod(o_shape) != prod(n_shape) or not all(all_int(m) for m in o_mask):
        return None
      if not all_int(o_strides):
        # a symbolic stride (p of shape (12, n) broadcast to (12, 64, n) and the 64 upcast): only splits are supported
        if (dims := _split_only(o_shape, o_strides, cast(Tuple[Tuple[int, int], ...], o_mask), n_shape)) is None:
          return None
        for (st, m), i in zip(dims, n_idx):
          strides[i], new_mask[i] = st, m
        continue
      part = View.create(o_shape, o_strides, 0, o_mask).reshape(n_shape)
      if part is None or not isinstance(part.offset, int):
        return None
      offset = offset + part.offset
      for j, i in enumerate(n_idx):
        strides[i] = part.strides[j]
        new_mask[i] = part.mask[j] if part.mask is not None else (0, new_shape[i])
    return View.create(new_shape, tuple(strides), offset, tuple(new_mask) if self.mask is not None or any(
      not (b == 0 and e == s) for (b, e), s in zip(new_mask, new_shape)) else None)


def _imax_dim(x: sint) -> int:
  while not isinstance(x, int):
    x = x.max
  return x


def _num(x: sint) -> sint:
  return x.b if isinstance(x, NumNode) else x


def _smax(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int):
    return max(a, b)
  if isinstance(a, int) and a <= _imin_s(b):
    return b
  if isinstance(b, int) and b <= _imin_s(a):
    return a
  return a if a == b else b if _imin_s(b - a) >= 0 else a  # best effort for symbolic bounds


def _smin(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int):
    return min(a, b)
  if isinstance(a, int) and a >= _imax_dim(b):
    return b
  if isinstance(b, int) and b >= _imax_dim(a):
    return a
  return a if a == b else a if _imin_s(b - a) >= 0 else b


def _imin_s(x: sint) -> int:
  while not isinstance(x, int):
    x = x.min
  return x


def _all_int_view(v: View) -> bool:
  return all_int(v.shape) and all_int(v.strides) and isinstance(v.offset, int) and (v.mask is None or all(all_int(m) for m in v.mask))


def _merge_unmasked(vm2: View, vm1: View) -> Optional[View]:
  """vm2 + vm1 for int views where vm1 has no mask: project vm1's strides onto vm2's dims."""
  shape2, strides2 = cast(Tuple[int, ...], vm2.shape), cast(Tuple[int, ...], vm2.strides)
  shape1, strides1 = cast(Tuple[int, ...], vm1.shape), cast(Tuple[int, ...], vm1.strides)
  size2, off1 = prod(shape2), cast(int, vm1.offset)
  if not 0 <= off1 < size2:
    return None
  origin = un1d(shape2, off1)
  # deltas[i][d]: how vm2's coordinate d moves when vm1's index i moves by one
  deltas: List[List[int]] = []
  for st in strides1:
    if st == 0:
      deltas.append([0] * len(shape2))
      continue
    if not 0 <= off1 + st < size2:
      return None
    deltas.append([a - o for a, o in zip(un1d(shape2, off1 + st), origin)])
  # group vm2's dims (innermost first) until each group's coordinate stays within its size without carries
  groups: List[int] = []
  gsize, gorigin, gcoef = 1, 0, [0] * len(shape1)
  for d in reversed(range(len(shape2))):
    gorigin += origin[d] * gsize
    gcoef = [c + dl[d] * gsize for c, dl in zip(gcoef, deltas)]
    gsize *= shape2[d]
    lo = gorigin + sum(min(0, c * (n - 1)) for c, n in zip(gcoef, shape1))
    hi = gorigin + sum(max(0, c * (n - 1)) for c, n in zip(gcoef, shape1))
    if lo >= 0 and hi < gsize:
      groups.append(gsize)
      gsize, gorigin, gcoef = 1, 0, [0] * len(shape1)
  if gsize != 1:
    return None
  if (grouped := tuple(reversed(groups))) != shape2:
    reshaped = vm2.reshape(grouped)
    return reshaped + vm1 if reshaped is not None and reshaped.shape != vm2.shape else None
  if vm2.mask is not None:
    mask2 = cast(Tuple[Tuple[int, int], ...], vm2.mask)
    newb, newe = [0] * len(shape1), list(shape1)
    for d, (b, e) in enumerate(mask2):
      coefs = [(i, dl[d]) for i, dl in enumerate(deltas) if dl[d] != 0 and shape1[i] > 1]
      lo = origin[d] + sum(min(0, k * (shape1[i] - 1)) for i, k in coefs)
      hi = origin[d] + sum(max(0, k * (shape1[i] - 1)) for i, k in coefs)
      if lo >= b and hi < e:
        continue
      if not coefs:
        if not shape1:
          return None  # a 0-dim view has no mask to say it is invalid
        return View.create(vm1.shape, (0,) * len(shape1), 0, ((0, 0),) * len(shape1))
      if len(coefs) != 1:
        return None
      (i, k), o = coefs[0], origin[d]
      if k > 0:
        rb, re = -(-(b - o) // k), (e - 1 - o) // k + 1
      else:
        rb, re = -(-(o - e + 1) // -k), (o - b) // -k + 1
      newb[i], newe[i] = max(newb[i], rb), min(newe[i], re)
    if any(b != 0 or e != s for b, e, s in zip(newb, newe, shape1)):
      return vm2 + View.create(vm1.shape, vm1.strides, vm1.offset, tuple((b, max(b, e)) for b, e in zip(newb, newe)))
  strides = tuple(sum(dl[d] * strides2[d] for d in range(len(shape2))) for dl in deltas)
  offset = cast(int, vm2.offset) + sum(o * s for o, s in zip(origin, strides2))
  return View.create(vm1.shape, strides, offset)
