"""Symbolic integer algebra for index expressions and symbolic shapes.

Nodes simplify as they are built: sums are flattened with like terms and constants folded, divisions and
modulos use the bounds of their operand, comparisons are normalized. Every node knows exact-or-conservative
integer bounds `min`/`max` (for symbolic shapes `max` may itself be a node). Division and modulo follow
Python (floor) semantics; the builders keep the numerator of every DivNode/ModNode non-negative, so that
the C rendering (truncating division) computes the same values.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple, Type, Union

from tiny.helpers import partition


class Node:
  """Base of all symbolic expressions. Equality and hashing are structural (by `key`)."""

  b: Union[Node, int]
  min: int
  max: sint

  def render(self, ops: Optional[Mapping[Type[Node], Callable[..., Any]]] = None, ctx: Any = None) -> Any:
    """Render with a table {NodeClass: fn(node, ops, ctx)}; the default table renders a Python expression string."""
    if ops is None:
      ops = render_python
    return ops[type(self)](self, ops, ctx)

  def vars(self) -> Set[Variable]:
    """Every Variable this expression depends on."""
    return set()

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    """The expression with the given Variables replaced (by nodes or ints); it re-simplifies as it rebuilds."""
    raise NotImplementedError(type(self).__name__)

  def unbind(self) -> Tuple[Node, Optional[int]]:
    """The expression with every bound Variable replaced by its unbound form."""
    return self.substitute({v: v.unbind()[0] for v in self.vars() if v._val is not None}), None

  @functools.cached_property
  def key(self) -> str:
    return self.render(ctx="DEBUG")

  def __repr__(self) -> str:
    return self.render(ctx="REPR")

  def __str__(self) -> str:
    return "<" + self.key + ">"

  def __hash__(self) -> int:
    return hash(self.key)

  def __bool__(self) -> bool:
    return not (self.max == self.min == 0)

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Node):
      return NotImplemented
    return self.key == other.key

  # *** arithmetic ***

  def __neg__(self) -> Node:
    return self * -1

  def __add__(self, b: Union[Node, int]) -> Node:
    return Node.sum([self, _to_node(b)])

  def __radd__(self, b: int) -> Node:
    return self + b

  def __sub__(self, b: Union[Node, int]) -> Node:
    return self + -b

  def __rsub__(self, b: int) -> Node:
    return -self + b

  def __le__(self, b: Union[Node, int]) -> Node:  # type: ignore[override]
    return self < (b + 1)

  def __gt__(self, b: Union[Node, int]) -> Node:  # type: ignore[override]
    return (-self) < (-b)

  def __ge__(self, b: Union[Node, int]) -> Node:  # type: ignore[override]
    return create_ge_node(self, b)

  def __lt__(self, b: Union[Node, int]) -> Node:  # type: ignore[override]
    return create_lt_node(self, b)

  def __mul__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int):
      if b == 0:
        return NumNode(0)
      if b == 1:
        return self
    elif not isinstance(b, Node):
      return NotImplemented
    return create_node(MulNode(self, b))

  def __rmul__(self, b: int) -> Node:
    return self * b

  def __lshift__(self, b: int) -> Node:
    return self * 2 ** b

  def __rshift__(self, b: int) -> Node:
    return self // 2 ** b

  def __rfloordiv__(self, b: int) -> Node:
    return NumNode(b) // self

  def __floordiv__(self, b: Union[Node, int], factoring_allowed: bool = True) -> Node:
    if isinstance(b, Node):
      if isinstance(b, NumNode):
        return self.__floordiv__(b.b, factoring_allowed)
      if self == b:
        return NumNode(1)
      if self.min >= 0 and _imin(b - self) > 0:
        return NumNode(0)
      if self.min >= 0 and b.min > 0:
        return create_node(DivNode(self, b))  # a symbolic divisor, e.g. a symbolic shape
      raise RuntimeError(f"not supported: {self} // {b}")
    if b == 0:
      raise ZeroDivisionError(f"{self} // 0")
    if b < 0:
      return (self * -1).__floordiv__(-b, factoring_allowed)
    if b == 1:
      return self
    if self.min < 0:
      # shift the numerator to be non-negative (C and Python division agree there), then shift the quotient back
      offset = self.min // b
      return (self + -offset * b).__floordiv__(b, False) + offset
    return create_node(DivNode(self, b))

  def __rmod__(self, b: int) -> Node:
    return NumNode(b) % self

  def __mod__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, Node):
      if isinstance(b, NumNode):
        return self % b.b
      if self == b:
        return NumNode(0)
      if self.min >= 0 and _imin(b - self) > 0:
        return self
      if self.min >= 0 and b.min > 0:
        return create_node(ModNode(self, b))
      raise RuntimeError(f"not supported: {self} % {b}")
    if b <= 0:
      raise ValueError(f"modulo by a non-positive number is not supported: {self} % {b}")
    if b == 1:
      return NumNode(0)
    if isinstance(self.max, int):
      if self.min // b == self.max // b:
        return self - b * (self.min // b)
      if self.min < 0:
        return (self - (self.min // b) * b) % b
    elif self.min < 0:
      return (self - (self.min // b) * b) % b
    return create_node(ModNode(self, b))

  # *** builders ***

  @staticmethod
  def sum(nodes: List[Node]) -> Node:
    """Sum of nodes: flattened, like terms (x*a + x*b) merged, constants folded."""
    groups: Dict[Node, int] = {}
    const = 0
    for node in _flat_sum(nodes):
      if node.__class__ is NumNode:
        const += node.b  # type: ignore[operator]
      elif node.__class__ is MulNode and isinstance(node.b, int):
        groups[node.a] = groups.get(node.a, 0) + node.b  # type: ignore[attr-defined]
      else:
        groups[node] = groups.get(node, 0) + 1
    new_nodes: List[Node] = [a if c == 1 else MulNode(a, c) for a, c in groups.items() if c != 0]
    if const:
      new_nodes.append(NumNode(const))
    if not new_nodes:
      return NumNode(0)
    return create_node(SumNode(new_nodes)) if len(new_nodes) > 1 else new_nodes[0]

  @staticmethod
  def ands(nodes: List[Node]) -> Node:
    """Logical and of 0/1 nodes: 1 when empty, 0 when any is known false, known-true ones dropped."""
    flat: List[Node] = []
    for x in nodes:
      flat.extend(x.nodes if isinstance(x, AndNode) else [x])
    if any(not x for x in flat):
      return NumNode(0)
    flat = [x for x in flat if x.min != x.max]
    if not flat:
      return NumNode(1)
    return create_node(AndNode(flat)) if len(flat) > 1 else flat[0]


def _to_node(b: Union[Node, int]) -> Node:
  if isinstance(b, Node):
    return b
  if isinstance(b, bool) or not isinstance(b, int):
    raise TypeError(f"can't use {b!r} ({type(b).__name__}) in a symbolic expression")
  return NumNode(b)


def _flat_sum(nodes: List[Node]) -> List[Node]:
  out: List[Node] = []
  for x in nodes:
    if isinstance(x, SumNode):
      out.extend(_flat_sum(x.nodes))
    elif isinstance(x, Node):
      out.append(x)
    else:
      out.append(_to_node(x))
  return out


def _imin(x: sint) -> int:
  """An int lower bound of x."""
  while not isinstance(x, int):
    x = x.min
  return x


def _imax(x: sint) -> int:
  """An int upper bound of x (a symbolic max is bounded by its own max)."""
  while not isinstance(x, int):
    x = x.max
  return x


def create_node(ret: Node) -> Node:
  """ret, or a NumNode when its bounds pin it to one value."""
  if isinstance(ret.max, int):
    assert ret.min <= ret.max, f"min greater than max! {ret.min} {ret.max} when creating {type(ret).__name__}"
    if ret.min == ret.max:
      return NumNode(ret.min)
  return ret


def create_lt_node(lhs: Node, b: Union[Node, int]) -> Node:
  """lhs < b, normalized: constants moved to the right, a common factor divided out, a lone coefficient removed."""
  if isinstance(b, NumNode):
    b = b.b
  if isinstance(lhs, SumNode) and isinstance(b, int):
    consts, rest = partition(lhs.nodes, lambda x: x.__class__ is NumNode)
    b -= sum(x.b for x in consts)  # type: ignore[misc]
    lhs = Node.sum(rest)
    if isinstance(lhs, SumNode):
      # g*T + R < g*B  <=>  T < B  when 0 <= R < g
      muls, others = partition(lhs.nodes, lambda x: bool(x.__class__ is MulNode and isinstance(x.b, int) and x.b > 0 and _imax(x.max) >= b))
      if muls:
        g = b
        for x in muls:
          g = math.gcd(g, x.b)  # type: ignore[arg-type]
        rem = Node.sum(others)
        if g > 1 and rem.min >= 0 and _imax(rem.max) < g:
          lhs, b = Node.sum([x // g for x in muls]), b // g
    return create_node(LtNode(lhs, b)) if isinstance(lhs, SumNode) else create_lt_node(lhs, b)
  if isinstance(lhs, MulNode) and isinstance(b, int) and isinstance(lhs.b, int) and lhs.b != -1:
    # c*a < b  <=>  sign(c)*a < ceil(b/|c|)
    c = lhs.b
    return create_node(LtNode(lhs.a * (1 if c > 0 else -1), -(-b // abs(c))))
  return create_node(LtNode(lhs, b))


def create_ge_node(lhs: Node, b: Union[Node, int]) -> Node:
  """lhs >= b, as -lhs < -b+1."""
  return create_lt_node(-lhs, -b + 1)


class Variable(Node):
  """A named integer in [nmin, nmax]; `bind(val)` gives a copy carrying a value (for symbolic shapes)."""

  def __new__(cls, *args: Any) -> Any:
    expr, nmin, nmax = args
    if not isinstance(expr, str):
      raise TypeError(f"Variable name must be a str, got {expr!r}")
    if not isinstance(nmin, int) or nmin < 0 or (isinstance(nmax, int) and nmin > nmax):
      raise ValueError(f"invalid Variable {expr=} {nmin=} {nmax=}: need 0 <= min <= max")
    if isinstance(nmax, int) and nmin == nmax:
      return NumNode(nmin)
    return super().__new__(cls)

  def __getnewargs__(self) -> Tuple[str, int, sint]:
    return (self.expr, self.min, self.max)

  def __init__(self, expr: str, nmin: int, nmax: sint) -> None:
    self.expr, self.min, self.max = expr, nmin, nmax
    self._val: Optional[int] = None

  def __getstate__(self) -> Dict[str, Any]:
    return {"expr": self.expr, "min": self.min, "max": self.max, "_val": self._val}

  def __setstate__(self, state: Dict[str, Any]) -> None:
    self.__dict__.update(state)

  @property
  def val(self) -> int:
    """The bound value; raises when unbound."""
    if self._val is None:
      raise ValueError(f"Variable {self.expr} isn't bound, can't access its value")
    return self._val

  def bind(self, val: int) -> Variable:
    """A copy of this Variable bound to val (min <= val <= max)."""
    if self._val is not None:
      raise ValueError(f"cannot bind {val} to {self!r}: it is already bound")
    if not isinstance(val, int) or not (self.min <= val <= _imax(self.max)):
      raise ValueError(f"cannot bind {val!r} to {self!r}: out of range")
    ret = Variable(self.expr, self.min, self.max)
    ret._val = val
    return ret

  def unbind(self) -> Tuple[Variable, int]:  # type: ignore[override]
    """(the unbound Variable, its value)."""
    return Variable(self.expr, self.min, self.max), self.val

  def vars(self) -> Set[Variable]:
    return {self}

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    ret = var_vals.get(self)
    if ret is None and self._val is not None:
      ret = var_vals.get(Variable(self.expr, self.min, self.max))
    return self if ret is None else _to_node(ret)


class NumNode(Node):
  """An integer constant. Compares equal (and hashes equal) to the int itself."""

  def __init__(self, num: int) -> None:
    if not isinstance(num, int):
      raise TypeError(f"{num!r} is not an int")
    self.b: int = num
    self.min, self.max = num, num

  def bind(self, val: int) -> NumNode:
    if self.b != val:
      raise ValueError(f"cannot bind {val} to {self}")
    return self

  def __mul__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, int):
      return NumNode(self.b * b)
    return b * self.b

  def __floordiv__(self, b: Union[Node, int], factoring_allowed: bool = True) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int):
      return NumNode(self.b // b)
    return Node.__floordiv__(self, b, factoring_allowed)

  def __mod__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int) and b > 0:
      return NumNode(self.b % b)
    return Node.__mod__(self, b)

  def __eq__(self, other: object) -> bool:
    return self.b == other

  def __hash__(self) -> int:
    return hash(self.b)

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    return self


class OpNode(Node):
  """A binary node `a op b` with b an int (or, for symbolic shapes, a node)."""

  def __init__(self, a: Node, b: Union[Node, int]) -> None:
    self.a, self.b = a, b
    self.min, self.max = self.get_bounds()

  def vars(self) -> Set[Variable]:
    return self.a.vars() | (self.b.vars() if isinstance(self.b, Node) else set())

  def get_bounds(self) -> Tuple[int, sint]:
    raise NotImplementedError("must be implemented")


class LtNode(OpNode):
  """a < b, as 0 or 1."""

  def get_bounds(self) -> Tuple[int, sint]:
    if self.a == self.b:
      return 0, 0
    bmin, bmax = (self.b, self.b) if isinstance(self.b, int) else (self.b.min, _imax(self.b.max))
    if _imax(self.a.max) < bmin:
      return 1, 1
    if self.a.min >= bmax:
      return 0, 0
    return 0, 1

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    return self.a.substitute(var_vals) < (self.b if isinstance(self.b, int) else self.b.substitute(var_vals))


class MulNode(OpNode):
  """a * b."""

  def __mul__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int) or isinstance(self.b, int):
      return self.a * (self.b * b)  # fold the two factors into one
    return Node.__mul__(self, b)

  def __floordiv__(self, b: Union[Node, int], factoring_allowed: bool = False) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int) and isinstance(self.b, int) and b != 0:
      if self.b % b == 0:
        return self.a * (self.b // b)
      if self.b > 0 and b % self.b == 0:
        return self.a // (b // self.b)
    if isinstance(b, Node) and (q := _exact_quotient(self, b)) is not None:
      return q
    return Node.__floordiv__(self, b, factoring_allowed)

  def __mod__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int) and isinstance(self.b, int) and b > 0:
      return Node.__mod__(self.a * (self.b % b), b)
    if isinstance(b, Node) and _exact_quotient(self, b) is not None:
      return NumNode(0)
    return Node.__mod__(self, b)

  def get_bounds(self) -> Tuple[int, sint]:
    a, b = self.a, self.b
    if isinstance(b, int):
      return (a.min * b, a.max * b) if b >= 0 else (_imax(a.max) * b, a.min * b)
    if a.min >= 0 and b.min >= 0:
      return a.min * b.min, a.max * b.max
    corners = [x * y for x in (a.min, _imax(a.max)) for y in (b.min, _imax(b.max))]
    return min(corners), max(corners)

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    return self.a.substitute(var_vals) * (self.b if isinstance(self.b, int) else self.b.substitute(var_vals))


class DivNode(OpNode):
  """a // b with a >= 0 and b > 0 (b an int, or a node for symbolic shapes)."""

  def __floordiv__(self, b: Union[Node, int], factoring_allowed: bool = False) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int) and isinstance(self.b, int) and b > 0:
      return self.a // (self.b * b)  # nested floor divisions by positive numbers combine
    return Node.__floordiv__(self, b, factoring_allowed)

  def get_bounds(self) -> Tuple[int, sint]:
    assert self.a.min >= 0 and _imin(self.b) > 0, f"bad DivNode {self.a} // {self.b}"
    if isinstance(self.b, int):
      return self.a.min // self.b, self.a.max // self.b
    return self.a.min // _imax(self.b.max), _imax(self.a.max) // self.b.min

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    return self.a.substitute(var_vals) // (self.b if isinstance(self.b, int) else self.b.substitute(var_vals))


