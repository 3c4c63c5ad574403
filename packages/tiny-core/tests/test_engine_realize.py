"""Running schedules: runners, counters, the DEBUG line, the method cache, and numpy-equal results on PYTHON."""
import importlib.util

import numpy as np
import pytest

from tiny.device import Buffer
from tiny.dtype import dtypes
from tiny.engine.realize import CustomOp, EmptyOp, ExecItem, Runner, ViewOp, lower_schedule_item, method_cache, run_schedule
from tiny.engine.schedule import ScheduleItem, create_schedule
from tiny.helpers import Context, GlobalCounters
from tiny.lazy import LazyBuffer
from tiny.ops import BinaryOps, LazyOp, MetaOps, ReduceOps, TernaryOps, UnaryOps

HAS_KERNEL = importlib.util.find_spec("tiny.codegen.kernel") is not None
needs_codegen = pytest.mark.skipif(not HAS_KERNEL, reason="tiny.codegen.kernel (issue: codegen) is not in this tree yet")


def realized(arr, device="PYTHON"):
  lb = LazyBuffer.metaop(MetaOps.EMPTY, arr.shape, dtypes.from_np(arr.dtype), device)
  lb.buffer.allocate().copyin(memoryview(np.ascontiguousarray(arr).tobytes()))
  del lb.srcs
  return lb


def rand(*shape, seed=0, positive=False):
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  return np.abs(x) + 0.1 if positive else x


def run(*outs):
  run_schedule(create_schedule(list(outs)))
  return [o.base.buffer.numpy().reshape(o.base.shape) if o.base is o else None for o in outs]


def value(lb):
  """Realize lb (a contiguous copy if it is a view) and return it as numpy."""
  if lb.base is not lb:
    lb = lb.e(MetaOps.CONTIGUOUS)
  run_schedule(create_schedule([lb]))
  return lb.buffer.numpy().reshape(lb.shape)


# **************** runners without kernels ****************

class CountingRunner(Runner):
  def __init__(self):
    super().__init__("counting", "PYTHON", op_estimate=100, mem_estimate=400)
    self.calls = []

  def __call__(self, rawbufs, var_vals, wait=False):
    self.calls.append((rawbufs, var_vals))
    return 0.5 if wait else None


def test_exec_item_updates_global_counters_and_allocates():
  GlobalCounters.reset()
  r = CountingRunner()
  b = Buffer("PYTHON", 4, dtypes.float32)
  ExecItem(r, [b]).run()
  assert b.is_allocated() and len(r.calls) == 1
  assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (1, 100, 400)
  ExecItem(r, [b]).run(wait=True)
  assert GlobalCounters.kernel_count == 2 and GlobalCounters.time_sum_s == 0.5
  ExecItem(r, [b]).run(do_update_stats=False)
  assert GlobalCounters.kernel_count == 2


def test_exec_item_with_unbound_buffer_raises():
  with pytest.raises(RuntimeError):
    ExecItem(CountingRunner(), [None]).run()


def test_debug_line(capsys):
  GlobalCounters.reset()
  with Context(DEBUG=2):
    ExecItem(CountingRunner(), [Buffer("PYTHON", 4, dtypes.float32)]).run()
  out = capsys.readouterr().out
  assert "counting" in out and "GFLOPS" in out and "GB/s" in out
  # 100 ops in 0.5 s
  assert f"{100 / 0.5 / 1e9:9.2f} GFLOPS" in out


def test_custom_empty_view_ops():
  seen = []
  a = Buffer("PYTHON", 3, dtypes.int32, initial_value=np.array([1, 2, 3], np.int32).tobytes())
  CustomOp(lambda *bufs: seen.append([b.numpy().tolist() for b in bufs]))([a], {})
  assert seen == [[[1, 2, 3]]]
  assert EmptyOp(a)([a], {}) is None
  v = a.view(2, dtypes.int32, 4)
  ViewOp(v)([v, a], {})
  with pytest.raises(RuntimeError):
    ViewOp(a)([a, v], {})


def test_lower_unknown_meta_op_raises():
  b = Buffer("PYTHON", 1, dtypes.float32)
  with pytest.raises(RuntimeError):
    lower_schedule_item(ScheduleItem(LazyOp(MetaOps.CONTIGUOUS, (), None), (b,)))


def test_copy_debug_line_and_counters(capsys):
  arr = np.arange(6, dtype=np.float32)
  lb = LazyBuffer.metaop(MetaOps.EMPTY, arr.shape, dtypes.float32, "NPY")
  lb.buffer.allocate(arr)
  del lb.srcs
  out = lb.copy_to_device("PYTHON")
  GlobalCounters.reset()
  with Context(DEBUG=2):
    run_schedule(create_schedule([out]))
  assert "copy" in capsys.readouterr().out
  assert GlobalCounters.kernel_count == 1 and GlobalCounters.global_mem == 24
  np.testing.assert_array_equal(out.buffer.numpy(), arr)


# **************** kernels on the PYTHON device ****************

@needs_codegen
def test_add_sum_matches_numpy():
  x, y = rand(8, 8), rand(8, 8, seed=1)
  out = realized(x).e(BinaryOps.ADD, realized(y)).r(ReduceOps.SUM, (0, 1))
  np.testing.assert_allclose(value(out).reshape(()), (x + y).sum(), rtol=1e-5)


