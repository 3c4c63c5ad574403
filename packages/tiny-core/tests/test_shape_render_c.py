"""The C rendering of index expressions, compiled with the system C compiler, computes what the Python rendering does.

Many expressions go into one C file per hypothesis example, so that a compile serves a whole batch.
"""
import ctypes
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny.helpers import prod
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import Node, render_c
from tiny.testing.strategies import (apply_to_numpy, apply_to_shapetracker, bindings, build_node, eval_tree, movement_chains, symbolic_trees,
                                     variables)

CC = next((c for c in (os.getenv("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


def _compile(src: str) -> ctypes.CDLL:
  if CC is None:
    pytest.skip("no C compiler (cc/gcc/clang) on PATH")
  with tempfile.TemporaryDirectory() as d:
    cpath, lpath = os.path.join(d, "exprs.c"), os.path.join(d, "exprs.so")
    with open(cpath, "w") as f:
      f.write(src)
    subprocess.run([CC, "-shared", "-fPIC", "-O0", "-w", "-o", lpath, cpath], check=True, capture_output=True)
    return ctypes.CDLL(lpath)  # the mapping outlives the deleted file


def _ptr(a: np.ndarray):
  return a.ctypes.data_as(ctypes.POINTER(ctypes.c_longlong))


def _c(node) -> str:
  return str(node) if isinstance(node, int) else node.render(render_c)

# each example compiles one C file (~50ms): run a quarter of the profile's examples
C_EXAMPLES = settings(max_examples=max(4, settings.default.max_examples // 4))


@st.composite
def tree_batches(draw):
  vs = draw(variables(min_vars=3, max_vars=3))
  return vs, draw(st.lists(st.tuples(symbolic_trees(vs), bindings(vs)), min_size=8, max_size=8))


@C_EXAMPLES
@given(tree_batches())
def test_symbolic_c_matches_python(batch):
  vs, cases = batch
  names = [v.expr for v in vs]
  nodes = [build_node(t, {v.expr: v for v in vs}) for t, _ in cases]
  args = ", ".join(f"long long {n}" for n in names)
  src = "".join(f"long long f{i}({args}) {{ return {_c(n)}; }}\n" for i, n in enumerate(nodes))
  lib = _compile(src)
  for i, (node, (tree, binding)) in enumerate(zip(nodes, cases)):
    fn = getattr(lib, f"f{i}")
    fn.restype, fn.argtypes = ctypes.c_longlong, [ctypes.c_longlong] * len(vs)
    vals = {v.expr: binding[v] for v in vs}
    py = node if isinstance(node, int) else int(eval(node.render(), {}, dict(vals)))  # noqa: S307 - our own rendering
    assert fn(*[vals[n] for n in names]) == py == eval_tree(tree, vals), f"C: {_c(node)}  python: {node}"


def _st_function(name: str, st: ShapeTracker) -> str:
  idx, valid = st.expr_idxs()
  loops = "".join(f"for (long long idx{i} = 0; idx{i} < {s}; idx{i}++) " for i, s in enumerate(st.shape))
  return (f"void {name}(long long *oi, long long *ov) {{ long long p = 0; {loops}"
          f"{{ oi[p] = {_c(idx)}; ov[p] = {_c(valid)}; p++; }} }}\n")


@C_EXAMPLES
@given(st.lists(movement_chains(), min_size=8, max_size=8))
def test_shapetracker_c_matches_python_and_numpy(chains):
  trackers = [apply_to_shapetracker(ShapeTracker.from_shape(start), ops) for start, ops in chains]
  lib = _compile("".join(_st_function(f"st{i}", t) for i, t in enumerate(trackers)))
  for i, ((start, ops), t) in enumerate(zip(chains, trackers)):
    n = prod(t.shape)
    oi, ov = np.zeros(max(n, 1), np.int64), np.zeros(max(n, 1), np.int64)
    getattr(lib, f"st{i}")(_ptr(oi), _ptr(ov))
    ref = apply_to_numpy(np.arange(prod(start), dtype=np.int64).reshape(start), ops).reshape(-1)
    np.testing.assert_array_equal(ov[:n] != 0, ref != -1)
    np.testing.assert_array_equal(np.where(ov[:n] != 0, oi[:n], -1), ref)
    # the Python rendering agrees at every position, invalid ones included
    idx, valid = t.expr_idxs()
    fn = eval(f"lambda {', '.join(f'idx{j}' for j in range(len(t.shape)))}: ({idx.render()}, {valid.render()})")  # noqa: S307
    for p, pos in enumerate(np.ndindex(*t.shape)):
      pi, pv = fn(*pos)
      assert bool(pv) == bool(ov[p])
      if pv:
        assert pi == oi[p]


def test_c_rendering_of_division_uses_nonnegative_numerators():
  # C's / truncates toward zero; the builders shift negative numerators so that C and Python agree
  from tiny.shape.symbolic import Variable
  a = Variable("a", 0, 10)
  node = (a - 7) // 3
  assert isinstance(node, Node)
  lib = _compile(f"long long f(long long a) {{ return {_c(node)}; }}\n")
  lib.f.restype, lib.f.argtypes = ctypes.c_longlong, [ctypes.c_longlong]
  assert [lib.f(x) for x in range(11)] == [(x - 7) // 3 for x in range(11)]