class ModNode(OpNode):
  """a % b with a >= 0 and b > 0."""

  def __mod__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int) and isinstance(self.b, int) and b > 0 and self.b % b == 0:
      return self.a % b
    return Node.__mod__(self, b)

  def __floordiv__(self, b: Union[Node, int], factoring_allowed: bool = True) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int) and isinstance(self.b, int) and b > 0 and self.b % b == 0:
      return (self.a // b) % (self.b // b)
    return Node.__floordiv__(self, b, factoring_allowed)

  def get_bounds(self) -> Tuple[int, sint]:
    assert self.a.min >= 0 and _imin(self.b) > 0, f"bad ModNode {self.a} % {self.b}"
    if not isinstance(self.b, int):
      return 0, min(_imax(self.a.max), _imax(self.b.max) - 1)
    if not isinstance(self.a.max, int):
      return 0, self.b - 1
    if self.a.max - self.a.min >= self.b or self.a.min % self.b > self.a.max % self.b:
      return 0, self.b - 1
    return self.a.min % self.b, self.a.max % self.b

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    return self.a.substitute(var_vals) % (self.b if isinstance(self.b, int) else self.b.substitute(var_vals))


def _exact_quotient(x: Node, b: Node) -> Optional[Node]:
  """x / b when x is structurally a multiple of the (symbolic) b, else None."""
  if x == b:
    return NumNode(1)
  if isinstance(x, MulNode):
    if x.a == b:
      return _to_node(x.b)
    if isinstance(x.b, Node) and x.b == b:
      return x.a
  return None


class RedNode(Node):
  """A node over a list of operands."""

  def __init__(self, nodes: List[Node]) -> None:
    self.nodes = nodes
    self.min, self.max = self.get_bounds()

  def vars(self) -> Set[Variable]:
    return set().union(*[x.vars() for x in self.nodes])

  def get_bounds(self) -> Tuple[int, sint]:
    raise NotImplementedError("must be implemented")


class SumNode(RedNode):
  """Sum of nodes (at most one NumNode, no nested sums when built with Node.sum)."""

  def get_bounds(self) -> Tuple[int, sint]:
    return sum(x.min for x in self.nodes), sum((x.max for x in self.nodes), 0)

  def __mul__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if isinstance(b, int) and b in (0, 1):
      return NumNode(0) if b == 0 else self
    return Node.sum([x * b for x in self.nodes])  # distribute

  def __floordiv__(self, b: Union[Node, int], factoring_allowed: bool = True) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if self == b:
      return NumNode(1)
    if isinstance(b, Node):
      quot: List[Node] = []
      rest: List[Node] = []
      for x in self.flat_components:
        if (q := _exact_quotient(x, b)) is not None:
          quot.append(q)
        else:
          rest.append(x)
      if quot:
        return Node.sum(quot) + (Node.sum(rest) // b if rest else 0)
      return Node.__floordiv__(self, b, factoring_allowed)
    if b <= 0 or b == 1 or not factoring_allowed:
      return Node.__floordiv__(self, b, factoring_allowed)
    fully_divided: List[Node] = []
    rest = []
    g, divisor = b, 1
    for x in self.flat_components:
      if x.__class__ is NumNode:
        quo, rem = divmod(x.b, b)  # type: ignore[call-overload]
        if quo:
          fully_divided.append(NumNode(quo))
        if rem:
          rest.append(NumNode(rem))
          g = math.gcd(g, rem)
      elif x.__class__ is MulNode and isinstance(x.b, int):
        if x.b % b == 0:
          fully_divided.append(x // b)
        else:
          rest.append(x)
          g = math.gcd(g, x.b)
          if divisor == 1 and x.b > 1 and b % x.b == 0:
            divisor = x.b
      else:
        rest.append(x)
        g = 1
    if not rest:
      return Node.sum(fully_divided)
    # every term of rest is a multiple of g, so the division splits exactly into // g then // (b // g)
    if g > 1:
      return Node.sum(fully_divided) + Node.sum(rest) // g // (b // g)
    if divisor > 1:
      return Node.sum(fully_divided) + Node.sum(rest) // divisor // (b // divisor)
    return Node.sum(fully_divided) + Node.__floordiv__(Node.sum(rest), b, False)

  def __mod__(self, b: Union[Node, int]) -> Node:
    if isinstance(b, NumNode):
      b = b.b
    if self == b:
      return NumNode(0)
    if isinstance(b, Node):
      if self.min >= 0 and _imin(b - self) > 0:
        return self
      rest = [x for x in self.flat_components if _exact_quotient(x, b) is None]
      if len(rest) != len(self.flat_components):
        return Node.sum(rest) % b
      return Node.__mod__(self, b)
    if b <= 0:
      return Node.__mod__(self, b)
    # (sum of terms) % b only depends on each coefficient and constant modulo b
    terms: List[Node] = []
    for x in self.flat_components:
      if x.__class__ is NumNode:
        terms.append(NumNode(x.b % b))  # type: ignore[operator]
      elif x.__class__ is MulNode and isinstance(x.b, int):
        terms.append(x.a * (x.b % b))  # type: ignore[attr-defined]
      else:
        terms.append(x)
    return Node.__mod__(Node.sum(terms), b)

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    return Node.sum([x.substitute(var_vals) for x in self.nodes])

  @property
  def flat_components(self) -> List[Node]:
    return _flat_sum(self.nodes)


class AndNode(RedNode):
  """Logical and of 0/1 nodes."""

  def get_bounds(self) -> Tuple[int, sint]:
    return min(x.min for x in self.nodes), max(_imax(x.max) for x in self.nodes)

  def substitute(self, var_vals: Mapping[Variable, Union[Node, int]]) -> Node:
    return Node.ands([x.substitute(var_vals) for x in self.nodes])


sint = Union[int, Node]


def sym_render(a: sint, ops: Optional[Mapping[Type[Node], Callable[..., Any]]] = None, ctx: Any = None) -> Any:
  """Render an int or a node with the same table."""
  return str(a) if isinstance(a, int) else a.render(ops, ctx)


def sym_infer(a: Union[sint, float], var_vals: Optional[Mapping[Variable, int]]) -> Any:
  """The value of a (an int, float or node) with the Variables given values."""
  if isinstance(a, (int, float)):
    return a
  ret = a.substitute({k: NumNode(v) for k, v in var_vals.items()}) if var_vals is not None else a
  if not isinstance(ret, NumNode):
    raise ValueError(f"sym_infer of {a} needs a value for {sorted(v.expr for v in ret.vars())}")
  return ret.b


def _render_variable(self: Variable, ops: Any, ctx: Any) -> str:
  if ctx == "DEBUG":
    return f"{self.expr}[{self.min}-{self.max}{'=' + str(self._val) if self._val is not None else ''}]"
  if ctx == "REPR":
    return f"Variable('{self.expr}', {self.min}, {self.max})" + (f".bind({self._val})" if self._val is not None else "")
  return self.expr


def render_mulnode(node: MulNode, ops: Any, ctx: Any) -> str:
  """a*b, with two Variables put in name order so that equal products render alike."""
  if isinstance(node.a, Variable) and isinstance(node.b, Variable) and node.b.expr < node.a.expr:
    return f"({node.b.render(ops, ctx)}*{node.a.render(ops, ctx)})"
  return f"({node.a.render(ops, ctx)}*{sym_render(node.b, ops, ctx)})"


render_python: Dict[Type[Node], Callable[..., Any]] = {
  Variable: _render_variable,
  NumNode: lambda self, ops, ctx: f"NumNode({self.b})" if ctx == "REPR" else f"{self.b}",
  MulNode: render_mulnode,
  DivNode: lambda self, ops, ctx: f"({self.a.render(ops, ctx)}//{sym_render(self.b, ops, ctx)})",
  ModNode: lambda self, ops, ctx: f"({self.a.render(ops, ctx)}%{sym_render(self.b, ops, ctx)})",
  LtNode: lambda self, ops, ctx: f"({self.a.render(ops, ctx)}<{sym_render(self.b, ops, ctx)})",
  SumNode: lambda self, ops, ctx: f"({'+'.join(sorted([x.render(ops, ctx) for x in self.nodes]))})",
  AndNode: lambda self, ops, ctx: f"({' and '.join(sorted([x.render(ops, ctx) for x in self.nodes]))})",
}

# C renders with truncating `/` and `%`: equal to Python's here because numerators are kept non-negative
render_c: Dict[Type[Node], Callable[..., Any]] = {
  **render_python,
  Variable: lambda self, ops, ctx: self.expr,
  NumNode: lambda self, ops, ctx: f"{self.b}" if self.b >= 0 else f"({self.b})",
  DivNode: lambda self, ops, ctx: f"({self.a.render(ops, ctx)}/{sym_render(self.b, ops, ctx)})",
  AndNode: lambda self, ops, ctx: f"({'&&'.join(sorted([x.render(ops, ctx) for x in self.nodes]))})",
}
