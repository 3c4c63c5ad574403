"""UOps: the micro-ops a kernel is lowered to, and the contract every renderer implements.

After `UOpGraph.linearize()` a kernel is a flat list of UOps in which every source comes before its
user. Renderers (C, CUDA, HIP, Metal, LLVM, PTX) and the PYTHON interpreter consume that list. The
meaning of each op in the linearized list:

| op | dtype | src | arg |
|---|---|---|---|
| DEFINE_GLOBAL | PtrDType(elem) | () | (buffer index: int, mutable: bool) — kernel argument `data{idx}` |
| DEFINE_VAR | int32 | () | the `Variable`; kernel argument named `var.expr`, after the buffers |
| DEFINE_LOCAL | PtrDType(elem) | () | (name: str, size: int) — shared memory |
| DEFINE_ACC | dtype of the accumulator (may be a vector) | (init CONST, *RANGE uops it accumulates over) | (acc index: int,) |
| CONST | scalar dtype | () | the Python value (bool/int/float) |
| SPECIAL | int32 | () | (dim: int, name: str, size: int); name "gidx{d}" global, "lidx{d}" local, "idx{d}" global*local |
| RANGE | int32 | (start, end) | (axis: int, is_reduce: bool) — opens `for (i = start; i < end; i++)` |
| ENDRANGE | None | (RANGE,) | None — closes the loop |
| IF | None | (cond, [BARRIER]) | None — opens `if (cond) {` |
| ENDIF | None | (IF,) | None |
| BARRIER | None | (STOREs to local memory,) | None — `__syncthreads()` |
| LOAD | elem or vector dtype | (buf, idx) or (buf, idx, gate, alt) [+ (BARRIER,)] | None; vector dtype = contiguous vector load |
| STORE | None | (buf, idx, value) or (buf, idx, value, gate) | None |
| ALU | result dtype (bool for CMPLT/CMPNE) | operands | a UnaryOps/BinaryOps/TernaryOps member |
| CAST | target dtype | (x,) | None |
| BITCAST | target dtype | (x,) | None |
| VECTORIZE | vector dtype | scalar elements | None |
| GEP | scalar dtype | (vector,) | element index: int |
| PHI | acc dtype | (DEFINE_ACC, new value) | None — `acc = new value` inside the loop |
| WMMA | output vector dtype | (a, b, c) | (name, dims, dtype_in, dtype_out, device, threads, upcast_axes, reduce_axes) |
| SINK | None | all STOREs | KernelInfo or None — only before linearization |

EXPAND, CONTRACT, REDUCE, VAR and NOOP exist only before linearization (the expander and the
reduce lowering remove them).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Optional, Tuple

from tiny.dtype import DType


class UOps(Enum):
  """Kinds of micro-op; the declaration order is the tie-break order of the linearizer's toposort."""

  SINK = auto(); VAR = auto(); EXPAND = auto(); CONTRACT = auto()  # noqa: E702
  DEFINE_GLOBAL = auto(); DEFINE_VAR = auto(); DEFINE_LOCAL = auto(); DEFINE_ACC = auto()  # noqa: E702
  CONST = auto(); SPECIAL = auto()  # noqa: E702
  NOOP = auto(); GEP = auto()  # noqa: E702
  CAST = auto(); BITCAST = auto(); VECTORIZE = auto()  # noqa: E702
  ALU = auto(); REDUCE = auto(); WMMA = auto()  # noqa: E702
  LOAD = auto(); STORE = auto(); PHI = auto()  # noqa: E702
  BARRIER = auto(); IF = auto(); RANGE = auto()  # noqa: E702
  ENDRANGE = auto(); ENDIF = auto()  # noqa: E702


@dataclass(frozen=True, eq=False)
class UOp:
  """One node of the kernel graph. Identity-compared; structural dedup happens in graph_rewrite."""

  op: UOps
  dtype: Optional[DType] = None
  src: Tuple[UOp, ...] = tuple()
  arg: Any = None
