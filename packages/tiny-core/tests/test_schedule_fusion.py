"""Scheduler guarantees on canonical graphs: kernel counts, realize decisions, ordering, determinism, memory planning."""
import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.engine.schedule import AssignNotContiguousError, ScheduleItem, create_schedule, create_schedule_with_vars
from tiny.helpers import Context
from tiny.lazy import LazyBuffer
from tiny.ops import BinaryOps, BufferOps, MetaOps, ReduceOps, UnaryOps


def realized(arr, device="PYTHON"):
  lb = LazyBuffer.metaop(MetaOps.EMPTY, arr.shape, dtypes.from_np(arr.dtype), device)
  lb.buffer.allocate().copyin(memoryview(np.ascontiguousarray(arr).tobytes()))
  del lb.srcs
  return lb


def rand(*shape, seed=0):
  return realized(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def kernels(sched):
  return [si for si in sched if si.ast.op is MetaOps.KERNEL]


def reduces(si):
  return [op for op in si.ast.lazyops if op.op in ReduceOps]


def softmax(x, axis):
  shape = x.shape
  m = x.r(ReduceOps.MAX, (axis,))
  e = x.e(BinaryOps.ADD, m.expand(shape).e(UnaryOps.NEG)).e(UnaryOps.EXP2)
  s = e.r(ReduceOps.SUM, (axis,))
  return e.e(BinaryOps.MUL, s.e(UnaryOps.RECIP).expand(shape))


def test_elementwise_add_sum_is_one_kernel():
  a, b = rand(16, 16), rand(16, 16, seed=1)
  sched = create_schedule([a.e(BinaryOps.ADD, b).r(ReduceOps.SUM, (0, 1))])
  assert len(sched) == 1 and len(kernels(sched)) == 1
  assert len(reduces(sched[0])) == 1
  assert sched[0].inputs == (a.buffer, b.buffer)


def test_elementwise_chain_is_one_kernel():
  a, b, c = rand(8, 8), rand(8, 8, seed=1), rand(8, 8, seed=2)
  out = a.e(BinaryOps.MUL, b).e(BinaryOps.ADD, c).e(UnaryOps.EXP2).e(BinaryOps.MAX, a)
  sched = create_schedule([out])
  assert len(sched) == 1 and set(sched[0].inputs) == {a.buffer, b.buffer, c.buffer}
  assert sched[0].outputs == (out.buffer,)


def test_softmax_is_at_most_three_kernels():
  with Context(ROW_FUSION=0):
    sched = create_schedule([softmax(rand(4, 32), 1)])
  assert len(sched) <= 3 and all(si.ast.op is MetaOps.KERNEL for si in sched)
  assert all(len(reduces(si)) <= 1 for si in sched)


def test_softmax_is_one_row_kernel():
  # the max and the sum are inlined: one kernel walks each row three times (engine/row_fusion.py)
  sched = create_schedule([softmax(rand(4, 32), 1)])
  assert len(sched) == 1 and len(reduces(sched[0])) == 2


def test_expand_after_reduce_realizes_the_reduce():
  a, b = rand(4, 8), rand(4, 8, seed=1)
  r = a.r(ReduceOps.SUM, (1,))
  out = r.expand((4, 8)).e(BinaryOps.ADD, b)
  with Context(ROW_FUSION=0):   # with it, one row kernel computes the sum and out (test_softmax_is_one_row_kernel)
    sched = create_schedule([out])
  assert len(sched) == 2
  # the reduce is computed first, into r's own buffer, and read by the elementwise kernel
  assert sched[0].outputs == (r.buffer,) and len(reduces(sched[0])) == 1
  assert r.buffer in sched[1].inputs and not reduces(sched[1])


def test_contiguous_elementwise_after_reduce_fuses():
  a, b = rand(4, 8), rand(4, 1, seed=1)
  out = a.r(ReduceOps.SUM, (1,)).e(BinaryOps.MUL, b).e(UnaryOps.SQRT)
  sched = create_schedule([out])
  assert len(sched) == 1 and sched[0].outputs == (out.buffer,)


def test_padded_log_does_not_fuse_but_padded_add_does():
  a, b = rand(4, 4), rand(6, 4, seed=1)
  safe = a.e(BinaryOps.ADD, a.const(1.0)).pad(((1, 1), (0, 0))).e(BinaryOps.ADD, b)
  assert len(create_schedule([safe])) == 1
  a2, b2 = rand(4, 4, seed=2), rand(6, 4, seed=3)
  lg = a2.e(UnaryOps.LOG2)
  unsafe = lg.pad(((1, 1), (0, 0))).e(BinaryOps.ADD, b2)
  sched = create_schedule([unsafe])
  assert len(sched) == 2 and sched[0].outputs == (lg.buffer,)
  # the padded region of the second kernel reads through a masked view, not through LOG2
  assert not any(op.op is UnaryOps.LOG2 for op in sched[1].ast.lazyops)


def test_multi_output_reduce_kernel():
  a = rand(4, 8)
  r = a.r(ReduceOps.SUM, (1,))
  o1, o2 = r.e(BinaryOps.ADD, r.const(1.0)), r.e(BinaryOps.MUL, r.const(2.0))
  sched = create_schedule([o1, o2])
  assert len(sched) == 1 and set(sched[0].outputs) == {o1.buffer, o2.buffer}
  assert len(sched[0].ast.src) == 2 and all(s.op is BufferOps.STORE for s in sched[0].ast.src)
  with Context(MULTIOUTPUT=0):
    a = rand(4, 8, seed=5)
    r = a.r(ReduceOps.SUM, (1,))
    assert len(create_schedule([r.e(UnaryOps.NEG), r.e(UnaryOps.SQRT)])) == 2


def test_forced_realize_splits_kernels():
  a = rand(8)
  mid = a.e(UnaryOps.EXP2).contiguous()
  out = mid.e(UnaryOps.SQRT)
  sched = create_schedule([out])
  assert len(sched) == 2 and sched[0].outputs == (mid.buffer,) and mid.buffer in sched[1].inputs


def test_shared_intermediate_is_computed_once_when_realized_but_fused_otherwise():
  a = rand(8)
  x = a.e(UnaryOps.EXP2)
  sched = create_schedule([x.e(UnaryOps.SQRT), x.e(UnaryOps.NEG)])
  # two outputs, both recompute the cheap elementwise op: no kernel for x alone
  assert len(sched) == 2 and all(x.buffer not in si.bufs for si in sched)


def test_realized_and_const_outputs_schedule_nothing():
  a = rand(4)
  assert create_schedule([a]) == []
  assert create_schedule([a.const(3.0)]) == []


def test_copy_and_empty_are_meta_items():
  a = rand(6)
  c = a.e(UnaryOps.NEG).copy_to_device("NPY")
  sched = create_schedule([c])
  assert [si.ast.op for si in sched] == [MetaOps.KERNEL, MetaOps.COPY]
  assert sched[1].outputs == (c.buffer,) and sched[1].inputs == (sched[0].outputs[0],) and sched[1].ast.arg == 24
  e = LazyBuffer.metaop(MetaOps.EMPTY, (3,), dtypes.int32, "PYTHON")
  (si,) = create_schedule([e])
  assert si.ast.op is MetaOps.EMPTY and si.outputs == (e.buffer,)


def test_scheduled_buffers_become_realized():
  a = rand(4)
  x = a.e(UnaryOps.NEG)
  assert x.realized is None
  create_schedule([x])
  assert x.realized is x.buffer
  assert create_schedule([x.e(UnaryOps.NEG)])[0].inputs == (x.buffer,)


def _sched_signature(sched):
  return [(si.ast, len(si.bufs)) for si in sched]


def test_schedule_is_deterministic():
  def build(seed):
    x, w = rand(4, 16, seed=seed), rand(4, 16, seed=seed + 1)
    h = softmax(x.e(BinaryOps.MUL, w), 1)
    r = h.r(ReduceOps.SUM, (0,))
    return [r.e(UnaryOps.SQRT), h.e(UnaryOps.NEG)]
  sigs = [_sched_signature(create_schedule(build(10 * i))) for i in range(3)]
  assert sigs[0] == sigs[1] == sigs[2]


def _positions(sched, buf):
  reads = [i for i, si in enumerate(sched) if buf in si.inputs]
  writes = [i for i, si in enumerate(sched) if buf in si.outputs]
  return reads, writes


@pytest.mark.parametrize("order", ["read_first", "assign_first"])
def test_assign_is_ordered_after_reads_of_its_target(order):
  t = rand(8)
  reader = t.e(BinaryOps.MUL, t.const(3.0)).contiguous()
  other = rand(8, seed=3)
  asg = t.assign(other.e(UnaryOps.NEG))
  outs = [reader, asg] if order == "read_first" else [asg, reader]
  sched = create_schedule(outs)
  reads, writes = _positions(sched, t.buffer)
  assert len(writes) == 1 and reads and max(reads) < writes[0]


def test_assign_reading_its_target_in_the_same_kernel():
  t = rand(8)
  asg = t.assign(t.e(BinaryOps.ADD, t.const(1.0)))
  (si,) = create_schedule([asg])
  assert si.outputs == (t.buffer,) and si.inputs == ()
  loads = [op for op in si.ast.lazyops if op.op is BufferOps.LOAD]
  assert [op.arg.idx for op in loads] == [0]  # reads its own output buffer, element by element


def test_assign_reading_transposed_target_raises():
  t = rand(4, 4)
  with pytest.raises(AssignNotContiguousError):
    create_schedule([t.assign(t.permute((1, 0)).e(UnaryOps.NEG))])


def chain(n, size=1024, seed=0):
  x = rand(size, seed=seed)
  for _ in range(n):
    x = x.e(BinaryOps.ADD, x.const(1.0)).e(UnaryOps.SQRT).contiguous()
  return x


def _distinct_bytes(sched):
  bases = {id(b.base): b.base for si in sched for b in si.bufs}
  return sum(b.nbytes for b in bases.values())


def test_memory_planner_reuses_dead_intermediates(monkeypatch):
  planned = create_schedule([chain(6)])
  monkeypatch.setenv("NO_MEMORY_PLANNER", "1")
  unplanned = create_schedule([chain(6, seed=1)])
  assert len(planned) == len(unplanned) == 6
  # input + output + 5 intermediates without planning; intermediates ping-pong between two buffers with it
  assert _distinct_bytes(unplanned) == 7 * 4096
  assert _distinct_bytes(planned) < _distinct_bytes(unplanned)
  assert _distinct_bytes(planned) <= 4 * 4096
  # a buffer is never read and written by the same kernel after planning
  for si in planned:
    assert not {id(b.base) for b in si.outputs} & {id(b.base) for b in si.inputs}


def test_memory_planner_keeps_buffers_that_lazybuffers_still_use():
  x = rand(256)
  mids = []
  for _ in range(4):
    x = x.e(UnaryOps.SQRT).contiguous()
    mids.append(x)
  sched = create_schedule([x])
  # every intermediate is still referenced (mids), so each keeps its own buffer
  assert [si.outputs[0] for si in sched] == [m.buffer for m in mids]


def test_schedule_item_outputs_inputs():
  a = rand(4)
  si = create_schedule([a.e(UnaryOps.NEG)])[0]
  assert isinstance(si, ScheduleItem) and si.outputs + si.inputs == si.bufs


def test_var_vals_from_symbolic_shapes():
  from tiny.shape.symbolic import Variable
  a = rand(10)
  vi = Variable("i", 1, 10).bind(3)
  x = a.shrink(((0, vi),)).e(UnaryOps.NEG)
  sched, var_vals = create_schedule_with_vars([x])
  assert len(sched) == 1 and list(var_vals.values()) == [3] and [v.expr for v in var_vals] == ["i"]
  with pytest.raises(RuntimeError):
    create_schedule([a.shrink(((0, Variable("j", 1, 10).bind(4)),)).e(UnaryOps.NEG)])


def test_split_reduce_puts_the_factor_first():
  """A long reduce with few outputs is split in two kernels; the partial results are (factor, *output shape), so the
  first kernel keeps the output's contiguous axis and the second sums the factor column-wise."""
  x = np.random.default_rng(3).standard_normal((4, 1 << 15)).astype(np.float32)
  lb = realized(x)
  out = lb.r(ReduceOps.SUM, (1,))
  ks = kernels(create_schedule([out]))
  assert len(ks) == 2
  partial = ks[0].outputs[0]
  assert partial.size % 4 == 0 and partial.size > 4
  first_st = ks[0].ast.src[0].arg.st
  assert first_st.shape[0] == partial.size // 4 and first_st.shape[1] == 4, first_st.shape
  from tiny.tensor import Tensor
  np.testing.assert_allclose(Tensor(x, device="PYTHON").sum(1).numpy(), x.sum(1), rtol=1e-4, atol=1e-3)
