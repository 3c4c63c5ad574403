"""The pass pipeline that turns a kernel's uop graph into the list renderers consume (`UOpGraph`).

Passes, in order (`UOpGraph.linearize`):
1. symbolic folding + the expander (EXPAND/CONTRACT disappear, every lane becomes scalar uops): `symbolic_rules`, `expander`,
2. reduce lowering (REDUCE -> DEFINE_ACC + PHI) and folding again: `reduce_lowering`,
3. decompositions the renderer needs (threefry, transcendental: `decompositions`), total integer division (`int_division`),
   vector load/store folding (`vector_memory`), re-vectorizing ALU lanes (CPU renderers, `vectorize`), the renderer's extra rules,
4. block-structured linearization (RANGE/ENDRANGE around exactly the uops that need the loop): `linearize`.

The names of those modules are re-exported here, where callers have always imported them from.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Tuple, Union

from tiny.helpers import DEBUG
from tiny.codegen.uops import UOp, UOps, PatternMatcher, graph_rewrite, graph_substitute
from tiny.codegen.symbolic_rules import INT_DTYPES, constant_folder, reduce_rules, symbolic_rules
from tiny.codegen.expander import do_contract, do_expand, expander
from tiny.codegen.reduce_lowering import make_reduce_lowerer
from tiny.codegen.decompositions import decomp_rules, threefry2x32, transcendental_matcher
from tiny.codegen.int_division import guard_int_division
from tiny.codegen.vector_memory import fold_vector_memory
from tiny.codegen.vectorize import vectorize_lanes
from tiny.codegen.linearize import LinearizeError, all_nodes, flops_mem, linearize_sink, toposort, verify_linearized

if TYPE_CHECKING:
  from tiny.renderer import Renderer

__all__ = ["UOpGraph", "INT_DTYPES", "constant_folder", "reduce_rules", "symbolic_rules", "do_contract", "do_expand", "expander",
           "make_reduce_lowerer", "decomp_rules", "threefry2x32", "transcendental_matcher", "guard_int_division", "fold_vector_memory",
           "LinearizeError", "all_nodes", "flops_mem", "linearize_sink", "toposort", "verify_linearized", "graph_rewrite", "graph_substitute"]


class UOpGraph:
  """A kernel's uop graph; `linearize()` rewrites it and orders it into the list renderers consume."""

  def __init__(self, sink: Union[UOp, List[UOp]], opts: Optional[Renderer] = None) -> None:
    if isinstance(sink, UOp) and sink.op is UOps.SINK:
      self.sink = sink
    else:
      self.sink = UOp(UOps.SINK, None, tuple(sink) if isinstance(sink, (list, tuple)) else (sink,))
    self.opts = opts
    self._uops: Optional[List[UOp]] = None

  def __iter__(self) -> Iterator[UOp]:
    return iter(self.uops)

  def __getitem__(self, index: int) -> UOp:
    return self.uops[index]

  def __len__(self) -> int:
    return len(self.uops)

  @property
  def uops(self) -> List[UOp]:
    """The linearized list (linearizes on first use)."""
    if self._uops is None:
      self.linearize()
    assert self._uops is not None
    return self._uops

  def vars(self) -> List[Any]:
    return sorted([u.arg for u in self.uops if u.op is UOps.DEFINE_VAR], key=lambda v: v.expr)

  def globals(self) -> List[Tuple[int, bool]]:
    return [u.arg for u in self.uops if u.op is UOps.DEFINE_GLOBAL]

  def flops_mem(self, ignore_indexing: bool = False) -> Tuple[Any, Any]:
    return flops_mem(self.uops, ignore_indexing)

  def print(self) -> None:
    for i, u in enumerate(self.uops):
      srcs = [self.uops.index(x) if x in self.uops else "--" for x in u.src]
      arg = u.arg.name if hasattr(u.arg, "name") and not isinstance(u.arg, tuple) else u.arg
      print(f"{i:4d} {u.op.name:15s}: {str(u.dtype):25s} {str(srcs):32s} {arg}")

  def rewrite(self, extra_pm: Optional[PatternMatcher] = None) -> UOp:
    """Run the rewrite passes and return the final sink (before ordering)."""
    folder = constant_folder + extra_pm if extra_pm is not None else constant_folder
    sink = graph_rewrite(self.sink, folder + expander)
    sink = graph_rewrite(sink, folder)
    sink = graph_rewrite(sink, make_reduce_lowerer() + PatternMatcher(symbolic_rules + decomp_rules))
    if (tm := transcendental_matcher(self.opts)) is not None:
      sink = graph_rewrite(sink, tm + PatternMatcher(symbolic_rules))
    sink = guard_int_division(sink)
    sink = fold_vector_memory(sink, self.opts)
    sink = vectorize_lanes(sink, self.opts)
    if (em := getattr(self.opts, "extra_matcher", None)) is not None:
      sink = graph_rewrite(sink, em + PatternMatcher(symbolic_rules))
    if extra_pm is not None:
      sink = graph_rewrite(sink, extra_pm)
    return sink

  def linearize(self, extra_pm: Optional[PatternMatcher] = None) -> UOpGraph:
    """Rewrite and order the graph into `self.uops`."""
    sink = self.rewrite(extra_pm)
    self._uops = linearize_sink(sink)
    if DEBUG >= 5:
      self.print()
    return self
