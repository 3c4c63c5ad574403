"""Schedules handed out by the public schedule functions and read before (or without) being run: every combination must
give numpy's values, and no item may run twice for one schedule (an in-place assign would add twice)."""
import gc

import numpy as np
import pytest

from tiny import Tensor
from tiny.engine import pending
from tiny.engine.realize import lower_schedule_item, run_schedule
from tiny.engine.schedule import create_schedule, create_schedule_with_vars
from tiny.helpers import GlobalCounters
from tiny.shape.symbolic import Variable

A = np.arange(12, dtype=np.float32).reshape(3, 4)


def _kernels(fn):
  before = GlobalCounters.kernel_count
  fn()
  return GlobalCounters.kernel_count - before


def test_schedule_then_numpy():
  y = (Tensor(A) * 2).sum(1)
  assert len(y.schedule()) >= 1
  np.testing.assert_equal(y.numpy(), (A * 2).sum(1))


def test_schedule_then_realize_then_run_schedule_runs_once():
  y = (Tensor(A) * 2).sum(1)
  s = y.schedule()
  assert _kernels(y.realize) >= 1
  assert _kernels(lambda: run_schedule(s)) == 0   # every item already ran for the realize
  np.testing.assert_equal(y.numpy(), (A * 2).sum(1))


def test_schedule_then_run_schedule():
  y = (Tensor(A) - 1).max(0)
  s = y.schedule()
  ref = s[0]._pending[0].ref
  run_schedule(s)
  assert ref not in pending.live
  assert _kernels(y.realize) == 0
  np.testing.assert_equal(y.numpy(), (A - 1).max(0))


def test_schedule_several_tensors():
  t = Tensor(A)
  a, b, c = t.sum(0), (t * 3).sum(1), t.exp()
  a.schedule(b, c)
  np.testing.assert_allclose(c.numpy(), np.exp(A), rtol=1e-6)
  np.testing.assert_equal(a.numpy(), A.sum(0))
  np.testing.assert_equal(b.numpy(), (A * 3).sum(1))


def test_schedule_twice():
  y = Tensor(A).sum()
  s1, s2 = y.schedule(), y.schedule()
  assert s2 == []   # already scheduled: it reads as realized
  np.testing.assert_equal(y.numpy(), A.sum())
  run_schedule(s1)
  np.testing.assert_equal(y.numpy(), A.sum())


def test_reader_of_scheduled_tensor_nan():
  # unrealized numpy input: the copy and the reduce are pending when another kernel reads the result
  x = np.array([np.nan, 1.0, 2.0], dtype=np.float32)
  y = Tensor(x).sum()
  y.schedule()
  z = y + 1
  assert np.isnan(z.numpy())
  assert np.isnan(y.numpy())


def test_partial_overlap_with_another_realize():
  t = Tensor(A)
  y = (t * 2).sum(1)
  s = y.schedule()
  z = (y + 1).numpy()
  np.testing.assert_equal(z, (A * 2).sum(1) + 1)
  run_schedule(s)
  np.testing.assert_equal(y.numpy(), (A * 2).sum(1))


def test_other_schedule_reading_pending_buffer():
  y = Tensor(A).sum(0)
  sy = y.schedule()
  z = y * 3
  sz = z.schedule()
  run_schedule(sz)   # reads y: y's items run first
  np.testing.assert_equal(z.numpy(), A.sum(0) * 3)
  assert _kernels(lambda: run_schedule(sy)) == 0
  np.testing.assert_equal(y.numpy(), A.sum(0))


def test_assign_schedule_then_numpy_then_run_adds_once():
  x = Tensor(A.copy()).realize()
  x.assign(x + 1)
  s = x.schedule()
  np.testing.assert_equal(x.numpy(), A + 1)
  run_schedule(s)   # the assign ran for numpy(): running it again would give A + 2
  np.testing.assert_equal(x.numpy(), A + 1)


def test_assign_scheduled_read_by_eager_op():
  x = Tensor(A.copy()).realize()
  x.assign(x * 2)
  x.schedule()
  np.testing.assert_equal((x + 0.5).numpy(), A * 2 + 0.5)
  np.testing.assert_equal(x.numpy(), A * 2)


def test_explicit_rerun_of_a_copy_runs_again():
  x = Tensor(A.copy()).realize()
  x.assign(x + 1)
  s = x.schedule()
  run_schedule(list(s))
  run_schedule(s)   # the caller asked for two runs
  np.testing.assert_equal(x.numpy(), A + 2)


def test_schedule_list_dropped():
  y = (Tensor(A) + 3).sum()
  y.schedule()
  gc.collect()
  np.testing.assert_equal(y.numpy(), (A + 3).sum())


def test_dropped_unrun_schedule_leaves_nothing_live():
  y = (Tensor(A) + 3).sum()
  s = y.schedule()
  ref = s[0]._pending[0].ref
  assert ref in pending.live
  del y, s
  gc.collect()
  assert ref() is None and ref not in pending.live


def test_create_schedule_lazybuffers():
  t = Tensor(A)
  y = (t * t).sum(1)
  create_schedule([y.lazydata])
  np.testing.assert_equal(y.numpy(), (A * A).sum(1))


