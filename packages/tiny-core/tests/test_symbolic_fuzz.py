"""Property tests: random symbolic trees evaluate the same after simplification, and lie within [min, max]."""
from hypothesis import given
from hypothesis import strategies as st

from tiny.shape.symbolic import DivNode, ModNode, Node, sym_infer
from tiny.testing.strategies import bindings, build_node, eval_tree, symbolic_trees, variables


@st.composite
def tree_cases(draw):
  vs = draw(variables())
  return vs, draw(symbolic_trees(vs)), draw(bindings(vs))


def _value(node, binding):
  return node if isinstance(node, int) else sym_infer(node, binding)


@given(tree_cases())
def test_simplified_tree_evaluates_like_python(case):
  vs, tree, binding = case
  values = {v.expr: x for v, x in binding.items()}

  def check(node: Node):
    # every intermediate node: bounds contain the value at this binding
    val = _value(node, binding)
    assert node.min <= val <= node.max, f"{node!r} = {val} outside [{node.min}, {node.max}]"
    # C's truncating division must see the same numbers as Python's floor division
    if isinstance(node, (DivNode, ModNode)):
      assert node.a.min >= 0 and node.b > 0, f"{node!r} has a possibly negative numerator"

  node = build_node(tree, {v.expr: v for v in vs}, check=check)
  assert _value(node, binding) == eval_tree(tree, values)


@given(tree_cases())
def test_python_rendering_evaluates_alike(case):
  vs, tree, binding = case
  node = build_node(tree, {v.expr: v for v in vs})
  values = {v.expr: x for v, x in binding.items()}
  assert int(eval(node.render(), {}, dict(values))) == eval_tree(tree, values)  # noqa: S307 - our own rendering


@given(tree_cases())
def test_substitute_then_bounds_are_exact_for_constants(case):
  vs, tree, binding = case
  node = build_node(tree, {v.expr: v for v in vs})
  if isinstance(node, Node):
    sub = node.substitute(binding)
    assert sub.min == sub.max == eval_tree(tree, {v.expr: x for v, x in binding.items()})
