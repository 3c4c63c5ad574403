"""Re-vectorizing scalar lanes for CPU renderers (a small SLP pass on the UOp graph).

The expander turns every upcast axis into independent scalar uops, one per lane. A GPU runs those lanes in
registers just fine, but on a CPU the C compiler has to rediscover the vector structure; for a register-tiled
matmul clang's SLP vectorizer rebuilds only 4-wide vectors from float4 loads, a quarter of an AVX-512 register.

`vectorize_lanes` starts at vector STOREs (a VECTORIZE of scalar values, made by `fold_vector_memory`) and packs each
column of lanes bottom-up: lanes that read one vector in order become that vector, equal lanes a broadcast,
lanes that are the same ALU/accumulator op become one vector op over packed operands. Packing stops (the lanes stay
scalar and are gathered) where it would not pay: an op whose every operand would have to be gathered.

A renderer opts in with `Renderer.simd_bytes` (the widest vector register; 0 keeps everything scalar).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType, dtypes
from tiny.ops import TernaryOps


def _lane_dtype_ok(dt: Optional[DType]) -> bool:
  # bool vectors and 16-bit floats (registers are float, memory is 16-bit) stay scalar
  return dt is not None and dt.count == 1 and dt != dtypes.bool and dt not in (dtypes.float16, dtypes.bfloat16)


class _Packer:
  """Builds vector uops for tuples of scalar lanes; remembers which scalar lanes became which vector lane."""

  def __init__(self) -> None:
    self.memo: Dict[Tuple[UOp, ...], Tuple[UOp, bool]] = {}
    self.lane_of: Dict[UOp, Tuple[UOp, int]] = {}

  def pack(self, lanes: Tuple[UOp, ...]) -> Tuple[UOp, bool]:
    """(vector uop for lanes, whether it is a real vector value rather than a broadcast or a gather of scalars)."""
    if (m := self.memo.get(lanes)) is not None:
      return m
    ret = self._pack(lanes)
    self.memo[lanes] = ret
    return ret

  def _gather(self, lanes: Tuple[UOp, ...]) -> Tuple[UOp, bool]:
    dt = lanes[0].dtype
    assert dt is not None
    return UOp(UOps.VECTORIZE, dt.vec(len(lanes)), lanes), False

  def _pack(self, lanes: Tuple[UOp, ...]) -> Tuple[UOp, bool]:
    n, first = len(lanes), lanes[0]
    if all(x is first for x in lanes):
      return self._gather(lanes)  # a broadcast: the renderer splats it
    if first.op is UOps.GEP and (v := first.src[0]).dtype is not None and v.dtype.count == n and \
        all(x.op is UOps.GEP and x.src[0] is v and x.arg == i for i, x in enumerate(lanes)):
      return v, True
    dt = first.dtype
    def alike(x: UOp) -> bool:  # a DEFINE_ACC's arg is each accumulator's own number
      return x.op is first.op and x.dtype == dt and (x.arg == first.arg or x.op is UOps.DEFINE_ACC) and len(x.src) == len(first.src)
    if not _lane_dtype_ok(dt) or not all(alike(x) for x in lanes):
      return self._gather(lanes)
    assert dt is not None
    vdt = dt.vec(n)
    if first.op is UOps.DEFINE_ACC:
      init = first.src[0]
      if init.op is not UOps.CONST or any(x.src[0].op is not UOps.CONST or x.src[0].arg != init.arg or x.src[1:] != first.src[1:]
                                          for x in lanes):
        return self._gather(lanes)
      return self._record(lanes, UOp(UOps.DEFINE_ACC, vdt, first.src, first.arg))
    if first.op is UOps.PHI:
      acc, acc_real = self.pack(tuple(x.src[0] for x in lanes))
      if not acc_real or acc.op is not UOps.DEFINE_ACC:
        return self._gather(lanes)
      val, _ = self.pack(tuple(x.src[1] for x in lanes))
      return self._record(lanes, UOp(UOps.PHI, vdt, (acc, val)))
    if first.op is UOps.ALU and first.arg is not TernaryOps.WHERE and all(_lane_dtype_ok(s.dtype) for s in first.src):
      cols = [self.pack(tuple(x.src[j] for x in lanes)) for j in range(len(first.src))]
      if not any(real for _, real in cols):
        return self._gather(lanes)
      return self._record(lanes, UOp(UOps.ALU, vdt, tuple(c for c, _ in cols), first.arg))
    return self._gather(lanes)

  def _record(self, lanes: Tuple[UOp, ...], vec: UOp) -> Tuple[UOp, bool]:
    for i, x in enumerate(lanes):
      self.lane_of.setdefault(x, (vec, i))
    return vec, True


def vectorize_lanes(sink: UOp, opts: object) -> UOp:
  """Pack the scalar lanes under vector STOREs into vector ops when the renderer asks for it (`simd_bytes`)."""
  simd = int(getattr(opts, "simd_bytes", 0) or 0)
  if simd == 0:
    return sink
  packer = _Packer()
  new_value: Dict[UOp, UOp] = {}
  order: List[UOp] = []
  seen = set()
  stack = [sink]
  while stack:
    u = stack.pop()
    if u in seen:
      continue
    seen.add(u)
    order.append(u)
    stack.extend(u.src)
  for u in order:
    if u.op is UOps.STORE and len(u.src) == 3 and (v := u.src[2]).op is UOps.VECTORIZE and v.dtype is not None and \
        v.dtype.count > 1 and v.dtype.count * v.dtype.scalar().itemsize <= simd and len(v.src) == v.dtype.count:
      packed, real = packer.pack(v.src)
      if real:
        new_value[u] = packed
  if not new_value:
    return sink
  # rebuild: stores take their packed value; any other use of a packed scalar lane reads it out of its vector
  done: Dict[UOp, UOp] = {}

  def rebuild(u: UOp) -> UOp:
    if (r := done.get(u)) is not None:
      return r
    if (lane := packer.lane_of.get(u)) is not None:
      ret = rebuild(lane[0]).gep(lane[1])
    else:
      src = (u.src[0], u.src[1], new_value[u]) if u in new_value else u.src
      new_src = tuple(rebuild(s) for s in src)
      ret = u if all(a is b for a, b in zip(new_src, u.src)) and len(new_src) == len(u.src) else UOp(u.op, u.dtype, new_src, u.arg)
    done[u] = ret
    return ret
  return rebuild(sink)
