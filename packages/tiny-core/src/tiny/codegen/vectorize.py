"""Re-vectorizing scalar lanes for CPU renderers (a small SLP pass on the UOp graph).

The expander turns every upcast axis into independent scalar uops, one per lane. A GPU runs those lanes in
registers just fine, but on a CPU the C compiler has to rediscover the vector structure; for a register-tiled
matmul clang's SLP vectorizer rebuilds only 4-wide vectors from float4 loads, a quarter of an AVX-512 register.

`vectorize_lanes` starts at vector STOREs (a VECTORIZE of scalar values, made by `fold_vector_memory`) and packs each
column of lanes bottom-up: lanes that read one vector in order become that vector, equal lanes a broadcast,
lanes that are the same ALU/accumulator op become one vector op over packed operands. Packing stops (the lanes stay
scalar and are gathered) where it would not pay: an op whose every operand would have to be gathered.

Unrolled reduce lanes that feed one scalar accumulator (a row max unrolled by 16) become a vector accumulator with a
horizontal reduce after the loop, so the loop body is one vector op instead of a serial chain of 16 scalar ones.

A renderer opts in with `Renderer.simd_bytes` (the widest vector register; 0 keeps everything scalar).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple, cast

from tiny.codegen.uops import UOp, UOps, graph_substitute
from tiny.dtype import DType, dtypes
from tiny.ops import BinaryOps, TernaryOps


# ints whose lanes may be packed as offsets from a common base (exact: integer addition is associative, wrapping too)
_INT_LANES = frozenset({dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64})


def _lane_dtype_ok(dt: Optional[DType]) -> bool:
  # bool vectors and 16-bit floats (registers are float, memory is 16-bit) stay scalar
  return dt is not None and dt.count == 1 and dt != dtypes.bool and dt not in (dtypes.float16, dtypes.bfloat16)


class _Packer:
  """Builds vector uops for tuples of scalar lanes; remembers which scalar lanes became which vector lane."""

  def __init__(self, topo: Optional[Dict[UOp, int]] = None) -> None:
    self.memo: Dict[Tuple[UOp, ...], Tuple[UOp, bool]] = {}
    self.lane_of: Dict[UOp, Tuple[UOp, int]] = {}
    self.frozen: Set[UOp] = set()  # accumulators already vectorized along their reduce: not packed across outputs
    self.topo: Dict[UOp, int] = topo if topo is not None else {}  # position in a sources-first order of the graph
    self.depth: Dict[UOp, int] = _depths(self.topo)  # longest path from a leaf: a uop is deeper than all its sources

  def _independent(self, lanes: Tuple[UOp, ...]) -> bool:
    """No lane is computed from another lane of the tuple. Lanes that are (a sum unrolled over a masked window can CSE
    into lane1 = lane0 + x) cannot be one vector op: its operand would hold its own result, a cycle in the graph."""
    members = set(lanes)
    if len(members) < 2:
      return True
    # a lane computed from another is deeper than it: lanes of one depth (the same ops on each lane) are independent
    depths = [self.depth.get(x, -1) for x in members]
    if min(depths) == max(depths) >= 0:
      return True
    # a source comes before its users in topo, and is shallower: nothing earlier, or shallower, than every lane leads to one
    floor, shallowest = min(self.topo.get(x, -1) for x in members), min(depths)
    seen: Set[UOp] = set()
    stack = [s for x in members for s in x.src]
    while stack:
      u = stack.pop()
      if u in seen or self.topo.get(u, floor) < floor or self.depth.get(u, shallowest) < shallowest:
        continue
      if u in members:
        return False
      seen.add(u)
      stack.extend(u.src)
    return True

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
    if all(x.op is UOps.CONST for x in lanes) and _lane_dtype_ok(dt) and all(x.dtype == dt for x in lanes):
      return self._gather(lanes)[0], True  # a vector literal: as good as a computed vector
    if (stepped := self._pack_offsets(lanes)) is not None:
      return stepped
    def alike(x: UOp) -> bool:  # a DEFINE_ACC's arg is each accumulator's own number
      return x.op is first.op and x.dtype == dt and (x.arg == first.arg or x.op is UOps.DEFINE_ACC) and len(x.src) == len(first.src)
    if not _lane_dtype_ok(dt) or not all(alike(x) for x in lanes) or not self._independent(lanes):
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
      if any(x in self.frozen for x in lanes):
        return self._gather(lanes)
      acc, acc_real = self.pack(tuple(x.src[0] for x in lanes))
      if not acc_real or acc.op is not UOps.DEFINE_ACC:
        return self._gather(lanes)
      val, _ = self.pack(tuple(x.src[1] for x in lanes))
      return self._record(lanes, UOp(UOps.PHI, vdt, (acc, val)))
    if first.op is UOps.BITCAST and _lane_dtype_ok(sdt := first.src[0].dtype) and sdt is not None and sdt.itemsize == dt.itemsize:
      # a lane-wise reinterpretation (exp's exponent-field scaling): bitcasting the packed vector keeps the chain in vectors
      src, real = self.pack(tuple(x.src[0] for x in lanes))
      return self._record(lanes, UOp(UOps.BITCAST, vdt, (src,))) if real else self._gather(lanes)
    if first.op is UOps.CAST and _lane_dtype_ok(sdt := first.src[0].dtype) and all(x.src[0].dtype == sdt for x in lanes):
      # a lane-wise conversion (threefry's counters to uint32): the vector CAST keeps the chain in vectors
      src, real = self.pack(tuple(x.src[0] for x in lanes))
      return self._record(lanes, UOp(UOps.CAST, vdt, (src,))) if real else self._gather(lanes)
    if first.op is UOps.ALU and first.arg is TernaryOps.WHERE and all(x.src[0] is first.src[0] for x in lanes) and \
        first.src[0].dtype == dtypes.bool and all(_lane_dtype_ok(s.dtype) for s in first.src[1:]):
      # one scalar condition for every lane (a padded region, decided per loop iteration): a select of whole vectors,
      # which needs no vector of bools
      cols = [self.pack(tuple(x.src[j] for x in lanes)) for j in (1, 2)]
      if not any(real for _, real in cols):
        return self._gather(lanes)
      return self._record(lanes, UOp(UOps.ALU, vdt, (first.src[0], cols[0][0], cols[1][0]), TernaryOps.WHERE))
    if first.op is UOps.ALU and first.arg is not TernaryOps.WHERE and all(_lane_dtype_ok(s.dtype) for s in first.src):
      cols = [self.pack(tuple(x.src[j] for x in lanes)) for j in range(len(first.src))]
      if not any(real for _, real in cols):
        return self._gather(lanes)
      return self._record(lanes, UOp(UOps.ALU, vdt, tuple(c for c, _ in cols), first.arg))
    return self._gather(lanes)

  def _pack_offsets(self, lanes: Tuple[UOp, ...]) -> Optional[Tuple[UOp, bool]]:
    """Integer lanes b, b+c1, b+c2, ... (lane 0 often folded to b itself: consecutive indices) as b + (0, c1, c2, ...),
    a broadcast plus a vector literal. Only the lanes that are ADDs are recorded as lanes of the result: b is the
    operand of that vector, so reading b out of it would be a cycle."""
    base = lanes[0]
    if not _lane_dtype_ok(base.dtype) or base.dtype not in _INT_LANES or base.op is UOps.CONST:
      return None
    offs: List[UOp] = []
    for x in lanes:
      if x is base:
        offs.append(base.const_like(0))
      elif x.op is UOps.ALU and x.arg is BinaryOps.ADD and x.src[0] is base and x.src[1].op is UOps.CONST and x.dtype == base.dtype:
        offs.append(x.src[1])
      else:
        return None
    if all(x is base for x in lanes):
      return None
    assert base.dtype is not None
    n = len(lanes)
    vec = UOp(UOps.ALU, base.dtype.vec(n), (self._gather((base,) * n)[0], self._gather(tuple(offs))[0]), BinaryOps.ADD)
    for i, x in enumerate(lanes):
      if x is not base:
        self.lane_of.setdefault(x, (vec, i))
    return vec, True

  def _record(self, lanes: Tuple[UOp, ...], vec: UOp) -> Tuple[UOp, bool]:
    for i, x in enumerate(lanes):
      self.lane_of.setdefault(x, (vec, i))
    return vec, True


def _op_leaves(u: UOp, op: Any) -> List[UOp]:
  """The operands of a tree of `op` ALUs rooted at u (u itself when it is not such an ALU)."""
  if u.op is UOps.ALU and u.arg is op and u.dtype == u.src[0].dtype:
    return [x for s in u.src for x in _op_leaves(s, op)]
  return [u]


def _first_gep(u: UOp) -> Optional[UOp]:
  """The first GEP found depth-first under u: the lane of a loaded vector that an unrolled reduce leaf reads."""
  if u.op is UOps.GEP:
    return u
  return next((g for s in u.src if (g := _first_gep(s)) is not None), None)


def _reduce_tree(op: Any, xs: List[UOp]) -> UOp:
  while len(xs) > 1:
    xs = [xs[i].alu(op, xs[i + 1]) if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
  return xs[0]


def _lane_chunks(leaves: List[UOp], lanes: int) -> Optional[List[List[UOp]]]:
  """The leaves of an unrolled reduce step cut into the vectors they were loaded as: one chunk per loaded vector (the
  vector of their first GEP), in lane order. A row of 20 loaded as 8 + 8 + 4 lanes gives chunks of 8, 8 and 4.
  None when a leaf reads no vector lane, or a chunk is not a whole vector of at most `lanes` lanes."""
  by_vec: Dict[UOp, List[Tuple[int, UOp]]] = {}
  for x in leaves:
    if (g := _first_gep(x)) is None:
      return None
    by_vec.setdefault(g.src[0], []).append((g.arg, x))
  chunks = []
  for vec, members in by_vec.items():
    members.sort(key=lambda m: m[0])
    n = len(members)
    if vec.dtype is None or vec.dtype.count != n or n > lanes or [i for i, _ in members] != list(range(n)):
      return None
    chunks.append([x for _, x in members])
  return chunks


def _fill(v: UOp, width: int, op: Any) -> UOp:
  """v (n lanes) as `width` lanes: its own lanes, then zeros for a sum or copies of its lanes for a max."""
  assert v.dtype is not None
  n = v.dtype.count
  fill = [v.gep(i % n) for i in range(n, width)] if op is BinaryOps.MAX else [UOp.const(v.dtype.scalar(), 0)] * (width - n)
  return UOp(UOps.VECTORIZE, v.dtype.scalar().vec(width), tuple(v.gep(i) for i in range(n)) + tuple(fill))


def _widen(chunk: UOp, width: int, op: Any) -> UOp:
  """A vector of fewer lanes than the accumulator, widened to `width` lanes that leave the reduce unchanged (zeros for
  a sum, copies of its own lanes for a max). A product is widened through its operands (0 * 0 adds nothing), so that
  the accumulate stays one fused multiply-add on full vectors; a short load widens into a register for free."""
  assert chunk.dtype is not None
  if chunk.dtype.count == width:
    return chunk
  if op is BinaryOps.ADD and chunk.op is UOps.ALU and chunk.arg is BinaryOps.MUL and \
      all(s.dtype is not None and s.dtype == chunk.dtype for s in chunk.src):
    return UOp(UOps.ALU, chunk.dtype.scalar().vec(width), tuple(_fill(s, width, op) for s in chunk.src), chunk.arg)
  return _fill(chunk, width, op)


def _packed_chunks(leaves: List[UOp], packer: _Packer, lanes: int) -> Optional[List[UOp]]:
  """The reduce leaves packed as vectors: cut along the vectors they were loaded as (a short row: 8 + 8 + 4), or else
  in equal chunks of lanes, 8 or 4 in lane order (one loaded vector). None when neither cut packs."""
  cuts: List[List[List[UOp]]] = []
  if (by_load := _lane_chunks(leaves, lanes)) is not None and max(len(x) for x in by_load) >= 4:
    cuts.append(by_load)
  if (width := next((w for w in (lanes, 8, 4) if len(leaves) % w == 0 and w <= lanes), None)) is not None:
    ordered = sorted(leaves, key=lambda x: g.arg if (g := _first_gep(x)) is not None else -1)
    cuts.append([ordered[i:i + width] for i in range(0, len(ordered), width)])
  for cut in cuts:
    packed = [packer.pack(tuple(c)) for c in cut]
    if all(real for _, real in packed):
      return [vec for vec, _ in packed]
  return None


def _vector_reduction(phi: UOp, packer: _Packer, simd: int, users: Dict[UOp, int]) -> Optional[UOp]:
  """A scalar reduce whose every step combines n unrolled lanes into the accumulator becomes a vector accumulator of
  those lanes (the lanes are combined across steps, in any order: exact for MAX and integer ADD, a reassociation of a
  float sum as the CPU renderers already allow), plus one horizontal reduce after the loop. Returns that scalar.

  The accumulator is as wide as the widest loaded vector; a narrower one (the tail of a 20-wide row loaded as 8 + 8 + 4)
  is widened with lanes that change nothing, so the whole row still accumulates in full-width vectors."""
  acc, val = phi.src
  dt = acc.dtype
  # the accumulator is read by this step and by the PHI, nothing else
  if acc.op is not UOps.DEFINE_ACC or not _lane_dtype_ok(dt) or acc.src[0].op is not UOps.CONST or users.get(acc, 0) != 2 or \
      val.op is not UOps.ALU or val.arg not in (BinaryOps.MAX, BinaryOps.ADD) or acc not in val.src:
    return None
  assert dt is not None
  op = val.arg
  leaves = [x for s in val.src if s is not acc for x in _op_leaves(s, op)]
  if len(leaves) < 4 or any(x is acc for x in leaves):
    return None
  chunks = _packed_chunks(leaves, packer, simd // dt.itemsize)
  if chunks is None:
    return None
  width = max(cast(DType, c.dtype).count for c in chunks)
  vdt = dt.vec(width)
  vacc = UOp(UOps.DEFINE_ACC, vdt, acc.src, acc.arg)
  # one chained step per chunk (acc + a*b + c*d ...), which the C compiler contracts into fused multiply-adds
  step = vacc
  for c in chunks:
    step = step.alu(op, _widen(c, width, op))
  vphi = UOp(UOps.PHI, vdt, (vacc, step))
  return _reduce_tree(op, [vphi.gep(i) for i in range(width)])


def _sources_first(sink: UOp) -> Dict[UOp, int]:
  """Every uop under sink numbered so that each comes after all of its sources."""
  pos: Dict[UOp, int] = {}
  stack: List[Tuple[UOp, bool]] = [(sink, False)]
  while stack:
    u, expanded = stack.pop()
    if u in pos:
      continue
    if expanded:
      pos[u] = len(pos)
      continue
    stack.append((u, True))
    stack.extend((s, False) for s in u.src if s not in pos)
  return pos


def _depths(topo: Dict[UOp, int]) -> Dict[UOp, int]:
  """Each uop's longest path from a leaf (0 for a uop without sources), for the uops numbered in topo (sources first)."""
  depth: Dict[UOp, int] = {}
  for u in sorted(topo, key=topo.__getitem__):
    depth[u] = 1 + max((depth.get(s, 0) for s in u.src), default=-1)
  return depth


