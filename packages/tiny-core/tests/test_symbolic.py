"""Symbolic algebra: folding, bounds, division/modulo by bounds, rendering, binding. Expected values are computed by hand."""
import pickle

import pytest

from tiny.shape.symbolic import (AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable, create_ge_node, create_lt_node, render_c,
                                 render_python, sym_infer)



def test_variable_and_numnode():
  a = Variable("a", 3, 8)
  assert (a.min, a.max, a.expr) == (3, 8, "a")
  assert isinstance(Variable("c", 5, 5), NumNode) and Variable("c", 5, 5) == 5
  assert NumNode(7) == 7 and hash(NumNode(7)) == hash(7)
  assert a.vars() == {a} and NumNode(1).vars() == set()
  for bad in [("x", -1, 3), ("x", 4, 3)]:
    with pytest.raises(ValueError):
      Variable(*bad)


def test_constant_folding_and_like_terms():
  a, b = Variable("a", 0, 10), Variable("b", 0, 10)
  assert (a + 0) == a
  assert (a + 3 - 3) == a
  assert (a - a) == 0 and isinstance(a - a, NumNode)
  s = a + a + b * 2 + b
  assert isinstance(s, SumNode) and s == a * 2 + b * 3
  assert (a * 3) * 4 == a * 12 and isinstance(a * 3 * 4, MulNode)
  assert a * 0 == 0 and a * 1 is a
  assert (a + b) == (b + a) and hash(a + b) == hash(b + a)
  assert -(a - 4) == (a * -1) + 4


