"""GRAPH=1: tiny.engine.graph_viz writes the schedule graph as Graphviz DOT."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tiny.engine import graph_viz
from tiny.helpers import Context
from tiny.ops import MetaOps
from tiny.tensor import Tensor

NODE = re.compile(r'^\s*(\w+) \[((?:\w+=(?:"(?:[^"\\]|\\.)*"|[\w.#]+)(?:, )?)+)\];$')
EDGE = re.compile(r'^\s*(\w+) -> (\w+) \[label="(?:[^"\\]|\\.)*"\];$')
ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[\w.#]+)')


@pytest.fixture(autouse=True)
def _fresh_graph():
  graph_viz.reset()
  yield
  graph_viz.reset()  # nothing left for the exit hook to write


def parse_dot(text):
  """A strict reader for the subset of DOT graph_viz writes: {node: attrs}, [(src, dst)], and the cluster count.
  Fails on anything else (unbalanced braces, unknown statements, edges to undeclared nodes)."""
  lines = text.strip().split("\n")
  assert lines[0] == "digraph tiny_schedule {" and lines[-1] == "}", (lines[0], lines[-1])
  nodes, edges, depth, clusters = {}, [], 1, 0
  for line in lines[1:-1]:
    s = line.strip()
    if re.fullmatch(r"subgraph cluster_\d+ \{", s):
      depth, clusters = depth + 1, clusters + 1
    elif s == "}":
      depth -= 1
      assert depth >= 1, "unbalanced braces"
    elif re.fullmatch(r'(rankdir=\w+|label="[^"]*"|(node|edge) \[[^\]]*\]);', s):
      continue  # graph, cluster and default node/edge attributes
    elif m := EDGE.match(line):
      edges.append((m.group(1), m.group(2)))
    elif m := NODE.match(line):
      assert m.group(1) not in nodes, f"node {m.group(1)} declared twice"
      nodes[m.group(1)] = {k: v.strip('"') for k, v in ATTR.findall(m.group(2))}
    else:
      raise AssertionError(f"unexpected DOT line: {line!r}")
  assert depth == 1, "unbalanced braces"
  for a, b in edges:
    assert a in nodes and b in nodes, f"edge {a} -> {b} to an undeclared node"
  return nodes, edges, clusters


def small_program():
  x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
  w = Tensor(np.ones((4, 5), dtype=np.float32))
  return ((x @ w).relu() + 1).sum(1)


def test_dot_has_a_node_per_schedule_item_and_an_edge_per_read(tmp_path):
  with Context(GRAPH=1):
    sched = small_program().schedule()
  assert len(sched) >= 3  # two copies in, one or more kernels
  # independent expectations from the schedule: one node per item, one edge per distinct buffer an item reads, and an
  # input node per distinct buffer read that no earlier item wrote
  written, external = set(), []
  for si in sched:
    external += [b for b in dict.fromkeys(si.inputs) if b not in written and b not in external]
    written.update(si.outputs)
  n_edges = sum(len(set(si.inputs)) for si in sched)
  path = graph_viz.save(str(tmp_path / "g.dot"))
  nodes, edges, clusters = parse_dot(open(path).read())
  assert clusters == 1
  kernels = {k: v for k, v in nodes.items() if k.startswith("k")}
  assert len(kernels) == len(sched)
  assert len(nodes) - len(kernels) == len(external)
  assert len(edges) == n_edges
  # copies look different from kernels, and labels say what each kernel is
  copies = [k for k, v in kernels.items() if v["shape"] == "cds"]
  assert len(copies) == sum(si.ast.op is MetaOps.COPY for si in sched) == 2
  compute = [v["label"] for v in kernels.values() if v["shape"] == "box"]
  assert len(compute) == sum(si.ast.op is MetaOps.KERNEL for si in sched)
  assert any("_kernel (3, 1)" in label and "SUM" in label for label in compute), compute
  assert any("relu" in label for label in compute), compute
  # kernels are numbered in run order and every edge goes forward in it
  order = {k: int(k[1:]) for k in kernels}
  assert all(order[b] > order[a] for a, b in edges if a in order)


def test_each_schedule_is_a_cluster(tmp_path):
  with Context(GRAPH=1):
    a = small_program()
    a.realize()
    (a * 2).realize()
  nodes, edges, clusters = parse_dot(graph_viz.to_dot())
  assert clusters == 2
  # the second schedule reads the first one's result: one external input node, one kernel, one edge
  assert graph_viz.to_dot().count("subgraph cluster_1") == 1 and len(edges) >= 1


def test_nothing_recorded_when_graph_is_unset():
  with Context(GRAPH=0):
    small_program().realize()
  assert parse_dot(graph_viz.to_dot())[0] == {}


def _run(code, env_extra, tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("GRAPH", "GRAPH_PATH")}
  env.update(env_extra)
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300)


PROGRAM = """
  import numpy as np
  from tiny.tensor import Tensor
  print((Tensor(np.ones((4, 4), dtype=np.float32)) * 3).sum().numpy())
"""


def test_env_var_writes_file_at_exit_and_only_then(tmp_path):
  path = tmp_path / "out.dot"
  off = _run(PROGRAM, {"GRAPH_PATH": str(path)}, tmp_path)
  assert off.returncode == 0 and "48" in off.stdout, off.stderr
  assert not path.exists() and "GRAPH:" not in off.stderr
  on = _run(PROGRAM, {"GRAPH": "1", "GRAPH_PATH": str(path)}, tmp_path)
  assert on.returncode == 0 and "48" in on.stdout, on.stderr
  nodes, _, clusters = parse_dot(path.read_text())
  assert clusters == 1 and any(v["shape"] == "box" for v in nodes.values())
  # one line on stderr, either way
  assert len([x for x in on.stderr.splitlines() if x.startswith("GRAPH:")]) == 1, on.stderr
  assert f"wrote {path}" in on.stderr


def test_without_dot_it_says_so(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(shutil, "which", lambda name: None)
  with Context(GRAPH=1):
    small_program().schedule()
  path = graph_viz.save(str(tmp_path / "g.dot"))
  err = capsys.readouterr().err
  assert os.path.exists(path) and "`dot` is not installed" in err and path in err
  assert not (tmp_path / "g.svg").exists()


def test_renders_svg_with_dot(tmp_path, monkeypatch, capsys):
  # a stand-in `dot` that records its arguments, so the rendering call is checked without Graphviz
  fake = tmp_path / "bin" / "dot"
  fake.parent.mkdir()
  fake.write_text(f"#!{sys.executable}\nimport sys\nopen(sys.argv[sys.argv.index('-o') + 1], 'w').write(' '.join(sys.argv[1:]))\n")
  fake.chmod(0o755)
  monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")
  with Context(GRAPH=1):
    small_program().schedule()
  path = graph_viz.save(str(tmp_path / "g.dot"))
  svg = tmp_path / "g.svg"
  assert svg.read_text() == f"-Tsvg {path} -o {svg}"
  assert f"wrote {path} and {svg}" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not installed (apt-get install graphviz)")
def test_real_dot_accepts_the_file(tmp_path):
  with Context(GRAPH=1):
    small_program().realize()
  path = graph_viz.save(str(tmp_path / "g.dot"))
  res = subprocess.run([shutil.which("dot"), "-Tsvg", path], capture_output=True, text=True, check=False)
  assert res.returncode == 0 and "<svg" in res.stdout and not res.stderr.strip(), res.stderr
