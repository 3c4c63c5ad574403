"""One kernel for an eager scalar op whose constant changes every call (`w * lr` with a new lr each step).

Constants are baked into kernels, so each new value of a Python scalar was a new kernel to compile (hundreds of
milliseconds on CLANG). Here a chain of `Tensor <op> python scalar` nodes (lazy.scalar_binop) on one realized buffer
is known by its structure without the constants' values. The first value seen keeps the usual kernel with the constant
baked in; once a second value of the same structure comes, one kernel is built that reads each constant from a
one-element buffer, and every later value runs it.

Results are bit for bit those of the baked kernel: only float32 and float64 constants are passed, as the exact value the
renderer's literal stands for (a float32 literal is the shortest decimal of the double, which the C compiler rounds to
float32: equal to rounding the double itself except at an exact midpoint between two float32 values, which is left
baked), never NaN or infinity, and the codegen has no rule that folds a float ADD/MUL by a value other than 0 or 1,
which scalar_binop already folds before a node is made.
"""
from __future__ import annotations

import math
import struct
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tiny import eager_key
from tiny.device import Buffer
from tiny.dtype import DType, dtypes
from tiny.lazy import LazyBuffer
from tiny.ops import LazyOp, MetaOps
from tiny.shape.shapetracker import ShapeTracker

# structure -> the id (see tiny.eager_key) of the first graph of it that was realized
_first_seen: Dict[Tuple[Any, ...], int] = {}
# structure -> (kernel AST reading the constants from buffers, and for each of its inputs: -1 for the realized buffer
# the chain starts from, i >= 0 for the buffer of constant i, numbered from the top of the chain)
_kernels: Dict[Tuple[Any, ...], Tuple[LazyOp, Tuple[int, ...]]] = {}
_MAX_ENTRIES = 1 << 12
# ids (see tiny.eager_key: the structure with its constants' values) that ran here once: a second run of one means the
# values repeat (a fixed constant in a loop), which is worth a kernel with them baked in that realize finds by the id
# alone, instead of walking the graph and filling constant buffers on every call
_param_ids: Dict[int, None] = {}

_Chain = Tuple[Tuple[Any, ...], List[Any], LazyBuffer, List[Tuple[LazyBuffer, LazyBuffer, LazyBuffer]]]


def _chain(out: LazyBuffer) -> Optional[_Chain]:
  """(structure, constants, realized base, [(node, its constant, its other source)] from the top) of out when out's
  graph is a chain of scalar_binop nodes on one realized buffer, each node read whole and unmasked by the next."""
  steps: List[Any] = []
  consts: List[Any] = []
  nodes: List[Tuple[LazyBuffer, LazyBuffer, LazyBuffer]] = []
  b = out
  while True:
    rev = b._scalar_rev
    if rev is None or not hasattr(b, "srcs"):
      return None
    c, x = (b.srcs[0], b.srcs[1]) if rev else (b.srcs[1], b.srcs[0])
    xb = x._base if x._base is not None else x
    consts.append(c.arg)
    nodes.append((b, c, x))
    steps.append((b.op, rev, c.st, x.st if x is not xb else None))
    if not hasattr(xb, "srcs"):
      return (out.device, out.dtype, xb.dtype, x.st, tuple(steps)), consts, xb, nodes
    if xb.forced_realize or (x is not xb and (x.size != xb.size or any(v.mask is not None for v in x.st.views))):
      return None
    b = xb


def _exact(v: Any, dtype: DType) -> bool:
  """v in a buffer of dtype is bit for bit the constant the renderer bakes for it (see the module docstring)."""
  if v.__class__ is not float or not math.isfinite(v):
    return False
  if dtype == dtypes.float64:
    return True
  if dtype != dtypes.float32:
    return False
  try:
    f = struct.unpack("f", struct.pack("f", v))[0]
  except OverflowError:
    return False
  if not math.isfinite(f):   # rounds up to infinity
    return False
  if f == v:
    return True
  g = float(np.nextafter(np.float32(f), np.float32(math.inf if v > f else -math.inf)))
  return math.isfinite(g) and v != (f + g) / 2


def _param_base(device: str, dtype: DType) -> LazyBuffer:
  """A realized one-element base (its Buffer is only a stand-in for lowering: nothing is allocated)."""
  pb = LazyBuffer(device, ShapeTracker.from_shape(()), dtype, MetaOps.EMPTY)
  pb.buffer = Buffer(device, 1, dtype)
  del pb.srcs
  return pb


def _build(chain: _Chain) -> Optional[Tuple[LazyOp, Tuple[int, ...]]]:
  """The kernel of the chain with its constants read from one-element buffers: the same graph rebuilt on such buffers
  (each read through the constant's own tracker), lowered as the scheduler lowers an eager graph."""
  from tiny.engine.schedule import _lower_alone
  _, consts, leaf, nodes = chain
  params: List[LazyBuffer] = []
  cur: Optional[LazyBuffer] = None
  for b, c, x in reversed(nodes):
    read = x if cur is None else (cur if x._base is None else LazyBuffer(b.device, x.st, b.dtype, base=cur))
    pb = _param_base(b.device, b.dtype)
    params.append(pb)
    pr = pb._view(c.st)
    cur = LazyBuffer(b.device, ShapeTracker.from_shape(b.shape), b.dtype, b.op, None, (pr, read) if b._scalar_rev else (read, pr))
  assert cur is not None
  item = _lower_alone(cur)
  params.reverse()   # numbered from the top of the chain, as the constants are
  spec: List[int] = []
  for inp in item.inputs:
    if inp is leaf:
      spec.append(-1)
    elif (i := next((i for i, p in enumerate(params) if p is inp), None)) is not None:
      spec.append(i)
    else:
      return None
  return item.ast, tuple(spec)


def try_run(out: LazyBuffer) -> bool:
  """Run out (an unrealized base whose kernel was not found) with the shared kernel of its structure when it is a chain of
  scalar ops whose constants changed since the structure was first seen. False, having done nothing, otherwise."""
  if out._scalar_rev is None or (chain := _chain(out)) is None:
    return False
  key, consts, leaf, _ = chain
  dtype, device = out.dtype, out.device
  if dtype not in (dtypes.float32, dtypes.float64) or leaf.device != device or leaf.size == 0 or not all(_exact(v, dtype) for v in consts):
    return False
  ek = eager_key.known(out)
  if (ent := _kernels.get(key)) is None:
    if ek is None:
      return False
    if len(_first_seen) >= _MAX_ENTRIES:
      _first_seen.clear()
    if _first_seen.setdefault(key, ek[0]) == ek[0]:
      return False   # one value so far: the usual kernel, with the constant baked in
    if (ent := _build(chain)) is None:
      return False
    if len(_kernels) >= _MAX_ENTRIES:
      _kernels.clear()
    _kernels[key] = ent
  elif ek is not None:
    if ek[0] in _param_ids:
      return False   # these very values again: the usual path bakes them in once and keeps the kernel by the id
    if len(_param_ids) >= _MAX_ENTRIES:
      _param_ids.clear()
    _param_ids[ek[0]] = None
  from tiny.engine.realize import _run_kernel, _runner_for
  ast, spec = ent
  fmt = dtype.fmt
  assert fmt is not None
  params = [Buffer(device, 1, dtype, initial_value=struct.pack(fmt, v)) for v in consts]
  bufs = [out.buffer] + [leaf.buffer if i < 0 else params[i] for i in spec]
  runner, idx = _runner_for(device, ast)
  out.mark_scheduled()
  _run_kernel(runner, [bufs[i] for i in idx])
  return True