def test_bounds():
  a, b = Variable("a", 2, 10), Variable("b", 0, 3)
  assert ((a * 3 - b * 2 + 1).min, (a * 3 - b * 2 + 1).max) == (2 * 3 - 6 + 1, 30 + 1)
  assert ((a * -2).min, (a * -2).max) == (-20, -4)
  assert ((a // 3).min, (a // 3).max) == (0, 3)
  m = Variable("m", 0, 20) % 7
  assert (m.min, m.max) == (0, 6)
  assert ((Variable("n", 8, 10) % 7).min, (Variable("n", 8, 10) % 7).max) == (1, 3)


def test_division_and_modulo_use_bounds():
  a, b = Variable("a", 0, 10), Variable("b", 0, 3)
  assert (a * 4 + b) // 4 == a
  assert (a * 4 + b) % 4 == b
  assert a // 11 == 0 and a % 11 == a
  assert (a + 20) % 10 == a % 10
  assert ((a * 2 + 1) * 3) // 6 == a
  assert (a * 6) // 3 == a * 2 and (a * 6) % 3 == 0
  assert (a // 2) // 3 == a // 6
  assert (a % 12) % 4 == a % 4 and (a % 12) // 4 == (a // 4) % 3
  assert isinstance(a // 3, DivNode) and isinstance(a % 3, ModNode)


def test_negative_numerators_are_shifted():
  a = Variable("a", 0, 10)
  node = (a - 7) // 3
  assert [sym_infer(node, {a: x}) for x in range(11)] == [(x - 7) // 3 for x in range(11)]
  node = (a - 7) % 3
  assert [sym_infer(node, {a: x}) for x in range(11)] == [(x - 7) % 3 for x in range(11)]
  assert [sym_infer(a // -3, {a: x}) for x in range(11)] == [x // -3 for x in range(11)]


def test_division_errors():
  a = Variable("a", 0, 10)
  with pytest.raises(ZeroDivisionError):
    a // 0
  with pytest.raises(ValueError):
    a % 0
  with pytest.raises(ValueError):
    a % -2


def test_comparisons():
  a, b = Variable("a", 0, 10), Variable("b", 0, 3)
  assert (a < 11) == 1 and (a < 0) == 0 and isinstance(a < 5, LtNode)
  assert (a >= 0) == 1 and (a >= 11) == 0
  # 4a + b < 8 with 0 <= b < 4 is a < 2
  assert ((a * 4 + b) < 8) == (a < 2)
  assert create_lt_node(a * 3, 7) == (a < 3)
  assert create_ge_node(a, 3) == (a * -1 < -2)
  for x in range(11):
    assert sym_infer(a <= 4, {a: x}) == int(x <= 4) and sym_infer(a > 4, {a: x}) == int(x > 4) and sym_infer(a >= 4, {a: x}) == int(x >= 4)


def test_ands():
  a = Variable("a", 0, 10)
  assert Node.ands([]) == 1 and Node.ands([a < 5]) == (a < 5)
  assert Node.ands([a < 5, NumNode(0)]) == 0
  assert Node.ands([a < 5, NumNode(1)]) == (a < 5)
  both = Node.ands([a < 5, a >= 2])
  assert isinstance(both, AndNode) and [sym_infer(both, {a: x}) for x in range(11)] == [int(2 <= x < 5) for x in range(11)]


def test_sum_builder():
  a, b = Variable("a", 0, 10), Variable("b", 0, 10)
  assert Node.sum([]) == 0 and Node.sum([a]) is a
  assert Node.sum([a, NumNode(2), a + b, NumNode(-2)]) == a * 2 + b
  assert Node.sum([a, a * -1]) == 0


def test_bind_unbind_substitute():
  a = Variable("a", 1, 10)
  ab = a.bind(4)
  assert ab.val == 4 and ab != a and ab.unbind() == (a, 4) and a._val is None
  with pytest.raises(ValueError):
    a.val
  with pytest.raises(ValueError):
    a.bind(11)
  with pytest.raises(ValueError):
    ab.bind(3)
  expr = ab * 3 + 1
  assert expr.unbind()[0] == a * 3 + 1
  assert sym_infer(expr, {a: 4}) == 13  # bound variables are found by their unbound form
  assert (a * 2 + 1).substitute({a: NumNode(3)}) == 7 and (a * 2).substitute({a: 5}) == 10
  b = Variable("b", 0, 5)
  assert (a + b).substitute({a: b}) == b * 2
  with pytest.raises(ValueError):
    sym_infer(a + b, {a: 1})
  assert sym_infer(3, {}) == 3


def test_render_python_and_c():
  a, b = Variable("a", 0, 10), Variable("b", 0, 10)
  node = (a * 3 + b) // 4 + (a % 5) * 2
  for x in range(11):
    for y in (0, 3, 10):
      want = (x * 3 + y) // 4 + (x % 5) * 2
      assert eval(node.render(), {}, {"a": x, "b": y}) == want
  assert "//" in ((a * 3 + b) // 4).render() and "//" not in ((a * 3 + b) // 4).render(render_c)
  assert (Node.ands([a < 3, b < 4])).render(render_c) == "((a<3)&&(b<4))"
  assert (a < 3).render() == "(a<3)" and render_python is not render_c


def test_render_dispatches_through_the_table():
  a, b = Variable("a", 0, 10), Variable("b", 0, 10)
  # a table that builds nested tuples: every node class must go through ops[type(node)]
  ops = {
    Variable: lambda self, ops, ctx: ("var", ctx[self.expr]),
    NumNode: lambda self, ops, ctx: ("num", self.b),
    MulNode: lambda self, ops, ctx: ("mul", self.a.render(ops, ctx), self.b),
    DivNode: lambda self, ops, ctx: ("div", self.a.render(ops, ctx), self.b),
    ModNode: lambda self, ops, ctx: ("mod", self.a.render(ops, ctx), self.b),
    LtNode: lambda self, ops, ctx: ("lt", self.a.render(ops, ctx), self.b),
    SumNode: lambda self, ops, ctx: ("sum",) + tuple(sorted(x.render(ops, ctx) for x in self.nodes)),
    AndNode: lambda self, ops, ctx: ("and",) + tuple(sorted(x.render(ops, ctx) for x in self.nodes)),
  }
  ctx = {"a": "A", "b": "B"}
  assert (a * 2 + 1).render(ops, ctx) == ("sum", ("mul", ("var", "A"), 2), ("num", 1))
  assert ((a + b) // 3).render(ops, ctx) == ("div", ("sum", ("var", "A"), ("var", "B")), 3)
  assert Node.ands([a < 3, b < 4]).render(ops, ctx) == ("and", ("lt", ("var", "A"), 3), ("lt", ("var", "B"), 4))


def test_repr_key_and_str():
  a = Variable("a", 0, 10)
  assert repr(a) == "Variable('a', 0, 10)" and repr(a.bind(3)) == "Variable('a', 0, 10).bind(3)"
  assert a.key == "a[0-10]" and a.bind(3).key == "a[0-10=3]" and str(a * 2) == "<(a[0-10]*2)>"
  assert repr(NumNode(3)) == "NumNode(3)"
  assert eval(repr(a * 2 + 1), {"Variable": Variable, "NumNode": NumNode}) is not None


def test_variable_as_dict_key_and_pickle():
  a = Variable("a", 0, 10)
  d = {a: 1}
  assert d[Variable("a", 0, 10)] == 1 and Variable("a", 0, 9) not in d
  b = a.bind(5)
  assert pickle.loads(pickle.dumps(b)) == b and pickle.loads(pickle.dumps(b)).val == 5
  assert pickle.loads(pickle.dumps(a * 3 + 2)) == a * 3 + 2


def test_symbolic_max_variable():
  n = Variable("n", 1, 10)
  idx = Variable("idx", 0, n - 1)
  assert idx.max == n - 1 and (idx * 4).max == (n - 1) * 4
  assert (idx < n).min == 0
  assert sym_infer(idx * 2 + n, {idx: 3, n: 5}) == 11


def test_bool_of_nodes():
  a = Variable("a", 0, 10)
  assert bool(a) and not bool(NumNode(0)) and bool(NumNode(-1))


def test_symbolic_division_by_symbolic():
  n = Variable("n", 1, 10)
  i = Variable("i", 0, 10)
  assert (n * 4) // n == 4 and (i * n + n * 3) // n == i + 3 and (n * 4) % n == 0
  assert n // n == 1 and n % n == 0
  # a general symbolic divisor stays a DivNode/ModNode with sound bounds
  q, r = i // n, i % n
  assert isinstance(q, DivNode) and isinstance(r, ModNode) and (q.min, q.max, r.min, r.max) == (0, 10, 0, 9)
  for iv in range(11):
    for nv in range(1, 11):
      assert sym_infer(q, {i: iv, n: nv}) == iv // nv and sym_infer(r, {i: iv, n: nv}) == iv % nv
      assert eval(q.render(), {}, {"i": iv, "n": nv}) == iv // nv
  with pytest.raises(RuntimeError):
    (i - 5) // n