def vectorize_lanes(sink: UOp, opts: object) -> UOp:
  """Pack the scalar lanes under vector STOREs, and unrolled lanes feeding one accumulator, into vector ops when the
  renderer asks for it (`simd_bytes`)."""
  simd = int(getattr(opts, "simd_bytes", 0) or 0)
  if simd == 0:
    return sink
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
  packer = _Packer(_sources_first(sink))
  users: Dict[UOp, int] = {}
  for u in order:
    for s in u.src:
      users[s] = users.get(s, 0) + 1
  # reduces first: a dot product unrolled along its contiguous reduce axis (x @ W.T) accumulates along that axis, in
  # vectors; packing its outputs instead would gather W's lanes
  reduced: Dict[UOp, UOp] = {}
  for u in order:
    if u.op is UOps.PHI and (r := _vector_reduction(u, packer, simd, users)) is not None:
      reduced[u] = r
  packer.frozen = set(reduced)
  for u in order:
    if u.op is UOps.STORE and len(u.src) == 3 and (v := u.src[2]).op is UOps.VECTORIZE and v.dtype is not None and \
        v.dtype.count > 1 and v.dtype.count * v.dtype.scalar().itemsize <= simd and len(v.src) == v.dtype.count:
      packed, real = packer.pack(v.src)
      if real:
        new_value[u] = packed
  if not new_value and not reduced:
    return sink
  # stores take their packed value; any other use of a packed scalar lane reads it out of its vector
  replace: Dict[UOp, UOp] = {lane: vec.gep(i) for lane, (vec, i) in packer.lane_of.items()}
  replace.update(reduced)
  replace.update((st, UOp(st.op, st.dtype, (st.src[0], st.src[1], val), st.arg)) for st, val in new_value.items())
  return graph_substitute(sink, replace)