@needs_codegen
def test_softmax_matches_numpy():
  x = rand(4, 16, seed=2)
  a = realized(x)
  m = a.r(ReduceOps.MAX, (1,))
  e = a.e(BinaryOps.ADD, m.expand(a.shape).e(UnaryOps.NEG)).e(UnaryOps.EXP2)
  out = e.e(BinaryOps.MUL, e.r(ReduceOps.SUM, (1,)).e(UnaryOps.RECIP).expand(a.shape))
  ref = np.exp2(x - x.max(1, keepdims=True))
  np.testing.assert_allclose(value(out), ref / ref.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


@needs_codegen
def test_expand_after_reduce_matches_numpy():
  x, y = rand(4, 8), rand(4, 8, seed=3)
  out = realized(x).r(ReduceOps.SUM, (1,)).expand((4, 8)).e(BinaryOps.MUL, realized(y))
  np.testing.assert_allclose(value(out), x.sum(1, keepdims=True) * y, rtol=1e-5)


@needs_codegen
def test_padded_log_matches_numpy():
  x, y = rand(3, 4, positive=True), rand(5, 4, seed=4)
  out = realized(x).e(UnaryOps.LOG2).pad(((1, 1), (0, 0))).e(BinaryOps.ADD, realized(y))
  np.testing.assert_allclose(value(out), np.pad(np.log2(x), ((1, 1), (0, 0))) + y, rtol=1e-5, atol=1e-6)


@needs_codegen
def test_multi_output_matches_numpy():
  x = rand(4, 8, seed=5)
  r = realized(x).r(ReduceOps.SUM, (1,))
  o1, o2 = r.e(BinaryOps.ADD, r.const(1.0)), r.e(BinaryOps.MUL, r.const(2.0))
  sched = create_schedule([o1, o2])
  assert len(sched) == 1
  run_schedule(sched)
  np.testing.assert_allclose(o1.buffer.numpy(), x.sum(1) + 1, rtol=1e-5)
  np.testing.assert_allclose(o2.buffer.numpy(), x.sum(1) * 2, rtol=1e-5)


@needs_codegen
def test_where_cast_and_int_ops_match_numpy():
  x, y = rand(16, seed=6), rand(16, seed=7)
  a, b = realized(x), realized(y)
  out = a.e(BinaryOps.CMPLT, b).e(TernaryOps.WHERE, a, b)  # elementwise min
  np.testing.assert_allclose(value(out), np.minimum(x, y))
  i = realized(np.arange(-8, 8, dtype=np.int32))
  q = i.e(BinaryOps.IDIV, i.const(3)).cast(dtypes.float32)
  np.testing.assert_array_equal(value(q), np.trunc(np.arange(-8, 8) / 3).astype(np.float32))


@needs_codegen
def test_split_reduce_matches_numpy(monkeypatch):
  monkeypatch.setenv("REDUCEOP_SPLIT_THRESHOLD", "16")
  x = rand(512, seed=8)
  out = realized(x).r(ReduceOps.SUM, (0,))
  sched = create_schedule([out])
  assert len(sched) == 2
  run_schedule(sched)
  np.testing.assert_allclose(out.buffer.numpy(), [x.sum()], rtol=1e-4)


@needs_codegen
def test_assign_reads_before_write_on_python():
  x, y = rand(8, seed=9), rand(8, seed=10)
  t = realized(x)
  reader = t.e(BinaryOps.MUL, t.const(3.0)).contiguous()
  asg = t.assign(realized(y).e(UnaryOps.NEG))
  run_schedule(create_schedule([asg, reader]))
  np.testing.assert_allclose(reader.buffer.numpy(), x * 3, rtol=1e-6)
  np.testing.assert_allclose(t.buffer.numpy(), -y)
  inc = t.assign(t.e(BinaryOps.ADD, t.const(1.0)))
  run_schedule(create_schedule([inc]))
  np.testing.assert_allclose(t.buffer.numpy(), -y + 1, rtol=1e-6)


@needs_codegen
def test_memory_planner_chain_is_correct_and_uses_less_memory(monkeypatch):
  def chain_value(seed):
    x = rand(256, seed=seed, positive=True)
    lb = realized(x)
    for _ in range(5):
      lb = lb.e(BinaryOps.ADD, lb.const(1.0)).e(UnaryOps.SQRT).contiguous()
    sched = create_schedule([lb])
    distinct = len({id(b.base) for si in sched for b in si.bufs})
    run_schedule(sched)
    ref = x
    for _ in range(5):
      ref = np.sqrt(ref + 1)
    return lb.buffer.numpy(), ref, distinct
  got, ref, planned = chain_value(11)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  monkeypatch.setenv("NO_MEMORY_PLANNER", "1")
  got, ref, unplanned = chain_value(12)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  assert planned < unplanned


@needs_codegen
def test_method_cache_compiles_each_ast_once():
  x = rand(8, seed=13, positive=True)
  a, b = realized(x), realized(x + 1)
  run_schedule(create_schedule([a.e(UnaryOps.SQRT).e(UnaryOps.NEG)]))
  n = len(method_cache)
  out = b.e(UnaryOps.SQRT).e(UnaryOps.NEG)
  run_schedule(create_schedule([out]))  # same AST, different buffers
  assert len(method_cache) == n
  np.testing.assert_allclose(out.buffer.numpy(), -np.sqrt(x + 1), rtol=1e-6)


@needs_codegen
def test_kernel_debug_line_has_launch_dims(capsys):
  a = realized(rand(8, seed=14))
  with Context(DEBUG=2):
    run_schedule(create_schedule([a.e(UnaryOps.SQRT)]))
  out = capsys.readouterr().out
  assert "global" in out and "local" in out and "GFLOPS" in out


@needs_codegen
def test_noopt_gives_same_result():
  x = rand(6, 10, seed=15)
  with Context(NOOPT=1):
    out = realized(x).r(ReduceOps.MAX, (1,))
    got = value(out)
  np.testing.assert_allclose(got.reshape(-1), x.max(1))
