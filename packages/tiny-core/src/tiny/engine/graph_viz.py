"""GRAPH=1: the schedule graph as Graphviz DOT (and SVG when Graphviz's `dot` is installed), like tinygrad's GRAPH.

Every schedule the program creates becomes a cluster: one node per kernel (labelled with its number, kind, output shape
and dtype, the ops it runs and the Tensor methods it came from), copies and other meta ops drawn as distinct shapes,
and one edge per buffer a later item reads: from the item that wrote it, or from an input node for a buffer that was
already realized before the schedule. The file (GRAPH_PATH, default /tmp/tiny_graph.dot) is written when the program
exits, or at any time with `save()`. The scheduler calls `record_schedule` only when GRAPH is set, so it costs nothing
otherwise.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from tiny.helpers import GRAPH, getenv
from tiny.ops import BufferOps, MetaOps, ReduceOps

if TYPE_CHECKING:
  from tiny.engine.schedule import ScheduleItem

__all__ = ["GRAPH", "default_path", "record_schedule", "reset", "save", "to_dot"]

DEFAULT_PATH = "/tmp/tiny_graph.dot"
# node shapes: kernels are boxes, copies between devices stand out, other meta ops and external buffers are plain
_STYLE = {"KERNEL": 'shape=box, style="rounded,filled", fillcolor="#e8f0fe"', "COPY": 'shape=cds, style=filled, fillcolor="#ffe0b2"',
          "META": 'shape=hexagon, style=filled, fillcolor="#eeeeee"', "INPUT": 'shape=note, style=filled, fillcolor="#f5f5f5"'}

_clusters: List[Tuple[List[str], List[str]]] = []  # (node lines, edge lines) of each recorded schedule
_state = {"kernels": 0, "hooked": False}


def default_path() -> str:
  """Where the DOT file goes: GRAPH_PATH, or /tmp/tiny_graph.dot."""
  return str(getenv("GRAPH_PATH", DEFAULT_PATH))


def _quote(s: str) -> str:
  return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _kind(si: ScheduleItem) -> str:
  return "KERNEL" if si.ast.op is MetaOps.KERNEL else "COPY" if si.ast.op is MetaOps.COPY else "META"


def _label(num: int, si: ScheduleItem) -> str:
  """Kernel number and kind, output shape and dtype, ops run (for kernels), source Tensor methods."""
  kind = _kind(si)
  out = si.outputs[0] if si.outputs else None
  where = f"{out.dtype.name} {out.device}" if out is not None else ""
  if kind != "KERNEL":
    head = f"{num}: {si.ast.op.name.lower()} {out.size if out is not None else 0} elements"
    if si.ast.op is MetaOps.COPY and si.inputs:
      head += f"\n{si.inputs[0].device} -> {out.device if out is not None else '?'}"
    return f"{head}\n{where}"
  ops = si.ast.lazyops
  stores = [x for x in ops if x.op is BufferOps.STORE]
  shapes = ", ".join(str(tuple(x.arg.st.shape)) for x in stores)
  prefix = "r" if any(isinstance(x.op, ReduceOps) for x in ops) else "E"
  alu = sorted({x.op.name for x in ops if not isinstance(x.op, BufferOps) and x.op is not MetaOps.KERNEL})
  lines = [f"{num}: {prefix}_kernel {shapes}", where]
  if alu:
    lines.append(" ".join(alu[:8]) + (" ..." if len(alu) > 8 else ""))
  if si.metadata:
    lines.append(", ".join(dict.fromkeys(m.name + (" bw" if m.backward else "") for m in si.metadata)))
  return "\n".join(lines)


def record_schedule(schedule: Sequence[ScheduleItem]) -> None:
  """Adds one schedule (in run order) to the graph; the file is written at exit (see `save`)."""
  if not _state["hooked"]:
    atexit.register(_save_at_exit)
    _state["hooked"] = True
  c = len(_clusters)
  nodes: List[str] = []
  edges: List[str] = []
  # id(buffer) -> node that last wrote it in this schedule (the schedule holds its buffers, so ids stay unique)
  writer: Dict[int, str] = {}
  inputs: Dict[int, str] = {}
  for si in schedule:
    _state["kernels"] += 1
    node = f"k{_state['kernels']}"
    nodes.append(f"    {node} [label={_quote(_label(_state['kernels'], si))}, {_STYLE[_kind(si)]}];")
    for buf in dict.fromkeys(si.inputs):
      src = writer.get(id(buf))
      if src is None:
        if id(buf) not in inputs:
          inputs[id(buf)] = f"c{c}b{len(inputs)}"
          nodes.append(f"    {inputs[id(buf)]} [label={_quote(f'{buf.dtype.name}[{buf.size}] {buf.device}')}, {_STYLE['INPUT']}];")
        src = inputs[id(buf)]
      edges.append(f"    {src} -> {node} [label={_quote(f'{buf.dtype.name}[{buf.size}]')}];")
    for buf in si.outputs:
      writer[id(buf)] = node
  _clusters.append((nodes, edges))


def to_dot() -> str:
  """The recorded schedules as one DOT digraph, a cluster per schedule."""
  out = ["digraph tiny_schedule {", "  rankdir=TB;", '  node [fontname="monospace", fontsize=10];', '  edge [fontname="monospace", fontsize=8];']
  for i, (nodes, edges) in enumerate(_clusters):
    out += [f"  subgraph cluster_{i} {{", f'    label="schedule {i}";', *nodes, *edges, "  }"]
  return "\n".join(out + ["}"]) + "\n"


def reset() -> None:
  """Forgets every recorded schedule."""
  _clusters.clear()
  _state["kernels"] = 0


def save(path: Optional[str] = None) -> Optional[str]:
  """Writes the DOT file (default: `default_path()`) and renders an SVG beside it when `dot` is installed, saying so on
  stderr. Returns the path of the DOT file."""
  path = path or default_path()
  with open(path, "w") as f:
    f.write(to_dot())
  dot = shutil.which("dot")
  if dot is None:
    print(f"GRAPH: wrote {path} ({len(_clusters)} schedules); Graphviz `dot` is not installed, so no SVG was rendered", file=sys.stderr)
    return path
  svg = os.path.splitext(path)[0] + ".svg"
  res = subprocess.run([dot, "-Tsvg", path, "-o", svg], capture_output=True, text=True, check=False)
  if res.returncode != 0:
    print(f"GRAPH: wrote {path}; `dot` failed to render it: {res.stderr.strip()}", file=sys.stderr)
  else:
    print(f"GRAPH: wrote {path} and {svg}", file=sys.stderr)
  return path


def _save_at_exit() -> None:
  if _clusters:
    save()
