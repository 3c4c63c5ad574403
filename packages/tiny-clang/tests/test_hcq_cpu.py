"""HCQCPU, the CPU reference of the HCQ interfaces: signals, queue ordering, copy/compute overlap, ops, the JIT graph, the trace."""
from __future__ import annotations

import ctypes
import json
import threading
import time
from typing import Any

import numpy as np
import pytest

from tiny import Device, Tensor, TinyJit, Variable
from tiny.helpers import Context
from tiny.runtime import hcq

pytestmark = pytest.mark.skipif(Device.availability("HCQCPU") is not None, reason=f"HCQCPU unavailable: {Device.availability('HCQCPU')}")


@pytest.fixture
def dev() -> Any:
  d = Device["HCQCPU"]
  d.synchronize()
  return d


class _Sleeper:
  """A stand-in program whose launch sleeps on the engine, recording when it started and ended."""

  def __init__(self, seconds: float, log: list, tag: str):
    self.seconds, self.log, self.tag, self.name = seconds, log, tag, tag

  def run(self, args_state: Any) -> None:
    st = time.perf_counter()
    time.sleep(self.seconds)
    self.log.append((self.tag, st, time.perf_counter()))


def test_signal_wait_blocks_until_value(dev: Any) -> None:
  sig = dev.signal_t(0, name="s")
  woke = []
  t = threading.Thread(target=lambda: (sig.wait(3), woke.append(sig.value)))
  t.start()
  sig.value = 2
  time.sleep(0.05)
  assert not woke, "a wait for 3 returned at 2"
  sig.value = 3
  t.join(5)
  assert woke == [3]
  assert sig.reached_at(3) is not None and sig.reached_at(2) is not None and sig.reached_at(2) <= sig.reached_at(3)


def test_signal_timeout_names_signal_and_values(dev: Any) -> None:
  sig = dev.signal_t(1, name="my-signal")
  with pytest.raises(hcq.HCQTimeoutError, match=r"my-signal.*value 5.*at 1"):
    sig.wait(5, timeout=0.05)


def test_out_of_order_submits_are_ordered_by_signals(dev: Any) -> None:
  """The copy queue is submitted first but waits for a signal the compute queue writes after its work."""
  sig = dev.signal_t(0)
  log: list = []
  a, b = dev.allocator.alloc(64), dev.allocator.alloc(64)
  ctypes.memset(a, 7, 64)
  dev.hw_copy_queue_t().wait(sig, 1).copy(b, a, 64).signal(sig, 2).submit(dev)
  time.sleep(0.05)
  assert bytes(b) != bytes(a), "the copy ran before the signal it waits for"
  dev.hw_compute_queue_t().exec(_Sleeper(0.02, log, "k"), None, (1, 1, 1), (1, 1, 1)).signal(sig, 1).submit(dev)
  sig.wait(2, timeout=5)
  assert bytes(b) == bytes(a) and log


def test_update_in_place_replays_with_new_values(dev: Any) -> None:
  s1, s2 = dev.signal_t(0), dev.signal_t(0)
  q = dev.hw_compute_queue_t().wait(s1, 1).signal(s2, 1)
  q.submit(dev)
  s1.value = 1
  s2.wait(1, timeout=5)
  q.update_wait(0, value=2).update_signal(1, value=5)
  q.submit(dev)
  time.sleep(0.02)
  assert s2.value == 1
  s1.value = 2
  s2.wait(5, timeout=5)
  with pytest.raises(ValueError, match="not wait"):
    q.update_wait(1, value=3)


