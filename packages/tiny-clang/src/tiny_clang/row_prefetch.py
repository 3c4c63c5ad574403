"""Row kernels (softmax, log_softmax, layernorm: tiny.engine.row_fusion) fetch the next row while they compute this one.

A CPU row kernel walks each row several times: the first loop (softmax's max) streams the row in from memory, the
later ones find it in L1/L2 and spend their time on arithmetic (softmax's exp). One thread does both in turn, so while
it computes nothing comes in from memory, and the hardware prefetchers stop at the end of the row (or of a 4 KiB page).
A software prefetch of the next row, issued along the row's compute loop, overlaps the two: by the time the first loop
of the next row starts, its lines are in L2. The same loop prefetches with write intent the output lines of the next
row that the kernel first writes there (softmax keeps exp(x - max) in its output), so their read-for-ownership misses
overlap too.

What is prefetched (decided from the linearized uops, the same for CLANG and LLVM):
- only in a row kernel: one with a STORE to a global buffer inside a reduce loop (the row's store loop, or the loop
  that keeps softmax's exp in the output); other reduces (matmul, sum) stream with the hardware prefetchers;
- only ungated whole-line (64-byte) vector LOADs and STOREs of global buffers that run in a reduce loop inside a
  non-reduce loop (the loop over rows);
- the distance is what the address moves by when that innermost loop over rows steps by one (the next row, or group of
  rows), found by evaluating the index; an index it cannot evaluate, or a step that is 0, negative or larger than
  MAX_DISTANCE_BYTES, gets no prefetch;
- a buffer the kernel reads only: its loads in the last reduce loop (in program order) that loads it, the one with the
  most work after the row is in cache (softmax's exp loop, not its max loop);
- a buffer the kernel writes: its stores in the first loop that stores it, with write intent (its loads read lines the
  kernel wrote itself).
A prefetch never faults and changes no result, so a wrong guess costs issue slots only.

Measured (4096x4096 fp32 softmax, the kernel's C alone, 1 thread, CPU time, interleaved best-of-10 on the shared 2-core
AVX-512 Xeon, three runs): no prefetch 19.3-23.3 ms; next row's input (prefetcht1) in the exp loop 14.5-17.1 ms; plus
the output's next row with write intent 12.9-16.2 ms (1.4-1.5x); the same from the max loop instead 15.6-17.8 ms; with
prefetcht0 instead of prefetcht1 14.6-15.2 ms. Computing exp again in the store loop to write the output with
non-temporal stores (no read-for-ownership) was slower: 14.0-17.6 ms with the input prefetch, 16.3-19.9 without.
TINY_ROW_PREFETCH=0 turns it off.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

from tiny.backend import BinaryOps, TernaryOps, UnaryOps, UOp, UOps, dtypes, exec_alu, getenv
from tiny_clang.streaming_stores import in_loops, whole_line

ROW_PREFETCH = int(getenv("TINY_ROW_PREFETCH", 1))
# a row kernel's rows are at most 64K elements (tiny.engine.row_fusion): 256 KiB of float32, and L2 holds a few of them
MAX_DISTANCE_BYTES = 1 << 18

# the integer ALU ops an index is built from; exec_alu (core's C semantics: truncating division, wrapping to the dtype)
# evaluates them
_INDEX_OPS = frozenset({BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, BinaryOps.IDIV, BinaryOps.MOD, BinaryOps.SHL, BinaryOps.SHR,
                        BinaryOps.AND, BinaryOps.OR, BinaryOps.XOR, BinaryOps.CMPLT, BinaryOps.CMPNE, UnaryOps.NEG, TernaryOps.WHERE})


def _eval_index(u: UOp, env: Dict[UOp, int], memo: Dict[UOp, Optional[int]]) -> Optional[int]:
  """The integer value of index uop u with the loop variables in env (any other loop at its start); None when u uses
  something that is not a plain integer expression of loops and constants."""
  if u in memo:
    return memo[u]
  val: Optional[int] = None
  if u.op is UOps.CONST and isinstance(u.arg, (int, bool)):
    val = int(u.arg)
  elif u.op is UOps.RANGE:
    val = env[u] if u in env else _eval_index(u.src[0], env, memo)
  elif u.op is UOps.CAST and u.dtype is not None and dtypes.is_int(u.dtype):
    val = _eval_index(u.src[0], env, memo)
  elif u.op is UOps.ALU and u.arg in _INDEX_OPS and u.dtype is not None and (dtypes.is_int(u.dtype) or u.dtype == dtypes.bool):
    args = [_eval_index(s, env, memo) for s in u.src]
    # a division by zero has no value here (exec_alu would give C's undefined result as 0)
    if all(a is not None for a in args) and not (u.arg in (BinaryOps.IDIV, BinaryOps.MOD) and args[1] == 0):
      val = int(exec_alu(u.arg, u.dtype, args))
  memo[u] = val
  return val


def index_step(idx: UOp, loops: Sequence[UOp], which: int) -> Optional[int]:
  """How many elements idx moves by when loops[which] steps by one (at its first iterations, every other loop at its
  start), when that is the same step twice; None otherwise."""
  starts = [_eval_index(r.src[0], {}, {}) for r in loops]
  if any(s is None for s in starts):
    return None
  at = []
  for i in range(3):
    env: Dict[UOp, int] = {r: s + (i if j == which else 0) for j, (r, s) in enumerate(zip(loops, starts))}   # type: ignore[operator]
    at.append(_eval_index(idx, env, {}))
  if any(a is None for a in at):
    return None
  d0, d1 = at[1] - at[0], at[2] - at[1]   # type: ignore[operator]
  return d0 if d0 == d1 else None


def row_prefetches(uops: Sequence[UOp], enabled: bool = True) -> Dict[UOp, Tuple[int, bool]]:
  """The LOAD and STORE uops of a row kernel that prefetch the next row, each with (distance in bytes, write intent);
  empty for any other kernel or when not enabled (see the module docstring for the rules)."""
  if not enabled or not ROW_PREFETCH:
    return {}
  # per access: the innermost non-reduce loop and the reduce loop (the outermost one inside it) it runs in
  candidates: List[Tuple[UOp, UOp, UOp]] = []
  written: Set[UOp] = set()
  row_kernel = False
  for u, open_ranges in in_loops(uops):
    if u.op in (UOps.LOAD, UOps.STORE) and u.src[0].op is UOps.DEFINE_GLOBAL:
      reduce_at = next((i for i, r in enumerate(open_ranges) if r.arg[1]), None)
      if u.op is UOps.STORE:
        written.add(u.src[0])
        row_kernel |= reduce_at is not None
      if reduce_at is None or reduce_at == 0 or any(r.arg[1] for r in open_ranges[:reduce_at]):
        continue
      gated = len(u.src) >= 4 and (u.op is UOps.STORE or u.src[2].op is not UOps.BARRIER)
      if gated or not whole_line(u.src[2].dtype if u.op is UOps.STORE else u.dtype):
        continue
      candidates.append((u, open_ranges[reduce_at - 1], open_ranges[reduce_at]))
  if not row_kernel:
    return {}
  # per buffer, the reduce loop its prefetches go in: the last that loads a read-only buffer, the first that stores one
  chosen: Dict[UOp, UOp] = {}
  for u, _, loop in candidates:
    buf = u.src[0]
    if buf in written:
      if u.op is UOps.STORE and buf not in chosen:
        chosen[buf] = loop
    elif u.op is UOps.LOAD:
      chosen[buf] = loop
  out: Dict[UOp, Tuple[int, bool]] = {}
  for u, row_loop, loop in candidates:
    buf = u.src[0]
    if chosen.get(buf) is not loop or (u.op is UOps.LOAD) == (buf in written):
      continue
    step = index_step(u.src[1], [row_loop], 0)
    if step is None:
      continue
    dist = step * buf.dtype.base.itemsize   # type: ignore[union-attr]
    if 0 < dist <= MAX_DISTANCE_BYTES:
      out[u] = (dist, u.op is UOps.STORE)
  return out
