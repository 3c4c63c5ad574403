"""Hypothesis strategies for tiny's shape layer, usable by any package that wants to fuzz against it.

Movement chains are plain data (a list of `(op, arg)` tuples), so the same chain can be applied to a
`ShapeTracker` (`apply_to_shapetracker`) and to a numpy array (`apply_to_numpy`) and the results compared
position by position (`shapetracker_indices`). Symbolic expression trees are plain data too: `build_node`
turns one into a simplified `Node`, `eval_tree` computes its true value with Python ints.

Ops: ("reshape", shape), ("permute", axes), ("expand", shape), ("pad", ((before, after), ...)),
("shrink", ((begin, end), ...)), ("flip", axes), ("stride", muls).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, cast

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from tiny.dtype import DTYPES_DICT, DType
from tiny.helpers import prod
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable

MovementOp = Tuple[str, Any]
Tree = Any  # nested tuples, see symbolic_trees

MOVEMENT_OPS = ("reshape", "permute", "expand", "pad", "shrink", "flip", "stride")


def register_profiles() -> None:
  """Register the 'default' (fast, for CI) and 'fuzz' (long) hypothesis profiles and load HYPOTHESIS_PROFILE's."""
  import os
  settings.register_profile("default", max_examples=40, deadline=None)
  settings.register_profile("fuzz", max_examples=1500, deadline=None)
  settings.load_profile(os.getenv("HYPOTHESIS_PROFILE", "default"))


# *** shapes ***

def shapes(min_dims: int = 0, max_dims: int = 4, min_side: int = 1, max_side: int = 6, max_size: int = 256) -> st.SearchStrategy[Tuple[int, ...]]:
  """Shapes with min_dims..max_dims dims of min_side..max_side each and at most max_size elements."""
  return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple).filter(lambda s: prod(s) <= max_size)


def _factorizations(n: int) -> List[Tuple[int, int]]:
  return [(a, n // a) for a in range(2, n) if n % a == 0]


@st.composite
def _random_factorization(draw: st.DrawFn, n: int, max_dims: int = 4) -> Tuple[int, ...]:
  """n as a product of up to max_dims factors (size-1 factors included)."""
  out: List[int] = []
  while len(out) < max_dims - 1 and draw(st.booleans()):
    choices = [1] + [a for a, _ in _factorizations(n)]
    f = draw(st.sampled_from(choices))
    out.append(f)
    n //= f
  out.append(n)
  return tuple(draw(st.permutations(out)))


@st.composite
def movement_op(draw: st.DrawFn, shape: Tuple[int, ...], max_size: int = 256, allow_pad: bool = True) -> MovementOp:
  """One movement op valid for shape that keeps the size at most max_size."""
  nd, size = len(shape), prod(shape)
  kinds = ["reshape", "permute", "shrink", "flip", "stride"] + (["pad"] if allow_pad else [])
  if 1 in shape:
    kinds.append("expand")
  kind = draw(st.sampled_from(kinds))
  if kind == "reshape":
    return ("reshape", draw(_reshape_target(shape)))
  if kind == "permute":
    return ("permute", tuple(draw(st.permutations(range(nd)))))
  if kind == "flip":
    return ("flip", tuple(i for i in range(nd) if draw(st.booleans())))
  if kind == "stride":
    return ("stride", tuple(draw(st.sampled_from([1, 1, 2, 3, -1, -2, -3])) for _ in range(nd)))
  if kind == "shrink":
    arg = []
    for s in shape:
      b = draw(st.integers(0, s))
      e = draw(st.integers(b, s)) if draw(st.integers(0, 9)) == 0 else draw(st.integers(min(b + 1, s), s))
      arg.append((b, e))
    return ("shrink", tuple(arg))
  if kind == "pad":
    parg = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in shape)
    if prod(s + b + e for s, (b, e) in zip(shape, parg)) <= max_size:
      return ("pad", parg)
    return ("pad", tuple((0, 0) for _ in shape))
  # expand
  new_shape = list(shape)
  for i, s in enumerate(shape):
    if s == 1 and draw(st.booleans()):
      new_shape[i] = draw(st.integers(1, 4))
      if size == 0 or prod(new_shape) > max_size:
        new_shape[i] = 1
  return ("expand", tuple(new_shape))


@st.composite
def _reshape_target(draw: st.DrawFn, shape: Tuple[int, ...]) -> Tuple[int, ...]:
  nd, size = len(shape), prod(shape)
  choices = ["add1", "arbitrary"]
  if 1 in shape:
    choices.append("remove1")
  if nd >= 2:
    choices.append("merge")
  if any(_factorizations(s) for s in shape):
    choices.append("split")
  how = draw(st.sampled_from(choices))
  if how == "add1":
    i = draw(st.integers(0, nd))
    return shape[:i] + (1,) + shape[i:]
  if how == "remove1":
    i = draw(st.sampled_from([i for i, s in enumerate(shape) if s == 1]))
    return shape[:i] + shape[i + 1:]
  if how == "merge":
    i = draw(st.integers(0, nd - 2))
    return shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:]
  if how == "split":
    i = draw(st.sampled_from([i for i, s in enumerate(shape) if _factorizations(s)]))
    a, b = draw(st.sampled_from(_factorizations(shape[i])))
    return shape[:i] + (a, b) + shape[i + 1:]
  if size == 0:
    return draw(st.sampled_from([(0,), (0, 1), (1, 0)]))
  return draw(_random_factorization(size))