def test_create_schedule_with_vars_symbolic():
  v = Variable("i", 1, 3).bind(2)
  t = Tensor(A)
  y = (t.shrink(((0, v), None)) * 2).sum(0)
  s, var_vals = create_schedule_with_vars([y.lazydata])
  assert var_vals
  np.testing.assert_equal(y.numpy(), (A[:2] * 2).sum(0))
  run_schedule(s, var_vals)
  np.testing.assert_equal(y.numpy(), (A[:2] * 2).sum(0))


def test_manual_lowering_takes_the_item():
  y = (Tensor(A) * 5).sum(0)
  s = y.schedule()
  ref = s[0]._pending[0].ref
  n = _kernels(lambda: [lower_schedule_item(si).run() for si in s])
  assert n >= 1
  assert ref not in pending.live
  assert _kernels(lambda: y.numpy()) <= 1   # at most numpy's own copy-out kernel, never the schedule again
  np.testing.assert_equal(y.numpy(), (A * 5).sum(0))


@pytest.mark.parametrize("run_first", [False, True])
def test_chain_of_schedules(run_first):
  t = Tensor(A)
  a = (t + 1).sum(1)
  sa = a.schedule()
  b = (a * a).sum()
  sb = b.schedule()
  if run_first:
    run_schedule(sa)
  np.testing.assert_equal(b.numpy(), ((A + 1).sum(1) ** 2).sum())
  run_schedule(sb)
  run_schedule(sa)
  np.testing.assert_equal(a.numpy(), (A + 1).sum(1))
  np.testing.assert_equal(b.numpy(), ((A + 1).sum(1) ** 2).sum())


@pytest.mark.parametrize("seed", range(8))
def test_random_schedule_run_read_sequences(seed):
  # schedules handed out, run, dropped or left, reads, new readers and in-place assigns in a random order: every read
  # matches numpy, and running what is left at the end changes nothing (no item ran twice)
  rng = np.random.default_rng(seed)
  tensors = []   # (Tensor, numpy value it must read as)
  var = Tensor(A.copy()).realize()
  var_val = A.copy()
  lists = []
  for _ in range(14):
    step = rng.integers(6)
    if step == 0 or not tensors:
      a = rng.standard_normal((3, 4)).astype(np.float32)
      tensors.append((Tensor(a), a))
    elif step == 1:
      t, v = tensors[rng.integers(len(tensors))]
      k = float(rng.integers(1, 4))
      tensors.append(((t * k + 1).sum(1, keepdim=True).expand(3, 4), np.broadcast_to((v * k + 1).sum(1, keepdims=True), (3, 4))))
    elif step == 2:
      picks = [tensors[i][0] for i in rng.choice(len(tensors), size=min(2, len(tensors)), replace=False)]
      lists.append(picks[0].schedule(*picks[1:]))
    elif step == 3 and lists:
      run_schedule(lists.pop(rng.integers(len(lists))))
    elif step == 4:
      t, v = tensors[rng.integers(len(tensors))]
      np.testing.assert_allclose(t.numpy(), v, rtol=1e-5)
    else:
      tensors.append((var * 2, var_val * 2))   # a lazy reader of the old contents
      var.assign(var + 1)
      var_val = var_val + 1
      tensors.append((var + 0.5, var_val + 0.5))   # a reader of the new contents
      if rng.integers(2):
        lists.append(var.schedule())
  for t, v in tensors:
    np.testing.assert_allclose(t.numpy(), v, rtol=1e-5)
  for s in lists:
    run_schedule(s)
  np.testing.assert_allclose(var.numpy(), var_val, rtol=1e-5)
  for t, v in tensors:
    np.testing.assert_allclose(t.numpy(), v, rtol=1e-5)


def test_assign_realized_after_a_pending_reader():
  # the pending reader reads the contents before the assign, even though the assign runs first
  x = Tensor(A.copy()).realize()
  r = x + 0.5
  r.schedule()
  x.assign(x * 3).realize()
  np.testing.assert_equal(r.numpy(), A + 0.5)
  np.testing.assert_equal(x.numpy(), A * 3)


def test_two_pending_assigns_run_in_order():
  x = Tensor(A.copy()).realize()
  x.assign(x + 1)
  s1 = x.schedule()
  x.assign(x * 2)
  s2 = x.schedule()
  run_schedule(s2)   # the first assign must run before the second
  np.testing.assert_equal(x.numpy(), (A + 1) * 2)
  run_schedule(s1)
  np.testing.assert_equal(x.numpy(), (A + 1) * 2)


def test_pending_reader_of_an_overwritten_tag():
  # r reads x after the first assign; a second pending assign retags x's buffer before r runs
  x = Tensor(A.copy()).realize()
  x.assign(x + 1)
  x.schedule()
  r = x + 0.5
  r.schedule()
  x.assign(x + 10)
  x.schedule()
  np.testing.assert_equal(r.numpy(), A + 1.5)
  np.testing.assert_equal(x.numpy(), A + 11)