def test_copy_runs_while_compute_runs(dev: Any) -> None:
  """A long kernel on the compute engine and a copy on the copy engine, not ordered by signals, overlap in time."""
  log: list = []
  n = 8 << 20
  a, b = dev.allocator.alloc(n), dev.allocator.alloc(n)
  kernel_done, copy_done = dev.signal_t(0), dev.signal_t(0)
  st, en = dev.signal_t(), dev.signal_t()
  dev.hw_compute_queue_t().exec(_Sleeper(1.0, log, "kernel"), None, (1, 1, 1), (1, 1, 1)).signal(kernel_done, 1).submit(dev)
  time.sleep(0.02)
  dev.hw_copy_queue_t().timestamp(st).copy(b, a, n).timestamp(en).signal(copy_done, 1).submit(dev)
  copy_done.wait(1, timeout=5)
  assert kernel_done.value == 0, "the copy waited for the kernel"
  kernel_done.wait(1, timeout=5)
  kernel_st, kernel_en = log[0][1] * 1e6, log[0][2] * 1e6
  assert st.timestamp is not None and en.timestamp is not None
  assert kernel_st < st.timestamp and en.timestamp < kernel_en, "the copy did not run inside the kernel's time"


@pytest.mark.parametrize("shape", [(7,), (33, 5)])
def test_elementwise_and_reduce(shape: Any) -> None:
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
  tx, ty = Tensor(x, device="HCQCPU"), Tensor(y, device="HCQCPU")
  np.testing.assert_allclose((tx * ty + tx.exp()).numpy(), x * y + np.exp(x), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(tx.sum(axis=-1).numpy(), x.sum(axis=-1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(tx.max().numpy(), x.max())


def test_matmul_and_large_copies() -> None:
  rng = np.random.default_rng(1)
  x, y = rng.standard_normal((96, 80)).astype(np.float32), rng.standard_normal((80, 70)).astype(np.float32)
  np.testing.assert_allclose((Tensor(x, device="HCQCPU") @ Tensor(y, device="HCQCPU")).numpy(), x @ y, rtol=1e-4, atol=1e-4)
  # more than the staging buffers hold at once: copyin and copyout go through them chunk by chunk
  big = rng.standard_normal(3 << 20).astype(np.float32)
  np.testing.assert_array_equal(Tensor(big, device="HCQCPU").numpy(), big)


def test_transfer_between_devices() -> None:
  x = np.arange(1000, dtype=np.float32)
  t = (Tensor(x, device="HCQCPU") + 1).to("HCQCPU:1")
  np.testing.assert_array_equal((t * 2).numpy(), (x + 1) * 2)


def test_jit_replays_through_hcq_graph() -> None:
  from tiny.backend import HCQGraph

  @TinyJit
  def step(a: Tensor, b: Tensor) -> Tensor:
    return ((a + b) * 2).relu().sum(axis=0) + (a * b).mean()

  rng = np.random.default_rng(2)
  for i in range(5):
    x, y = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
    out = step(Tensor(x, device="HCQCPU"), Tensor(y, device="HCQCPU")).numpy()
    np.testing.assert_allclose(out, np.maximum((x + y) * 2, 0).sum(axis=0) + (x * y).mean(), rtol=1e-5, atol=1e-5)
  assert any(isinstance(ei.prg, HCQGraph) for ei in step.jit_cache), "the replay did not go through HCQGraph"


def test_jit_symbolic_variable_through_hcq_graph() -> None:
  from tiny.backend import HCQGraph

  @TinyJit
  def step(a: Tensor) -> Tensor:
    return ((a * 3) + 1).sum(axis=0).contiguous() * 2

  v = Variable("n", 1, 32)
  for n in [4, 9, 17, 30, 5]:
    x = np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)
    a = Tensor(x, device="HCQCPU").reshape(v.bind(n), 6)
    out = step(a).numpy()
    np.testing.assert_allclose(out, ((x * 3) + 1).sum(axis=0) * 2, rtol=1e-5, atol=1e-4)
  assert any(isinstance(ei.prg, HCQGraph) for ei in step.jit_cache)


def test_failed_command_raises_on_synchronize(dev: Any) -> None:
  class Boom:
    name = "boom"

    def run(self, args_state: Any) -> None:
      raise ValueError("kernel exploded")

  with dev.submit_lock:
    dev.hw_compute_queue_t().wait(dev.timeline_signal, dev.timeline_value - 1).exec(Boom(), None, (1,), (1,)) \
      .signal(dev.timeline_signal, dev.timeline_value).submit(dev)
    dev.timeline_value += 1
  with pytest.raises(RuntimeError, match="kernel exploded"):
    dev.synchronize()
  dev.synchronize()   # the error is reported once; the device keeps working
  np.testing.assert_array_equal((Tensor([1.0, 2.0], device="HCQCPU") + 1).numpy(), [2.0, 3.0])


def test_profile_trace_is_chrome_trace_format(tmp_path: Any) -> None:
  hcq.clear_profile()
  with Context(PROFILE=1):
    x = Tensor(np.ones((32, 32), np.float32), device="HCQCPU")
    (x @ x + 1).numpy()

    @TinyJit
    def f(a: Tensor) -> Tensor:
      return (a * 2).sum(axis=0) + 1

    for _ in range(3):
      f(Tensor(np.ones((8, 8), np.float32), device="HCQCPU")).numpy()
  path = hcq.write_trace(str(tmp_path / "trace.json"))
  with open(path) as fh:
    trace = json.load(fh)
  events = trace["traceEvents"]
  complete = [e for e in events if e["ph"] == "X"]
  meta = [e for e in events if e["ph"] == "M"]
  assert complete and meta
  for e in complete:
    assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
  assert {"COMPUTE", "COPY"} <= {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
  assert "HCQCPU" in {e["args"]["name"] for e in meta if e["name"] == "process_name"}
  # each event's process and thread are named by a metadata event
  named = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
  assert all((e["pid"], e["tid"]) in named for e in complete)
  hcq.clear_profile()


def test_hcq_graph_with_copy_queue() -> None:
  """Copies on the graph's copy queue around the captured kernels: the kernels wait for the copy in, the copy out for them."""
  from tiny.backend import Buffer, ExecItem, HCQGraph, dtypes
  from tiny.engine.realize import BufferXfer

  @TinyJit
  def step(a: Tensor) -> Tensor:
    return ((a + 1) * 2).sum(axis=0) + a.max()

  for _ in range(3):
    step(Tensor(np.ones((4, 8), np.float32), device="HCQCPU")).realize()
  graph = next(ei.prg for ei in step.jit_cache if isinstance(ei.prg, HCQGraph))
  kitems = [ExecItem(ei.prg, list(ei.bufs)) for ei in graph.jit_cache]
  # the step's input (0) and output (1) slots get fixed buffers here; the copies fill and drain them
  kin, kout = Buffer("HCQCPU", 32, dtypes.float32).ensure_allocated(), Buffer("HCQCPU", 8, dtypes.float32).ensure_allocated()
  for (j, i), idx in graph.input_replace.items():
    kitems[j].bufs[i] = kin if idx == 0 else kout
  x_buf, y_buf = Buffer("HCQCPU", 32, dtypes.float32).ensure_allocated(), Buffer("HCQCPU", 8, dtypes.float32).ensure_allocated()
  items = [ExecItem(BufferXfer(128, "HCQCPU", "HCQCPU"), [kin, x_buf])] + kitems + [ExecItem(BufferXfer(32, "HCQCPU", "HCQCPU"), [y_buf, kout])]
  g = HCQGraph(items, [x_buf, y_buf], {})
  assert g.copy_q is not None and len(g.copy_q.cmds) > 2
  for seed in range(3):
    x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
    xb, yb = Buffer("HCQCPU", 32, dtypes.float32).ensure_allocated(), Buffer("HCQCPU", 8, dtypes.float32).ensure_allocated()
    xb.copyin(memoryview(x.reshape(-1)).cast("B"))
    g([xb, yb], {})
    out = np.frombuffer(bytes(yb.as_buffer()), dtype=np.float32)
    np.testing.assert_allclose(out, ((x + 1) * 2).sum(axis=0) + x.max(), rtol=1e-5, atol=1e-5)