@st.composite
def movement_chains(draw: st.DrawFn, shape: Optional[Union[Tuple[int, ...], st.SearchStrategy[Tuple[int, ...]]]] = None,
                    min_ops: int = 1, max_ops: int = 8, max_size: int = 256, allow_pad: bool = True) -> Tuple[Tuple[int, ...], List[MovementOp]]:
  """(start shape, list of movement ops) where every op is valid for the shape it is applied to."""
  if shape is None:
    shape = shapes(max_size=max_size)
  start = draw(shape) if isinstance(shape, st.SearchStrategy) else tuple(shape)
  ops: List[MovementOp] = []
  cur = start
  for _ in range(draw(st.integers(min_ops, max_ops))):
    op = draw(movement_op(cur, max_size=max_size, allow_pad=allow_pad))
    ops.append(op)
    cur = op_output_shape(cur, op)
  return start, ops


def op_output_shape(shape: Tuple[int, ...], op: MovementOp) -> Tuple[int, ...]:
  """The shape after applying op to shape."""
  kind, arg = op
  if kind in ("reshape", "expand"):
    return tuple(arg)
  if kind == "permute":
    return tuple(shape[a] for a in arg)
  if kind == "pad":
    return tuple(s + b + e for s, (b, e) in zip(shape, arg))
  if kind == "shrink":
    return tuple(e - b for b, e in arg)
  if kind == "flip":
    return shape
  if kind == "stride":
    return tuple((s + abs(m) - 1) // abs(m) for s, m in zip(shape, arg))
  raise ValueError(f"unknown movement op {kind}")


def apply_to_shapetracker(sht: ShapeTracker, ops: Sequence[MovementOp]) -> ShapeTracker:
  """Apply a movement chain to a ShapeTracker."""
  for kind, arg in ops:
    if kind == "flip":
      sht = sht.stride(tuple(-1 if i in arg else 1 for i in range(len(sht.shape))))
    else:
      sht = getattr(sht, kind)(arg)
  return sht


def apply_to_numpy(arr: np.ndarray, ops: Sequence[MovementOp], pad_value: Any = -1) -> np.ndarray:
  """Apply a movement chain to a numpy array (views where numpy can, pad fills with pad_value)."""
  for kind, arg in ops:
    if kind == "reshape":
      arr = arr.reshape(arg)
    elif kind == "permute":
      arr = arr.transpose(arg)
    elif kind == "expand":
      arr = np.broadcast_to(arr, arg)
    elif kind == "pad":
      if any(b or e for b, e in arg):
        arr = np.pad(arr, arg, constant_values=pad_value)
    elif kind == "shrink":
      arr = arr[tuple(slice(b, e) for b, e in arg)]
    elif kind == "flip":
      arr = np.flip(arr, arg) if arg else arr
    elif kind == "stride":
      arr = arr[tuple(slice(None, None, m) for m in arg)]
    else:
      raise ValueError(f"unknown movement op {kind}")
  return arr


def numpy_is_one_view(start_shape: Tuple[int, ...], ops: Sequence[MovementOp]) -> bool:
  """True when numpy applies the whole chain without a copy (no pad, every reshape a view)."""
  arr = np.arange(max(prod(start_shape), 1), dtype=np.int64)[:prod(start_shape)].reshape(start_shape)
  base = arr
  for op in ops:
    if op[0] == "pad":
      return False
    arr = apply_to_numpy(arr, [op])
    # a copy lives in fresh memory, a view inside the original buffer
    if arr.size and not np.may_share_memory(arr, base):
      return False
  return True


def _numpy_ops(ctx: Dict[str, np.ndarray]) -> Dict[type, Callable[..., Any]]:
  def val(x: Any, ops: Any, c: Any) -> Any:
    return x.render(ops, c) if isinstance(x, Node) else x
  return {
    Variable: lambda self, ops, c: c[self.expr],
    NumNode: lambda self, ops, c: np.int64(self.b),
    MulNode: lambda self, ops, c: self.a.render(ops, c) * val(self.b, ops, c),
    DivNode: lambda self, ops, c: self.a.render(ops, c) // val(self.b, ops, c),
    ModNode: lambda self, ops, c: self.a.render(ops, c) % val(self.b, ops, c),
    LtNode: lambda self, ops, c: (self.a.render(ops, c) < val(self.b, ops, c)).astype(np.int64),
    SumNode: lambda self, ops, c: sum((x.render(ops, c) for x in self.nodes), np.int64(0)),
    AndNode: lambda self, ops, c: np.logical_and.reduce([np.asarray(x.render(ops, c)) != 0 for x in self.nodes]).astype(np.int64),
  }


def eval_node_numpy(node: Node, values: Dict[str, np.ndarray]) -> np.ndarray:
  """Evaluate node elementwise over numpy arrays of Variable values (keyed by name), via the render table."""
  return np.asarray(node.render(_numpy_ops(values), values), dtype=np.int64)


def shapetracker_indices(sht: ShapeTracker, simplify: bool = False) -> Tuple[np.ndarray, np.ndarray]:
  """(index, valid) of every position of sht as int64 / bool arrays of sht.shape, from its expr_idxs."""
  if simplify:
    sht = sht.simplify()
  shape = tuple(int(cast(int, s)) for s in sht.shape)
  idx, valid = sht.expr_idxs()
  grids = np.indices(shape, dtype=np.int64) if shape else np.zeros((0,), dtype=np.int64)
  values = {f"idx{i}": grids[i] for i in range(len(shape))}
  iv = np.broadcast_to(eval_node_numpy(idx, values), shape)
  vv = np.broadcast_to(eval_node_numpy(valid, values), shape) != 0
  return iv, vv


# *** symbolic expressions ***

@st.composite
def variables(draw: st.DrawFn, min_vars: int = 1, max_vars: int = 3, max_value: int = 20) -> List[Variable]:
  """Distinct Variables a, b, c... with random ranges 0 <= min < max <= max_value."""
  out = []
  for i in range(draw(st.integers(min_vars, max_vars))):
    lo = draw(st.integers(0, max_value - 1))
    hi = draw(st.integers(lo + 1, max_value))
    out.append(Variable("abcdefgh"[i], lo, hi))
  return out


@st.composite
def bindings(draw: st.DrawFn, vs: Sequence[Variable]) -> Dict[Variable, int]:
  """A value within range for each Variable."""
  return {v: draw(st.integers(v.min, int(cast(int, v.max)))) for v in vs}


def symbolic_trees(vs: Sequence[Variable], max_leaves: int = 12) -> st.SearchStrategy[Tree]:
  """Expression trees over vs as nested tuples: ("var", name), ("num", k), ("add"|"sub", l, r), ("neg", l),
  ("mul"|"div", l, k), ("mod", l, k>0), ("lt"|"ge", l, k), ("and", [comparisons]), ("sum", [trees])."""
  leaves = st.one_of(st.sampled_from([("var", v.expr) for v in vs]), st.integers(-8, 8).map(lambda k: ("num", k)))

  def extend(children: st.SearchStrategy[Tree]) -> st.SearchStrategy[Tree]:
    nonzero = st.integers(-9, 9).filter(lambda k: k != 0)
    cmp = st.tuples(st.sampled_from(["lt", "ge"]), children, st.integers(-10, 30))
    return st.one_of(
      st.tuples(st.sampled_from(["add", "sub"]), children, children),
      st.tuples(st.just("neg"), children),
      st.tuples(st.just("mul"), children, st.integers(-5, 5)),
      st.tuples(st.just("div"), children, nonzero),
      st.tuples(st.just("mod"), children, st.integers(1, 9)),
      cmp,
      st.tuples(st.just("and"), st.lists(cmp, min_size=1, max_size=3)),
      st.tuples(st.just("sum"), st.lists(children, min_size=1, max_size=4)),
    )
  return st.recursive(leaves, extend, max_leaves=max_leaves)


def build_node(tree: Tree, vs: Dict[str, Variable], check: Optional[Callable[[Node], None]] = None) -> Union[Node, int]:
  """The (simplifying) Node for tree; check is called on every intermediate Node."""
  def b(t: Tree) -> Any:
    ret = _build(t, b, vs)
    if check is not None and isinstance(ret, Node):
      check(ret)
    return ret
  return b(tree)


def _build(t: Tree, rec: Callable[[Tree], Any], vs: Dict[str, Variable]) -> Any:
  op = t[0]
  if op == "var":
    return vs[t[1]]
  if op == "num":
    return NumNode(t[1])
  if op == "add":
    return rec(t[1]) + rec(t[2])
  if op == "sub":
    return rec(t[1]) - rec(t[2])
  if op == "neg":
    return -rec(t[1])
  if op == "mul":
    return rec(t[1]) * t[2]
  if op == "div":
    return rec(t[1]) // t[2]
  if op == "mod":
    return rec(t[1]) % t[2]
  if op == "lt":
    return rec(t[1]) < t[2]
  if op == "ge":
    return rec(t[1]) >= t[2]
  if op == "and":
    return Node.ands([rec(x) for x in t[1]])
  if op == "sum":
    return Node.sum([rec(x) for x in t[1]])
  raise ValueError(f"unknown tree op {op}")


def eval_tree(t: Tree, values: Dict[str, int]) -> int:
  """The true value of tree with Python int semantics (floor division and modulo)."""
  op = t[0]
  if op == "var":
    return values[t[1]]
  if op == "num":
    return t[1]
  if op == "add":
    return eval_tree(t[1], values) + eval_tree(t[2], values)
  if op == "sub":
    return eval_tree(t[1], values) - eval_tree(t[2], values)
  if op == "neg":
    return -eval_tree(t[1], values)
  if op == "mul":
    return eval_tree(t[1], values) * t[2]
  if op == "div":
    return eval_tree(t[1], values) // t[2]
  if op == "mod":
    return eval_tree(t[1], values) % t[2]
  if op == "lt":
    return int(eval_tree(t[1], values) < t[2])
  if op == "ge":
    return int(eval_tree(t[1], values) >= t[2])
  if op == "and":
    return int(all(eval_tree(x, values) for x in t[1]))
  if op == "sum":
    return sum(eval_tree(x, values) for x in t[1])
  raise ValueError(f"unknown tree op {op}")


# *** dtypes ***

def scalar_dtypes(include_bfloat16: bool = True) -> st.SearchStrategy[DType]:
  """Any scalar dtype (aliases collapse to one)."""
  dts = sorted(set(DTYPES_DICT.values()), key=lambda d: d.priority)
  return st.sampled_from([d for d in dts if include_bfloat16 or d.fmt is not None])
